# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""KVFabricConnector: vLLM's KV connector interface (KVConnectorBase_V1)
over kvfabric. Needs vLLM (it subclasses vLLM's own classes);
docs/integration-vllm.md shows the configuration and what each hook does.

Scheduler side (engine core process, connection to the agent of rank 0):

* ``get_num_new_matched_tokens``: chained keys of the prompt's full chunks
  for every TP rank, one lookup per rank (prefetch on rank 0's); the hit is
  the minimum over ranks (an engine can skip only tokens every rank holds),
  beyond what vLLM's own prefix cache holds, never the whole prompt.
  Answered once per request (vLLM may ask again: the same answer, no new
  lookup or prefetch) until the request is preempted;
* ``update_state_after_alloc``: remembers which tokens to load;
* ``build_connector_meta``: per scheduled request, its block ids (replaced,
  not extended, when vLLM resumes it after a preemption), the chunks to
  load and the chunks that become complete in this step (to save);
* ``request_finished``: forgets the request; a decode-side PD request that
  never loaded releases its slot at the agent.

Worker side (one per worker, connection to that worker's agent; its TP rank
from vLLM's parallel state): ``register_kv_caches`` detects the layout
(layout.vllm_layout: flash-attention NHD/HND, FlashInfer, the CPU backend)
and checks the shape; ``start_load_kv`` retrieves and unpacks;
``save_kv_layer`` packs; ``wait_for_save`` checksums, pushes (PD) and
commits; PD loads on the decode side are asynchronous (a thread waits for
the push; ``get_finished`` reports them as finished receiving).

The agent being away never fails the engine: every call that reaches it is
guarded; a failure is counted, logged once per outage, and answered as "no
external hit" (scheduler) or "recompute" (worker, through
``get_block_ids_with_load_errors``; the connector sets vLLM's
``kv_load_failure_policy`` to ``recompute``). Reconnects are tried at most
every ``retry_s`` seconds.
"""
import hashlib
import json
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

from vllm.distributed.kv_events import (
    BlockRemoved, BlockStored, KVConnectorKVEvents, KVEventAggregator)
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics, KVConnectorStats)

import kvfabric as kvf
from kvfabric.errors import (ERR_AUTH, ERR_CLOSED, ERR_IO, ERR_NO_MEMORY,
                             ERR_NOT_FOUND, ERR_PROTO, ERR_TIMEOUT,
                             ERR_TOO_BIG, ERR_TRANSPORT, ERR_VERSION)

log = logging.getLogger("kvfabric.vllm")

__all__ = ["KVFabricConnector", "KVFabricConnectorMetadata",
           "KVFabricStats", "KVFabricKVEvents", "KVConnectorRole"]

# the medium of the KV events for chunks in kvfabric (vLLM's own are "GPU",
# "CPU", "STORAGE"); kv_connector_extra_config "kv_events_medium" changes it
KV_EVENTS_MEDIUM = "kvfabric"

_ERRORS = (kvf.KvfError, OSError)


def _close_quietly(client: Optional[kvf.Client]) -> None:
    """Closes @p client (None: nothing), whatever the agent says: it is
    dropped because it failed or the connector stops."""
    if client is None:
        return
    try:
        client.close(force=True)
    except _ERRORS + (RuntimeError,):
        pass

# what a failed call says about the agent: these statuses mean it, or the
# connection to it, is gone; any other is its answer about this request
# (a COMMIT whose checksum did not match, a slot it no longer grants) and
# the connection stays in use
_AGENT_DOWN = frozenset((ERR_CLOSED, ERR_IO, ERR_TIMEOUT, ERR_PROTO,
                         ERR_TRANSPORT, ERR_AUTH, ERR_VERSION))

# the receive thread's pd_wait slice: how soon it sees an abort
_PD_WAIT_SLICE_S = 0.25

# vLLM --kv-cache-dtype -> the dtype name the namespace is built from
_KV_DTYPES = {"fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn",
              "fp8_e5m2": "float8_e5m2", "fp8_inc": "float8_e4m3fn",
              "fp8_ds_mla": "float8_e4m3fn"}

# counters of the connector (stats, KVConnectorStats, Prometheus)
STAT_NAMES = ("lookups", "hit_tokens", "loaded_chunks", "saved_chunks",
              "missed_chunks", "pd_pushes", "pd_pushed_chunks",
              "pd_push_errors", "pd_received_chunks", "pd_wait_errors",
              "pd_released", "pd_cancelled", "agent_errors", "bytes_loaded",
              "bytes_saved", "resumed_requests", "save_refused",
              "save_failed")


class _AgentAway(kvf.KvfError):
    """The agent was unreachable and the next reconnect is not due."""


@dataclass
class ReqMeta:
    """One request's work in one step (built by the scheduler side)."""
    req_id: str
    block_ids: List[int]
    load_start: int = 0                # tokens [load_start, load_end) load
    load_end: int = 0
    load_keys: List[List[Any]] = field(default_factory=list)  # per rank
    load_first_chunk: int = 0
    save_keys: List[List[Any]] = field(default_factory=list)  # per rank
    save_first_chunk: int = 0
    # PD, producer: push the first pd_push_count chunks of save_keys
    pd_request_id: int = 0
    pd_decoder: str = ""
    pd_push_count: int = 0
    pd_final: bool = False
    pd_store: bool = True              # commit the saved chunks as well
    # PD, consumer: an asynchronous load from PD request pd_request_id
    pd_load: bool = False
    # KV events (vLLM's kv_events_config on): the BlockStored of each chunk
    # of load_keys / save_keys (None where vLLM has no block hashes for it)
    load_events: List[Any] = field(default_factory=list)
    save_events: List[Any] = field(default_factory=list)


@dataclass
class KVFabricConnectorMetadata(KVConnectorMetadata):
    requests: List[ReqMeta] = field(default_factory=list)
    # PD, consumer: requests finished (aborted) while their asynchronous
    # load runs: the receive thread stops waiting for them
    pd_cancel: List[str] = field(default_factory=list)


@dataclass
class KVFabricStats(KVConnectorStats):
    """The connector's counters of one interval (summed over workers)."""

    def reset(self):
        self.data = {}

    def aggregate(self, other: "KVConnectorStats") -> "KVConnectorStats":
        for k, v in (other.data or {}).items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> Dict[str, Any]:
        return dict(self.data)

    def is_empty(self) -> bool:
        return not any(self.data.values())


class KVFabricKVEvents(KVConnectorKVEvents):
    """One step's KV events of a worker (each event once). vLLM's executor
    merges the workers' objects (``add_events`` + ``increment_workers``);
    ``aggregate`` keeps the events every worker reported: a chunk is
    announced once all TP ranks committed (or loaded) their part of it."""

    def __init__(self, num_workers: int = 1):
        self._agg = KVEventAggregator(num_workers)

    def add_events(self, events) -> None:
        self._agg.add_events(list(events))

    def aggregate(self) -> "KVFabricKVEvents":
        common = self._agg.get_common_events()
        self._agg.clear_events()
        self._agg.add_events(common)
        self._agg.reset_workers()
        return self

    def increment_workers(self, count: int = 1) -> None:
        self._agg.increment_workers(count)

    def get_all_events(self):
        return self._agg.get_all_events()

    def get_number_of_workers(self) -> int:
        return self._agg.get_number_of_workers()

    def clear_events(self) -> None:
        self._agg.clear_events()

    def __repr__(self) -> str:
        return f"<KVFabricKVEvents {self._agg!r}>"


class KVFabricPromMetrics(KVConnectorPromMetrics):
    """``vllm:kvfabric_<counter>`` counters, per engine."""

    def __init__(self, vllm_config, metric_types, labelnames,
                 per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames,
                         per_engine_labelvalues)
        self._counters = {}
        for name in STAT_NAMES:
            c = self._counter_cls(
                name=f"vllm:kvfabric_{name}",
                documentation=f"kvfabric connector: {name.replace('_', ' ')}",
                labelnames=labelnames)
            self._counters[name] = {
                idx: c.labels(*vals)
                for idx, vals in per_engine_labelvalues.items()}

    def observe(self, transfer_stats_data: Dict[str, Any],
                engine_idx: int = 0):
        for k, v in transfer_stats_data.items():
            c = self._counters.get(k, {}).get(engine_idx)
            if c is not None and v:
                c.inc(v)


@dataclass
class _ReqState:
    tokens: List[int]
    keys: List[List[Any]]        # per rank
    block_ids: List[int]
    request: Any = None          # vLLM's Request (block hashes, LoRA)
    saved_chunks: int = 0        # chunks [0, saved) are held or saved
    matched: Optional[Tuple[int, int]] = None  # (vLLM's computed, answer)
    lookup: Optional[Tuple[int, int]] = None   # (vLLM's computed, hit)
    load: Optional[Tuple[int, int]] = None
    # PD, producer: (request id, decoder, chunks to push); chunks scheduled
    pd_push: Optional[Tuple[int, str, int]] = None
    pd_pushed: int = 0
    # PD, consumer: (request id, chunks pushed); cleared once scheduled
    pd_recv: Optional[Tuple[int, int]] = None
    pd_load: bool = False        # the pending load comes from pd_recv
    pd_inflight: bool = False    # handed to the worker, not finished yet


def _extra(cfg) -> Dict[str, Any]:
    ktc = cfg.kv_transfer_config
    return dict(getattr(ktc, "kv_connector_extra_config", None) or {})


def kv_dtype_name(cache_dtype, model_dtype) -> str:
    """The KV dtype name of vLLM's ``--kv-cache-dtype`` (``auto``: the
    model's dtype; ``fp8``, ``fp8_e4m3``, ``fp8_e5m2``: the torch float8
    names)."""
    d = str(cache_dtype or "auto")
    if d == "auto":
        d = str(model_dtype)
    d = d.replace("torch.", "")
    return _KV_DTYPES.get(d, d)


def worker_tp_rank(default: int = 0) -> int:
    """This worker's TP rank from vLLM's parallel state (the scheduler
    process has none: @p default)."""
    try:
        from vllm.distributed.parallel_state import (
            get_tensor_model_parallel_rank, model_parallel_is_initialized)
        if model_parallel_is_initialized():
            return int(get_tensor_model_parallel_rank())
    except (ImportError, AssertionError, RuntimeError):
        pass
    return default


def _model_shape(cfg, extra):
    """(model_id, dtype name, layers, kv heads, head dim, tp world) from
    vLLM's config, each overridable in kv_connector_extra_config. The
    model id carries the exact KV dtype (fp8 e4m3 and e5m2 are one
    kvf_dtype_t but not interchangeable)."""
    mc, pc = cfg.model_config, cfg.parallel_config
    dtype = str(extra.get("dtype") or kv_dtype_name(
        getattr(cfg.cache_config, "cache_dtype", "auto"), mc.dtype))
    model_id = extra.get("model_id") or str(mc.model)
    if dtype.startswith("float8"):
        model_id = f"{model_id}#kv={dtype}"
    layers = int(extra.get("num_layers") or mc.get_num_layers(pc))
    heads = int(extra.get("num_kv_heads") or mc.get_num_kv_heads(pc))
    head_dim = int(extra.get("head_dim") or mc.get_head_size())
    world = int(extra.get("tp_world", getattr(pc, "tensor_parallel_size", 1)))
    return model_id, dtype, layers, heads, head_dim, world


class KVFabricConnector(KVConnectorBase_V1):
    """kv_transfer_config:
    ``{"kv_connector": "KVFabricConnector",
    "kv_connector_module_path": "kvfabric.vllm_connector",
    "kv_role": "kv_both", "kv_connector_extra_config": {"socket": ...,
    "chunk_size": 256}}``."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        extra = _extra(vllm_config)
        ktc = vllm_config.kv_transfer_config
        self._kv_role = getattr(ktc, "kv_role", None) or "kv_both"
        self._block_size = int(vllm_config.cache_config.block_size)
        self._chunk = int(extra.get("chunk_size", kvf.keys.DEFAULT_CHUNK_SIZE))
        if self._chunk % self._block_size:
            raise ValueError(f"kvfabric: chunk_size {self._chunk} must be a "
                             f"multiple of block_size {self._block_size}")
        (model_id, dtype, layers, heads, head_dim,
         world) = _model_shape(vllm_config, extra)
        self._shape = (layers, heads, head_dim)
        self._world = world
        self._ns = [kvf.namespace_fingerprint(
            model_id, "fp8" if dtype.startswith("float8") else dtype, layers,
            heads, head_dim, tp_rank=r, tp_world=world,
            chunk_size=self._chunk) for r in range(world)]
        if role == KVConnectorRole.WORKER:
            self._rank = int(extra.get("tp_rank", worker_tp_rank()))
        else:
            self._rank = 0  # the scheduler talks to rank 0's agent
        self._rank %= world
        self._socket_tpl = str(extra.get("socket",
                                         "/run/kvfabric/agent.sock"))
        self._socket = self._socket_tpl.format(rank=self._rank)
        # scheduler, TP > 1: connections to the other ranks' agents, for
        # releasing their shards of an aborted decode-side PD request
        self._rank_clients: Dict[int, kvf.Client] = {}
        self._timeout = float(extra.get("timeout_s", 5.0))
        self._retry_s = float(extra.get("retry_s", 1.0))
        self._prefetch = bool(extra.get("prefetch", True))
        # "{rank}" in a decoder name becomes the pushing worker's TP rank
        self._decoder = str(extra.get("decoder", ""))
        self._pd_store = bool(extra.get("pd_store", True))
        self._pd_wait_timeout = float(extra.get("pd_wait_timeout_s", 30.0))
        self._layout_kind = extra.get("layout")  # None: from the shape
        self._stats_dir = extra.get("stats_dir")
        kec = getattr(vllm_config, "kv_events_config", None)
        self._events_on = bool(kec is not None and
                               getattr(kec, "enable_kv_cache_events", False))
        self._medium = str(extra.get("kv_events_medium", KV_EVENTS_MEDIUM))
        self._nonce = os.urandom(8).hex()
        self._client: Optional[kvf.Client] = None
        self._down_since: Optional[float] = None  # agent unreachable
        self._retry_at = 0.0
        self._broken = False
        self._lock = threading.Lock()   # stats, finished sets
        # vLLM's default is "fail"; a kvfabric miss is always recomputable
        if (role == KVConnectorRole.SCHEDULER and
                extra.get("kv_load_failure_policy", "recompute") ==
                "recompute" and
                getattr(ktc, "kv_load_failure_policy", None) == "fail"):
            ktc.kv_load_failure_policy = "recompute"
        # scheduler side
        self._reqs: Dict[str, _ReqState] = {}
        self._events: List[Any] = []   # KV events for take_events
        self._pd_cancel: List[str] = []  # for the next metadata
        # worker side
        self._layers: Dict[str, int] = {}
        self._kv: List[Any] = []
        self._layout = None
        self._pending: List[Tuple[ReqMeta, List[kvf.Slot]]] = []
        self._load_errors: Set[int] = set()
        self._pd_sending: Set[str] = set()   # requests with a PD push
        self._recv_q: "queue.Queue[Optional[ReqMeta]]" = queue.Queue()
        self._recv_thread: Optional[threading.Thread] = None
        self._recv_done: Set[str] = set()
        self._recv_cancel: Set[str] = set()
        self._recv_pending: Set[str] = set()  # queued or being loaded
        self._kv_events: Dict[Any, None] = {}  # this step's, each once
        self.stats = {k: 0 for k in STAT_NAMES}
        self._warned: Set[str] = set()  # stats warned of once
        self._interval = {k: 0 for k in STAT_NAMES}

    # shared ------------------------------------------------------------

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.stats[name] += n
            self._interval[name] += n

    @property
    def client(self) -> kvf.Client:
        """The agent connection; raises KvfError while the agent is
        unreachable and the next retry is not due."""
        if self._client is None:
            if time.monotonic() < self._retry_at:
                raise _AgentAway(ERR_CLOSED, "kvf_client_connect",
                                 "agent unreachable, retry pending")
            self._client = kvf.Client(
                self._socket, timeout=self._timeout,
                name=f"vllm-{self.role.name.lower()}-{self._rank}")
            if self._down_since is not None:
                log.warning("kvfabric: agent %s is back after %.1f s",
                            self._socket,
                            time.monotonic() - self._down_since)
                self._down_since = None
        return self._client

    def _agent_failed(self, what: str, e: Exception) -> None:
        """A call to the agent failed: counted, logged once per outage; the
        connection is dropped at the end of the step (views may be alive
        until then) and retried after retry_s."""
        if isinstance(e, _AgentAway):
            return
        self._count("agent_errors")
        if self._down_since is None:
            self._down_since = time.monotonic()
            log.warning("kvfabric: %s on agent %s failed (%s): no external "
                        "hits, recomputing, until it is back", what,
                        self._socket, e)
        else:
            log.debug("kvfabric: %s failed: %s", what, e)
        self._broken = True
        self._retry_at = time.monotonic() + self._retry_s

    def _save_lost(self, stat: str, m: "ReqMeta", e: Exception,
                   why: str) -> None:
        """This request's chunks are not cached: the agent had no room for
        them (save_refused: its pool, or this engine's staging area, is
        full) or refused their COMMIT (save_failed: a checksum that did not
        match the bytes, a slot it no longer grants). Counted in @p stat,
        warned once each; the agent stays in use for everything else."""
        self._count(stat)
        if stat not in self._warned:
            self._warned.add(stat)
            log.warning("kvfabric: request %s not saved: %s (%s; counted in "
                        "%s, logged once)", m.req_id, e, why, stat)

    def _alloc_refused(self, m: "ReqMeta", e: kvf.KvfError) -> None:
        """The agent is up and refused room for this request's chunks."""
        if e.status == ERR_NO_MEMORY:
            self._save_lost("save_refused", m, e, "raise the agent's "
                            "engine_staging_size or pool_size")
        elif e.status == ERR_TOO_BIG:
            self._save_lost("save_failed", m, e,
                            f"a chunk is {self._chunk_bytes} bytes here: "
                            "raise the agent's max_chunk to hold it")
        else:
            self._save_lost("save_failed", m, e,
                            "the agent refused the allocation")

    def _end_step(self) -> None:
        if self._broken:
            self._broken = False
            c, self._client = self._client, None
            _close_quietly(c)
        self._write_stats()

    def _write_stats(self) -> None:
        if not self._stats_dir:
            return
        path = os.path.join(self._stats_dir, f"{self.role.name.lower()}-"
                            f"{self._rank}-{os.getpid()}.json")
        try:
            with open(path + ".tmp", "w") as f:
                json.dump(self.stats, f)
            os.replace(path + ".tmp", path)
        except OSError:
            pass

    @property
    def is_producer(self) -> bool:
        return self._kv_role in ("kv_producer", "kv_both")

    @property
    def is_consumer(self) -> bool:
        return self._kv_role in ("kv_consumer", "kv_both")

    def shutdown(self):
        if self._recv_thread is not None:
            self._recv_q.put(None)
            self._recv_thread.join(timeout=5)
            self._recv_thread = None
        _close_quietly(self._client)
        self._client = None
        for c in self._rank_clients.values():
            _close_quietly(c)
        self._rank_clients.clear()

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config) -> Optional[str]:
        """None (every layout layout.vllm_layout knows works), unless
        ``kv_cache_layout`` ("NHD" or "HND") is set in the extra config."""
        lay = _extra(vllm_config).get("kv_cache_layout")
        return str(lay) if lay else None

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config) -> bool:
        """save_kv_layer packs between attention layers: full-graph replay
        would skip it (a P/D push could miss its final chunk)."""
        return True

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        return KVFabricStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames,
                           per_engine_labelvalues):
        return KVFabricPromMetrics(vllm_config, metric_types, labelnames,
                                   per_engine_labelvalues)

    def get_kv_connector_stats(self):
        with self._lock:
            data, self._interval = self._interval, {k: 0 for k in STAT_NAMES}
        if not any(data.values()):
            return None
        return KVFabricStats(data=data)

    # scheduler side ----------------------------------------------------

    def _state(self, request) -> _ReqState:
        st = self._reqs.get(request.request_id)
        if st is None:
            tokens = list(request.prompt_token_ids)
            st = _ReqState(tokens, [kvf.key_chain(ns, tokens, self._chunk)
                                    for ns in self._ns], [], request)
            self._pd_state(request, st)
            self._reqs[request.request_id] = st
        return st

    def _pd_request_id(self, req_id: str) -> int:
        """A PD request id for vLLM request @p req_id: 63 bits of a hash
        of it and this instance's nonce, never 0."""
        h = hashlib.blake2b(f"{self._nonce}/{req_id}".encode(),
                            digest_size=8).digest()
        return (int.from_bytes(h, "big") >> 1) or 1

    def _pd_state(self, request, st: _ReqState) -> None:
        """Reads the request's kv_transfer_params (vLLM's P/D handshake)."""
        params = getattr(request, "kv_transfer_params", None) or {}
        C = self._chunk
        if params.get("do_remote_decode") and self.is_producer:
            decoder = str(params.get("kvf_decoder") or self._decoder)
            if not decoder:
                log.warning("kvfabric: request %s asks for remote decode but "
                            "names no decoder (kvf_decoder, or decoder in "
                            "kv_connector_extra_config): not pushed",
                            request.request_id)
                return
            rid = int(params.get("kvf_request_id") or
                      self._pd_request_id(request.request_id))
            # D computes the chunk holding the last prompt token
            st.pd_push = (rid, decoder, max(len(st.tokens) - 1, 0) // C)
        elif (params.get("do_remote_prefill") and self.is_consumer and
              params.get("kvf_request_id")):
            if int(params.get("kvf_chunk_size", C)) != C:
                log.error("kvfabric: request %s was pushed in chunks of %s "
                          "tokens, this instance uses %d: recomputed",
                          request.request_id, params.get("kvf_chunk_size"),
                          C)
                return
            st.pd_recv = (int(params["kvf_request_id"]),
                          int(params.get("kvf_chunks", 0)))

    def _lookup_hit(self, st: _ReqState) -> int:
        """Chunks held for every rank (rank 0's lookup prefetches)."""
        hit = None
        for r in range(self._world):
            res = self.client.lookup(st.keys[r], prefetch=self._prefetch and
                                     r == 0)
            hit = res.hit_chunks if hit is None else min(hit,
                                                         res.hit_chunks)
            if hit == 0:
                break
        return hit or 0

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int
                                   ) -> Tuple[int, bool]:
        st = self._state(request)
        if st.matched is not None and st.matched[0] == num_computed_tokens:
            return st.matched[1], st.pd_load  # asked again: same answer
        if st.pd_recv is not None:
            # pushed by the prefill instance: no lookup, an async load
            n = st.pd_recv[1]
            hit = min(n * self._chunk,
                      ((len(st.tokens) - 1) // self._chunk) * self._chunk)
            if n == 0 or hit <= num_computed_tokens:
                # nothing to load: the pushed request is released now
                self._pd_release(st)
                st.matched = (num_computed_tokens, 0)
                return 0, False
            st.lookup = (num_computed_tokens, hit)
            st.pd_load = True
            st.matched = (num_computed_tokens, hit - num_computed_tokens)
            return st.matched[1], True
        if not self.is_consumer or not st.keys[0]:
            return 0, False
        try:
            hit_chunks = self._lookup_hit(st)
        except _ERRORS as e:
            self._agent_failed("lookup", e)
            self._end_step()
            return 0, False
        self._count("lookups")
        if st.pd_push is None:  # loaded chunks are pushed all the same
            st.saved_chunks = max(st.saved_chunks, hit_chunks)
        hit = hit_chunks * self._chunk
        # vLLM must compute at least the last prompt token
        if hit >= len(st.tokens):
            hit = ((len(st.tokens) - 1) // self._chunk) * self._chunk
        if hit <= num_computed_tokens:
            st.lookup = None
            st.matched = (num_computed_tokens, 0)
            return 0, False
        st.lookup = (num_computed_tokens, hit)
        st.matched = (num_computed_tokens, hit - num_computed_tokens)
        return st.matched[1], False

    def update_state_after_alloc(self, request, blocks,
                                 num_external_tokens: int):
        st = self._state(request)
        if num_external_tokens > 0 and st.lookup is not None:
            start = st.lookup[0]
            st.load = (start, start + num_external_tokens)
            self._count("hit_tokens", num_external_tokens)
            if st.pd_load:
                # asynchronous: the request waits for the load unscheduled,
                # so its blocks come from here, not from a scheduler output
                st.block_ids = list(blocks.get_block_ids()[0])

    def _chunk_events(self, st: _ReqState, c0: int, c1: int) -> List[Any]:
        """The BlockStored events of chunks [c0, c1) of a request, as
        vLLM's block pool words them (its block hashes of the chunk's
        blocks, the parent block's hash, the chunk's tokens), medium
        kvfabric; [] when KV events are off, None for a chunk whose block
        hashes vLLM has not computed."""
        if not self._events_on or st.request is None:
            return []
        from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

        req, bs, C = st.request, self._block_size, self._chunk
        hashes = getattr(req, "block_hashes", None) or []
        lora = getattr(req, "lora_request", None)
        out = []
        for c in range(c0, c1):
            b0, b1 = c * C // bs, (c + 1) * C // bs
            if b1 > len(hashes):
                out.append(None)
                continue
            out.append(BlockStored(
                block_hashes=[maybe_convert_block_hash(h)
                              for h in hashes[b0:b1]],
                parent_block_hash=(maybe_convert_block_hash(hashes[b0 - 1])
                                   if b0 > 0 else None),
                token_ids=list(st.tokens[c * C:(c + 1) * C]),
                block_size=bs,
                lora_id=lora.adapter_id if lora is not None else None,
                medium=self._medium,
                lora_name=lora.name if lora is not None else None,
                group_idx=0))
        return out

    def _req_meta(self, req_id: str, st: _ReqState, computed_end: int
                  ) -> Optional[ReqMeta]:
        m = ReqMeta(req_id, list(st.block_ids))
        C = self._chunk
        if st.load is not None and not st.pd_load:
            m.load_start, m.load_end = st.load
            first = m.load_start // C
            m.load_first_chunk = first
            m.load_keys = [k[first:m.load_end // C] for k in st.keys]
            m.load_events = self._chunk_events(st, first, m.load_end // C)
            st.load = None
        if self.is_producer:
            full = min(computed_end, len(st.tokens)) // C
            if full > st.saved_chunks:
                m.save_first_chunk = st.saved_chunks
                m.save_keys = [k[st.saved_chunks:full] for k in st.keys]
                m.save_events = self._chunk_events(st, st.saved_chunks, full)
                st.saved_chunks = full
            if st.pd_push is not None and m.save_keys:
                rid, decoder, n = st.pd_push
                count = max(min(full, n) - m.save_first_chunk, 0)
                if count > 0:
                    m.pd_request_id, m.pd_decoder = rid, decoder
                    m.pd_push_count = count
                    st.pd_pushed = m.save_first_chunk + count
                    m.pd_final = st.pd_pushed == n
                    m.pd_store = self._pd_store
        if not m.load_keys and not (m.save_keys and m.save_keys[0]):
            return None
        return m

    def _recv_meta(self, req_id: str, st: _ReqState) -> ReqMeta:
        """The asynchronous PD load of @p req_id (all pushed chunks are
        claimed; those before load_start, vLLM's own prefix cache, are
        skipped by the worker)."""
        m = ReqMeta(req_id, list(st.block_ids))
        m.load_start, m.load_end = st.load
        m.pd_load, m.pd_request_id = True, st.pd_recv[0]
        st.load, st.pd_load, st.pd_recv = None, False, None
        st.pd_inflight = True
        return m

    def build_connector_meta(self, scheduler_output
                             ) -> KVFabricConnectorMetadata:
        meta = KVFabricConnectorMetadata()
        meta.pd_cancel, self._pd_cancel = self._pd_cancel, []
        for req_id, st in self._reqs.items():
            if st.pd_load and st.load is not None:
                meta.requests.append(self._recv_meta(req_id, st))
        nst = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            st = self._reqs.get(new.req_id)
            if st is None:
                continue
            st.block_ids = list(new.block_ids[0])
            m = self._req_meta(new.req_id, st, new.num_computed_tokens +
                               nst.get(new.req_id, 0))
            if m is not None:
                meta.requests.append(m)
        cached = scheduler_output.scheduled_cached_reqs
        resumed = set(getattr(cached, "resumed_req_ids", None) or ())
        for i, req_id in enumerate(getattr(cached, "req_ids", [])):
            st = self._reqs.get(req_id)
            if st is None:
                continue
            new_blocks = cached.new_block_ids[i]
            if req_id in resumed:
                # resumed after a preemption: vLLM's new block ids replace
                # the old ones (which were freed and may be reused)
                st.block_ids = list(new_blocks[0]) if new_blocks else []
                self._count("resumed_requests")
            elif new_blocks is not None:
                st.block_ids.extend(new_blocks[0])
            m = self._req_meta(req_id, st, cached.num_computed_tokens[i] +
                               nst.get(req_id, 0))
            if m is not None:
                meta.requests.append(m)
        for req_id in getattr(scheduler_output, "preempted_req_ids",
                              None) or ():
            st = self._reqs.get(req_id)
            if st is not None:  # asked again when it is rescheduled
                st.matched, st.lookup, st.load = None, None, None
        self._write_stats()
        return meta

    def _pd_release(self, st: _ReqState) -> None:
        """Gives back a pushed request D will never load (decode side): at
        rank 0's agent, and with TP > 1 each other rank's shard at that
        rank's agent (before, those waited for the agents' claim
        timeout)."""
        rid = st.pd_recv[0]
        st.pd_recv = None
        for r in range(1, self._world):
            self._pd_release_at(r, rid)
        try:
            self.client.pd_release(rid)
            self._count("pd_released")
        except kvf.KvfError as e:
            if e.status == ERR_NOT_FOUND:
                return  # not arrived yet: the agent's claim timeout frees it
            self._agent_failed("pd_release", e)
            self._end_step()
        except OSError as e:
            self._agent_failed("pd_release", e)
            self._end_step()

    def _pd_release_at(self, rank: int, rid: int) -> None:
        """Releases PD request @p rid at the agent of TP rank @p rank (its
        socket from the "{rank}" in ``socket``). Best effort: a failure is
        logged and the connection dropped; that agent's claim timeout frees
        the shard then, as it did before."""
        sock = self._socket_tpl.format(rank=rank)
        if sock == self._socket:
            return  # one agent for every rank: released there already
        try:
            c = self._rank_clients.get(rank)
            if c is None:
                c = kvf.Client(sock, timeout=self._timeout,
                               name=f"vllm-scheduler-{rank}")
                self._rank_clients[rank] = c
            c.pd_release(rid)
            self._count("pd_released")
        except kvf.KvfError as e:
            if e.status == ERR_NOT_FOUND:
                return  # not arrived there yet: its claim timeout frees it
            self._rank_release_failed(rank, sock, e)
        except OSError as e:
            self._rank_release_failed(rank, sock, e)

    def _rank_release_failed(self, rank: int, sock: str,
                             e: Exception) -> None:
        key = f"rank-release-{rank}"
        (log.debug if key in self._warned else log.warning)(
            "kvfabric: releasing an aborted PD request at rank %d's agent "
            "%s failed (%s); its claim timeout frees it (logged once)", rank,
            sock, e)
        self._warned.add(key)
        _close_quietly(self._rank_clients.pop(rank, None))

    def request_finished(self, request, block_ids
                         ) -> Tuple[bool, Optional[Dict[str, Any]]]:
        """A PD-pushed request keeps its blocks until the worker reports it
        finished sending (get_finished), and hands D its PD request in
        kv_transfer_params. A decode-side request that ends before its load
        was scheduled (aborted) releases its pushed request at the agent;
        one that ends while its asynchronous load runs keeps its blocks
        (True) until the worker reports the load finished (it is told to
        stop waiting in the next step's metadata): nothing is unpacked into
        blocks vLLM freed."""
        st = self._reqs.pop(request.request_id, None)
        if st is None:
            return False, None
        if st.pd_recv is not None:  # never handed to the worker
            self._pd_release(st)
        if st.pd_inflight:
            self._pd_cancel.append(request.request_id)
            return True, None
        if st.pd_push is None:
            return False, None
        rid, decoder, n = st.pd_push
        params = None
        if st.pd_pushed == n:
            params = dict(do_remote_prefill=True, do_remote_decode=False,
                          kvf_request_id=rid, kvf_decoder=decoder,
                          kvf_chunks=n, kvf_chunk_size=self._chunk)
        return st.pd_pushed > 0, params

    def update_connector_output(self, connector_output) -> None:
        """Keeps the KV events of this step that every worker reported
        (KVFabricKVEvents.aggregate)."""
        for req_id in getattr(connector_output, "finished_recving",
                              None) or ():
            st = self._reqs.get(req_id)
            if st is not None:
                st.pd_inflight = False
        ev = getattr(connector_output, "kv_cache_events", None)
        if isinstance(ev, KVFabricKVEvents):
            self._events.extend(ev.aggregate().get_all_events())

    def take_events(self):
        """KV events (vLLM publishes them with its own): BlockStored,
        medium kvfabric, for the chunks this instance committed to or
        loaded from its agent (so the agent holds them: a fetched chunk is
        committed there too); BlockRemoved for chunks a lookup promised
        and the retrieve no longer found."""
        events, self._events = self._events, []
        return events

    # worker side -------------------------------------------------------

    def register_kv_caches(self, kv_caches: Dict[str, Any]):
        from .layout import vllm_layout

        self._layers = {name: i for i, name in enumerate(kv_caches)}
        self._kv = list(kv_caches.values())
        layers, heads, head_dim = self._shape
        if len(self._kv) != layers:
            raise ValueError(f"kvfabric: {len(self._kv)} KV cache layers, "
                             f"the model has {layers}")
        self._layout = vllm_layout(self._kv, kind=self._layout_kind,
                                   num_kv_heads=heads, head_dim=head_dim,
                                   block_size=self._block_size)
        self._chunk_bytes = self._layout.chunk_bytes(self._chunk)
        log.info("kvfabric: rank %d, %d layers in layout %s (%s), chunks "
                 "of %d tokens, %d bytes, agent %s", self._rank, layers,
                 self._layout.kind, self._layout.dtype, self._chunk,
                 self._chunk_bytes, self._socket)

    def _chunk_view(self, client, slot: kvf.Slot):
        return client.slot_tensor(kvf.Slot(slot.offset, self._chunk_bytes),
                                  self._layout.dtype)

    def _slot_mapping(self, m: ReqMeta, c0: int):
        """Slots of tokens [c0, c0 + chunk) of @p m (-1 past its blocks)."""
        import torch

        bs = self._block_size
        t = torch.arange(c0, c0 + self._chunk, dtype=torch.int64)
        blocks = torch.tensor(m.block_ids, dtype=torch.int64)
        idx = t // bs
        ok = idx < len(m.block_ids)
        sm = torch.full_like(t, -1)
        sm[ok] = blocks[idx[ok]] * bs + t[ok] % bs
        return sm

    def _load_failed(self, m: ReqMeta, c0: int, c1: int) -> None:
        """Tokens [c0, c1) of @p m could not be loaded: their blocks go to
        get_block_ids_with_load_errors (vLLM recomputes them)."""
        bs = self._block_size
        lo = max(c0, m.load_start)
        with self._lock:
            self._load_errors.update(
                m.block_ids[t // bs] for t in range(lo, c1)
                if t // bs < len(m.block_ids))

    def start_load_kv(self, forward_context, **kwargs) -> None:
        meta = self._get_connector_metadata()
        if meta.pd_cancel:
            with self._lock:
                self._recv_cancel.update(set(meta.pd_cancel) &
                                         self._recv_pending)
        C = self._chunk
        for m in meta.requests:
            if m.pd_load:
                self._recv_start(m)
                continue
            if not m.load_keys:
                continue
            keys = m.load_keys[self._rank]
            try:
                client = self.client
                slots, missing = client.retrieve(keys)
            except _ERRORS as e:
                self._agent_failed("retrieve", e)
                self._load_failed(m, m.load_start, m.load_end)
                continue
            try:
                for j, (s, miss) in enumerate(zip(slots, missing)):
                    c0 = (m.load_first_chunk + j) * C
                    if miss:
                        self._count("missed_chunks")
                        self._load_failed(m, c0, c0 + C)
                        if j < len(m.load_events) and m.load_events[j]:
                            ev = m.load_events[j]
                            self._kv_event(BlockRemoved(
                                block_hashes=ev.block_hashes,
                                medium=ev.medium, group_idx=0))
                        continue
                    sm = self._slot_mapping(m, c0)
                    # tokens vLLM already holds (local prefix) stay as are
                    sm[:max(m.load_start - c0, 0)] = -1
                    src = self._chunk_view(client, s)
                    self._layout.unpack(self._kv, sm, src)
                    del src
                    self._count("loaded_chunks")
                    self._count("bytes_loaded", self._chunk_bytes)
                    if j < len(m.load_events):
                        self._kv_event(m.load_events[j])
            finally:
                try:
                    client.release(slots)
                except _ERRORS as e:
                    self._agent_failed("release", e)
        self._end_step()

    # decode side, asynchronous PD loads --------------------------------

    def _recv_start(self, m: ReqMeta) -> None:
        with self._lock:
            self._recv_pending.add(m.req_id)
        if self._recv_thread is None:
            self._recv_thread = threading.Thread(
                target=self._recv_loop, name="kvfabric-pd-recv", daemon=True)
            self._recv_thread.start()
        self._recv_q.put(m)

    def _recv_loop(self) -> None:
        """The PD receive thread: its own agent connection; waits for each
        request in turn, unpacks it into the request's blocks (vLLM does
        not run the request until get_finished reports it), releases it."""
        client = None
        while True:
            m = self._recv_q.get()
            if m is None:
                break
            try:
                if client is None:
                    client = kvf.Client(self._socket, timeout=self._timeout,
                                        name=f"vllm-pd-recv-{self._rank}")
                self._pd_load(client, m)
            except _ERRORS as e:
                self._count("pd_wait_errors")
                log.warning("kvfabric: PD load of %s: %s; recomputed",
                            m.req_id, e)
                self._load_failed(m, 0, m.load_end)
                _close_quietly(client)
                client = None
            except Exception:  # never leave vLLM waiting for this request
                log.exception("kvfabric: PD load of %s failed; recomputed",
                              m.req_id)
                self._count("pd_wait_errors")
                self._load_failed(m, 0, m.load_end)
            with self._lock:
                self._recv_pending.discard(m.req_id)
                self._recv_cancel.discard(m.req_id)
                self._recv_done.add(m.req_id)
        if client is not None:
            client.close(force=True)

    def _pd_load(self, client, m: ReqMeta) -> None:
        """Waits for PD request m.pd_request_id, unpacks its chunks into
        tokens [load_start, load_end), releases it."""
        C = self._chunk
        need = (m.load_end + C - 1) // C
        try:
            slots = self._pd_wait_or_cancel(client, m)
            if slots is None:  # the request was aborted: no unpack
                return
        except kvf.KvfError as e:
            log.warning("kvfabric: PD request %x (%s): %s; recomputed",
                        m.pd_request_id, m.req_id, e)
            self._count("pd_wait_errors")
            self._load_failed(m, 0, m.load_end)
            try:  # a timed-out request may still arrive: give it back
                client.pd_release(m.pd_request_id)
            except kvf.KvfError:
                pass
            return
        try:
            self._count("pd_received_chunks", len(slots))
            for j in range(need):
                c0 = j * C
                c1 = min(c0 + C, m.load_end)
                if c1 <= m.load_start:
                    continue
                if j >= len(slots) or slots[j].length != self._chunk_bytes:
                    self._count("missed_chunks")
                    self._load_failed(m, c0, c1)
                    continue
                sm = self._slot_mapping(m, c0)
                sm[:max(m.load_start - c0, 0)] = -1
                sm[c1 - c0:] = -1
                src = self._chunk_view(client, slots[j])
                self._layout.unpack(self._kv, sm, src)
                del src
                self._count("loaded_chunks")
                self._count("bytes_loaded", self._chunk_bytes)
        finally:
            client.pd_release(m.pd_request_id)

    def _cancelled(self, req_id: str) -> bool:
        with self._lock:
            if req_id in self._recv_cancel:
                self._recv_cancel.discard(req_id)
                return True
        return False

    def _pd_wait_or_cancel(self, client, m: ReqMeta):
        """pd_wait for m's PD request, in slices of at most _PD_WAIT_SLICE_S
        seconds up to pd_wait_timeout_s, so an abort (metadata pd_cancel)
        ends the wait within one slice: then the request is released at
        the agent (a later push is dropped there) and None returned."""
        deadline = time.monotonic() + self._pd_wait_timeout
        while True:
            if self._cancelled(m.req_id):
                log.info("kvfabric: PD load of %s aborted", m.req_id)
                self._count("pd_cancelled")
                try:
                    client.pd_release(m.pd_request_id)
                except kvf.KvfError:
                    pass  # not arrived: the agent's claim timeout frees it
                return None
            left = deadline - time.monotonic()
            try:
                return client.pd_wait(m.pd_request_id,
                                      timeout=max(min(left, _PD_WAIT_SLICE_S),
                                                  0.001))
            except kvf.KvfError as e:
                if e.status != ERR_TIMEOUT or left <= _PD_WAIT_SLICE_S:
                    raise

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata,
                      **kwargs) -> None:
        if not self.has_connector_metadata():
            return
        li = self._layers[layer_name]
        if li == 0:
            self._pending = []
            for m in self._get_connector_metadata().requests:
                if m.save_keys and m.save_keys[self._rank]:
                    try:
                        slots = self.client.alloc(
                            self._chunk_bytes, len(m.save_keys[self._rank]))
                    except kvf.KvfError as e:
                        if (e.status in _AGENT_DOWN or
                                isinstance(e, _AgentAway)):
                            self._agent_failed("alloc", e)
                            break
                        self._alloc_refused(m, e)
                        continue
                    except OSError as e:
                        self._agent_failed("alloc", e)
                        break
                    self._pending.append((m, slots))
        C = self._chunk
        for m, slots in self._pending:
            for j, s in enumerate(slots):
                sm = self._slot_mapping(m, (m.save_first_chunk + j) * C)
                dst = self._chunk_view(self._client, s)
                self._layout.pack(self._kv, sm, dst, layer_begin=li,
                                  layer_count=1)
                del dst

    def wait_for_save(self):
        pending, self._pending = self._pending, []
        client = self._client
        saves = []
        # every PD push of the step starts before any is waited for: the
        # requests of one batch travel to their decoders at once
        for m, slots in pending:
            if self._broken:
                break
            try:
                sums = []
                for s in slots:
                    v = self._chunk_view(client, s)
                    sums.append(kvf.chunk_checksum(v))
                    del v
                chunks = [kvf.Slot(s.offset, self._chunk_bytes)
                          for s in slots]
                started = (m.pd_push_count > 0 and
                           self._pd_push_start(client, m, chunks, sums))
                saves.append((m, slots, chunks, sums, started))
            except _ERRORS as e:
                self._agent_failed("commit", e)
        for m, slots, chunks, sums, started in saves:
            if self._broken:
                break
            try:
                if started:
                    self._pd_push_wait(client, m)
                if m.pd_push_count > 0 and not m.pd_store:
                    client.release(slots)
                    continue
                client.commit(m.save_keys[self._rank], chunks, sums)
                for ev in m.save_events:
                    self._kv_event(ev)
                self._count("saved_chunks", len(slots))
                self._count("bytes_saved", len(slots) * self._chunk_bytes)
            except kvf.KvfError as e:
                if e.status in _AGENT_DOWN or isinstance(e, _AgentAway):
                    self._agent_failed("commit", e)
                else:
                    self._save_lost("save_failed", m, e,
                                    "the agent refused its commit")
            except OSError as e:
                self._agent_failed("commit", e)
        self._end_step()

    def _pd_push_start(self, client, m: ReqMeta, chunks, sums) -> bool:
        """Starts the push of the first m.pd_push_count chunks of this step
        to the decoder (``_pd_push_wait`` collects it); False when it could
        not start. A failure is logged, not raised: the decoder aborts the
        request and D recomputes. The slots stay untouched until the wait."""
        k = m.pd_push_count
        self._pd_sending.add(m.req_id)
        try:
            client.pd_push_start(m.pd_request_id,
                                 m.pd_decoder.format(rank=self._rank),
                                 chunks[:k], sums[:k], m.pd_final)
            return True
        except kvf.KvfError as e:
            self._pd_push_failed(m, e)
            return False

    def _pd_push_wait(self, client, m: ReqMeta) -> None:
        """Waits until the decoder verified the push (or it failed)."""
        try:
            client.pd_push_wait(m.pd_request_id)
            self._count("pd_pushes")
            self._count("pd_pushed_chunks", m.pd_push_count)
        except kvf.KvfError as e:
            self._pd_push_failed(m, e)

    def _pd_push_failed(self, m: ReqMeta, e: Exception) -> None:
        log.warning("kvfabric: PD push of %s (request %x) to %r: %s",
                    m.req_id, m.pd_request_id, m.pd_decoder, e)
        self._count("pd_push_errors")

    def get_finished(self, finished_req_ids):
        """(finished sending, finished receiving): the finished requests
        whose PD push this worker made (pushes complete in the step that
        scheduled them), and the PD loads the receive thread completed."""
        done = {r for r in finished_req_ids if r in self._pd_sending}
        self._pd_sending -= done
        with self._lock:
            recv, self._recv_done = self._recv_done, set()
        return (done or None), (recv or None)

    def _kv_event(self, ev) -> None:
        if ev is not None:
            self._kv_events[ev] = None

    def get_kv_connector_kv_cache_events(self) -> Optional[KVFabricKVEvents]:
        """This step's KV events of this worker: BlockStored for each chunk
        committed or loaded, BlockRemoved for each chunk found missing. An
        object (maybe empty) in every step whose metadata asked for events,
        so vLLM counts every worker (KVFabricKVEvents.aggregate)."""
        evs, self._kv_events = self._kv_events, {}
        if not self._events_on or not self.has_connector_metadata():
            return None
        if not any(m.load_events or m.save_events
                   for m in self._get_connector_metadata().requests):
            return None
        out = KVFabricKVEvents(num_workers=1)
        out.add_events(list(evs))
        return out

    def get_block_ids_with_load_errors(self) -> Set[int]:
        with self._lock:
            out, self._load_errors = self._load_errors, set()
        return out
