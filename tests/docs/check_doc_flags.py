#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
#
# The operator docs may only name flags and kvfctl commands that exist:
# every `--flag` in them must be in some program's --help (or be one of the
# few other tools' flags listed here), every `kvfctl COMMAND` in kvfctl's.
import os
import re
import subprocess
import sys

root = os.environ.get("KVF_SOURCE_ROOT", ".")
build = os.environ.get("KVF_BUILD_ROOT", "build")
DOCS = ["docs/operations.md", "docs/troubleshooting.md", "deploy/README.md",
        "docs/architecture.md"]
OTHER_TOOLS = {"--dry-run", "--now", "--keep-running", "--help"}

env = {k: v for k, v in os.environ.items() if not k.startswith("KVF_")}
helps = {}
for prog in ("agent/kvf-agent", "controller/kvf-controller", "tools/kvfctl"):
    r = subprocess.run([os.path.join(build, prog), "--help"],
                       capture_output=True, text=True, env=env, timeout=60)
    helps[prog] = r.stdout + r.stderr
# kvf-bench: each benchmark lists its own options
bench = os.path.join(build, "tools/kvf-bench")
r = subprocess.run([bench, "--help"], capture_output=True, text=True, env=env,
                   timeout=60)
for name in re.findall(r"^  ([a-z][a-z-]*) ", r.stdout + r.stderr, re.M):
    r = subprocess.run([bench, name, "--help"], capture_output=True,
                       text=True, env=env, timeout=60)
    helps["kvf-bench " + name] = r.stdout + r.stderr
flags = set(re.findall(r"--[a-z][a-z0-9-]*", "".join(helps.values())))
commands = set(re.findall(r"^  ([a-z]+) ", helps["tools/kvfctl"], re.M))
if not commands:
    sys.exit("kvfctl --help lists no commands")

problems = []
for doc in DOCS:
    text = open(os.path.join(root, doc)).read()
    for flag in sorted(set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))):
        if flag not in flags | OTHER_TOOLS:
            problems.append(f"{doc}: {flag} is not a flag of any program")
    for cmd in re.findall(r"kvfctl(?: --controller \S+)?(?: --json)? ([a-z]+)",
                          text):
        if cmd not in commands:
            problems.append(f"{doc}: 'kvfctl {cmd}' is not a kvfctl command")
for p in problems:
    print(p)
sys.exit(1 if problems else 0)
