#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""Fails when an #include or a meson link crosses a layer the wrong way.

The layers (docs/architecture.md "Code layout"):

    common <- proto <- transport <- agent, controller, client <- tools
    common <- gpu <- agent (and libkvfabric bundles gpu)

tools link client/, not the daemons' libraries (agent/, controller/).

A folder's .c/.h files may include "X/..." headers only of the folders
ALLOWED lists for it; public headers (include/kvfabric) include only
<kvfabric/...> and the system. A folder's meson.build may use only the
kvf_* libraries and dependencies defined by those folders.

Usage: check_layers.py SOURCE_ROOT      (exit 1 and one line per crossing)
       check_layers.py --self-test      (a crossing in a scratch tree fails)
"""
import pathlib
import re
import sys
import tempfile

ALLOWED = {
    "common": {"common"},
    "proto": {"proto", "common"},
    "transport": {"transport", "proto", "common"},
    "gpu": {"gpu", "common"},
    "client": {"client", "proto", "common", "gpu"},
    "agent": {"agent", "transport", "proto", "common", "gpu"},
    "controller": {"controller", "proto", "common"},
    # tools reach the daemons over the wire (client/), never link them
    "tools": {"tools", "client", "transport", "proto", "common", "gpu"},
}
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"/]+)/[^"]*"', re.M)
DEFINE_RE = re.compile(r"^(kvf_\w+)\s*=", re.M)
USE_RE = re.compile(r"\b(kvf_\w+)\b")


def strip_comments(text):
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def check(root):
    root = pathlib.Path(root)
    errors = []
    for folder, allowed in ALLOWED.items():
        for path in sorted((root / folder).rglob("*.[ch]")):
            text = strip_comments(path.read_text(errors="replace"))
            for m in INCLUDE_RE.finditer(text):
                target = m.group(1)
                if target in ALLOWED and target not in allowed:
                    errors.append(f"{path.relative_to(root)}: includes "
                                  f"{target}/ ({folder} may include "
                                  f"{', '.join(sorted(allowed))})")
    for path in sorted((root / "include").rglob("*.h")):
        for m in INCLUDE_RE.finditer(strip_comments(path.read_text())):
            errors.append(f"{path.relative_to(root)}: a public header "
                          f"includes the private {m.group(1)}/")
    # which folder defines each kvf_* meson variable
    owner = {}
    for folder in ALLOWED:
        build = root / folder / "meson.build"
        if build.exists():
            for m in DEFINE_RE.finditer(build.read_text()):
                owner.setdefault(m.group(1), folder)
    for folder, allowed in ALLOWED.items():
        build = root / folder / "meson.build"
        if not build.exists():
            continue
        text = "\n".join(line.split("#", 1)[0]
                         for line in build.read_text().splitlines())
        for name in sorted(set(USE_RE.findall(text))):
            src = owner.get(name)
            if src is not None and src not in allowed:
                errors.append(f"{folder}/meson.build: uses {name} of "
                              f"{src}/ ({folder} may link "
                              f"{', '.join(sorted(allowed))})")
    return errors


def self_test():
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        for d in ("common", "proto", "agent", "include/kvfabric"):
            (root / d).mkdir(parents=True)
        (root / "common" / "log.c").write_text('#include "common/log.h"\n')
        (root / "proto" / "meson.build").write_text(
            "kvf_proto_dep = declare_dependency()\n")
        (root / "agent" / "meson.build").write_text(
            "kvf_agent_dep = declare_dependency()\n")
        assert check(root) == [], check(root)
        (root / "common" / "bad.c").write_text(
            '/* "agent/x.h" in a comment is fine */\n#include "agent/pool.h"\n')
        (root / "common" / "meson.build").write_text(
            "x = [kvf_proto_dep]  # kvf_agent_dep in a comment is fine\n")
        (root / "include" / "kvfabric" / "x.h").write_text(
            '#include "common/log.h"\n')
        errors = check(root)
        assert len(errors) == 3, errors
        assert "common/bad.c: includes agent/" in errors[0], errors
    print("ok: self-test")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return 0
    errors = check(sys.argv[1])
    for e in errors:
        print(e)
    if errors:
        print(f"FAIL: {len(errors)} crossing(s) against the layering "
              "(docs/architecture.md)")
        return 1
    print("ok: every include and link points down the layers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
