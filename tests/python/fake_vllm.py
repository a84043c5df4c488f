# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""A faithful fake of vLLM's v1 KV connector interface, for testing
kvfabric.vllm_connector without vLLM.

``install()`` puts modules named as vLLM's into sys.modules
(vllm.distributed.kv_transfer.kv_connector.v1.base with KVConnectorRole,
KVConnectorMetadata, KVConnectorBase_V1), so the connector imports them
exactly as it would import vLLM's. ``FakeEngine`` drives a connector pair
(scheduler role + worker role) in the order vLLM's scheduler and GPU model
runner do, around a real model (kvfabric.testing.tiny_gpt) whose per-layer
caches are vLLM flash-attention tensors:

  scheduler, per step: for a waiting request, local prefix-cache hit
  (none here) -> get_num_new_matched_tokens(request, num_local) ->
  allocate blocks -> update_state_after_alloc(request, blocks, num_external)
  -> request.num_computed_tokens = num_local + num_external; schedule up to
  the token budget -> build_connector_meta(scheduler_output);
  worker, per step: bind_connector_metadata(meta) -> start_load_kv(ctx) ->
  per attention layer: wait_for_layer_load(name), attention writes the
  layer's KV, save_kv_layer(name, kv_cache, attn_metadata) ->
  wait_for_save() -> get_finished(finished_ids) ->
  get_block_ids_with_load_errors() -> clear_connector_metadata();
  when a request finishes: request_finished(request, block_ids) -> free
  blocks unless the connector delays it (returns True); the request id
  goes into the next step's scheduler_output.finished_req_ids, which the
  worker passes to get_finished(); a delayed request's blocks are freed
  when get_finished reports it as finished sending. While such requests
  remain, the engine keeps stepping with nothing scheduled (vLLM's
  kv_connector_no_forward: bind, start_load_kv, get_finished, clear; no
  wait_for_save).

P/D (vLLM's disaggregated-prefill proxy): a request carries
``kv_transfer_params`` (from the API's ``kv_transfer_params`` field);
request_finished's second value is what the response hands back, and the
proxy passes it on unchanged as the next instance's request params.

Signatures follow vLLM's base.py (KVConnectorBase_V1 with the
kv_cache_config constructor argument, SchedulerOutput with
scheduled_new_reqs / scheduled_cached_reqs as CachedRequestData of lists,
KVCacheBlocks.get_block_ids() returning one list per KV cache group).
"""
import enum
import sys
import types
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import torch


# vllm.distributed.kv_transfer.kv_connector.v1.base -------------------------

class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


class KVConnectorMetadata(ABC):  # noqa: B024 (as vLLM's)
    pass


class KVConnectorBase_V1(ABC):
    def __init__(self, vllm_config, role, kv_cache_config):
        self._connector_metadata = None
        self._vllm_config = vllm_config
        if vllm_config.kv_transfer_config is None:
            raise ValueError("kv_transfer_config must be set")
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

    @abstractmethod
    def start_load_kv(self, forward_context, **kwargs):
        pass

    @abstractmethod
    def wait_for_layer_load(self, layer_name):
        pass

    @abstractmethod
    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass

    @abstractmethod
    def wait_for_save(self):
        pass

    def get_finished(self, finished_req_ids):
        return None, None

    def get_block_ids_with_load_errors(self):
        return set()

    def shutdown(self):
        return None

    @abstractmethod
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        pass

    @abstractmethod
    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        pass

    @abstractmethod
    def build_connector_meta(self, scheduler_output):
        pass

    def request_finished(self, request, block_ids):
        return False, None


def install():
    """Registers the fake under vLLM's module names (idempotent)."""
    names = ["vllm", "vllm.distributed", "vllm.distributed.kv_transfer",
             "vllm.distributed.kv_transfer.kv_connector",
             "vllm.distributed.kv_transfer.kv_connector.v1",
             "vllm.distributed.kv_transfer.kv_connector.v1.base"]
    for n in names:
        sys.modules.setdefault(n, types.ModuleType(n))
    base = sys.modules[names[-1]]
    base.KVConnectorRole = KVConnectorRole
    base.KVConnectorMetadata = KVConnectorMetadata
    base.KVConnectorBase_V1 = KVConnectorBase_V1


def uninstall():
    for n in list(sys.modules):
        if n == "vllm" or n.startswith("vllm."):
            del sys.modules[n]


# configs --------------------------------------------------------------------

@dataclass
class KVTransferConfig:
    kv_connector: str
    kv_role: str
    kv_connector_module_path: Optional[str] = None
    kv_connector_extra_config: Dict[str, Any] = field(default_factory=dict)


class ModelConfig:
    def __init__(self, model, dtype, layers, kv_heads, head_dim):
        self.model, self.dtype = model, dtype
        self._l, self._h, self._d = layers, kv_heads, head_dim

    def get_num_layers(self, parallel_config):
        return self._l

    def get_num_kv_heads(self, parallel_config):
        return self._h // parallel_config.tensor_parallel_size

    def get_head_size(self):
        return self._d


@dataclass
class CacheConfig:
    block_size: int
    cache_dtype: str = "auto"


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    rank: int = 0


@dataclass
class VllmConfig:
    model_config: ModelConfig
    cache_config: CacheConfig
    parallel_config: ParallelConfig
    kv_transfer_config: KVTransferConfig


# scheduler objects ----------------------------------------------------------

@dataclass
class Request:
    request_id: str
    prompt_token_ids: List[int]
    max_tokens: int
    num_computed_tokens: int = 0
    output_token_ids: List[int] = field(default_factory=list)
    kv_transfer_params: Optional[Dict[str, Any]] = None

    @property
    def all_token_ids(self):
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self):
        return len(self.all_token_ids)


