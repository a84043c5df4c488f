# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""Other KV transfer engines, measured the way kvf-bench measures ours.

Run by ``kvf-bench p2p --peers`` and ``kvf-bench pd --peers`` with the
interpreter of the environment ``tools/bench/setup-peers.sh`` makes
(build/peers-venv, never committed). For each peer a target process on
127.0.0.1 holds a registered DRAM buffer; this process (the initiator)
moves ``--count`` chunks of ``--size`` bytes, ``--batch`` chunks per call,
one call at a time, and reports GB/s (1e9 B/s: bytes over the summed call
times) and the p50/p99 of a call, as kvf-bench does for a retrieve or a
push. ``--op read`` (p2p): the initiator pulls chunks the target wrote;
``--op write`` (pd): it pushes chunks into the target. The last call's
bytes are compared with what was written, after the timing.

* Mooncake Transfer Engine (``mooncake-transfer-engine-non-cuda``): TCP
  transport, P2P handshake (no metadata server), batch_transfer_sync_read
  / _write.
* NIXL (``nixl-cu12``): UCX backend with our agents' UCX settings on
  loopback (UCX_TLS=tcp, 256K TCP segments), one READ or WRITE transfer of
  a descriptor list per call.

Prints one JSON object on stdout, e.g. ``{"mooncake_te_GBps": 2.1,
"mooncake_te_p50_us": 900, "mooncake_te_p99_us": 1500,
"mooncake_te_verified": true, "nixl_GBps": ...}``; a peer that cannot run
here gets ``"<peer>_GBps": null`` and ``"<peer>_reason": "..."``.
"""

import argparse
import base64
import ctypes
import json
import os
import subprocess
import sys
import time

RING = 8  # chunk buffers per side at least (a pool reuses its slots)

# what kvf-bench gives its agents (tools/bench/bench_util.c); set before any
# UCX library loads, inherited by the target process
UCX_ENV = {"UCX_TLS": "tcp", "UCX_TCP_TX_SEG_SIZE": "256K",
           "UCX_TCP_RX_SEG_SIZE": "256K"}


def _word(index):
    return ((0x9E3779B97F4A7C15 * (index + 1)) & 0xFFFFFFFFFFFFFFFF).to_bytes(
        8, "little")


def _fill(addr, size, index):
    """Chunk @index's bytes: one 8-byte word repeated."""
    block = _word(index) * 512
    for off in range(0, size, len(block)):
        ctypes.memmove(addr + off, block, min(len(block), size - off))


