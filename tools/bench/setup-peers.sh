#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
#
# The virtual environment of `kvf-bench p2p|pd --peers`: Mooncake Transfer
# Engine and NIXL from the Python package index, pinned, in VENV (default
# build/peers-venv; never committed). Idempotent: a complete environment is
# left as it is. Prints the interpreter's path on success.
#
# NIXL: the CUDA-12 wheel alone, without its declared torch dependency
# (nixl_cu12._api imports torch only for type checks; with it the
# environment grows from about 0.3 to 6 GB). Its UCX backend and UCX
# libraries come inside the wheel.
set -euo pipefail

VENV=${1:-build/peers-venv}
MOONCAKE=mooncake-transfer-engine-non-cuda==0.3.13.post1
NIXL=nixl-cu12==1.5.1
NUMPY=numpy==2.4.6
stamp="$VENV/.kvf-peers-$MOONCAKE-$NIXL-$NUMPY"

if [ -f "$stamp" ]; then
    echo "$VENV/bin/python"
    exit 0
fi
python3 -m venv "$VENV" >&2
"$VENV/bin/pip" install -q --disable-pip-version-check "$MOONCAKE" "$NUMPY" >&2
"$VENV/bin/pip" install -q --disable-pip-version-check --no-deps "$NIXL" >&2
"$VENV/bin/python" -c 'import mooncake.engine, nixl_cu12._api' >&2
touch "$stamp"
echo "$VENV/bin/python"
