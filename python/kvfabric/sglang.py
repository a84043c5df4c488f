# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""KvfabricStore: an SGLang HiCache storage backend (L3) over kvfabric.

SGLang loads it with its own factory (``--hicache-storage-backend dynamic``)::

    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvfabric",
        "module_path": "kvfabric.sglang", "class_name": "KvfabricStore",
        "interface_v1": 1, "socket": "/run/kvfabric/gpu0/agent.sock"}'

and constructs it as ``KvfabricStore(storage_config, kwargs)``; the cache
controller then calls ``register_mem_pool_host`` with its host KV pool, and
with ``interface_v1`` uses the zero-copy ``batch_get_v1``/``batch_set_v1``:
each page moves between the host pool's page buffers
(``get_page_buffer_meta``) and one pool slot of the local agent with one
memmove per buffer, no tensor in between.

Mapping (docs/integration-sglang.md):

* one SGLang page = one kvfabric chunk (chunk size = page size in tokens);
  the chunk's bytes are the page's buffers in order: K then V for MHA
  (``page_first`` or ``page_first_direct`` layout), the one latent buffer
  for MLA;
* a page key (SGLang's chained hex SHA-256 of the page's tokens and its
  prefix) becomes ``key_from_digest(ns, bytes.fromhex(key))``;
