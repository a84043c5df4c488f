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
  (saves are synchronous).

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
* ``get_finished``: (None, None): no transfer outlives a step.

PD push (kv_role ``kv_producer`` pushing to a named decoder) depends on
kvf_pd_push/kvf_pd_wait/kvf_pd_release, which libkvfabric does not export
yet (``kvfabric.HAS_PD``); until then producer/consumer roles share KV
through store + lookup, which needs no request-id handshake.
"""
import enum
import logging
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
        self._client: Optional[kvf.Client] = None
        # scheduler side
        self._reqs: Dict[str, _ReqState] = {}
        # worker side
        self._layers: Dict[str, int] = {}
        self._kv: List[Any] = []
        self._layout = None
        self._pending: List[Tuple[ReqMeta, List[kvf.Slot]]] = []
        self._load_errors: Set[int] = set()
        self.stats = dict(lookups=0, hit_tokens=0, loaded_chunks=0,
                          saved_chunks=0, missed_chunks=0)

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
            self._reqs[request.request_id] = st
        return st

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int
                                   ) -> Tuple[int, bool]:
        st = self._state(request)
        if not self.is_consumer or not st.keys:
            return 0, False
        r = self.client.lookup(st.keys, prefetch=self._prefetch)
        self.stats["lookups"] += 1
        st.hit_chunks = r.hit_chunks
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
        if num_external_tokens > 0 and st.lookup is not None:
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
        if self.is_producer:
            full = min(computed_end, len(st.tokens)) // C
            if full > st.saved_chunks:
                m.save_first_chunk = st.saved_chunks
                m.save_keys = st.keys[st.saved_chunks:full]
                st.saved_chunks = full
        if not m.load_keys and not m.save_keys:
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
        self._reqs.pop(request.request_id, None)
        return False, None

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
        for m, slots in self._pending:
            sums = []
            for s in slots:
                v = self._chunk_view(s)
                sums.append(kvf.chunk_checksum(v))
                del v
            self.client.commit(m.save_keys,
                               [kvf.Slot(s.offset, self._chunk_bytes)
                                for s in slots], sums)
            self.stats["saved_chunks"] += len(slots)
        self._pending = []

    def get_finished(self, finished_req_ids):
        return None, None

    def get_block_ids_with_load_errors(self) -> Set[int]:
        out, self._load_errors = self._load_errors, set()
        return out
