#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
#
# Hosts as network namespaces for the fault tests: TAG-h0 .. TAG-h(N-1),
# each with eth0 = 10.231.0.(i+1)/24 on a veth whose other end (p<i>) sits
# on a bridge in TAG-sw (the switch), so one host's link can go down or get
# netem without touching the others. Nothing is added to the namespace this
# script runs in; the 10.231.0.0/24 addresses exist only inside TAG-*.
#
#   netns.sh probe             can namespaces be made here? (reason on stdout)
#   netns.sh up TAG N          create (removes a stale TAG-* first)
#   netns.sh down TAG          remove every TAG-* namespace (idempotent)
#   netns.sh link TAG I up|down
#   netns.sh netem TAG I SPEC  tc netem SPEC on host I's eth0; SPEC "off" clears
#   netns.sh netem-probe       can netem be used here? (reason on stdout)
#   netns.sh cut TAG I J on|off  drop (blackhole) all traffic between hosts
#                              I and J, both ways, or heal it
#   netns.sh gc                remove kvff<PID>-* of processes that are gone
set -u
cmd=${1:-}
IP=$(command -v ip || echo /usr/sbin/ip)
TC=$(command -v tc || echo /usr/sbin/tc)

down() {
    local ns
    for ns in $("$IP" netns list 2>/dev/null | awk '{print $1}' | grep "^$1-"); do
        "$IP" netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
        "$IP" netns del "$ns" 2>/dev/null
    done
    return 0
}

case "$cmd" in
probe)
    [ -x "$IP" ] || { echo "iproute2 (ip) is not installed"; exit 1; }
    ns="kvff$$-probe"
    if ! err=$("$IP" netns add "$ns" 2>&1); then
        echo "ip netns add failed (needs CAP_SYS_ADMIN): $err"
        exit 1
    fi
    if ! err=$("$IP" link add eth0 netns "$ns" type veth peer name p0 \
            netns "$ns" 2>&1); then
        "$IP" netns del "$ns"
        echo "cannot create veth pairs: $err"
        exit 1
    fi
    "$IP" netns del "$ns"
    ;;
netem-probe)
    [ -x "$TC" ] || { echo "tc (iproute2) is not installed"; exit 1; }
    ns="kvff$$-probe"
    "$IP" netns add "$ns" || exit 1
    "$IP" -n "$ns" link set lo up
    err=$("$IP" netns exec "$ns" "$TC" qdisc add dev lo root netem \
        delay 1ms 2>&1)
    rc=$?
    "$IP" netns del "$ns"
    if [ $rc -ne 0 ]; then
        echo "tc qdisc netem does not work here (kernel module sch_netem" \
            "missing?): $err"
        exit 1
    fi
    ;;
up)
    tag=$2 n=$3
    down "$tag"
    set -e
    "$IP" netns add "$tag-sw"
    "$IP" -n "$tag-sw" link add br0 type bridge
    "$IP" -n "$tag-sw" link set br0 up
    for ((i = 0; i < n; i++)); do
        h="$tag-h$i"
        "$IP" netns add "$h"
        "$IP" link add eth0 netns "$h" type veth peer name "p$i" netns "$tag-sw"
        "$IP" -n "$tag-sw" link set "p$i" master br0
        "$IP" -n "$tag-sw" link set "p$i" up
        "$IP" -n "$h" addr add "10.231.0.$((i + 1))/24" dev eth0
        "$IP" -n "$h" link set lo up
        "$IP" -n "$h" link set eth0 up
    done
    ;;
down)
    down "$2"
    ;;
link)
    # the switch side: the host sees carrier loss, as with a pulled cable
    "$IP" -n "$2-sw" link set "p$3" "$4"
    ;;
netem)
    if [ "$4" = off ]; then
        "$IP" netns exec "$2-h$3" "$TC" qdisc del dev eth0 root 2>/dev/null
        exit 0
    fi
    # shellcheck disable=SC2086 # SPEC is words for tc
    "$IP" netns exec "$2-h$3" "$TC" qdisc replace dev eth0 root netem $4
    ;;
cut)
    op=add
    [ "$5" = off ] && op=del
    "$IP" -n "$2-h$3" route "$op" blackhole "10.231.0.$(($4 + 1))/32" &&
        "$IP" -n "$2-h$4" route "$op" blackhole "10.231.0.$(($3 + 1))/32"
    ;;
gc)
    for ns in $("$IP" netns list 2>/dev/null | awk '{print $1}' |
                grep -E '^kvff[0-9]+-' | sed 's/-.*//' | sort -u); do
        pid=${ns#kvff}
        [ -d "/proc/$pid" ] || down "$ns"
    done
    ;;
*)
    sed -n '4,20p' "$0" >&2
    exit 2
    ;;
esac
