# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""Client: a connection to the local kvf-agent (kvfabric.h), with zero-copy
numpy and torch views of its shared pool.

Lifetime of views. The pool is mapped by the C client and unmapped by
kvf_client_disconnect(). Every view (``pool_view``, ``slot_view``,
``slot_tensor``) keeps a reference to the client, so a client that still has
views is never disconnected by garbage collection; an explicit ``close()``
while views are alive raises ``RuntimeError`` (pass ``force=True`` to unmap
anyway, after which touching a view is a use-after-unmap). A slot's bytes
are stable only while the slot is held: between ``alloc`` and ``commit``, or
between ``retrieve`` and ``release``.
"""
import ctypes
import sys
import threading
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from . import _lib
from .errors import ERR_EXISTS, ERR_TOO_BIG, OK, KvfError, check
from .keys import Key, keys_to_c

HAS_PD = _lib.HAS_PD


@dataclass(frozen=True)
class Slot:
    """kvf_slot_t: a byte range of the pool (offset from its base)."""
    offset: int
    length: int


@dataclass(frozen=True)
class LookupResult:
    """kvf_lookup_result_t"""
    hit_chunks: int
    local_chunks: int
    lease_id: int


@dataclass(frozen=True)
class Stats:
    """kvf_client_stats_t"""
    pool_capacity: int
    pool_used: int
    chunks: int
    local_hits: int
    misses: int
    fetched_chunks: int
    evictions: int
    node_id: int
    registered: bool


def _pd_request_id(request_id) -> int:
    """Checks a PD request id: an int that fits in 64 bits. A str (a vLLM
    request id) or anything else raises a TypeError that says what to do,
    rather than ctypes' ArgumentError."""
    if isinstance(request_id, bool) or not isinstance(request_id, int):
        raise TypeError(
            f"kvfabric: a PD request id is an int (u64), not "
            f"{type(request_id).__name__} {request_id!r}; map string ids to "
            f"one, e.g. int.from_bytes(hashlib.blake2b(s.encode(), "
            f"digest_size=8).digest(), 'little') >> 1")
    if not 0 <= request_id < 1 << 64:
        raise ValueError(f"kvfabric: PD request id {request_id} is outside "
                         f"0..2**64-1")
    return request_id


def _slots_to_c(slots: Sequence[Slot]):
    arr = (_lib.SlotStruct * len(slots))()
    for i, s in enumerate(slots):
        arr[i].offset, arr[i].length = s.offset, s.length
    return arr


def _connect_error() -> str:
    """kvf_client_last_error(NULL): why this thread's connect failed."""
    s = _lib.lib.kvf_client_last_error(None)
    return s.decode(errors="replace") if s else ""


