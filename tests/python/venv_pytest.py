#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""Runs pytest with the interpreter of the integrations venv
(build/venv-sglang, made by `make venv-sglang` from
python/requirements-integrations.txt: sglang, lmcache and the torch they
need), else with this interpreter, where the tests skip saying so.

Usage: venv_pytest.py PYTEST-ARGS... (meson.build passes the test file).
KVF_INTEGRATIONS_VENV overrides the venv's path. Torch's JIT extensions
(SGLang builds its page hash this way) go under the venv, not ~/.cache."""
import os
import pathlib
import sys

src = pathlib.Path(os.environ.get(
    "KVF_SOURCE_ROOT", pathlib.Path(__file__).resolve().parents[2]))
venv = pathlib.Path(os.environ.get("KVF_INTEGRATIONS_VENV",
                                   src / "build" / "venv-sglang"))
py = venv / "bin" / "python"
if not (venv / ".installed").exists():
    print(f"venv_pytest: {venv} not installed (make venv-sglang); the tests "
          "skip", file=sys.stderr)
    py = pathlib.Path(sys.executable)
else:
    os.environ.setdefault("TORCH_EXTENSIONS_DIR",
                          str(venv / "torch-extensions"))
os.execv(str(py), [str(py), "-m", "pytest"] + sys.argv[1:])
