#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
#
# Installs the Debian packages named on the command line that are missing.
# Silent when everything is there; loud, with the reason, when it cannot.
set -euo pipefail

missing=()
for pkg in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed'; then
        missing+=("$pkg")
    fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "kvfabric: installing Debian packages: ${missing[*]}"
sudo=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        sudo=(sudo)
    else
        echo "kvfabric: need root (or sudo) to install: ${missing[*]}" >&2
        exit 1
    fi
fi
export DEBIAN_FRONTEND=noninteractive
if ! "${sudo[@]}" apt-get update -qq >/tmp/kvf-apt.log 2>&1 ||
   ! "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" \
        >>/tmp/kvf-apt.log 2>&1; then
    tail -n 20 /tmp/kvf-apt.log >&2
    echo "kvfabric: apt-get could not install: ${missing[*]} (log: /tmp/kvf-apt.log)" >&2
    exit 1
fi
