#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
#
# Fails when libkvfabric.so exports a symbol that does not start with kvf_
# (STYLE.md B8, as DPDK's check-symbols.sh), or exports nothing at all.
set -euo pipefail
lib=$1
syms=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVWiu]$/ {print $3}')
if [ -z "$syms" ]; then
    echo "FAIL: $lib exports no symbols"
    exit 1
fi
bad=$(printf '%s\n' "$syms" | grep -v '^kvf_' | grep -v '^KVFABRIC_' || true)
if [ -n "$bad" ]; then
    echo "FAIL: $lib exports symbols outside the kvf_ namespace:"
    printf '  %s\n' $bad
    exit 1
fi
for want in kvf_client_connect kvf_pd_push kvf_pd_wait kvf_pd_release; do
    if ! printf '%s\n' "$syms" | sed 's/@.*//' | grep -qx "$want"; then
        echo "FAIL: $lib does not export $want"
        exit 1
    fi
done
echo "ok: $(printf '%s\n' "$syms" | wc -l) exported symbols, all kvf_*"
