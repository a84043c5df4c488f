# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""Runs a real-vLLM pytest file with the virtual environment's interpreter
(build/venv, made by `make test`: tools/vllm-venv.sh), without the ASan
runtime: vLLM's processes load the release libkvfabric.so (KVF_VLLM_LIB,
else build/release's), the agents and the controller they talk to come from
this (ASan) build with their leak checks on. Missing pieces fail the test
and say why; only an unreachable package index makes it a skip (77)."""
import os
import pathlib
import sys

SRC = pathlib.Path(os.environ.get("KVF_SOURCE_ROOT",
                                  pathlib.Path(__file__).resolve().parents[2]))


def main(argv):
    py = pathlib.Path(os.environ.get("KVF_VLLM_PYTHON",
                                     SRC / "build" / "venv" / "bin" / "python"))
    if not py.exists():
        log = SRC / "build" / "venv.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        unreachable = any(s in text for s in (
            "Failed to establish a new connection", "Temporary failure in "
            "name resolution", "Network is unreachable"))
        print(f"kvfabric: no vLLM virtual environment at {py} (make test "
              f"makes it with tools/vllm-venv.sh; log {log})"
              + (": the package index is unreachable" if unreachable else ""))
        return 77 if unreachable else 1
    lib = os.environ.get("KVF_VLLM_LIB")
    if not lib:
        for sub in ("client", "agent"):
            p = SRC / "build" / "release" / sub / "libkvfabric.so"
            if p.exists():
                lib = str(p)
                break
    if not lib:
        print("kvfabric: no release libkvfabric.so under build/release "
              "(make test builds it; or set KVF_VLLM_LIB)")
        return 1
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env.pop("ASAN_OPTIONS", None)
    env["KVF_LIB"] = env["KVF_VLLM_LIB"] = lib
    env["KVF_VLLM_PYTHON"] = str(py)
    env["KVF_SOURCE_ROOT"] = str(SRC)
    args = [str(py), "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider"]
    os.execve(str(py), args + argv[1:], env)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
