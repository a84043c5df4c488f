# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""The controller's KV event stream (docs/integration-routers.md, "KV
events") as a router consuming vLLM's events sees it: a ZeroMQ SUB socket
and msgpack, sequence numbers in order, a gap (batches published before
the subscriber connected) detected and filled from the ROUTER replay
socket, BlockStored with the engine's chunk digests, and AllBlocksCleared once
the agent is gone."""
import socket
import struct
import time

import numpy as np
import pytest

zmq = pytest.importorskip("zmq", reason="python3-zmq (make test installs "
                          "it with apt)")
msgpack = pytest.importorskip("msgpack", reason="python3-msgpack (make test "
                              "installs it with apt)")

import kvfabric as kvf  # noqa: E402
from kvfabric.testing.cluster import Cluster  # noqa: E402

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def digest(key):
    """The 16-byte form of a key's digest in BlockStored.block_hashes."""
    return struct.pack(">QQ", key.hi, key.lo)


def store(client, keys, chunk=4096):
    slots = client.alloc(chunk, len(keys))
    sums = []
    for i, s in enumerate(slots):
        v = client.slot_view(s, np.uint8)[:chunk]
        v[:] = i
        sums.append(kvf.chunk_checksum(v))
        del v
    assert client.commit(keys, [kvf.Slot(s.offset, chunk) for s in slots],
                         sums) == 0


def recv_batch(sub, timeout=20):
    """(topic, seq, batch) of the next published batch."""
    assert sub.poll(timeout * 1000), "no KV event batch published"
    topic, seq, payload = sub.recv_multipart()
    return topic, int.from_bytes(seq, "big"), msgpack.unpackb(payload)


def replay(ctx, endpoint, start):
    """What the ROUTER socket sends for a request from @p start."""
    req = ctx.socket(zmq.DEALER)
    req.connect(endpoint)
    req.send_multipart([b"", start.to_bytes(8, "big")])
    got = []
    while True:
        assert req.poll(20000), "replay did not answer"
        frames = req.recv_multipart()
        assert frames[0] == b""
        seq, payload = frames[1], frames[2]
        if seq == END_SEQ:
            break
        got.append((int.from_bytes(seq, "big"), msgpack.unpackb(payload)))
    req.close(linger=0)
    return got


def test_order_gaps_and_replay():
    pub_ep = f"tcp://127.0.0.1:{free_port()}"
    rep_ep = f"tcp://127.0.0.1:{free_port()}"
    ns = kvf.namespace_fingerprint("events-test", "bf16", 2, 2, 64,
                                   chunk_size=16)
    first = kvf.key_chain(ns, list(range(64)), 16)          # 4 chunks
    second = kvf.key_chain(ns, list(range(100, 132)), 16)   # 2 chunks
    ctx = zmq.Context()
    cl = Cluster(agents=("a",), extra_controller_args=[
        "--events", pub_ep, "--events-replay", rep_ep])
    cl.start()
    try:
        with cl.client("a") as a:
            store(a, first)  # before anyone listens: a gap to replay
            # the agent announces it to the controller asynchronously: wait
            # (deadline) until batch 0 is published, seen through replay
            deadline = time.monotonic() + 30
            while not replay(ctx, rep_ep, 0):
                assert time.monotonic() < deadline, cl.logs()
                time.sleep(0.05)
            sub = ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(pub_ep)
            # a subscription reaches the publisher asynchronously: store
            # until a batch arrives (each its own keys), within a deadline
            deadline = time.monotonic() + 30
            extra = 0
            while not sub.poll(200):
                assert time.monotonic() < deadline, cl.logs()
                store(a, kvf.key_chain(ns, [1000 + extra] * 16, 16))
                extra += 1
            store(a, second)
            batches = []
            while True:
                topic, seq, batch = recv_batch(sub)
                batches.append((seq, batch))
                ev = batch["events"][0]
                if ev["type"] == "BlockStored" and \
                        ev["block_hashes"] == [digest(k) for k in second]:
                    break
            # in order, no gap once subscribed
            seqs = [s for s, _ in batches]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
            assert topic == cl.node_name("a").encode()
            # the gap: batch 0 (the first store) was missed; replay it
            assert seqs[0] > 0
            got = replay(ctx, rep_ep, 0)
            assert [s for s, _ in got] == list(range(0, seqs[-1] + 1))
            first_ev = got[0][1]["events"][0]
            assert first_ev["type"] == "BlockStored"
            assert first_ev["block_hashes"] == [digest(k) for k in first]
            assert first_ev["medium"] == "CPU"
            assert first_ev["parent_block_hash"] is None
            assert first_ev["token_ids"] == []
            # replayed payloads are the published ones
            assert {s: b for s, b in got}[seqs[-1]] == batches[-1][1]
            node_id = got[0][1]["data_parallel_rank"]
            assert isinstance(got[0][1]["ts"], float)
            # a replay from the middle starts there
            assert [s for s, _ in replay(ctx, rep_ep, seqs[-1])] == \
                [seqs[-1]]
        # the agent leaves: its blocks are all gone
        cl.agents["a"].stop()
        last = seqs[-1]
        while True:
            topic, seq, batch = recv_batch(sub, timeout=30)
            assert seq == last + 1, "a gap after the subscription"
            last = seq
            if batch["events"][0]["type"] == "AllBlocksCleared":
                break
        assert batch["data_parallel_rank"] == node_id
        sub.close(linger=0)
    finally:
        codes = cl.stop()
        logs = cl.logs()
        cl.cleanup()
        ctx.destroy(linger=0)
    bad = {k: v for k, v in codes.items() if v != 0}
    assert not bad, f"processes exited badly: {bad}\n{logs}"
