# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""kvfabric.vllm_connector through a faithful fake of vLLM's connector
interface (fake_vllm): imports without vLLM; a vLLM-style engine on agent a
stores a prompt's chunks as it prefills; a second engine on agent b gets
them as external matched tokens, loads them over the fabric and generates
exactly what the first one did. Then a P/D pair on a prefill agent and a
decode agent: P pushes the prompt's chunks as it computes them, D waits
for the request named in the kv_transfer_params P returned, loads it and
generates exactly what one engine alone does."""
import importlib
import sys

import pytest

import fake_vllm
from conftest import torch_or_skip


@pytest.fixture
def connector_module():
    """kvfabric.vllm_connector imported against the fake vLLM modules."""
    fake_vllm.install()
    sys.modules.pop("kvfabric.vllm_connector", None)
    mod = importlib.import_module("kvfabric.vllm_connector")
    try:
        yield mod
    finally:
        fake_vllm.uninstall()
        sys.modules.pop("kvfabric.vllm_connector", None)


def test_imports_without_vllm():
    fake_vllm.uninstall()
    sys.modules.pop("kvfabric.vllm_connector", None)
    mod = importlib.import_module("kvfabric.vllm_connector")
    assert mod.HAVE_VLLM is False
    for name in ("get_num_new_matched_tokens", "update_state_after_alloc",
                 "build_connector_meta", "request_finished",
                 "register_kv_caches", "start_load_kv", "wait_for_layer_load",
                 "save_kv_layer", "wait_for_save", "get_finished"):
        assert callable(getattr(mod.KVFabricConnector, name))
    sys.modules.pop("kvfabric.vllm_connector", None)


def test_implements_vllms_interface(connector_module):
    mod = connector_module
    assert mod.HAVE_VLLM is True
    assert issubclass(mod.KVFabricConnector, fake_vllm.KVConnectorBase_V1)
    assert issubclass(mod.KVFabricConnectorMetadata,
                      fake_vllm.KVConnectorMetadata)
    # every abstract method is implemented
    assert not getattr(mod.KVFabricConnector, "__abstractmethods__", set())


def _prompt(n, seed):
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 512, (n,), generator=g).tolist()


def test_store_on_one_engine_load_on_another(connector_module, cluster):
    torch = torch_or_skip()
    from kvfabric.testing.tiny_gpt import TinyGPT, deterministic

    deterministic()
    model = TinyGPT()
    C = model.cfg.chunk
    mod = connector_module

    def engine(agent, role="kv_both"):
        return fake_vllm.FakeEngine(
            model, mod.KVFabricConnector,
            dict(socket=cluster.sockets[agent], chunk_size=C,
                 timeout_s=20), kv_role=role)

    prompt = _prompt(5 * C + 7, 1)
    e1 = engine("a")
    t1, l1 = e1.generate("req-1", prompt, 6)
    assert e1.external_tokens == 0
    assert e1.worker.stats["saved_chunks"] == 5
    assert e1.computed_prompt_tokens == len(prompt)

    # agent b learns of a's chunks through the controller (async ADMIT)
    e2 = engine("b", role="kv_consumer")
    keys = e2.sched._state(fake_vllm.Request("probe", prompt, 1)).keys
    e2.sched._reqs.clear()
    import time
    deadline = time.monotonic() + 20
    while e2.sched.client.lookup(keys).hit_chunks < 5:
        assert time.monotonic() < deadline, "agent b never saw the chunks"
        time.sleep(0.005)

    t2, l2 = e2.generate("req-2", prompt, 6)
    assert e2.external_tokens == 5 * C
    assert e2.computed_prompt_tokens == 7
    assert e2.worker.stats["loaded_chunks"] == 5
    assert e2.worker.stats["saved_chunks"] == 0  # a consumer stores nothing
    assert not e2.load_errors
    assert t1 == t2
    assert torch.equal(l1, l2)

    # a prompt of whole chunks: the last chunk is computed, not loaded
    whole = prompt[:3 * C]
    e3 = engine("b")
    t3, l3 = e3.generate("req-3", whole, 3)
    assert e3.external_tokens == 2 * C
    assert e3.computed_prompt_tokens == C
    ref = fake_vllm.FakeEngine(model, mod.KVFabricConnector,
                               dict(socket=cluster.sockets["a"],
                                    chunk_size=C), kv_role="kv_producer")
    t_ref, l_ref = ref.generate("req-ref", whole, 3)
    assert ref.external_tokens == 0  # a producer never loads
    assert t3 == t_ref and torch.equal(l3, l_ref)
    for e in (e1, e2, e3, ref):
        e.shutdown()


def test_chunk_size_must_be_a_multiple_of_the_block_size(connector_module,
                                                         cluster):
    torch_or_skip()
    from kvfabric.testing.tiny_gpt import TinyGPT

    with pytest.raises(ValueError, match="multiple"):
        fake_vllm.FakeEngine(TinyGPT(), connector_module.KVFabricConnector,
                             dict(socket=cluster.sockets["a"],
                                  chunk_size=24))


def test_pd_pair_pushes_and_decodes_exactly(connector_module, pd_cluster):
    """vLLM's P/D flow over PD push: the proxy sends the request to P
    (max_tokens 1, do_remote_decode), P pushes each full chunk as its step
    computes it and holds the blocks until get_finished reports the send;
    D gets P's kv_transfer_params, waits for the pushed request in
    start_load_kv, loads, releases and decodes; tokens and logits equal a
    single engine's that computed everything."""
    torch = torch_or_skip()
    from kvfabric.testing.tiny_gpt import TinyGPT, deterministic

    deterministic()
    model = TinyGPT()
    C = model.cfg.chunk
    mod = connector_module
    dec = pd_cluster.node_name("d")

    def engine(agent, role, **extra):
        return fake_vllm.FakeEngine(
            model, mod.KVFabricConnector,
            dict(socket=pd_cluster.sockets[agent], chunk_size=C,
                 timeout_s=20, **extra), kv_role=role)

    prompt = _prompt(5 * C + 7, 3)
    p = engine("p", "kv_producer", decoder=dec)
    tp, lp = p.generate("req-p", prompt, 1,
                        kv_transfer_params={"do_remote_decode": True})
    params = p.kv_transfer_params
    assert params["do_remote_prefill"] is True
    assert params["kvf_decoder"] == dec and params["kvf_chunks"] == 5
    assert params["kvf_request_id"] > 0
    # streamed: one push per prefill step (budget = one chunk), final last
    assert p.worker.stats["pd_pushes"] == 5
    assert p.worker.stats["pd_pushed_chunks"] == 5
    assert p.worker.stats["pd_push_errors"] == 0
    # blocks held until the worker reported the send, then freed
    assert p.finished_sending == {"req-p"} and not p.delayed
    assert p.idle_steps == 1 and len(p.free) == 64

    d = engine("d", "kv_consumer")
    td, ld = d.generate("req-d", prompt, 6, kv_transfer_params=params)
    assert d.external_tokens == 5 * C
    assert d.computed_prompt_tokens == 7
    assert d.worker.stats["loaded_chunks"] == 5
    assert d.worker.stats["pd_received_chunks"] == 5
    assert d.sched.stats["lookups"] == 0  # pushed, not looked up
    assert not d.load_errors
    assert d.kv_transfer_params is None and not d.delayed

    ref = engine("p", "kv_producer")  # no params: no push, no load
    tr, lr = ref.generate("req-ref", prompt, 6)
    assert ref.worker.stats["pd_pushes"] == 0
    assert td == tr and torch.equal(ld, lr)
    assert tp == tr[:1] and torch.equal(lp, lr[:1])

    # D released the request: the decoder holds nothing of it any more
    with pd_cluster.client("d") as c:
        with pytest.raises(kvf_error()) as e:
            c.pd_release(params["kvf_request_id"])
        assert e.value.name == "KVF_ERR_NOT_FOUND"
    for e in (p, d, ref):
        e.shutdown()


def test_pd_consumer_recomputes_what_never_arrives(connector_module,
                                                   pd_cluster):
    """D told of a PD request that is never pushed: the wait times out,
    the blocks of the tokens it would have loaded are reported as load
    errors (vLLM recomputes them), nothing is left claimed."""
    torch_or_skip()
    from kvfabric.testing.tiny_gpt import TinyGPT, deterministic

    deterministic()
    model = TinyGPT()
    C = model.cfg.chunk
    d = fake_vllm.FakeEngine(
        model, connector_module.KVFabricConnector,
        dict(socket=pd_cluster.sockets["d"], chunk_size=C, timeout_s=20,
             pd_wait_timeout_s=0.5), kv_role="kv_consumer")
    params = dict(do_remote_prefill=True, kvf_request_id=424242,
                  kvf_decoder=pd_cluster.node_name("d"), kvf_chunks=2,
                  kvf_chunk_size=C)
    d.generate("req-lost", _prompt(2 * C + 3, 4), 1,
               kv_transfer_params=params)
    assert d.worker.stats["pd_wait_errors"] == 1
    assert len(d.load_errors) == 2 * C // d.block_size
    d.shutdown()


def kvf_error():
    import kvfabric

    return kvfabric.KvfError
