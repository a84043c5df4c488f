#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
#
# Runs every libFuzzer target in BUILD_DIR for SECONDS each, starting from
# the corpus kept in tests/fuzz/corpus/<target>. New interesting inputs are
# added to a scratch corpus; a crash stops the run with the input's path so
# it can be fixed and kept in tests/fuzz/corpus/<target> as a regression.
set -euo pipefail
build=$1
seconds=${2:-30}
root=$(cd "$(dirname "$0")/.." && pwd)
status=0
for bin in "$build"/tests/fuzz/fuzz-*; do
    { [ -f "$bin" ] && [ -x "$bin" ]; } || continue
    name=${bin##*/fuzz-}
    scratch="$build/fuzz-corpus/$name"
    artifacts="$build/fuzz-artifacts/$name/"
    mkdir -p "$scratch" "$artifacts"
    echo "fuzz $name: ${seconds}s"
    if ! "$bin" -max_total_time="$seconds" -artifact_prefix="$artifacts" \
            -print_final_stats=1 "$scratch" "$root/tests/fuzz/corpus/$name" \
            >"$build/fuzz-$name.log" 2>&1; then
        tail -n 40 "$build/fuzz-$name.log"
        echo "fuzz $name: crash; inputs in $artifacts" >&2
        status=1
    else
        grep -E 'stat::number_of_executed_units|cov:' "$build/fuzz-$name.log" | tail -n 2
    fi
done
exit $status