* the namespace ``ns`` is ``namespace_fingerprint`` of the model name (with
  the pipeline and context-parallel shard, as SGLang's own backends suffix
  their keys), the pool's dtype, layers, heads and head size, the TP rank
  and size (MLA: rank 0 of 1, all ranks share one copy and only the
  storage writer stores) and the page size; the layout version says how
  the bytes are ordered: ``page_first_direct`` pages are kvfabric's
  ``KV_2LTD`` (the vLLM connector's chunks), ``page_first`` pages are
  ``[2][T][L][H*D]`` and get a namespace of their own.

Lookups (``exists``, ``batch_exists``) ask the whole cluster: a page another
node stored counts, and ``batch_get_v1`` fetches it over the fabric.

extra_config keys (all optional but the factory's): ``socket`` (the agent's
socket, else ``KVF_SOCKET``, else the library default), ``timeout`` (s per
call), ``secret_file``, ``model_id`` (instead of SGLang's model name) and,
for the tensor API used without a registered host pool, ``dtype``,
``num_layers``, ``num_kv_heads``, ``head_dim``, ``page_size``.
"""
import ctypes
import logging
from typing import Any, List, Optional

import torch
from sglang.srt.mem_cache.hicache_storage import (HiCacheStorage,
                                                  HiCacheStorageConfig,
                                                  HiCacheStorageExtraInfo)

from . import _lib
from .client import Client
from .errors import KvfError
from .keys import (LAYOUT_VERSION, Key, dtype_code, key_from_digest,
                   namespace_fingerprint)

logger = logging.getLogger(__name__)

# Layout versions in the namespace: how a chunk's bytes are ordered.
LAYOUT_KV_2LTD = LAYOUT_VERSION  # page_first_direct: [2][L][T][H*D]
LAYOUT_SGLANG_PAGE_FIRST = 0x53470001  # page_first: [2][T][L][H*D]
LAYOUT_SGLANG_MLA = 0x53470002  # MLA latent page: [T][L][D]

_LAYOUTS = {"page_first_direct": LAYOUT_KV_2LTD,
            "page_first": LAYOUT_SGLANG_PAGE_FIRST}


def page_key(ns: int, key: str) -> Key:
    """The kvfabric key of an SGLang page key: its digest bytes when it is
    hex (SGLang's SHA-256 page hashes), else its UTF-8 bytes."""
    try:
        digest = bytes.fromhex(key)
    except ValueError:
        digest = b""
    return key_from_digest(ns, digest if digest else key.encode())


class KvfabricStore(HiCacheStorage):
    """SGLang HiCacheStorage over the local kvf-agent (see module doc).

    Thread-safety: SGLang calls a backend from its prefetch and backup
    threads; every call takes the Client's lock, so they serialize."""

    def __init__(self, storage_config: HiCacheStorageConfig,
                 kwargs: Optional[dict] = None):
        self.storage_config = storage_config
        self.extra = dict(storage_config.extra_config or {})
        self.kwargs = dict(kwargs or {})
        self.client = Client(self.extra.get("socket"),
                             timeout=self.extra.get("timeout"),
                             name=self.extra.get("client_name", "sglang"),
                             secret_file=self.extra.get("secret_file"))
        self.mem_pool_host = None
        self.ns: Optional[int] = None
        self.page_bytes = 0
        if all(k in self.extra for k in ("dtype", "num_layers",
                                         "num_kv_heads", "head_dim",
                                         "page_size")):
            self.ns = self._namespace(
                self.extra["dtype"], int(self.extra["num_layers"]),
                int(self.extra["num_kv_heads"]), int(self.extra["head_dim"]),
                int(self.extra["page_size"]),
                self.extra.get("layout", "page_first_direct"))

    # namespace ---------------------------------------------------------

    def _model_id(self) -> str:
        c = self.storage_config
        model = str(self.extra.get("model_id") or c.model_name or "")
        model = "-".join(model.split("/")) or "sglang-model"
        if c.pp_size > 1:
            model += f"@pp{c.pp_rank}/{c.pp_size}"
        if c.attn_cp_size > 1:
            model += f"@cp{c.attn_cp_rank}/{c.attn_cp_size}"
        if c.dcp_size > 1:
            model += (f"@dcp{c.dcp_rank}/{c.dcp_size}"
                      f"@page{c.logical_page_size}")
        return model

    def _namespace(self, dtype, num_layers: int, num_kv_heads: int,
                   head_dim: int, page_size: int, layout: str) -> int:
        c = self.storage_config
        if c.is_mla_model:
            tp_rank, tp_world = 0, 1  # replicated: one copy for all ranks
            version = LAYOUT_SGLANG_MLA
        else:
            tp_rank, tp_world = c.tp_rank, c.tp_size
            try:
                version = _LAYOUTS[layout]
            except KeyError:
                raise ValueError(
                    f"kvfabric: host pool layout {layout!r} unsupported; use "
                    "--hicache-mem-layout page_first or page_first_direct"
                ) from None
        return namespace_fingerprint(self._model_id(), dtype_code(dtype),
                                     num_layers, num_kv_heads, head_dim,
                                     tp_rank=tp_rank, tp_world=tp_world,
                                     chunk_size=page_size,
                                     layout_version=version)

    def register_mem_pool_host(self, mem_pool_host):
        super().register_mem_pool_host(mem_pool_host)
        pool = mem_pool_host
        heads = getattr(pool, "head_num", 1)  # MLA pools have no heads
        head_dim = getattr(pool, "head_dim", None) or getattr(
            pool, "kv_cache_dim")
        self.ns = self._namespace(pool.dtype, pool.layer_num, heads,
                                  head_dim, pool.page_size, pool.layout)
        _, sizes = pool.get_page_buffer_meta(
            torch.arange(pool.page_size, dtype=torch.int64))
        self.page_bytes = sum(sizes)
        logger.info("kvfabric: namespace %016x, %d-token pages of %d bytes",
                    self.ns, pool.page_size, self.page_bytes)

    def _keys(self, keys: List[str]) -> List[Key]:
        if self.ns is None:
            raise RuntimeError("kvfabric: no namespace yet; register the host "
                               "pool or give the geometry in extra_config")
        return [page_key(self.ns, k) for k in keys]

    # zero-copy page I/O ------------------------------------------------

    def _page_buffers(self, host_indices: torch.Tensor, n: int):
        """(pointers, sizes) of @p n pages, grouped per page."""
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        per = len(ptrs) // n if n else 0
        if per == 0 or per * n != len(ptrs):
            raise ValueError(f"kvfabric: {len(ptrs)} page buffers for {n} "
                             "keys")
        return ([ptrs[i * per:(i + 1) * per] for i in range(n)],
                [sizes[i * per:(i + 1) * per] for i in range(n)])

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None
                     ) -> List[bool]:
        n = len(keys)
        if n == 0:
            return []
        if not self.storage_config.is_storage_writer:
            return [True] * n  # another rank stores the shared MLA pages
        try:
            kk = self._keys(keys)
            ptrs, sizes = self._page_buffers(host_indices, n)
            # pages the cluster holds already are not written again
            have = self.client.lookup(kk).hit_chunks
            todo = list(range(have, n))
            if not todo:
                return [True] * n
            slots = self.client.alloc(self.page_bytes, len(todo))
            sums = []
            for s, i in zip(slots, todo):
                dst = self.client.pool_base + s.offset
                for p, size in zip(ptrs[i], sizes[i]):
                    ctypes.memmove(dst, p, size)
                    dst += size
                sums.append(_lib.lib.kvf_chunk_checksum(
                    self.client.pool_base + s.offset, self.page_bytes))
            self.client.commit([kk[i] for i in todo], slots, sums)
        except KvfError as e:
            logger.warning("kvfabric: storing %d pages failed: %s", n, e)
            return [False] * n
        return [True] * n

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None
                     ) -> List[bool]:
        n = len(keys)
        if n == 0:
            return []
        try:
            kk = self._keys(keys)
            ptrs, sizes = self._page_buffers(host_indices, n)
            slots, _missing = self.client.retrieve(kk)
        except KvfError as e:
            logger.warning("kvfabric: fetching %d pages failed: %s", n, e)
            return [False] * n
        ok = []
        try:
            for i, s in enumerate(slots):
                if s is None or s.length != sum(sizes[i]):
                    ok.append(False)
                    continue
                src = self.client.pool_base + s.offset
                for p, size in zip(ptrs[i], sizes[i]):
                    ctypes.memmove(p, src, size)
                    src += size
                ok.append(True)
        finally:
            self.client.release(slots)
        return ok

    # tensor API (SGLang's generic path) --------------------------------

    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> Optional[torch.Tensor]:
        return self.batch_get([key], [target_location])[0]

    def batch_get(self, keys: List[str],
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None
                  ) -> List[Optional[torch.Tensor]]:
        """Copies each present page into its target tensor (a flat data
        page, ``get_dummy_flat_data_page()``); None where absent."""
        if not keys:
            return []
        targets = list(target_locations or [None] * len(keys))
        try:
            slots, _missing = self.client.retrieve(self._keys(keys))
        except KvfError as e:
            logger.warning("kvfabric: fetching %d pages failed: %s",
                           len(keys), e)
            return [None] * len(keys)
        out: List[Optional[torch.Tensor]] = []
        try:
            for s, t in zip(slots, targets):
                if s is None:
                    out.append(None)
                    continue
                src = self.client.slot_tensor(s)
                if t is None:
                    out.append(src.clone())
                    continue
                dst = t.view(-1).view(torch.uint8)
                if dst.numel() != s.length:
                    out.append(None)
                    continue
                dst.copy_(src)
                out.append(t)
                del src
        finally:
            self.client.release(slots)
        return out

    def set(self, key: str, value: Optional[Any] = None,
            target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: List[str], values: Optional[Any] = None,
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        """Stores each value (a CPU tensor, a flat data page) under its key;
        True when all are stored."""
        if not keys:
            return True
        if not self.storage_config.is_storage_writer:
            return True
        values = [v.contiguous().view(-1).view(torch.uint8) for v in values]
        try:
            kk = self._keys(keys)
            for k, v in zip(kk, values):
                if self.client.lookup([k]).hit_chunks == 1:
                    continue
                [s] = self.client.alloc(v.numel(), 1)
                dst = self.client.slot_tensor(s)
                dst.copy_(v)
                del dst
                self.client.commit(
                    [k], [s], [_lib.lib.kvf_chunk_checksum(
                        self.client.pool_base + s.offset, v.numel())])
        except KvfError as e:
            logger.warning("kvfabric: storing %d pages failed: %s",
                           len(keys), e)
            return False
        return True

    # lookups -----------------------------------------------------------

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_exists(self, keys: List[str],
                     extra_info: Optional[HiCacheStorageExtraInfo] = None
                     ) -> int:
        """Leading pages held anywhere in the cluster."""
        if not keys:
            return 0
        try:
            return self.client.lookup(self._keys(keys)).hit_chunks
        except KvfError as e:
            logger.warning("kvfabric: lookup of %d pages failed: %s",
                           len(keys), e)
            return 0

    # the rest ----------------------------------------------------------

    def clear(self) -> None:
        """Nothing: the cluster's chunks are shared with other engines and
        age out by the agents' eviction."""

    def get_stats(self):
        s = self.client.stats()
        return {"chunks": s.chunks, "pool_used": s.pool_used,
                "local_hits": s.local_hits, "misses": s.misses,
                "fetched_chunks": s.fetched_chunks,
                "evictions": s.evictions}

    def close(self) -> None:
        self.client.close(force=True)
