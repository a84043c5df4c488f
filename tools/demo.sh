#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
#
# make demo: a local kvfabric cluster on loopback. Starts a controller and two
# agents from BUILD_DIR, drives them with a synthetic engine workload (the
# second worker reuses the first one's KV through peer fetch), shows what an
# operator sees (kvfctl, /metrics), and shuts everything down cleanly.
#
#   tools/demo.sh BUILD_DIR [--keep-running] [--cluster-only]
#
# Ctrl-C, or kill of the controller, stops it cleanly (exit 0). On a
# failure the log directory is kept and named.
#   --cluster-only  start the cluster, skip the workloads (tests)
set -euo pipefail

build=${1:?usage: demo.sh BUILD_DIR [--keep-running] [--cluster-only]}
shift
keep=0
cluster_only=0
for arg in "$@"; do
    case $arg in
    --keep-running) keep=1 ;;
    --cluster-only) cluster_only=1 ;;
    *) echo "demo: unknown option '$arg' (known: --keep-running, --cluster-only)" >&2; exit 2 ;;
    esac
done

controller_bin=$build/controller/kvf-controller
agent_bin=$build/agent/kvf-agent
kvfctl_bin=$build/tools/kvfctl
engine_bin=$build/tools/kvf-demo-engine
work=$(mktemp -d /tmp/kvf-demo.XXXXXX)
pids=()
names=()
reaped=()     # exit status of a process already waited for, by index
finished=0    # 1 once every process exited cleanly: the logs may go
interrupted=0

say() { printf '\n== %s\n' "$*"; }

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# is_running PID: alive and not a zombie waiting to be reaped
is_running() {
    kill -0 "$1" 2>/dev/null &&
        [ "$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null)" != Z ]
}

