# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""KvfabricConnector: a kvfabric cluster as LMCache's L2 tier, through
LMCache's ``native_plugin`` L2 adapter.

LMCache's multiprocess server loads it from its ``--l2-adapter`` JSON::

    --l2-adapter '{"type": "native_plugin",
                   "module_path": "kvfabric.lmcache_adapter",
                   "class_name": "KvfabricConnector",
                   "adapter_params": {"socket": "/run/kvfabric/gpu0/agent.sock",
                       "dtype": "bf16", "num_layers": 32, "num_kv_heads": 8,
                       "head_dim": 128, "chunk_size": 256}}'

and wraps it in its own ``NativeConnectorL2Adapter`` (three event fds,
store/lookup/load tasks, client-side locks). This object is the "native
client" that adapter drives: ``submit_batch_set/get/exists`` queue a batch
and return a future id at once; one worker thread runs the batches in order
against the local kvf-agent (kvfabric.Client) and signals the one eventfd
``event_fd()``; ``drain_completions()`` hands back
``(future_id, ok, error, per_key_bools)``.

Mapping (docs/integration-lmcache.md):

* one LMCache chunk = one kvfabric chunk, bytes 1:1 (LMCache's ``KV_2LTD``
  objects are kvfabric's chunk layout; ``chunk_size`` is LMCache's, in
  tokens);
* an LMCache key ``<model>@<kv_rank>@<group>@<chunk_hash>[@<salt>]``
  becomes ``key_from_digest(ns, chunk_hash)``, where ``ns`` is
  ``namespace_fingerprint`` of ``<model>@<kv_rank>@<group>[@<salt>]`` (or
  ``model_id`` from the params, then suffixed the same way) and the
  geometry in ``adapter_params`` (required: ``dtype``, ``num_layers``,
  ``num_kv_heads``, ``head_dim``, ``chunk_size``): every rank, group and
  salt has a namespace of its own;
* exists answers per key whether the cluster holds it anywhere; get fetches
  remote chunks over the fabric. There is no delete: kvfabric's agents
  evict on their own (LMCache logs that its L2 eviction delete is a no-op).

