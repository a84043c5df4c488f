#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
#
# tools/ucx-new.sh VENV BUILD REQUIREMENTS [meson test args...]: builds and
# tests kvfabric against a current UCX, the libraries of the `libucx-cu12`
# wheel (pinned in REQUIREMENTS) instead of Debian's UCX 1.13 (`make
# test-ucx-new`, docs/operations.md).
#
# The wheel ships UCX's headers, libraries, pkg-config files and its modules
# (lib/ucx: cma, and CUDA ones that fail to load without libcuda, which UCX
# skips quietly). Its .pc files name the prefix the wheel was built in, so
# copies with the real prefix go to BUILD-pkgconfig; the binaries get an
# rpath to the wheel's lib/, and UCX finds its modules next to libucs.
set -euo pipefail
venv=$1
build=$2
req=$3
shift 3

stamp="$venv/.kvf-requirements"
if ! { [ -f "$stamp" ] && cmp -s "$stamp" "$req" && [ -x "$venv/bin/python" ]; }; then
    echo "kvfabric: installing $venv (pinned in $req; log $venv.log)" >&2
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    if ! { /usr/bin/python3 -m venv "$venv" &&
           "$venv/bin/pip" install --quiet --disable-pip-version-check \
               --no-deps -r "$req"; } >"$venv.log" 2>&1; then
        tail -n 20 "$venv.log" >&2
        echo "kvfabric: pip install of $req failed (log: $venv.log)" >&2
        exit 1
    fi
    cp "$req" "$stamp"
fi

prefix=$("$venv/bin/python" -c \
    'import libucx, os; print(os.path.dirname(os.path.abspath(libucx.__file__)))')
pc="$build-pkgconfig"
mkdir -p "$pc"
for f in "$prefix"/lib/pkgconfig/*.pc; do
    sed "s|^prefix *=.*|prefix = $prefix|" "$f" >"$pc/$(basename "$f")"
done
version=$(PKG_CONFIG_PATH="$pc" pkg-config --modversion ucx)

# (re)configure when the wheel or the options changed
opts=(-Db_sanitize=address,undefined -Db_lundef=false -Dtests=enabled
      -Dwerror=true -Dcuda=disabled "-Dpkg_config_path=$pc"
      "-Dc_link_args=-Wl,-rpath,$prefix/lib")
key="$prefix ${opts[*]}"
if ! [ -f "$build/build.ninja" ] || [ "$(cat "$build/.kvf-ucx" 2>/dev/null)" != "$key" ]; then
    "$(dirname "$0")/meson-setup.sh" "$build" "${opts[@]}"
    echo "$key" >"$build/.kvf-ucx"
fi
ninja -C "$build" --quiet | { grep -v '^ninja: no work to do' || true; }

# the binaries must load the wheel's UCX, not Debian's
loaded=$(ldd "$build/agent/kvf-agent" | awk '/libucp\.so/ {print $3}')
case "$loaded" in
"$prefix"/lib/*) ;;
*)
    echo "kvfabric: $build/agent/kvf-agent loads libucp from '$loaded'," \
         "not from $prefix/lib" >&2
    exit 1
    ;;
esac
echo "kvfabric: UCX $version from $prefix/lib (build $build)"
LD_LIBRARY_PATH="$prefix/lib" "$prefix/bin/ucx_info" -v | sed -n 1p

log="$build/meson-test.out"
echo "kvfabric: running the unit and integration suites (log: $log)"
rc=0
ASAN_OPTIONS=abort_on_error=1:detect_leaks=1 \
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    meson test -C "$build" --print-errorlogs --num-processes 2 \
    --suite unit --suite integration --suite security "$@" >"$log" 2>&1 || rc=$?
grep -E '^ *[0-9]+/[0-9]+ ' "$log" | awk '!seen[$0]++' || true
grep -E '^(Ok|Expected Fail|Fail|Unexpected Pass|Skipped|Timeout):' "$log" || true
if [ "$rc" -ne 0 ]; then
    echo "kvfabric: tests failed against UCX $version (log: $log)" >&2
fi
exit "$rc"
