#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
#
# docs/protocol.md must describe every message and enum of
# proto/kvfabric.proto field by field (its "Message reference"), and name
# every frame type of proto/frame.h: a message or field added without
# documentation fails here.
import os
import re
import sys

root = os.environ.get("KVF_SOURCE_ROOT", ".")
proto = open(os.path.join(root, "proto", "kvfabric.proto")).read()
frame_h = open(os.path.join(root, "proto", "frame.h")).read()
doc = open(os.path.join(root, "docs", "protocol.md")).read()
problems = []

ref = doc.split("\n## Message reference\n", 1)
if len(ref) != 2:
    sys.exit("docs/protocol.md: no '## Message reference' section")
sections = {}
for m in re.finditer(r"^### (\w+)\n(.*?)(?=^### |^## |\Z)", ref[1], re.S | re.M):
    sections[m.group(1)] = m.group(2)

for m in re.finditer(r"^(message|enum) (\w+) \{(.*?)^\}", proto, re.S | re.M):
    kind, name, body = m.groups()
    if name not in sections:
        problems.append(f"{kind} {name}: no '### {name}' in the reference")
        continue
    if kind == "enum":
        names = re.findall(r"^\s*(\w+) = \d+;", body, re.M)
    else:
        names = re.findall(r"^\s*(?:repeated )?\w+ (\w+) = \d+;", body, re.M)
    for field in names:
        if f"| `{field}` |" not in sections[name]:
            problems.append(f"{name}.{field}: not in its table")

for t in re.findall(r"KVF_MSG_([A-Z_]+)\s*=", frame_h):
    if t != "TYPE_MAX" and not re.search(rf"\b{t}\b", doc):
        problems.append(f"frame type {t} (proto/frame.h) is not mentioned")

for p in problems:
    print("docs/protocol.md:", p)
sys.exit(1 if problems else 0)
