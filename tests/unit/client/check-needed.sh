#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
#
# Fails when libkvfabric.so needs a library an engine should not load:
# the daemons' YAML config, libevent, libssl (client/README.md).
set -euo pipefail
lib=$1
needed=$(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
bad=$(printf '%s\n' "$needed" | grep -E '^lib(yaml|event|ssl)' || true)
if [ -n "$bad" ]; then
    echo "FAIL: $lib needs what an engine should not load:"
    printf '  %s\n' $bad
    exit 1
fi
echo "ok: $lib needs $(printf '%s\n' "$needed" | tr '\n' ' ')"