# stop_all: SIGTERM to every process still running (one that already
# exited, e.g. the controller an operator killed, is only reaped), 10 s
# each to exit, then SIGKILL. Returns 1 when any exited uncleanly.
stop_all() {
    local i pid rc=0 st alive
    if [ $interrupted -eq 1 ]; then
        # Ctrl-C signalled every process of the terminal's group: they are
        # shutting down already, and a second signal would make them quit
        # without a clean shutdown; give them 3 s before SIGTERM
        for _ in $(seq 30); do
            alive=0
            for pid in "${pids[@]}"; do
                is_running "$pid" && alive=1
            done
            [ $alive -eq 0 ] && break
            sleep 0.1
        done
    fi
    for pid in "${pids[@]}"; do
        is_running "$pid" && kill -TERM "$pid" 2>/dev/null || true
    done
    for i in "${!pids[@]}"; do
        pid=${pids[$i]}
        for _ in $(seq 100); do
            is_running "$pid" || break
            sleep 0.1
        done
        is_running "$pid" && kill -KILL "$pid" 2>/dev/null || true
        if [ -n "${reaped[$i]:-}" ]; then
            st=${reaped[$i]}
        else
            # a trapped signal interrupts wait (status > 128) while the
            # process is still there, if only as a zombie: wait again
            while :; do
                st=0
                wait "$pid" 2>/dev/null || st=$?
                if [ "$st" -le 128 ] || ! kill -0 "$pid" 2>/dev/null; then
                    break
                fi
            done
        fi
        if [ "$st" -eq 0 ]; then
            echo "${names[$i]} (pid $pid) exited cleanly"
        else
            echo "${names[$i]} (pid $pid) exited with status $st" >&2
            rc=1
        fi
    done
    pids=()
    return $rc
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [ $interrupted -eq 1 ] && [ $finished -eq 0 ] && [ ${#pids[@]} -gt 0 ]; then
        # Ctrl-C during a phase: the engine died with it, the cluster
        # shuts down as usual
        say "interrupted: shutting down"
        if stop_all; then
            rm -rf "$work"
            echo "demo: stopped cleanly"
            exit 0
        fi
    fi
    if [ ${#pids[@]} -gt 0 ]; then
        stop_all >/dev/null 2>&1 || true
    fi
    if [ $finished -eq 1 ]; then
        rm -rf "$work"
    else
        echo "demo: failed (status $rc); logs kept in $work:" >&2
        ls "$work"/*.log 2>/dev/null | sed 's/^/  /' >&2 || true
    fi
}
trap cleanup EXIT
# Ctrl-C and kill: a clean shutdown, not an error
trap 'interrupted=1' INT TERM

# wait_for DESCRIPTION SECONDS COMMAND...: polls until COMMAND succeeds
wait_for() {
    local what=$1 secs=$2
    shift 2
    for _ in $(seq $((secs * 10))); do
        if "$@" >/dev/null 2>&1; then
            return 0
        fi
        sleep 0.1
    done
    echo "demo: timed out after ${secs}s waiting for $what" >&2
    return 1
}

ctl_port=$(free_port)
ctl_http=$(free_port)

say "kvfabric local demo (work dir $work)"
if [ ! -x "$controller_bin" ]; then
    echo "demo: $controller_bin is missing; run make build" >&2
    exit 1
fi
"$controller_bin" --listen "127.0.0.1:$ctl_port" --http "127.0.0.1:$ctl_http" \
    --initial-keys 65536 \
    >"$work/controller.log" 2>&1 &
pids+=($!)
names+=(kvf-controller)
wait_for "kvf-controller on 127.0.0.1:$ctl_port" 10 \
    curl -sf "http://127.0.0.1:$ctl_http/healthz"
echo "kvf-controller  pid ${pids[-1]}  control 127.0.0.1:$ctl_port  http 127.0.0.1:$ctl_http"

# start_agent NAME ROLE POOL [FLAGS...]: one GPU worker's agent with its own
# pool, socket and ports; UCX moves chunks between agents over TCP on loopback
agent_http=()
start_agent() {
    local name=$1 role=$2 pool=$3 http
    shift 3
    http=$(free_port)
    agent_http+=("$http")
    "$agent_bin" --controller "127.0.0.1:$ctl_port" --name "$name" \
        --role "$role" --pool-size "$pool" --socket "$work/$name.sock" \
        --listen "127.0.0.1:0" --http "127.0.0.1:$http" --transports tcp "$@" \
        >"$work/$name.log" 2>&1 &
    pids+=($!)
    names+=("$name")
    wait_for "$name to register" 20 \
        bash -c "curl -sf http://127.0.0.1:$http/healthz | grep -q '\"registered\":true'"
    printf 'kvf-agent       pid %-6s %-14s %-8s http 127.0.0.1:%s\n' \
        "${pids[-1]}" "$name" "$role" "$http"
}
# two workers that both store and reuse, and a prefill/decode pair whose
# decoder owns a receive region for pushed KV. Each engine writes into a
# staging area of its own (engine_staging_size), which must hold the
# chunks it has allocated and not yet committed: a whole request of
# 32 MiB chunks here
if [ $cluster_only -eq 1 ]; then
    big=128M small=64M dpool=64M region=16M staging=64M # no workload
else
    big=3G small=1G dpool=256M region=1G staging=1G
fi
start_agent demo-agent-1 both $big --pd-buffer-size 0 \
    --engine-staging-size $staging
start_agent demo-agent-2 both $big --pd-buffer-size 0 \
    --engine-staging-size $staging
start_agent demo-prefill prefill $small --engine-staging-size $staging
start_agent demo-decode decode $dpool --pd-buffer-size $region \
    --engine-staging-size $staging

if [ $cluster_only -eq 0 ]; then
workload="6 conversations x 3 turns over one 2048-token system prompt, then 4 RAG
documents reused by every conversation; Llama-3-8B-shaped KV (32 layers,
8 KV heads, head_dim 128, bf16, 256-token chunks = 32 MiB each). Every byte
read back is checked against what the writer produced."

say "phase 1: an engine on worker 1 serves the workload (its own cache only)"
echo "$workload"
"$engine_bin" --socket "$work/demo-agent-1.sock" --name engine-worker-1 \
    --json --progress >"$work/phase1.json"

say "phase 2: an engine on worker 2 serves the same workload"
echo "Its agent finds the prefixes in the cluster and fetches them from"
echo "demo-agent-1 over UCX into its own pool before the engine reads them."
"$engine_bin" --socket "$work/demo-agent-2.sock" --name engine-worker-2 \
    --json --progress >"$work/phase2.json"

say "phase 3: prefill/decode disaggregation (PD push)"
echo "6 requests of 2048 prompt tokens: the prefill engine writes each request's"
echo "KV chunk by chunk and pushes every chunk to demo-decode as soon as it is"
echo "ready; the decoder verifies checksums before acknowledging, and the decode"
echo "engine (already waiting) checks every byte it receives."
"$engine_bin" --socket "$work/demo-decode.sock" --name engine-decode \
    --mode decode --json >"$work/phase3-decode.json" &
decode_pid=$!
"$engine_bin" --socket "$work/demo-prefill.sock" --name engine-prefill \
    --mode prefill --decoder demo-decode --json --progress \
    >"$work/phase3-prefill.json"
wait "$decode_pid"

say "results (every figure measured in this run)"
python3 "$(dirname "$0")/demo-report.py" \
    "phase 1: worker 1=$work/phase1.json" "phase 2: worker 2=$work/phase2.json" \
    "phase 3: PD pair=$work/phase3-prefill.json+$work/phase3-decode.json"

if [ -x "$kvfctl_bin" ]; then
    # the node table shows what agents last reported (one heartbeat a
    # second): let the decoder report its released receive region first
    wait_for "demo-decode to report its receive region empty" 10 \
        bash -c "\"$kvfctl_bin\" --controller 127.0.0.1:$ctl_port --json nodes |
                 python3 -c 'import json,sys; n=[x for x in json.load(sys.stdin)[\"nodes\"] if x[\"name\"]==\"demo-decode\"]; sys.exit(0 if n and n[0][\"pd_used\"]==0 else 1)'" || true
    say "kvfctl nodes"
    "$kvfctl_bin" --controller "127.0.0.1:$ctl_port" nodes
    say "kvfctl stats"
    "$kvfctl_bin" --controller "127.0.0.1:$ctl_port" stats
fi

say "demo-agent-2 metrics (GET /metrics, excerpt)"
curl -sf "http://127.0.0.1:${agent_http[1]}/metrics" | grep -v '^#' |
    grep -E 'pool_bytes|commits|retrieve|fetch|checksum' | grep -v _bucket || true

say "what this demo does not show"
cat <<'TXT'
GPU copies on a real GPU: the CUDA kernels are built, but no GPU is here, so
engines write KV into the shared pool from the CPU. RDMA: UCX moves the bytes
over TCP on loopback here; the same code uses verbs where a NIC is present.
TXT
fi

if [ $keep -eq 1 ] && [ $interrupted -eq 0 ]; then
    say "cluster left running (Ctrl-C here, or kill ${pids[0]}, stops it)"
    echo "  dashboard: http://127.0.0.1:$ctl_http/"
    echo "  curl http://127.0.0.1:${agent_http[0]}/metrics"
    echo "  curl http://127.0.0.1:$ctl_http/metrics"
    [ -x "$kvfctl_bin" ] && echo "  $kvfctl_bin --controller 127.0.0.1:$ctl_port nodes"
    echo "  logs: $work/*.log"
    # returns when the controller exits or a signal arrives (trapped)
    st=0
    wait "${pids[0]}" 2>/dev/null || st=$?
    if ! is_running "${pids[0]}" && [ $interrupted -eq 0 ]; then
        reaped[0]=$st # the operator stopped the controller: reaped here
    fi
fi

say "shutting down"
if stop_all; then
    finished=1
    echo "demo: stopped cleanly"
    exit 0
fi
exit 1