class KVCacheBlocks:
    def __init__(self, block_ids: List[int]):
        self._ids = list(block_ids)

    def get_block_ids(self):
        return (list(self._ids),)


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: List[int]
    block_ids: tuple
    num_computed_tokens: int


@dataclass
class CachedRequestData:
    req_ids: List[str] = field(default_factory=list)
    new_token_ids: List[List[int]] = field(default_factory=list)
    new_block_ids: List[Optional[tuple]] = field(default_factory=list)
    num_computed_tokens: List[int] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: List[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: Dict[str, int]
    total_num_scheduled_tokens: int
    finished_req_ids: set
    kv_connector_metadata: Any = None


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor


@dataclass
class ForwardContext:
    no_compile_layers: Dict[str, Any]
    attn_metadata: Any
    virtual_engine: int = 0


# the engine ----------------------------------------------------------------

class _Hooks:
    def __init__(self, conn, names, kv, attn):
        self.conn, self.names, self.kv, self.attn = conn, names, kv, attn

    def before_layer(self, i):
        self.conn.wait_for_layer_load(self.names[i])

    def after_layer(self, i):
        self.conn.save_kv_layer(self.names[i], self.kv[i], self.attn)


class FakeEngine:
    """vLLM's scheduler + one GPU worker, one request at a time, chunked
    prefill with a token budget, around kvfabric.testing.tiny_gpt."""

    def __init__(self, model, connector_cls, extra: Dict[str, Any],
                 kv_role: str = "kv_both", num_blocks: int = 64,
                 block_size: int = 16, budget: int = 16):
        c = model.cfg
        self.model = model
        self.block_size = block_size
        self.budget = budget
        self.cfg = VllmConfig(
            ModelConfig(c.model_id, torch.bfloat16, c.layers, c.n_kv_heads,
                        c.head_dim),
            CacheConfig(block_size), ParallelConfig(),
            KVTransferConfig("KVFabricConnector", kv_role,
                             "kvfabric.vllm_connector", dict(extra)))
        self.sched = connector_cls(self.cfg, KVConnectorRole.SCHEDULER, None)
        self.worker = connector_cls(self.cfg, KVConnectorRole.WORKER, None)
        self.names = [f"model.layers.{i}.self_attn.attn"
                      for i in range(c.layers)]
        self.kv = [torch.zeros(2, num_blocks, block_size, c.n_kv_heads,
                               c.head_dim, dtype=torch.bfloat16)
                   for _ in range(c.layers)]
        self.worker.register_kv_caches(dict(zip(self.names, self.kv)))
        # a free list that does not hand out blocks in order
        g = torch.Generator().manual_seed(num_blocks)
        self.free = torch.randperm(num_blocks, generator=g).tolist()
        self.computed_prompt_tokens = 0
        self.external_tokens = 0
        self.load_errors = set()
        self.finished_req_ids = set()   # for the next step's output
        self.delayed = {}               # req id -> blocks held for a send
        self.finished_sending = set()
        self.kv_transfer_params = None  # of the last finished request
        self.idle_steps = 0

    def _scheduler_output(self, new, cached, nst):
        fin, self.finished_req_ids = self.finished_req_ids, set()
        so = SchedulerOutput(new, cached, nst, sum(nst.values()), fin)
        so.kv_connector_metadata = self.sched.build_connector_meta(so)
        return so

    def _kv_output(self, so):
        """The end of the worker's connector context: get_finished with the
        output's finished ids, load errors, clear; the scheduler then frees
        the blocks of requests finished sending."""
        sending, recving = self.worker.get_finished(so.finished_req_ids)
        assert recving is None  # nothing is loaded asynchronously here
        self.load_errors |= self.worker.get_block_ids_with_load_errors()
        self.worker.clear_connector_metadata()
        for r in sending or ():
            assert r in self.delayed, f"{r} reported but not delayed"
            self.free.extend(self.delayed.pop(r))
            self.finished_sending.add(r)

    def idle_step(self):
        """A step with nothing scheduled (vLLM kv_connector_no_forward)."""
        so = self._scheduler_output([], CachedRequestData(), {})
        self.worker.bind_connector_metadata(so.kv_connector_metadata)
        self.worker.start_load_kv(ForwardContext({}, None))
        self._kv_output(so)
        self.idle_steps += 1

    def _alloc(self, n):
        out, self.free = self.free[:n], self.free[n:]
        return out

    def generate(self, req_id: str, prompt: List[int], max_tokens: int,
                 kv_transfer_params: Optional[Dict[str, Any]] = None):
        """Serves one request; returns (tokens, logits [max_tokens, vocab])
        of greedy decoding. The request's output kv_transfer_params are
        left in ``self.kv_transfer_params``."""
        from kvfabric.testing.tiny_gpt import PagedCache

        req = Request(req_id, list(prompt), max_tokens,
                      kv_transfer_params=kv_transfer_params)
        bs = self.block_size
        # --- scheduler: admit the request
        num_local = 0  # vLLM's own prefix cache: empty in this engine
        ext, load_async = self.sched.get_num_new_matched_tokens(req,
                                                                num_local)
        assert not load_async
        total = len(prompt) + max_tokens
        blocks = self._alloc((total + bs - 1) // bs)
        self.sched.update_state_after_alloc(req, KVCacheBlocks(blocks), ext)
        req.num_computed_tokens = num_local + ext
        self.external_tokens += ext
        slots = torch.tensor([b * bs + o for b in blocks for o in range(bs)])
        lay = self.model.layout("vllm", len(self.kv[0][0]) * bs)
        cache = PagedCache(lay, self.kv, slots)

        logits, first = [], True
        while len(req.output_token_ids) < max_tokens:
            # --- scheduler: one step
            if req.num_computed_tokens < len(prompt):
                n = min(self.budget, len(prompt) - req.num_computed_tokens)
            else:
                n = 1
            if first:
                new = [NewRequestData(req_id, list(prompt), (list(blocks),),
                                      req.num_computed_tokens)]
                cached = CachedRequestData()
            else:
                new = []
                cached = CachedRequestData([req_id], [[]], [None],
                                           [req.num_computed_tokens])
            so = self._scheduler_output(new, cached, {req_id: n})
            first = False
            # --- worker: one forward
            start = req.num_computed_tokens
            attn = AttentionMetadata(slots[start:start + n])
            ctx = ForwardContext({nm: None for nm in self.names}, attn)
            self.worker.bind_connector_metadata(so.kv_connector_metadata)
            self.worker.start_load_kv(ctx)
            hooks = _Hooks(self.worker, self.names, self.kv, attn)
            toks = req.all_token_ids[start:start + n]
            lg = self.model.forward(cache, toks, start,
                                    torch.arange(start, start + n),
                                    torch.zeros(n, dtype=torch.int64),
                                    hooks=hooks)
            self.worker.wait_for_save()
            self._kv_output(so)
            if start < len(prompt):
                self.computed_prompt_tokens += n
            # --- scheduler: update from the output
            req.num_computed_tokens += n
            if req.num_computed_tokens >= len(prompt):
                logits.append(lg[-1])
                req.output_token_ids.append(int(torch.argmax(lg[-1])))
        delay, params = self.sched.request_finished(req, list(blocks))
        self.kv_transfer_params = params
        self.finished_req_ids.add(req_id)
        if delay:
            self.delayed[req_id] = blocks
        else:
            self.free.extend(blocks)
        for _ in range(8):  # the engine steps on while sends are pending
            if not self.delayed:
                break
            self.idle_step()
        assert not self.delayed, f"never finished sending: {self.delayed}"
        return req.output_token_ids, torch.stack(logits)

    def shutdown(self):
        self.sched.shutdown()
        self.worker.shutdown()
