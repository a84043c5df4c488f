# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""KVFabricConnector built by vLLM's own factory from vLLM's own config
objects (EngineArgs -> VllmConfig), fed vLLM's own Request objects, on real
kvf-agents: the hooks whose effect no engine output shows (which rank's
namespace, how many lookups, released PD slots, errors swallowed, stats).
Runs in build/venv (tests/python/run_in_venv.py)."""
import os
import random

import pytest

from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import (
    KVConnectorFactory)
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorRole)
from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import SamplingParams
from vllm.v1.request import Request

import kvfabric as kvf
from kvfabric import vllm_connector as vc
from kvfabric.testing.vllm_engine import kv_config, tiny_llama_dir

C = 128


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_llama_dir(str(tmp_path_factory.mktemp("model")))


@pytest.fixture(scope="module")
def agents():
    from conftest import _run_cluster

    yield from _run_cluster(agents=("a", "p", "d"),
                            roles={"p": "prefill", "d": "decode"},
                            pd_buffer_size="16M")


def vllm_config(model, socket, role="kv_both", tp=1, cache_dtype="auto",
                **extra):
    cfg = kv_config(socket, role, C, **extra)
    args = EngineArgs(model=model, load_format="dummy",
                      skip_tokenizer_init=True, enforce_eager=True,
                      block_size=C, max_model_len=4096,
                      kv_cache_dtype=cache_dtype,
                      kv_transfer_config=KVTransferConfig(**cfg))
    vcfg = args.create_engine_config()
    vcfg.parallel_config.tensor_parallel_size = tp
    return vcfg


def connector(vcfg, role=KVConnectorRole.SCHEDULER):
    from vllm.v1.kv_cache_interface import KVCacheConfig

    c = KVConnectorFactory.create_connector(
        vcfg, role, KVCacheConfig(num_blocks=64, kv_cache_tensors=[],
                                  kv_cache_groups=[]))
    assert isinstance(c, vc.KVFabricConnector)
    return c


def request(rid, tokens, params=None):
    sp = SamplingParams(max_tokens=4)
    if params is not None:
        sp.extra_args = {"kv_transfer_params": params}
    return Request(rid, tokens, sp, None)


def _prompt(n, seed):
    r = random.Random(seed)
    return [r.randrange(3, 2000) for _ in range(n)]


def _store(client, keys, chunk_bytes=4096):
    slots = client.alloc(chunk_bytes, len(keys))
    sums = []
    for s in slots:
        v = client.slot_view(s)
        v[:] = 7
        sums.append(kvf.chunk_checksum(v))
        del v
    client.commit(keys, slots, sums)


def test_hooks_vllm_calls_are_declared(model, agents):
    vcfg = vllm_config(model, agents.sockets["a"])
    cls = KVConnectorFactory.get_connector_class(vcfg.kv_transfer_config)
    assert cls is vc.KVFabricConnector
    assert cls.requires_piecewise_for_cudagraph({}) is True
    assert cls.get_required_kvcache_layout(vcfg) is None
    vcfg2 = vllm_config(model, agents.sockets["a"], kv_cache_layout="HND")
    assert cls.get_required_kvcache_layout(vcfg2) == "HND"
    # vLLM's default "fail" becomes "recompute" (a miss is recomputable)
    connector(vcfg)
    assert vcfg.kv_transfer_config.kv_load_failure_policy == "recompute"
    st = cls.build_kv_connector_stats({"loaded_chunks": 2})
    st.aggregate(cls.build_kv_connector_stats({"loaded_chunks": 3}))
    assert st.reduce()["loaded_chunks"] == 5


def test_prom_metrics_register_with_vllm(model, agents):
    from prometheus_client import Counter, Gauge, Histogram

    vcfg = vllm_config(model, agents.sockets["a"])
    m = vc.KVFabricConnector.build_prom_metrics(
        vcfg, {Gauge: Gauge, Counter: Counter, Histogram: Histogram},
        ["model_name", "engine"], {0: ["tiny", "0"]})
    m.observe({"loaded_chunks": 4}, 0)
    from prometheus_client import REGISTRY

    assert REGISTRY.get_sample_value(
        "vllm:kvfabric_loaded_chunks_total",
        {"model_name": "tiny", "engine": "0"}) == 4


def test_fp8_kv_cache_dtypes(model, agents):
    """--kv-cache-dtype fp8_e4m3 / fp8_e5m2 are accepted, and they never
    share a namespace (same kvf_dtype_t, different bytes)."""
    ns = {}
    for d in ("auto", "fp8", "fp8_e4m3", "fp8_e5m2"):
        c = connector(vllm_config(model, agents.sockets["a"],
                                  cache_dtype=d))
        ns[d] = c._ns[0]
    assert ns["fp8"] == ns["fp8_e4m3"]
    assert len({ns["auto"], ns["fp8_e4m3"], ns["fp8_e5m2"]}) == 3


def test_lookup_is_idempotent(model, agents):
    """vLLM may ask get_num_new_matched_tokens several times for one
    request: one lookup (one prefetch lease), the same answer."""
    c = connector(vllm_config(model, agents.sockets["a"]))
    tokens = _prompt(4 * C + 5, 1)
    with agents.client("a") as cl:
        _store(cl, kvf.key_chain(c._ns[0], tokens, C))
    req = request("r1", tokens)
    first = c.get_num_new_matched_tokens(req, 0)
    assert first == (4 * C, False)
    for _ in range(3):
        assert c.get_num_new_matched_tokens(req, 0) == first
    assert c.stats["lookups"] == 1
    c.shutdown()


def test_tp_group_lookup_is_min_over_ranks(model, agents):
    """TP=2 (vLLM's config objects): every rank has its own namespace; the
    scheduler's hit is what every rank holds; a worker uses its own rank's
    namespace and socket."""
    sock = agents.sockets["a"].replace("agent-a", "agent-{rank}")
    vcfg = vllm_config(model, sock, tp=2)
    sched = connector(vcfg)
    sched._socket = agents.sockets["a"]  # both ranks' chains on agent a
    assert sched._ns[0] != sched._ns[1]
    tokens = _prompt(3 * C + 1, 2)
    k0 = kvf.key_chain(sched._ns[0], tokens, C)
    k1 = kvf.key_chain(sched._ns[1], tokens, C)
    with agents.client("a") as cl:
        _store(cl, k0)              # rank 0 holds 3 chunks
        _store(cl, k1[:1])          # rank 1 only the first
    assert sched.get_num_new_matched_tokens(request("t1", tokens), 0) == \
        (C, False)
    with agents.client("a") as cl:
        _store(cl, k1[1:])
    assert sched.get_num_new_matched_tokens(request("t2", tokens), 0) == \
        (3 * C, False)
    # the worker of rank 1 (tp_rank as vLLM's parallel state gives it)
    w = connector(vllm_config(model, sock, tp=2, tp_rank=1),
                  KVConnectorRole.WORKER)
    assert w._rank == 1 and w._socket.endswith("agent-1.sock")
    sched.shutdown()


def test_agent_away_degrades(model, tmp_path):
    """No agent: no external hit, counted, nothing raised; nothing is
    retried before retry_s."""
    c = connector(vllm_config(model, str(tmp_path / "none.sock"),
                              retry_s=60))
    req = request("x", _prompt(3 * C, 3))
    assert c.get_num_new_matched_tokens(req, 0) == (0, False)
    assert c.get_num_new_matched_tokens(request("y", _prompt(3 * C, 4)),
                                        0) == (0, False)
    assert c.stats["agent_errors"] == 1  # the second call did not retry


def _pd_push_filled(p, rid, decoder, value, n=2):
    """Pushes PD request @p rid (@p n chunks of 4 KiB, every byte
    @p value) from prefill client @p p to @p decoder, whole."""
    slots = p.alloc(4096, n)
    sums = []
    for s in slots:
        v = p.slot_view(s)
        v[:] = value
        sums.append(kvf.chunk_checksum(v))
        del v
    p.pd_push(rid, decoder, slots, sums, True)
    p.release(slots)


@pytest.mark.skipif(not kvf.HAS_PD, reason="libkvfabric without PD calls")
def test_aborted_decode_request_releases_its_slot(model, agents):
    """D is handed a pushed request, which is aborted before it was
    scheduled: request_finished releases it at the agent (before, only
    the agent's claim timeout did)."""
    d = connector(vllm_config(model, agents.sockets["d"], "kv_consumer"))
    rid = 0x5eed
    with agents.client("p") as p:
        _pd_push_filled(p, rid, agents.node_name("d"), 3)
    tokens = _prompt(2 * C + 1, 5)
    req = request("pd-1", tokens, dict(
        do_remote_prefill=True, kvf_request_id=rid, kvf_chunks=2,
        kvf_chunk_size=C, kvf_decoder=agents.node_name("d")))
    n, is_async = d.get_num_new_matched_tokens(req, 0)
    assert (n, is_async) == (2 * C, True)
    assert d.request_finished(req, []) == (False, None)
    assert d.stats["pd_released"] == 1
    with agents.client("d") as cl:
        with pytest.raises(kvf.KvfError) as e:
            cl.pd_wait(rid, timeout=0.2)
        assert e.value.name in ("KVF_ERR_NOT_FOUND", "KVF_ERR_TIMEOUT")
    d.shutdown()


@pytest.fixture
def tp_pd_agents():
    """A prefill agent and the decode agents of TP ranks 0 and 1."""
    from conftest import _run_cluster

    yield from _run_cluster(agents=("p", "d0", "d1"),
                            roles={"p": "prefill", "d0": "decode",
                                   "d1": "decode"},
                            pd_buffer_size="16M")


@pytest.mark.skipif(not kvf.HAS_PD, reason="libkvfabric without PD calls")
def test_aborted_decode_request_releases_every_ranks_shard(model,
                                                            tp_pd_agents):
    """TP=2 (vLLM's config objects): each prefill rank pushed its shard to
    its decode rank's agent; the request is aborted before it was
    scheduled, and the scheduler (connected to rank 0's agent) releases
    the shard at rank 1's agent too. Before, rank 1's waited for that
    agent's claim timeout, holding its receive region."""
    ag = tp_pd_agents
    sock = ag.sockets["d0"].replace("agent-d0", "agent-d{rank}")
    d = connector(vllm_config(model, sock, "kv_consumer", tp=2))
    assert d._socket == ag.sockets["d0"]
    rid = 0x5eee
    with ag.client("p") as p:
        for dec in ("d0", "d1"):
            _pd_push_filled(p, rid, ag.node_name(dec), 5)
    tokens = _prompt(2 * C + 1, 6)
    req = request("pd-tp", tokens, dict(
        do_remote_prefill=True, kvf_request_id=rid, kvf_chunks=2,
        kvf_chunk_size=C, kvf_decoder=ag.node_name("d0")))
    assert d.get_num_new_matched_tokens(req, 0) == (2 * C, True)
    assert d.request_finished(req, []) == (False, None)
    assert d.stats["pd_released"] == 2
    for dec in ("d0", "d1"):
        with ag.client(dec) as cl:
            with pytest.raises(kvf.KvfError) as e:
                cl.pd_release(rid)
            assert e.value.name == "KVF_ERR_NOT_FOUND", dec
    d.shutdown()


@pytest.mark.skipif(not kvf.HAS_PD, reason="libkvfabric without PD calls")
def test_an_unreachable_ranks_agent_does_not_fail_the_release(
        model, agents, tmp_path, caplog):
    """TP=2 with one agent for both ranks (no "{rank}" in ``socket``): one
    release, there. Then rank 1's agent unreachable: rank 0's shard is
    released, rank 1's is left to its claim timeout, warned once, nothing
    raised into vLLM."""
    import logging

    caplog.set_level(logging.WARNING, logger="kvfabric.vllm")
    d = connector(vllm_config(model, agents.sockets["d"], "kv_consumer",
                              tp=2))
    for n, rid in enumerate((0x5ef0, 0x5ef1, 0x5ef2)):
        with agents.client("p") as p:
            _pd_push_filled(p, rid, agents.node_name("d"), 7)
        req = request(f"pd-u{n}", _prompt(2 * C + 1, 7 + n), dict(
            do_remote_prefill=True, kvf_request_id=rid, kvf_chunks=2,
            kvf_chunk_size=C, kvf_decoder=agents.node_name("d")))
        assert d.get_num_new_matched_tokens(req, 0) == (2 * C, True)
        assert d.request_finished(req, []) == (False, None)
        assert d.stats["pd_released"] == n + 1
        if n == 0:
            # from now on rank 1's agent is elsewhere, and not there
            d._socket_tpl = str(tmp_path / "agent-{rank}.sock")
    warned = [r for r in caplog.records
              if "rank 1's agent" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]
    assert d._rank_clients == {}
    d.shutdown()


def test_resumed_request_replaces_its_block_ids(model, agents):
    """vLLM's SchedulerOutput for a request resumed after a preemption
    (CachedRequestData.resumed_req_ids): its new block ids replace the old
    ones, so its reload lands in the blocks it now owns (before: appended
    to the freed ones). A request not resumed appends."""
    from vllm.v1.core.sched.output import SchedulerOutput

    c = connector(vllm_config(model, agents.sockets["a"]))
    tokens = _prompt(3 * C + 10, 11)
    with agents.client("a") as cl:
        _store(cl, kvf.key_chain(c._ns[0], tokens, C))
    req = request("pre-1", tokens)
    assert c.get_num_new_matched_tokens(req, 0) == (3 * C, False)
    c._reqs["pre-1"].block_ids = [1, 2, 3, 4]  # its first run
    # preempted: vLLM frees 1-4; resumed with blocks 9, 8, 7, 6
    so = SchedulerOutput.make_empty()
    so.preempted_req_ids = {"pre-1"}
    c.build_connector_meta(so)
    assert c.get_num_new_matched_tokens(req, 0) == (3 * C, False)

    class Blocks:
        def get_block_ids(self):
            return ([9, 8, 7, 6],)

    c.update_state_after_alloc(req, Blocks(), 3 * C)
    so = SchedulerOutput.make_empty()
    cr = so.scheduled_cached_reqs
    cr.req_ids, cr.resumed_req_ids = ["pre-1"], {"pre-1"}
    cr.new_block_ids, cr.num_computed_tokens = [([9, 8, 7, 6],)], [3 * C]
    cr.num_output_tokens, cr.new_token_ids = [5], [[]]
    so.num_scheduled_tokens = {"pre-1": 10}
    meta = c.build_connector_meta(so)
    (m,) = meta.requests
    assert m.block_ids == [9, 8, 7, 6]
    assert (m.load_start, m.load_end) == (0, 3 * C)
    assert c.stats["resumed_requests"] == 1
    # not resumed: appended
    so = SchedulerOutput.make_empty()
    cr = so.scheduled_cached_reqs
    cr.req_ids, cr.resumed_req_ids = ["pre-1"], set()
    cr.new_block_ids, cr.num_computed_tokens = [([5],)], [4 * C]
    cr.num_output_tokens, cr.new_token_ids = [6], [[]]
    so.num_scheduled_tokens = {"pre-1": 1}
    c.build_connector_meta(so)
    assert c._reqs["pre-1"].block_ids == [9, 8, 7, 6, 5]
    c.shutdown()


def test_kv_events_are_those_every_tp_rank_reported(model, agents):
    """A worker reports each committed or loaded chunk once; vLLM's
    KVOutputAggregator merges the TP workers' objects and the scheduler
    keeps (take_events) only the events every rank reported: a chunk one
    rank failed to commit is not announced."""
    from vllm.distributed.kv_events import BlockStored
    from vllm.distributed.kv_transfer.kv_connector.utils import (
        KVOutputAggregator)
    from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

    def ev(i):
        return BlockStored(block_hashes=[i], parent_block_hash=None,
                           token_ids=[i] * C, block_size=C, lora_id=None,
                           medium=vc.KV_EVENTS_MEDIUM, lora_name=None,
                           group_idx=0)

    def worker_output(events):
        e = vc.KVFabricKVEvents()
        e.add_events(events)
        return ModelRunnerOutput(req_ids=[], req_id_to_index={},
                                 kv_connector_output=KVConnectorOutput(
                                     kv_cache_events=e))

    c = connector(vllm_config(model, agents.sockets["a"], tp=2))
    agg = KVOutputAggregator(2)
    for step in ([[ev(1), ev(2)], [ev(2), ev(1)]],   # both ranks
                 [[ev(3)], []],                       # rank 1 failed
                 [[ev(4)], [ev(4)]]):
        out = agg.aggregate([worker_output(e) for e in step])
        c.update_connector_output(out.kv_connector_output)
    assert list(c.take_events()) == [ev(1), ev(2), ev(4)]
    assert list(c.take_events()) == []
    c.shutdown()


def test_worker_kv_events_loaded_and_missing_chunks(model, agents):
    """With vLLM's kv_events_config on, a worker reports BlockStored for a
    chunk it loaded and BlockRemoved (same hashes) for one the agent no
    longer holds; without events in the metadata it reports nothing."""
    import torch
    from vllm.config import KVEventsConfig
    from vllm.distributed.kv_events import BlockRemoved, BlockStored

    vcfg = vllm_config(model, agents.sockets["a"])
    vcfg.kv_events_config = KVEventsConfig(enable_kv_cache_events=True,
                                           publisher="null")
    w = connector(vcfg, KVConnectorRole.WORKER)
    # vLLM's CPU backend layout: [blocks][heads][block_size][2 * head_dim]
    w.register_kv_caches({f"model.layers.{i}.self_attn.attn":
                          torch.zeros(4, 2, C, 128, dtype=torch.bfloat16)
                          for i in range(2)})
    tokens = _prompt(2 * C, 12)
    keys = kvf.key_chain(w._ns[0], tokens, C)
    with agents.client("a") as cl:
        _store(cl, keys[:1], w._chunk_bytes)
    evs = [BlockStored(block_hashes=[100 + c], parent_block_hash=None,
                       token_ids=tokens[c * C:(c + 1) * C], block_size=C,
                       lora_id=None, medium=vc.KV_EVENTS_MEDIUM,
                       lora_name=None, group_idx=0) for c in range(2)]
    m = vc.ReqMeta("ev-1", [0, 1], load_start=0, load_end=2 * C,
                   load_keys=[keys], load_events=evs)
    w.bind_connector_metadata(vc.KVFabricConnectorMetadata([m]))
    w.start_load_kv(None)
    w.wait_for_save()
    out = w.get_kv_connector_kv_cache_events()
    w.clear_connector_metadata()
    assert out.get_all_events() == [
        evs[0], BlockRemoved(block_hashes=[101], medium=vc.KV_EVENTS_MEDIUM,
                             group_idx=0)]
    assert w.get_block_ids_with_load_errors() == {1}
    m = vc.ReqMeta("ev-2", [2, 3], load_start=0, load_end=C,
                   load_keys=[keys[:1]])
    w.bind_connector_metadata(vc.KVFabricConnectorMetadata([m]))
    w.start_load_kv(None)
    assert w.get_kv_connector_kv_cache_events() is None
    w.clear_connector_metadata()
    w.shutdown()


def _one_agent(name, *args):
    from conftest import _run_cluster

    yield from _run_cluster(agents=(name,), extra_agent_args=list(args))


@pytest.fixture
def tight_agent():
    """One agent whose engines may stage 4 MiB (engine_staging_size)."""
    yield from _one_agent("s", "--engine-staging-size", "4M")


@pytest.fixture
def small_chunk_agent():
    """One agent whose chunks are at most 64 KiB (max_chunk)."""
    yield from _one_agent("m", "--max-chunk", "64K")


def _saving_worker(model, socket, blocks):
    """A worker on @p socket whose two layers (vLLM's CPU layout) hold
    @p blocks blocks of ones; returns it and its layers."""
    import torch

    w = connector(vllm_config(model, socket), KVConnectorRole.WORKER)
    layers = {f"model.layers.{i}.self_attn.attn":
              torch.ones(blocks, 2, C, 128, dtype=torch.bfloat16)
              for i in range(2)}
    w.register_kv_caches(layers)
    return w, layers


def _save_step(w, layers, metas):
    """One step that saves @p metas; returns the client the worker had
    while saving."""
    w.bind_connector_metadata(vc.KVFabricConnectorMetadata(metas))
    for name, kv in layers.items():
        w.save_kv_layer(name, kv, None)
    client = w._client
    w.wait_for_save()
    w.clear_connector_metadata()
    return client


def test_a_save_the_agent_has_no_room_for_is_skipped_not_an_outage(
        model, tight_agent):
    """A request whose chunks do not fit in the engine's staging area
    (engine_staging_size) is not saved and is counted (save_refused); the
    agent stays in use: a smaller request of the same step is saved, and
    nothing counts as an agent error."""
    cl = tight_agent
    n = (4 << 20) // (2 * 2 * C * 128 * 2) + 2  # chunks past 4 MiB
    w, layers = _saving_worker(model, cl.sockets["s"], n + 1)
    assert w._chunk_bytes * n > (4 << 20)
    big = kvf.key_chain(w._ns[0], _prompt(n * C, 21), C)
    small = kvf.key_chain(w._ns[0], _prompt(C, 22), C)
    _save_step(w, layers, [vc.ReqMeta("big", list(range(n)), save_keys=[big]),
                           vc.ReqMeta("small", [n], save_keys=[small])])
    assert w.stats["save_refused"] == 1, w.stats
    assert w.stats["agent_errors"] == 0, w.stats
    assert w.stats["saved_chunks"] == 1, w.stats
    with cl.client("s") as c:
        assert c.lookup(small).hit_chunks == 1
        assert c.lookup(big).hit_chunks == 0
    w.shutdown()


def test_a_commit_the_agent_refuses_is_not_an_outage(model, agents,
                                                     monkeypatch):
    """A COMMIT the agent answers with an error about the request itself
    (here KVF_ERR_CHECKSUM: the checksum the worker sent does not match the
    bytes, as after a torn write) loses that request's chunks only: counted
    in save_failed, not agent_errors; the other request of the same step is
    saved, and the worker keeps its connection."""
    w, layers = _saving_worker(model, agents.sockets["a"], 3)
    bad = kvf.key_chain(w._ns[0], _prompt(C, 31), C)
    good = kvf.key_chain(w._ns[0], _prompt(2 * C, 32), C)
    real_sum = kvf.chunk_checksum
    calls = []

    def first_sum_wrong(view):
        calls.append(1)
        return real_sum(view) ^ (1 if len(calls) == 1 else 0)

    monkeypatch.setattr(vc.kvf, "chunk_checksum", first_sum_wrong)
    client = _save_step(w, layers,
                        [vc.ReqMeta("bad", [0], save_keys=[bad]),
                         vc.ReqMeta("good", [1, 2], save_keys=[good])])
    monkeypatch.undo()
    assert len(calls) == 3
    assert w.stats["agent_errors"] == 0, w.stats
    assert w.stats["saved_chunks"] == 2, w.stats
    assert w.stats["save_failed"] == 1, w.stats
    assert w._client is client and client is not None
    with agents.client("a") as c:
        assert c.lookup(bad).hit_chunks == 0
        assert c.lookup(good).hit_chunks == 2
    w.shutdown()


def test_chunks_larger_than_the_agents_max_chunk_are_not_an_outage(
        model, small_chunk_agent, caplog):
    """Chunks larger than the agent's max_chunk (KVF_ERR_TOO_BIG on ALLOC):
    each request is counted in save_failed with a warning that names
    max_chunk, nothing counts as an agent error, and the worker keeps its
    connection for the next step."""
    import logging

    w, layers = _saving_worker(model, small_chunk_agent.sockets["m"], 3)
    assert w._chunk_bytes > (64 << 10)
    caplog.set_level(logging.WARNING, logger="kvfabric.vllm")
    for step in range(2):
        keys = kvf.key_chain(w._ns[0], _prompt(C, 40 + step), C)
        client = _save_step(w, layers, [vc.ReqMeta(f"r{step}", [step],
                                                   save_keys=[keys])])
        assert w._client is client and client is not None
    assert w.stats["agent_errors"] == 0, w.stats
    assert w.stats["save_failed"] == 2, w.stats
    assert w.stats["saved_chunks"] == 0, w.stats
    warned = [r.getMessage() for r in caplog.records
              if "not saved" in r.getMessage()]
    assert len(warned) == 1 and "max_chunk" in warned[0], warned
    w.shutdown()