class Client:
    """A connection to the local agent (kvf_client_connect()).

    One thread at a time per connection, as in C; the methods take an
    internal lock, so sharing one Client between threads is safe (serial).
    Use as a context manager, or call ``close()``.
    """

    def __init__(self, socket_path: Optional[str] = None,
                 timeout: Optional[float] = None, name: Optional[str] = None,
                 secret_file: Optional[str] = None):
        """@p timeout: default per-call timeout in seconds (C default 5 s)."""
        p = _lib.ClientParams()
        self._keep = []
        if socket_path is not None:
            p.field_mask |= _lib.CLIENT_PARAM_SOCKET
            p.socket_path = self._b(socket_path)
        if timeout is not None:
            p.field_mask |= _lib.CLIENT_PARAM_TIMEOUT
            p.timeout_ns = int(timeout * 1e9)
        if name is not None:
            p.field_mask |= _lib.CLIENT_PARAM_NAME
            p.name = self._b(name)
        if secret_file is not None:
            p.field_mask |= _lib.CLIENT_PARAM_SECRET
            p.secret_file = self._b(secret_file)
        self._lock = threading.Lock()
        self._h = None
        h = ctypes.c_void_p()
        check(_lib.lib.kvf_client_connect(ctypes.byref(p), ctypes.byref(h)),
              "kvf_client_connect", _connect_error)
        self._h = h
        self._base = _lib.lib.kvf_client_pool_base(h)
        self._size = _lib.lib.kvf_client_pool_size(h)
        # one buffer object spans the whole pool; views hang off it
        self._pool = (ctypes.c_uint8 * self._size).from_address(self._base)
        self._pool_refs = sys.getrefcount(self._pool)
        self._views = 0

    def _b(self, s: str) -> bytes:
        b = s.encode()
        self._keep.append(b)
        return b

    # lifetime ----------------------------------------------------------

    def live_views(self) -> int:
        """Views of the pool still referenced somewhere."""
        if self._h is None:
            return 0
        return max(sys.getrefcount(self._pool) - self._pool_refs, 0)

    def close(self, force: bool = False) -> None:
        """kvf_client_disconnect(): unmaps the pool, releases every grant and
        pin this connection holds. Idempotent."""
        if self._h is None:
            return
        if not force and self.live_views() > 0:
            raise RuntimeError(
                f"kvfabric: {self.live_views()} pool view(s) still alive; "
                "drop them before close() (or close(force=True))")
        with self._lock:
            _lib.lib.kvf_client_disconnect(self._h)
            self._h = None
            self._pool = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        # views keep the client alive, so here none is left
        try:
            if self._h is not None:
                _lib.lib.kvf_client_disconnect(self._h)
                self._h = None
        except Exception:  # interpreter shutdown
            pass

    @property
    def closed(self) -> bool:
        return self._h is None

    def _handle(self):
        if self._h is None:
            raise KvfError(-12, "kvfabric client", "connection closed")
        return self._h

    def last_error(self) -> str:
        """kvf_client_last_error(): why the last call failed."""
        if self._h is None:
            return ""
        s = _lib.lib.kvf_client_last_error(self._h)
        return s.decode(errors="replace") if s else ""

    @property
    def reconnects(self) -> int:
        """kvf_client_reconnects(): how often the client reconnected to a
        restarted agent (calls then fail with ERR_CLOSED until it is up)."""
        return _lib.lib.kvf_client_reconnects(self._handle())

    def _check(self, status: int, call: str) -> None:
        check(status, call, self.last_error)

    # the pool ----------------------------------------------------------

    @property
    def pool_base(self) -> int:
        """Address of the mapped pool in this process."""
        self._handle()
        return self._base

    @property
    def pool_size(self) -> int:
        self._handle()
        return self._size

    def pool_view(self, offset: int, length: int, dtype=None, shape=None):
        """A numpy view (no copy) of pool bytes [offset, offset + length)."""
        import numpy as np

        self._handle()
        if offset < 0 or length < 0 or offset + length > self._size:
            raise KvfError(-19, "pool_view",
                           f"[{offset}, +{length}) outside the pool")
        dt = np.dtype(np.uint8 if dtype is None else dtype)
        if length % dt.itemsize:
            raise ValueError("kvfabric: length not a multiple of the dtype")
        a = np.frombuffer(self._pool, dtype=dt, count=length // dt.itemsize,
                          offset=offset)
        a = _ClientView(a, self)
        return a if shape is None else a.reshape(shape)

    def slot_view(self, slot: Slot, dtype=None, shape=None):
        """A numpy view (no copy) of a slot's bytes."""
        return self.pool_view(slot.offset, slot.length, dtype, shape)

    def slot_tensor(self, slot: Slot, dtype=None, shape=None):
        """A CPU torch tensor sharing a slot's bytes (no copy); any torch
        dtype, bfloat16 included. Default dtype uint8."""
        import torch

        dtype = torch.uint8 if dtype is None else dtype
        size = torch.tensor([], dtype=dtype).element_size()
        raw = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}[size]
        t = torch.from_numpy(self.slot_view(slot, raw))
        if t.dtype != dtype:
            t = t.view(dtype)
        return t if shape is None else t.view(shape)

    # calls -------------------------------------------------------------

    def alloc(self, chunk_bytes: int, num: int = 1) -> List[Slot]:
        """kvf_client_alloc(): @p num slots of @p chunk_bytes for writing."""
        arr = (_lib.SlotStruct * num)()
        with self._lock:
            self._check(_lib.lib.kvf_client_alloc(self._handle(), chunk_bytes,
                                                  num, arr),
                        "kvf_client_alloc")
        return [Slot(s.offset, s.length) for s in arr]

    def commit(self, keys: Sequence[Key], slots: Sequence[Slot],
               checksums: Sequence[int], exists_ok: bool = True) -> int:
        """kvf_client_commit(): publishes slots under @p keys. Returns
        errors.OK, or errors.ERR_EXISTS when @p exists_ok and the library
        reports a key already held (its slot released, the existing chunk
        kept). Today's agent answers a held key with OK, so either value
        means the chunks are published."""
        n = len(keys)
        if len(slots) != n or len(checksums) != n:
            raise ValueError("kvfabric: keys, slots, checksums differ in size")
        sums = (ctypes.c_uint64 * n)(*checksums)
        with self._lock:
            st = _lib.lib.kvf_client_commit(self._handle(), keys_to_c(keys),
                                            _slots_to_c(slots), sums, n)
            if st == ERR_EXISTS and exists_ok:
                return st
            self._check(st, "kvf_client_commit")
        return OK

    def lookup(self, keys: Sequence[Key], prefetch: bool = False
               ) -> LookupResult:
        """kvf_client_lookup(): leading chunks of @p keys held anywhere."""
        r = _lib.LookupResult()
        with self._lock:
            self._check(_lib.lib.kvf_client_lookup(self._handle(),
                                                   keys_to_c(keys), len(keys),
                                                   prefetch, ctypes.byref(r)),
                        "kvf_client_lookup")
        return LookupResult(r.hit_chunks, r.local_chunks, r.lease_id)

    def retrieve(self, keys: Sequence[Key]
                 ) -> Tuple[List[Optional[Slot]], List[bool]]:
        """kvf_client_retrieve(): pinned slots of @p keys (fetched from peers
        when remote). Returns (slots, missing); a missing chunk's slot is
        None. Release the others with ``release``."""
        n = len(keys)
        arr = (_lib.SlotStruct * n)()
        missing = (ctypes.c_bool * n)()
        with self._lock:
            self._check(_lib.lib.kvf_client_retrieve(self._handle(),
                                                     keys_to_c(keys), n, arr,
                                                     missing),
                        "kvf_client_retrieve")
        slots = [None if missing[i] else Slot(arr[i].offset, arr[i].length)
                 for i in range(n)]
        return slots, [bool(m) for m in missing]

    def retrieve_checksums(self, keys: Sequence[Key]
                           ) -> Tuple[List[Optional[Slot]], List[bool],
                                      List[int]]:
        """kvf_client_retrieve_checksums(): as ``retrieve``, plus the
        checksum each chunk was committed with (0 for a missing one), to
        check with ``verify``."""
        n = len(keys)
        arr = (_lib.SlotStruct * n)()
        missing = (ctypes.c_bool * n)()
        sums = (ctypes.c_uint64 * n)()
        with self._lock:
            self._check(_lib.lib.kvf_client_retrieve_checksums(
                self._handle(), keys_to_c(keys), n, arr, missing, sums),
                "kvf_client_retrieve_checksums")
        slots = [None if missing[i] else Slot(arr[i].offset, arr[i].length)
                 for i in range(n)]
        return slots, [bool(m) for m in missing], list(sums)

    def verify(self, slot: Slot, checksum: int) -> bool:
        """kvf_client_verify(): do the bytes of @p slot have @p checksum?"""
        s = _lib.SlotStruct(slot.offset, slot.length)
        return bool(_lib.lib.kvf_client_verify(self._handle(),
                                               ctypes.byref(s), checksum))

    def release(self, slots: Sequence[Optional[Slot]]) -> None:
        """kvf_client_release(): unpins retrieved slots (None entries are
        skipped)."""
        slots = [s for s in slots if s is not None]
        if not slots:
            return
        with self._lock:
            self._check(_lib.lib.kvf_client_release(self._handle(),
                                                    _slots_to_c(slots),
                                                    len(slots)),
                        "kvf_client_release")

    def stats(self) -> Stats:
        """kvf_client_stats(): the agent's counters."""
        s = _lib.ClientStats()
        with self._lock:
            self._check(_lib.lib.kvf_client_stats(self._handle(),
                                                  ctypes.byref(s)),
                        "kvf_client_stats")
        return Stats(s.pool_capacity, s.pool_used, s.chunks, s.local_hits,
                     s.misses, s.fetched_chunks, s.evictions, s.node_id,
                     bool(s.registered))

    # PD mode (kvfabric.h): defined only when the library exports it -------
    if HAS_PD:
        def pd_push(self, request_id: int, decoder: str,
                    slots: Sequence[Slot], checksums: Sequence[int],
                    final: bool) -> None:
            """kvf_pd_push(): pushes chunks of PD request @p request_id into
            the receive region of the decoder agent named @p decoder (its
            node name). Call it once per chunk or layer group as they are
            produced, ``final=True`` on the last call. Returns once the
            decoder verified every chunk of this call (and of the pushes of
            the request started before it with ``pd_push_start``: it raises
            the first of their failures). @p slots are this
            connection's grants (``alloc``) or pins (``retrieve``); a slot's
            ``length`` may be less than its grant (a partial last chunk).
            The slots stay the caller's: ``release`` or ``commit`` them
            after."""
            self._pd_push("kvf_pd_push", request_id, decoder, slots,
                          checksums, final)

        def pd_push_start(self, request_id: int, decoder: str,
                          slots: Sequence[Slot], checksums: Sequence[int],
                          final: bool) -> None:
            """kvf_pd_push_start(): as ``pd_push``, but returns once the
            push is sent to the agent: pushes of one request (one per layer
            group, as they are computed) then travel several at a time, and
            the decoder keeps their chunks in the order of the calls.
            ``pd_push_wait`` reports how they ended; the slots must stay
            unchanged and unreleased until it returns."""
            self._pd_push("kvf_pd_push_start", request_id, decoder, slots,
                          checksums, final)

        def pd_push_wait(self, request_id: int,
                         timeout: Optional[float] = None) -> None:
            """kvf_pd_push_wait(): waits until every push of @p request_id
            started with ``pd_push_start`` ended; raises the first failure
            among them (the request is then aborted at its decoder).
            @p timeout in seconds (None: the agent's push timeout plus the
            connection's)."""
            request_id = _pd_request_id(request_id)
            timeout_ns = 0 if timeout is None else max(int(timeout * 1e9), 1)
            with self._lock:
                self._check(_lib.lib.kvf_pd_push_wait(self._handle(),
                                                      request_id, timeout_ns),
                            "kvf_pd_push_wait")

        def _pd_push(self, fn: str, request_id: int, decoder: str,
                     slots: Sequence[Slot], checksums: Sequence[int],
                     final: bool) -> None:
            request_id = _pd_request_id(request_id)
            if not isinstance(decoder, str) or not decoder:
                raise TypeError(f"kvfabric: decoder is the decode agent's "
                                f"node name (a non-empty str), not "
                                f"{decoder!r}")
            n = len(slots)
            if len(checksums) != n:
                raise ValueError("kvfabric: slots and checksums differ in "
                                 "size")
            sums = (ctypes.c_uint64 * n)(*checksums)
            with self._lock:
                self._check(getattr(_lib.lib, fn)(self._handle(), request_id,
                                                  decoder.encode(),
                                                  _slots_to_c(slots), sums, n,
                                                  bool(final)), fn)

        def pd_wait(self, request_id: int, timeout: Optional[float] = None,
                    max_chunks: int = 256) -> List[Slot]:
            """kvf_pd_wait(): waits until every chunk of @p request_id
            arrived and verified (the final push acknowledged), claims it
            for this connection and returns its chunks in push order (pool
            slots: ``slot_view``/``slot_tensor`` read them, no copy). Either
            order with the push works. @p timeout in seconds (None: the
            connection's default). The slots stay valid until
            ``pd_release`` or ``close``. @p max_chunks is only the first
            guess of room: a larger request is asked again with room for
            all of it (the agent keeps it claimed for us)."""
            return self._pd_wait(request_id, timeout, max_chunks, False)[0]

        def pd_wait_checksums(self, request_id: int,
                              timeout: Optional[float] = None,
                              max_chunks: int = 256
                              ) -> Tuple[List[Slot], List[int]]:
            """kvf_pd_wait_checksums(): as ``pd_wait``, plus the checksum
            each chunk was verified with, to check with ``verify`` (after
            copying a chunk elsewhere, say)."""
            return self._pd_wait(request_id, timeout, max_chunks, True)

        def _pd_wait(self, request_id: int, timeout: Optional[float],
                     max_chunks: int, with_sums: bool
                     ) -> Tuple[List[Slot], List[int]]:
            request_id = _pd_request_id(request_id)
            timeout_ns = 0 if timeout is None else max(int(timeout * 1e9), 1)
            room = max(int(max_chunks), 1)
            fn = "kvf_pd_wait_checksums" if with_sums else "kvf_pd_wait"
            while True:
                arr = (_lib.SlotStruct * room)()
                sums = (ctypes.c_uint64 * (room if with_sums else 0))()
                num = ctypes.c_uint32()
                with self._lock:
                    if with_sums:
                        st = _lib.lib.kvf_pd_wait_checksums(
                            self._handle(), request_id, timeout_ns, arr, sums,
                            room, ctypes.byref(num))
                    else:
                        st = _lib.lib.kvf_pd_wait(self._handle(), request_id,
                                                  timeout_ns, arr, room,
                                                  ctypes.byref(num))
                    if st == ERR_TOO_BIG and room < 65536:
                        room = min(room * 4, 65536)
                        continue
                    self._check(st, fn)
                n = num.value
                return ([Slot(arr[i].offset, arr[i].length) for i in range(n)],
                        list(sums[:n]) if with_sums else [])

        def pd_release(self, request_id: int) -> None:
            """kvf_pd_release(): frees the receive slots of @p request_id
            (a request not complete yet is aborted). KvfError
            KVF_ERR_NOT_FOUND for an unknown id, KVF_ERR_BUSY for one
            another connection claimed."""
            request_id = _pd_request_id(request_id)
            with self._lock:
                self._check(_lib.lib.kvf_pd_release(self._handle(),
                                                    request_id),
                            "kvf_pd_release")


_VIEW_TYPE = None


def _ClientView(array, client):
    """Ties a numpy view to its client (see the module docstring): a plain
    ndarray subclass whose instance holds the client; arrays derived from it
    (slices, reshapes, torch.from_numpy) hold it through their base."""
    global _VIEW_TYPE
    if _VIEW_TYPE is None:
        import numpy as np

        class PoolView(np.ndarray):
            """numpy view of a kvfabric pool; keeps its Client alive."""

        _VIEW_TYPE = PoolView
    v = array.view(_VIEW_TYPE)
    v._kvf_client = client
    return v