Other ``adapter_params``: ``socket`` (else ``KVF_SOCKET``, else the
library default), ``timeout`` (s per call), ``secret_file``, ``name``.
"""
import collections
import ctypes
import os
import threading
from typing import Dict, List, Optional, Sequence, Tuple

from . import _lib
from .client import Client
from .keys import (Key, _buffer_address, dtype_code, key_from_digest,
                   namespace_fingerprint)

KEY_SEP = "@"

Completion = Tuple[int, bool, str, Optional[List[bool]]]


class KvfabricConnector:
    """LMCache native-plugin client over the local kvf-agent (see module
    doc). thread: submit_* and drain_completions from any thread."""

    def __init__(self, dtype, num_layers: int, num_kv_heads: int,
                 head_dim: int, chunk_size: int, socket: Optional[str] = None,
                 timeout: Optional[float] = None,
                 secret_file: Optional[str] = None,
                 model_id: Optional[str] = None, name: str = "lmcache"):
        self._geometry = (dtype_code(dtype), int(num_layers),
                          int(num_kv_heads), int(head_dim), int(chunk_size))
        self._model_id = model_id
        self._ns: Dict[str, int] = {}
        self._client = Client(socket, timeout=timeout, name=name,
                              secret_file=secret_file)
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queue: collections.deque = collections.deque()
        self._done: List[Completion] = []
        self._next_id = 1
        self._closing = False
        self._worker = threading.Thread(target=self._run, daemon=True,
                                        name="kvfabric-lmcache")
        self._worker.start()

    # the native-client interface ----------------------------------------

    def event_fd(self) -> int:
        return self._efd

    def submit_batch_set(self, keys: Sequence[str], buffers) -> int:
        return self._submit(self._do_set, list(keys), list(buffers))

    def submit_batch_get(self, keys: Sequence[str], buffers) -> int:
        return self._submit(self._do_get, list(keys), list(buffers))

    def submit_batch_exists(self, keys: Sequence[str]) -> int:
        return self._submit(self._do_exists, list(keys), None)

    def drain_completions(self) -> List[Completion]:
        try:
            os.eventfd_read(self._efd)
        except BlockingIOError:
            pass
        with self._lock:
            done, self._done = self._done, []
        return done

    def close(self) -> None:
        """Finishes the queued batches, stops the worker, disconnects.
        Idempotent."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            self._wake.notify()
        self._worker.join()
        self._client.close(force=True)
        os.close(self._efd)

    # keys ----------------------------------------------------------------

    def key(self, key: str) -> Key:
        """The kvfabric key of an LMCache key string."""
        parts = key.split(KEY_SEP)
        if len(parts) not in (4, 5):
            raise ValueError(f"kvfabric: not an LMCache key: {key!r}")
        model, rank, group, digest = parts[:4]
        scope = KEY_SEP.join([self._model_id or model, rank, group] +
                             parts[4:])
        ns = self._ns.get(scope)
        if ns is None:
            dt, layers, heads, dim, chunk = self._geometry
            ns = namespace_fingerprint(scope, dt, layers, heads, dim,
                                       chunk_size=chunk)
            self._ns[scope] = ns
        return key_from_digest(ns, bytes.fromhex(digest))

    # the worker ----------------------------------------------------------

    def _submit(self, fn, keys, buffers) -> int:
        with self._lock:
            if self._closing:
                raise RuntimeError("kvfabric: connector closed")
            fid = self._next_id
            self._next_id += 1
            self._queue.append((fid, fn, keys, buffers))
            self._wake.notify()
        return fid

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closing:
                    self._wake.wait()
                if not self._queue:
                    return
                fid, fn, keys, buffers = self._queue.popleft()
            try:
                bools = fn([self.key(k) for k in keys], buffers)
                # a lookup succeeds whatever it found; LMCache reads its
                # per-key answers only then
                ok = fn == self._do_exists or all(bools)
                done = (fid, ok, "", bools)
            except Exception as e:  # noqa: BLE001 (LMCache waits for each)
                done = (fid, False, f"{type(e).__name__}: {e}",
                        [False] * len(keys))
            with self._lock:
                self._done.append(done)
            os.eventfd_write(self._efd, 1)

    def _do_set(self, keys: List[Key], buffers) -> List[bool]:
        if not keys:
            return []
        c = self._client
        bufs = [_buffer_address(b) for b in buffers]
        sizes = {n for _, n, _ in bufs}
        if len(sizes) == 1:  # one grant for the batch (the usual case)
            slots = c.alloc(sizes.pop(), len(bufs))
        else:
            slots = [c.alloc(n, 1)[0] for _, n, _ in bufs]
        sums = []
        for s, (addr, n, _keep) in zip(slots, bufs):
            ctypes.memmove(c.pool_base + s.offset, addr, n)
            sums.append(_lib.lib.kvf_chunk_checksum(c.pool_base + s.offset,
                                                    n))
        c.commit(keys, slots, sums)
        return [True] * len(keys)

    def _do_get(self, keys: List[Key], buffers) -> List[bool]:
        if not keys:
            return []
        c = self._client
        bufs = [_buffer_address(b) for b in buffers]
        slots, _missing = c.retrieve(keys)
        try:
            ok = []
            for s, (addr, n, _keep) in zip(slots, bufs):
                if s is None or s.length != n:
                    ok.append(False)
                    continue
                ctypes.memmove(addr, c.pool_base + s.offset, n)
                ok.append(True)
        finally:
            c.release(slots)
        return ok

    def _do_exists(self, keys: List[Key], _buffers) -> List[bool]:
        """Per key; kvf_client_lookup answers leading runs, so one call per
        run of present keys and one per absent key."""
        found = [False] * len(keys)
        i = 0
        while i < len(keys):
            hit = self._client.lookup(keys[i:]).hit_chunks
            for j in range(i, i + hit):
                found[j] = True
            i += hit + 1
        return found