def _check(addr, size, index):
    n = size - size % 8
    return ctypes.string_at(addr, n) == _word(index) * (n // 8)


def _ring(args):
    return max(RING, args.batch)


def _slots(args, first, n):
    return [(first + k) % _ring(args) for k in range(n)]


def _batches(args):
    i = 0
    while i < args.count:
        n = min(args.batch, args.count - i)
        yield i, n
        i += n


def _last_batch(args):
    return list(_batches(args))[-1]


def _percentile(samples, pct):
    s = sorted(samples)
    return s[min(len(s) - 1, int(len(s) * pct / 100.0))] if s else 0


# --- the peers: target side and one call of the initiator ----------------


class Mooncake:
    name = "mooncake_te"

    def __init__(self, args):
        from mooncake.engine import TransferEngine

        self.te = TransferEngine()
        if self.te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
            raise RuntimeError("TransferEngine.initialize failed")
        self.base = self.te.allocate_managed_buffer(_ring(args) * args.size)
        if self.base == 0:
            raise RuntimeError("allocate_managed_buffer failed")

    def info(self):
        return {"port": self.te.get_rpc_port(), "base": self.base}

    def connect(self, info):
        self.target = "127.0.0.1:%d" % info["port"]

    def call(self, op, local, remote, size):
        fn = (self.te.batch_transfer_sync_read if op == "read"
              else self.te.batch_transfer_sync_write)
        rc = fn(self.target, local, remote, [size] * len(local))
        if rc != 0:
            raise RuntimeError("batch transfer returned %d" % rc)


class Nixl:
    name = "nixl"

    def __init__(self, args):
        from nixl_cu12._api import nixl_agent, nixl_agent_config

        self.agent = nixl_agent("kvf-%d" % os.getpid(),
                                nixl_agent_config(backends=["UCX"]))
        nbytes = _ring(args) * args.size
        self.buf = ctypes.create_string_buffer(nbytes)
        self.base = ctypes.addressof(self.buf)
        self.agent.register_memory(
            self.agent.get_reg_descs([(self.base, nbytes, 0, "")], "DRAM"))

    def info(self):
        return {"meta": base64.b64encode(
            self.agent.get_agent_metadata()).decode(), "base": self.base}

    def connect(self, info):
        self.remote = self.agent.add_remote_agent(
            base64.b64decode(info["meta"]))

    def call(self, op, local, remote, size):
        a = self.agent
        loc = a.get_xfer_descs([(p, size, 0) for p in local], "DRAM")
        rem = a.get_xfer_descs([(p, size, 0) for p in remote], "DRAM")
        handle = a.initialize_xfer("READ" if op == "read" else "WRITE", loc,
                                   rem, self.remote, b"kvf")
        state = a.transfer(handle)
        while state not in ("DONE", "ERR"):
            state = a.check_xfer_state(handle)
        a.release_xfer_handle(handle)
        if state == "ERR":
            raise RuntimeError("NIXL transfer failed")


PEERS = {"mooncake_te": Mooncake, "nixl": Nixl}


def run_target(args):
    """Holds the buffer: for reads, writes every chunk first (chunk j in
    slot j % ring, so the last ones stay); for writes, checks the last
    call's chunks when told "done"."""
    peer = PEERS[args.peer](args)
    if args.op == "read":
        for j in range(args.count):
            _fill(peer.base + (j % _ring(args)) * args.size, args.size, j)
    print(json.dumps(peer.info()), flush=True)
    sys.stdin.readline()
    first, n = _last_batch(args)
    ok = all(_check(peer.base + s * args.size, args.size, first + k)
             for k, s in enumerate(_slots(args, first, n)))
    print(json.dumps({"verified": ok}), flush=True)


def _read_json(f):
    """The next line of @f that is a JSON object (libraries log to stdout
    too); {} at the end of the stream."""
    for line in f:
        if line.startswith("{"):
            return json.loads(line)
    return {}


def run_peer(args, name):
    target = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--role", "target",
         "--peer", name, "--size", str(args.size), "--count",
         str(args.count), "--batch", str(args.batch), "--op", args.op],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True)
    try:
        info = _read_json(target.stdout)
        if not info:
            raise RuntimeError("the target process did not start")
        peer = PEERS[name](args)
        peer.connect(info)
        lat, nbytes = [], 0
        for first, n in _batches(args):
            slots = _slots(args, first, n)
            local = [peer.base + s * args.size for s in slots]
            remote = [info["base"] + s * args.size for s in slots]
            if args.op == "write":
                for k, p in enumerate(local):
                    _fill(p, args.size, first + k)
            t0 = time.perf_counter_ns()
            peer.call(args.op, local, remote, args.size)
            lat.append(time.perf_counter_ns() - t0)
            nbytes += n * args.size
        first, n = _last_batch(args)
        if args.op == "read":
            verified = all(_check(peer.base + s * args.size, args.size,
                                  first + k)
                           for k, s in enumerate(_slots(args, first, n)))
        target.stdin.write("done\n")
        target.stdin.flush()
        remote_ok = _read_json(target.stdout)
        if args.op == "write":
            verified = bool(remote_ok.get("verified"))
        total = sum(lat)
        return {name + "_GBps": round(nbytes / total, 2) if total else 0.0,
                name + "_p50_us": round(_percentile(lat, 50) / 1000.0),
                name + "_p99_us": round(_percentile(lat, 99) / 1000.0),
                name + "_verified": verified}
    finally:
        if target.poll() is None:
            target.kill()
        target.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--op", choices=["read", "write"], default="read")
    ap.add_argument("--only", choices=list(PEERS), default=None)
    ap.add_argument("--role", choices=["initiator", "target"],
                    default="initiator")
    ap.add_argument("--peer", choices=list(PEERS), default="mooncake_te")
    args = ap.parse_args()
    for k, v in UCX_ENV.items():
        os.environ.setdefault(k, v)
    if args.role == "target":
        run_target(args)
        return
    out = {}
    for name in PEERS:
        if args.only not in (None, name):
            continue
        try:
            out.update(run_peer(args, name))
        except Exception as e:  # a peer that cannot run here: say why
            out[name + "_GBps"] = None
            out[name + "_reason"] = "%s: %s" % (type(e).__name__, e)
    print(json.dumps(out, separators=(",", ":")), flush=True)


if __name__ == "__main__":
    main()
