#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
#
# meson setup DIR ARGS..., quiet unless it fails. CUDA's nvcc is looked for in
# /usr/local/cuda/bin as well, since a non-login PATH often lacks it.
set -euo pipefail
dir=$1
shift
if [ -d /usr/local/cuda/bin ] && ! command -v nvcc >/dev/null 2>&1; then
    export PATH="$PATH:/usr/local/cuda/bin"
fi
mkdir -p "$(dirname "$dir")"
log="$(dirname "$dir")/$(basename "$dir")-setup.log"
rm -rf "$dir"
if ! meson setup "$dir" "$@" >"$log" 2>&1; then
    cat "$log" >&2
    echo "kvfabric: meson setup of $dir failed (log: $log)" >&2
    exit 1
fi
sed -n '/^kvfabric/,$p' "$log"
