# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""KVFabricConnector: vLLM's KV connector interface (KVConnectorBase_V1)
over kvfabric. Import-safe without vLLM (a local stand-in of the base
class is used then); docs/integration-vllm.md shows the configuration.

Scheduler side (engine core process, connection to the local agent):

* ``get_num_new_matched_tokens``: chained keys of the prompt's full chunks,
  one lookup (with prefetch: the agent starts pulling remote chunks at
  once); answers the hit beyond what vLLM's own prefix cache holds, never
  the whole prompt (one token is always computed);
* ``update_state_after_alloc``: remembers which tokens to load;
* ``build_connector_meta``: per scheduled request, the slot mapping of its
  blocks, the chunks to load and the chunks that become complete in this
  step (to save), with their keys;
* ``request_finished``: forgets the request; blocks are freed at once
  (saves are synchronous), except after a PD push (below).

Worker side (one per GPU worker, connection to that worker's agent):

* ``register_kv_caches``: the per-layer flash-attention tensors
  ``[2][num_blocks][block_size][heads][dim]``;
* ``start_load_kv``: retrieve (fetched from peers when remote), unpack into
  the paged cache, release; chunks that could not be had are reported
  through ``get_block_ids_with_load_errors`` so vLLM recomputes them;
* ``wait_for_layer_load``: nothing to wait for (loads complete in
  start_load_kv);
* ``save_kv_layer``: packs this layer's rows of the chunks completed in
  this step into pool slots granted on the first layer;
* ``wait_for_save``: checksums and commits them;
* ``get_finished``: requests whose PD push is done, as finished sending.

PD push (a prefill instance pushing a request's KV straight into a decode
instance's receive region, kvf_pd_push/wait/release), in vLLM's P/D flow
(the proxy sends the request to P with ``max_tokens=1`` and
``kv_transfer_params={"do_remote_decode": true}``, then to D with the
``kv_transfer_params`` P's response carried):

* P (kv_role ``kv_producer`` or ``kv_both``): a request with
  ``do_remote_decode`` gets a PD request id (``kvf_request_id`` in its
  params, else derived from vLLM's id) and a decoder (``kvf_decoder`` in its
  params, else ``decoder`` in kv_connector_extra_config). Its full chunks
  but the one holding the last prompt token (D computes that token, as with
  vLLM's other P/D connectors) are packed per layer in ``save_kv_layer``
  and pushed in ``wait_for_save`` of the step that computed them
  (streaming), ``final`` with the last; they are then committed too
  (``pd_store``, default true), so the prefill side keeps them for prefix
  reuse. ``request_finished`` returns ``True`` (blocks held) and
  ``{"do_remote_prefill": true, "kvf_request_id", "kvf_decoder",
  "kvf_chunks", "kvf_chunk_size"}``; ``get_finished`` reports the request
  as finished sending, which frees the blocks.
* D (kv_role ``kv_consumer`` or ``kv_both``): a request whose params say
  ``do_remote_prefill`` with a ``kvf_request_id`` gets ``kvf_chunks``
  chunks as external tokens (no lookup); ``start_load_kv`` waits for the
  request (``pd_wait``, ``pd_wait_timeout_s``), unpacks, releases it. A
  failed wait (the push failed or P died: ``KVF_ERR_CANCELED``, or a
  timeout) reports the request's blocks through
  ``get_block_ids_with_load_errors`` so vLLM recomputes them. Loads are
  synchronous (``load_async`` False).
"""
import enum
import hashlib
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple

import kvfabric as kvf

log = logging.getLogger("kvfabric.vllm")

try:  # the real interface when vLLM is installed
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole)
    HAVE_VLLM = True
except ImportError:
    HAVE_VLLM = False

    class KVConnectorRole(enum.Enum):
        SCHEDULER = 0
        WORKER = 1

    class KVConnectorMetadata:
        """Scheduler -> worker metadata of one step."""

    class KVConnectorBase_V1:
        """Stand-in with vLLM's constructor and metadata plumbing, so this
        module imports and its logic runs without vLLM."""

        def __init__(self, vllm_config, role, kv_cache_config=None):
            self._connector_metadata = None
            self._vllm_config = vllm_config
            self._kv_transfer_config = vllm_config.kv_transfer_config
            self._kv_cache_config = kv_cache_config
            self._role = role

        @property
        def role(self):
            return self._role

        def bind_connector_metadata(self, connector_metadata):
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self):
            self._connector_metadata = None

        def _get_connector_metadata(self):
            assert self._connector_metadata is not None
            return self._connector_metadata

        def has_connector_metadata(self):
            return self._connector_metadata is not None

        def register_kv_caches(self, kv_caches):
            return

        def get_finished(self, finished_req_ids):
            return None, None

        def get_block_ids_with_load_errors(self):
            return set()

        def request_finished(self, request, block_ids):
            return False, None


@dataclass
class ReqMeta:
    """One request's work in one step (built by the scheduler side)."""
    req_id: str
    slot_mapping: List[int]            # slot of every token with a block
    load_start: int = 0                # tokens [load_start, load_end) load
    load_end: int = 0
    load_keys: List[Any] = field(default_factory=list)   # chunks to fetch
    load_first_chunk: int = 0
    save_keys: List[Any] = field(default_factory=list)   # chunks to store
    save_first_chunk: int = 0
    # PD, producer: push the first pd_push_count chunks of save_keys
    pd_request_id: int = 0
    pd_decoder: str = ""
    pd_push_count: int = 0
    pd_final: bool = False
    pd_store: bool = True              # commit the saved chunks as well
    # PD, consumer: the load comes from PD request pd_request_id
    pd_load: bool = False


@dataclass
class KVFabricConnectorMetadata(KVConnectorMetadata):
    requests: List[ReqMeta] = field(default_factory=list)


@dataclass
class _ReqState:
    tokens: List[int]
    keys: List[Any]
    block_ids: List[int]
    hit_chunks: int = 0          # chunks the fabric held at lookup
    saved_chunks: int = 0        # chunks [0, saved) are held or saved
    lookup: Optional[Tuple[int, int]] = None  # (vLLM's computed, hit)
    load: Optional[Tuple[int, int]] = None
    # PD, producer: (request id, decoder, chunks to push); chunks scheduled
    pd_push: Optional[Tuple[int, str, int]] = None
    pd_pushed: int = 0
    # PD, consumer: (request id, chunks pushed); cleared once scheduled
    pd_recv: Optional[Tuple[int, int]] = None
    pd_load: bool = False        # the pending load comes from pd_recv


def _extra(cfg) -> Dict[str, Any]:
    ktc = cfg.kv_transfer_config
    return dict(getattr(ktc, "kv_connector_extra_config", None) or {})


def _model_shape(cfg, extra):
    """(model_id, dtype name, layers, kv heads, head dim, tp rank, tp world)
    from vLLM's config, each overridable in kv_connector_extra_config."""
    mc, pc = cfg.model_config, cfg.parallel_config
    model_id = extra.get("model_id") or str(mc.model)
    dtype = str(extra.get("dtype") or getattr(cfg.cache_config, "cache_dtype",
                                              "auto"))
    if dtype == "auto":
        dtype = str(mc.dtype)
    layers = int(extra.get("num_layers") or mc.get_num_layers(pc))
    heads = int(extra.get("num_kv_heads") or mc.get_num_kv_heads(pc))
    head_dim = int(extra.get("head_dim") or mc.get_head_size())
    rank = int(extra.get("tp_rank", getattr(pc, "rank", 0)))
    world = int(extra.get("tp_world", getattr(pc, "tensor_parallel_size", 1)))
    return model_id, dtype.replace("torch.", ""), layers, heads, head_dim, \
        rank % world, world


class KVFabricConnector(KVConnectorBase_V1):
    """kv_transfer_config:
    ``{"kv_connector": "KVFabricConnector",
    "kv_connector_module_path": "kvfabric.vllm_connector",
    "kv_role": "kv_both", "kv_connector_extra_config": {"socket": ...,
    "chunk_size": 256}}``."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        if HAVE_VLLM:
            super().__init__(vllm_config, role, kv_cache_config)
        else:
            KVConnectorBase_V1.__init__(self, vllm_config, role,
                                        kv_cache_config)
        extra = _extra(vllm_config)
        ktc = vllm_config.kv_transfer_config
        self._kv_role = getattr(ktc, "kv_role", None) or "kv_both"
        self._block_size = int(vllm_config.cache_config.block_size)
        self._chunk = int(extra.get("chunk_size", kvf.keys.DEFAULT_CHUNK_SIZE))
        if self._chunk % self._block_size:
            raise ValueError(f"kvfabric: chunk_size {self._chunk} must be a "
                             f"multiple of block_size {self._block_size}")
        (model_id, dtype, layers, heads, head_dim, rank,
         world) = _model_shape(vllm_config, extra)
        self._ns = kvf.namespace_fingerprint(
            model_id, dtype, layers, heads, head_dim, tp_rank=rank,
            tp_world=world, chunk_size=self._chunk)
        self._socket = str(extra.get("socket", "/run/kvfabric/agent.sock")
                           ).format(rank=rank)
        self._timeout = float(extra.get("timeout_s", 5.0))
        self._prefetch = bool(extra.get("prefetch", True))
        # "{rank}" in a decoder name becomes the pushing worker's TP rank
        self._decoder = str(extra.get("decoder", ""))
        self._rank = rank
        self._pd_store = bool(extra.get("pd_store", True))
        self._pd_wait_timeout = float(extra.get("pd_wait_timeout_s", 30.0))
        self._nonce = os.urandom(8).hex()
        self._client: Optional[kvf.Client] = None
        # scheduler side
        self._reqs: Dict[str, _ReqState] = {}
        # worker side
        self._layers: Dict[str, int] = {}
        self._kv: List[Any] = []
        self._layout = None
        self._pending: List[Tuple[ReqMeta, List[kvf.Slot]]] = []
        self._load_errors: Set[int] = set()
        self._pd_sending: Set[str] = set()   # requests with a PD push
        self.stats = dict(lookups=0, hit_tokens=0, loaded_chunks=0,
                          saved_chunks=0, missed_chunks=0, pd_pushes=0,
                          pd_pushed_chunks=0, pd_push_errors=0,
                          pd_received_chunks=0, pd_wait_errors=0)

    # shared ------------------------------------------------------------

    @property
    def client(self) -> kvf.Client:
        if self._client is None:
            self._client = kvf.Client(self._socket, timeout=self._timeout,
                                      name=f"vllm-{self.role.name.lower()}")
        return self._client

    @property
    def is_producer(self) -> bool:
        return self._kv_role in ("kv_producer", "kv_both")

    @property
    def is_consumer(self) -> bool:
        return self._kv_role in ("kv_consumer", "kv_both")

    def shutdown(self):
        if self._client is not None:
            self._client.close(force=True)
            self._client = None

    # scheduler side ----------------------------------------------------

    def _state(self, request) -> _ReqState:
        st = self._reqs.get(request.request_id)
        if st is None:
            tokens = list(request.prompt_token_ids)
            st = _ReqState(tokens, kvf.key_chain(self._ns, tokens,
                                                 self._chunk), [])
            self._pd_state(request, st)
            self._reqs[request.request_id] = st
        return st

    def _pd_request_id(self, req_id: str) -> int:
        """A PD request id for vLLM request @p req_id: 63 bits of a hash
        of it and this instance's nonce (unique among a decoder's
        requests in flight in practice), never 0."""
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

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int
                                   ) -> Tuple[int, bool]:
        st = self._state(request)
        if st.pd_recv is not None:
            # pushed by the prefill instance: no lookup, wait for it
            n = st.pd_recv[1]
            hit = min(n * self._chunk,
                      ((len(st.tokens) - 1) // self._chunk) * self._chunk)
            if n == 0:
                st.pd_recv = None
                return 0, False
            # the load also claims and releases the pushed request, even
            # when vLLM's own prefix cache already holds all of it
            st.lookup = (num_computed_tokens, max(hit, num_computed_tokens))
            st.pd_load = True
            return max(hit - num_computed_tokens, 0), False
        if not self.is_consumer or not st.keys:
            return 0, False
        r = self.client.lookup(st.keys, prefetch=self._prefetch)
        self.stats["lookups"] += 1
        st.hit_chunks = r.hit_chunks
        if st.pd_push is None:  # loaded chunks are pushed all the same
            st.saved_chunks = max(st.saved_chunks, r.hit_chunks)
        hit = r.hit_chunks * self._chunk
        # vLLM must compute at least the last prompt token
        if hit >= len(st.tokens):
            hit = ((len(st.tokens) - 1) // self._chunk) * self._chunk
        if hit <= num_computed_tokens:
            st.lookup = None
            return 0, False
        st.lookup = (num_computed_tokens, hit)
        return hit - num_computed_tokens, False

    def update_state_after_alloc(self, request, blocks,
                                 num_external_tokens: int):
        st = self._state(request)
        if st.pd_load and st.lookup is not None:
            start = st.lookup[0]
            st.load = (start, start + num_external_tokens)
        elif num_external_tokens > 0 and st.lookup is not None:
            start = st.lookup[0]
            st.load = (start, start + num_external_tokens)

    def _slot_mapping(self, block_ids: List[int]) -> List[int]:
        bs = self._block_size
        return [b * bs + o for b in block_ids for o in range(bs)]

    def _req_meta(self, req_id: str, st: _ReqState, computed_end: int
                  ) -> Optional[ReqMeta]:
        m = ReqMeta(req_id, self._slot_mapping(st.block_ids))
        C = self._chunk
        if st.load is not None:
            m.load_start, m.load_end = st.load
            first = m.load_start // C
            m.load_first_chunk = first
            m.load_keys = st.keys[first:m.load_end // C]
            st.load = None
            if st.pd_load:
                # every pushed chunk is claimed; those before load_start
                # (vLLM's own prefix cache) are skipped by the worker
                m.pd_load, m.pd_request_id = True, st.pd_recv[0]
                m.load_first_chunk, m.load_keys = 0, []
                st.pd_load, st.pd_recv = False, None
        if self.is_producer:
            full = min(computed_end, len(st.tokens)) // C
            if full > st.saved_chunks:
                m.save_first_chunk = st.saved_chunks
                m.save_keys = st.keys[st.saved_chunks:full]
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
        if not m.load_keys and not m.save_keys and not m.pd_load:
            return None
        return m

    def build_connector_meta(self, scheduler_output
                             ) -> KVFabricConnectorMetadata:
        meta = KVFabricConnectorMetadata()
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
        for i, req_id in enumerate(getattr(cached, "req_ids", [])):
            st = self._reqs.get(req_id)
            if st is None:
                continue
            new_blocks = cached.new_block_ids[i]
            if new_blocks is not None:
                st.block_ids.extend(new_blocks[0])
            m = self._req_meta(req_id, st, cached.num_computed_tokens[i] +
                               nst.get(req_id, 0))
            if m is not None:
                meta.requests.append(m)
        return meta

    def request_finished(self, request, block_ids
                         ) -> Tuple[bool, Optional[Dict[str, Any]]]:
        """A PD-pushed request keeps its blocks until the worker reports it
        finished sending (get_finished), and hands D its PD request in
        kv_transfer_params (once the final push was scheduled: a request
        aborted half-way is aborted at the decoder when no push follows,
        and D is given nothing to wait for)."""
        st = self._reqs.pop(request.request_id, None)
        if st is None or st.pd_push is None:
            return False, None
        rid, decoder, n = st.pd_push
        params = None
        if st.pd_pushed == n:
            params = dict(do_remote_prefill=True, do_remote_decode=False,
                          kvf_request_id=rid, kvf_decoder=decoder,
                          kvf_chunks=n, kvf_chunk_size=self._chunk)
        return st.pd_pushed > 0, params

    # worker side -------------------------------------------------------

    def register_kv_caches(self, kv_caches: Dict[str, Any]):
        from .layout import vllm_layout

        self._layers = {name: i for i, name in enumerate(kv_caches)}
        self._kv = list(kv_caches.values())
        self._layout = vllm_layout(self._kv)
        self._chunk_bytes = self._layout.chunk_bytes(self._chunk)

    def _chunk_view(self, slot: kvf.Slot):
        return self.client.slot_tensor(kvf.Slot(slot.offset,
                                                self._chunk_bytes),
                                       self._layout.dtype)

    def start_load_kv(self, forward_context, **kwargs) -> None:
        import torch

        meta = self._get_connector_metadata()
        C = self._chunk
        for m in meta.requests:
            if m.pd_load:
                self._pd_load(m)
                continue
            if not m.load_keys:
                continue
            slots, missing = self.client.retrieve(m.load_keys)
            try:
                for j, (s, miss) in enumerate(zip(slots, missing)):
                    c0 = (m.load_first_chunk + j) * C
                    sm = torch.tensor(m.slot_mapping[c0:c0 + C],
                                      dtype=torch.int64)
                    # tokens vLLM already holds (local prefix) stay as are
                    sm[:max(m.load_start - c0, 0)] = -1
                    if miss:
                        self.stats["missed_chunks"] += 1
                        bs = self._block_size
                        self._load_errors.update(
                            int(x) // bs for x in sm.tolist() if x >= 0)
                        continue
                    src = self._chunk_view(s)
                    self._layout.unpack(self._kv, sm, src)
                    del src
                    self.stats["loaded_chunks"] += 1
            finally:
                self.client.release(slots)

    def _load_failed(self, m: ReqMeta, c0: int, c1: int) -> None:
        """Tokens [c0, c1) of @p m could not be loaded: their blocks go to
        get_block_ids_with_load_errors (vLLM recomputes them)."""
        bs = self._block_size
        self._load_errors.update(
            x // bs for x in m.slot_mapping[max(c0, m.load_start):c1]
            if x >= 0)

    def _pd_load(self, m: ReqMeta) -> None:
        """Waits for PD request m.pd_request_id, unpacks its chunks into
        tokens [load_start, load_end), releases it."""
        import torch

        C = self._chunk
        need = (m.load_end + C - 1) // C
        try:
            slots = self.client.pd_wait(m.pd_request_id,
                                        timeout=self._pd_wait_timeout)
        except kvf.KvfError as e:
            log.error("kvfabric: PD request %x (%s): %s; recomputed",
                      m.pd_request_id, m.req_id, e)
            self.stats["pd_wait_errors"] += 1
            self._load_failed(m, 0, m.load_end)
            try:  # a timed-out request may still arrive: give it back
                self.client.pd_release(m.pd_request_id)
            except kvf.KvfError:
                pass
            return
        try:
            self.stats["pd_received_chunks"] += len(slots)
            for j in range(need):
                c0 = j * C
                c1 = min(c0 + C, m.load_end)
                if c1 <= m.load_start:
                    continue
                if j >= len(slots) or slots[j].length != self._chunk_bytes:
                    self.stats["missed_chunks"] += 1
                    self._load_failed(m, c0, c1)
                    continue
                sm = torch.tensor(m.slot_mapping[c0:c0 + C],
                                  dtype=torch.int64)
                sm[:max(m.load_start - c0, 0)] = -1
                sm[c1 - c0:] = -1
                src = self._chunk_view(slots[j])
                self._layout.unpack(self._kv, sm, src)
                del src
                self.stats["loaded_chunks"] += 1
        finally:
            self.client.pd_release(m.pd_request_id)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata,
                      **kwargs) -> None:
        import torch

        if not self.has_connector_metadata():
            return
        li = self._layers[layer_name]
        if li == 0:
            self._pending = []
            for m in self._get_connector_metadata().requests:
                if m.save_keys:
                    self._pending.append(
                        (m, self.client.alloc(self._chunk_bytes,
                                              len(m.save_keys))))
        C = self._chunk
        for m, slots in self._pending:
            for j, s in enumerate(slots):
                c0 = (m.save_first_chunk + j) * C
                sm = torch.tensor(m.slot_mapping[c0:c0 + C],
                                  dtype=torch.int64)
                dst = self._chunk_view(s)
                self._layout.pack(self._kv, sm, dst, layer_begin=li,
                                  layer_count=1)
                del dst

    def wait_for_save(self):
        pending, self._pending = self._pending, []
        for m, slots in pending:
            sums = []
            for s in slots:
                v = self._chunk_view(s)
                sums.append(kvf.chunk_checksum(v))
                del v
            chunks = [kvf.Slot(s.offset, self._chunk_bytes) for s in slots]
            if m.pd_push_count > 0:
                self._pd_push(m, chunks, sums)
            if m.pd_push_count > 0 and not m.pd_store:
                self.client.release(slots)
                continue
            self.client.commit(m.save_keys, chunks, sums)
            self.stats["saved_chunks"] += len(slots)

    def _pd_push(self, m: ReqMeta, chunks, sums) -> None:
        """Pushes the first m.pd_push_count chunks of this step to the
        decoder (returns once it verified them). A failure is logged, not
        raised: the decoder aborts the request and D recomputes."""
        k = m.pd_push_count
        self._pd_sending.add(m.req_id)
        try:
            self.client.pd_push(m.pd_request_id,
                                m.pd_decoder.format(rank=self._rank),
                                chunks[:k], sums[:k], m.pd_final)
            self.stats["pd_pushes"] += 1
            self.stats["pd_pushed_chunks"] += k
        except kvf.KvfError as e:
            log.error("kvfabric: PD push of %s (request %x) to %r: %s",
                      m.req_id, m.pd_request_id, m.pd_decoder, e)
            self.stats["pd_push_errors"] += 1

    def get_finished(self, finished_req_ids):
        """(finished sending, finished receiving): the finished requests
        whose PD push this worker made (their pushes completed in the step
        that scheduled them); nothing is received asynchronously."""
        done = {r for r in finished_req_ids if r in self._pd_sending}
        self._pd_sending -= done
        return (done or None), None

    def get_block_ids_with_load_errors(self) -> Set[int]:
        out, self._load_errors = self._load_errors, set()
        return out
