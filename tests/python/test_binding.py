# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""The ctypes binding: keys equal the C library's, statuses become
KvfError, pool views are zero-copy and tied to their client, chunks stored
through agent a come back through agent b byte for byte."""
import ctypes
import gc
import os
import subprocess
import threading
import time

import numpy as np
import pytest

import kvfabric as kvf
from kvfabric import _lib
from conftest import SRC, torch_or_skip


def wait_hits(client, keys, hits, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        r = client.lookup(keys)
        if r.hit_chunks == hits or time.monotonic() > deadline:
            return r
        time.sleep(0.005)


def test_namespace_matches_its_fields():
    a = kvf.namespace_fingerprint("m", "bf16", 4, 2, 64, chunk_size=16)
    assert a == kvf.namespace_fingerprint("m", kvf.DTYPE_BF16, 4, 2, 64,
                                          chunk_size=16)
    assert a != kvf.namespace_fingerprint("m", "fp16", 4, 2, 64,
                                          chunk_size=16)
    assert a != kvf.namespace_fingerprint("m", "bf16", 4, 2, 64,
                                          chunk_size=32)
    with pytest.raises(kvf.KvfError) as e:
        kvf.namespace_fingerprint("m", "bf16", 0, 2, 64)
    assert e.value.name == "KVF_ERR_INVALID"


def test_key_chain_equals_the_c_definition():
    """The chain Python gets is the C library's: checked against a C
    program built here from keys.h (kvfctl-independent), and against its
    own definition (partial chunks, prefix property)."""
    ns = 0x77
    tokens = [i * 7 + 3 for i in range(40)]
    keys = kvf.key_chain(ns, tokens, 16)
    assert len(keys) == 2
    assert len(kvf.key_chain(ns, tokens, 16, include_partial=True)) == 3
    # a key names its whole prefix: same first chunk, different second
    other = kvf.key_chain(ns, tokens[:16] + [1] * 16, 16)
    assert other[0] == keys[0] and other[1] != keys[1]
    # round trips through the C text and wire forms
    for k in keys:
        assert kvf.Key.parse(str(k)) == k
        assert kvf.Key.unpack(k.pack()) == k
    # independent key of a chunk = the chain's first key of the same tokens
    assert kvf.key_independent(ns, tokens[16:32]) == \
        kvf.key_chain(ns, tokens[16:32], 16)[0]
    assert kvf.key_from_digest(ns, bytes(range(16))).hi == \
        int.from_bytes(bytes(range(8)), "big")


def test_keys_match_a_c_engine(tmp_path):
    """A C program linked to libkvfabric prints the keys of the same tokens;
    Python must print the same text."""
    cc = "gcc"
    prog = tmp_path / "keys.c"
    prog.write_text(r"""
#include <kvfabric/keys.h>
#include <stdio.h>
int main(void)
{
    uint32_t t[40];
    kvf_key_t k[3], ind;
    size_t n, i;
    char buf[KVF_KEY_STR_SIZE];
    for (i = 0; i < 40; i++) t[i] = (uint32_t)(i * 7 + 3);
    if (kvf_key_chain(0x77, t, 40, 16, true, k, 3, &n) != KVF_OK) return 1;
    for (i = 0; i < n; i++) printf("%s\n", kvf_key_format(&k[i], buf));
    kvf_key_independent(0x77, t + 8, 16, &ind);
    printf("%s\n", kvf_key_format(&ind, buf));
    printf("%016llx\n", (unsigned long long)kvf_chunk_checksum(t, 160));
    return 0;
}
""")
    libdir = os.path.dirname(_lib.lib_path)
    exe = tmp_path / "keys"
    build = subprocess.run(
        [cc, "-std=c11", f"-I{SRC / 'include'}", str(prog), "-o", str(exe),
         f"-L{libdir}", "-l:libkvfabric.so", f"-Wl,-rpath,{libdir}"]
        + (["-fsanitize=address,undefined"] if "asan" in libdir else []),
        capture_output=True, text=True)
    if build.returncode != 0:
        pytest.fail(f"cannot build the C key program: {build.stderr}")
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    out = subprocess.run([str(exe)], capture_output=True, text=True,
                         env=env, check=True).stdout.split()
    tokens = [i * 7 + 3 for i in range(40)]
    py = [str(k) for k in kvf.key_chain(0x77, tokens, 16, True)]
    py.append(str(kvf.key_independent(0x77, tokens[8:24])))
    arr = np.array(tokens, dtype=np.uint32)
    py.append(f"{kvf.chunk_checksum(arr):016x}")
    assert py == out


def test_checksum_of_bytes_array_and_tensor_agree():
    torch = torch_or_skip()
    data = bytes(range(256)) * 4
    a = np.frombuffer(data, dtype=np.uint8)
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    assert kvf.chunk_checksum(data) == kvf.chunk_checksum(a) == \
        kvf.chunk_checksum(t) == kvf.chunk_checksum(bytearray(data))
    assert kvf.chunk_checksum(data, 10) == kvf.chunk_checksum(data[:10])


def test_status_codes_become_exceptions_with_text():
    assert kvf.strerror(-6) == "timed out"
    assert kvf.status_name(-6) == "KVF_ERR_TIMEOUT"
    with pytest.raises(kvf.KvfError) as e:
        kvf.Client("/nonexistent/kvf.sock", timeout=0.5)
    assert e.value.status == -4 and e.value.call == "kvf_client_connect"
    # the reason an operator needs, in the exception text (#17 item 3)
    assert "/nonexistent/kvf.sock" in str(e.value), str(e.value)
    with pytest.raises(kvf.KvfError):
        kvf.Key.parse("not a key")


def test_pd_is_bound_only_when_exported():
    assert kvf.HAS_PD == hasattr(kvf.Client, "pd_push")
    assert kvf.HAS_PD == all(hasattr(_lib.lib, n)
                             for n in ("kvf_pd_push", "kvf_pd_wait",
                                       "kvf_pd_release"))
    # the library of this tree exports them (kvfabric.h)
    assert kvf.HAS_PD


def test_retrieve_hands_out_the_committed_checksums(cluster):
    ns = kvf.namespace_fingerprint("binding-sums", "bf16", 2, 2, 64,
                                   chunk_size=16)
    keys = kvf.key_chain(ns, list(range(32)), 16)
    chunk = 64 << 10
    a = cluster.client("a")
    slots = a.alloc(chunk, len(keys))
    sums = []
    for i, s in enumerate(slots):
        v = a.slot_view(s, np.uint8)[:chunk]
        v[:] = (np.arange(chunk) * 7 + i).astype(np.uint8)
        sums.append(kvf.chunk_checksum(v))
    del v
    assert a.commit(keys, [kvf.Slot(s.offset, chunk) for s in slots],
                    sums) == 0
    got, missing, got_sums = a.retrieve_checksums(keys)
    assert missing == [False] * len(keys)
    assert got_sums == sums
    assert all(a.verify(s, c) for s, c in zip(got, got_sums))
    assert not a.verify(got[0], sums[0] ^ 1)
    a.release(got)


def test_store_on_a_retrieve_on_b(cluster):
    torch = torch_or_skip()
    ns = kvf.namespace_fingerprint("binding-test", "bf16", 2, 2, 64,
                                   chunk_size=16)
    keys = kvf.key_chain(ns, list(range(64)), 16)
    chunk = 64 << 10
    a, b = cluster.client("a"), cluster.client("b")
    slots = a.alloc(chunk, len(keys))
    assert all(s.length >= chunk for s in slots)
    sums = []
    for i, s in enumerate(slots):
        v = a.slot_view(s, np.uint8)[:chunk]
        v[:] = np.arange(chunk, dtype=np.uint64).astype(np.uint8) ^ i
        # the view is the pool: the C client sees the same bytes
        raw = ctypes.string_at(a.pool_base + s.offset, 16)
        assert raw == v[:16].tobytes()
        sums.append(kvf.chunk_checksum(v))
    del v
    assert a.commit(keys, [kvf.Slot(s.offset, chunk) for s in slots],
                    sums) == 0

    r = wait_hits(b, keys, len(keys))
    assert r.hit_chunks == len(keys) and r.local_chunks == 0
    got, missing = b.retrieve(keys)
    assert missing == [False] * len(keys)
    for i, s in enumerate(got):
        t = b.slot_tensor(s)[:chunk]
        expect = torch.from_numpy(
            (np.arange(chunk, dtype=np.uint64).astype(np.uint8) ^ i))
        assert torch.equal(t, expect)
        # typed views share the bytes
        bf = b.slot_tensor(kvf.Slot(s.offset, chunk), torch.bfloat16)
        assert bf.dtype == torch.bfloat16 and bf.numel() == chunk // 2
        assert bf.view(torch.uint8).data_ptr() == t.data_ptr()
    st = b.stats()
    assert st.registered and st.fetched_chunks >= len(keys)

    # a live view keeps close() from unmapping under it
    with pytest.raises(RuntimeError, match="view"):
        b.close()
    del t, bf
    gc.collect()
    b.release(got)
    b.close()
    assert b.closed
    with pytest.raises(kvf.KvfError):
        b.stats()
    a.close()


def test_commit_of_a_held_key_keeps_the_existing_chunk(cluster):
    """The agent answers a commit of a key it already holds with OK (the
    existing chunk kept, the new slot released); a wrong checksum is
    refused with the agent's reason."""
    ns = kvf.namespace_fingerprint("binding-test", "fp16", 1, 1, 64,
                                   chunk_size=4)
    keys = kvf.key_chain(ns, [1, 2, 3, 4], 4)
    with cluster.client("a") as a:
        for _ in range(2):
            s = a.alloc(4096, 1)
            a.slot_view(s[0])[:] = 7
            sums = [kvf.chunk_checksum(a.slot_view(s[0]))]
            gc.collect()
            assert a.commit(keys, s, sums) == 0
        assert a.stats().chunks == 1
        keys2 = kvf.key_chain(ns, [5, 6, 7, 8], 4)
        s = a.alloc(4096, 1)
        with pytest.raises(kvf.KvfError) as e:
            a.commit(keys2, s, [12345])
        assert e.value.name == "KVF_ERR_CHECKSUM"
        assert e.value.detail != ""


def test_missing_chunks_are_reported_not_raised(cluster):
    ns = kvf.namespace_fingerprint("binding-test", "fp16", 1, 1, 64,
                                   chunk_size=4)
    keys = kvf.key_chain(ns, list(range(100, 112)), 4)
    with cluster.client("b") as b:
        assert b.lookup(keys).hit_chunks == 0
        slots, missing = b.retrieve(keys)
        assert missing == [True] * 3 and slots == [None] * 3
        b.release(slots)  # None entries are skipped


# PD mode -------------------------------------------------------------------

PD_CHUNK = 64 << 10


def _pd_bytes(req, index, n=PD_CHUNK):
    """Chunk @p index of PD request @p req: bytes no other chunk has."""
    g = np.random.default_rng(req * 1000 + index)
    return g.integers(0, 256, n, dtype=np.uint8)


def _pd_push(p, decoder, req, first, lengths, final):
    """Pushes chunks first.. of @p req (one call), then releases the grants
    (the slots stay the caller's after a push, whatever its outcome)."""
    slots = p.alloc(PD_CHUNK, len(lengths))
    pushed, sums = [], []
    for i, (s, n) in enumerate(zip(slots, lengths)):
        v = p.slot_view(s)[:n]
        v[:] = _pd_bytes(req, first + i, n)
        sums.append(kvf.chunk_checksum(v))
        pushed.append(kvf.Slot(s.offset, n))
    del v
    try:
        p.pd_push(req, decoder, pushed, sums, final)
    finally:
        gc.collect()
        p.release(slots)


def _pd_check(d, slots, req, lengths):
    assert [s.length for s in slots] == list(lengths)
    for i, s in enumerate(slots):
        assert np.array_equal(d.slot_view(s), _pd_bytes(req, i, s.length))


def test_pd_push_wait_release_round_trip(pd_cluster):
    """Three chunks pushed in two calls (streaming; the last one partial),
    waited for with too little room (the binding asks again), byte for
    byte; release frees them, a second release finds nothing."""
    dec = pd_cluster.node_name("d")
    lengths = [PD_CHUNK, PD_CHUNK, 40000]
    with pd_cluster.client("p") as p, pd_cluster.client("d") as d:
        _pd_push(p, dec, 11, 0, lengths[:2], final=False)
        _pd_push(p, dec, 11, 2, lengths[2:], final=True)
        slots = d.pd_wait(11, timeout=10, max_chunks=1)
        _pd_check(d, slots, 11, lengths)
        gc.collect()
        d.pd_release(11)
        with pytest.raises(kvf.KvfError) as e:
            d.pd_release(11)
        assert e.value.status == kvf.errors.ERR_NOT_FOUND
        assert e.value.name == "KVF_ERR_NOT_FOUND"
        assert e.value.call == "kvf_pd_release"


def test_pd_layer_pushes_started_without_waiting(pd_cluster):
    """Layer groups pushed with pd_push_start (none waits for the one
    before), collected by pd_push_wait; the decoder hands them out in call
    order. A failed group (bad checksum) raises from pd_push_wait and the
    request is gone at the decoder."""
    dec = pd_cluster.node_name("d")
    with pd_cluster.client("p") as p, pd_cluster.client("d") as d:
        slots = p.alloc(PD_CHUNK, 6)
        sums = []
        for i, s in enumerate(slots):
            v = p.slot_view(s)
            v[:] = _pd_bytes(14, i)
            sums.append(kvf.chunk_checksum(v))
        del v
        for i, s in enumerate(slots):
            p.pd_push_start(14, dec, [s], [sums[i]], final=(i == 5))
        p.pd_push_wait(14, timeout=30)
        got, got_sums = d.pd_wait_checksums(14, timeout=10, max_chunks=2)
        _pd_check(d, got, 14, [PD_CHUNK] * 6)
        # what the decoder verified each chunk with: the prefill engine's
        assert got_sums == sums
        assert all(d.verify(s, c) for s, c in zip(got, got_sums))
        assert not d.verify(got[0], got_sums[1])
        gc.collect()
        d.pd_release(14)
        for i, s in enumerate(slots[:3]):
            bad = sums[i] ^ (i == 1)
            p.pd_push_start(15, dec, [s], [bad], final=(i == 2))
        with pytest.raises(kvf.KvfError) as e:
            p.pd_push_wait(15, timeout=30)
        assert e.value.name == "KVF_ERR_CHECKSUM", e.value
        assert e.value.call == "kvf_pd_push_wait"
        with pytest.raises(kvf.KvfError) as e:
            d.pd_wait(15, timeout=5)
        assert e.value.name == "KVF_ERR_CANCELED"
        p.release(slots)


def test_pd_wait_before_push(pd_cluster):
    """The decoder may wait before the push starts: the wait returns when
    the final push is acknowledged."""
    dec = pd_cluster.node_name("d")
    got = {}
    with pd_cluster.client("p") as p, pd_cluster.client("d") as d:
        def waiter():
            try:
                got["slots"] = d.pd_wait(12, timeout=30)
            except kvf.KvfError as e:  # reported below
                got["error"] = e

        t = threading.Thread(target=waiter)
        t.start()
        # give the wait time to reach the agent first; the test passes in
        # either order, as the API promises, and only proves wait-first
        # when the scheduler lets the thread run (it does on an idle VM)
        time.sleep(0.3)
        assert t.is_alive(), got
        _pd_push(p, dec, 12, 0, [PD_CHUNK] * 2, final=False)
        assert t.is_alive()  # not complete before the final push
        _pd_push(p, dec, 12, 2, [PD_CHUNK], final=True)
        t.join(30)
        assert not t.is_alive() and "error" not in got, got
        _pd_check(d, got["slots"], 12, [PD_CHUNK] * 3)
        gc.collect()
        d.pd_release(12)


def test_pd_errors_carry_their_status(pd_cluster):
    dec = pd_cluster.node_name("d")
    with pd_cluster.client("p") as p, pd_cluster.client("d") as d:
        # unknown request id
        with pytest.raises(kvf.KvfError) as e:
            d.pd_release(987654)
        assert e.value.status == kvf.errors.ERR_NOT_FOUND
        with pytest.raises(kvf.KvfError) as e:
            d.pd_wait(987654, timeout=0.3)
        assert e.value.name == "KVF_ERR_TIMEOUT"
        # a decoder nobody runs
        with pytest.raises(kvf.KvfError) as e:
            _pd_push(p, "no-such-decoder", 13, 0, [PD_CHUNK], final=True)
        assert e.value.name in ("KVF_ERR_NOT_FOUND", "KVF_ERR_CLOSED")
        assert e.value.call == "kvf_pd_push" and e.value.detail
        # a prefill agent has no receive region
        with pytest.raises(kvf.KvfError) as e:
            p.pd_wait(13, timeout=0.3)
        assert e.value.name == "KVF_ERR_UNSUPPORTED"
        # bad arguments stay on this side
        with pytest.raises(ValueError):
            p.pd_push(13, dec, [kvf.Slot(0, 1)], [], final=True)
        # a vLLM-style string id: a TypeError that says what to do, not
        # ctypes.ArgumentError
        with pytest.raises(TypeError, match="request id is an int"):
            p.pd_push("req-1", dec, [kvf.Slot(0, 1)], [0], final=True)
        with pytest.raises(TypeError, match="request id is an int"):
            d.pd_wait("req-1", timeout=0.1)
        with pytest.raises(ValueError, match="outside"):
            d.pd_release(-1)
        with pytest.raises(TypeError, match="node name"):
            p.pd_push(13, None, [kvf.Slot(0, 1)], [0], final=True)


def test_pd_duplicate_request_id_is_refused_and_harmless(pd_cluster):
    """A second push of an id already delivered is KVF_ERR_EXISTS and
    leaves the delivered request as it was."""
    dec = pd_cluster.node_name("d")
    with pd_cluster.client("p") as p, pd_cluster.client("d") as d:
        _pd_push(p, dec, 14, 0, [PD_CHUNK, PD_CHUNK], final=True)
        with pytest.raises(kvf.KvfError) as e:
            _pd_push(p, dec, 14, 5, [PD_CHUNK], final=True)
        assert e.value.status == kvf.errors.ERR_EXISTS
        slots = d.pd_wait(14, timeout=10)
        _pd_check(d, slots, 14, [PD_CHUNK, PD_CHUNK])
        gc.collect()
        d.pd_release(14)


def test_client_rides_over_an_agent_restart(cluster):
    """#17 item 1 through the binding: the agent under a connected Client
    restarts; a call while it is away raises ERR_CLOSED naming the agent's
    socket, and the same Client works again within a second of the new
    agent registering, on the same pool address."""
    c = cluster.client("a", timeout=5)
    base = c.pool_base
    assert c.stats().registered
    cluster.exit_codes["agent-a-1"] = cluster.agents["a"].stop()
    with pytest.raises(kvf.KvfError) as e:
        c.stats()
    assert e.value.status == kvf.errors.ERR_CLOSED
    assert cluster.sockets["a"] in str(e.value), str(e.value)
    cluster.start_agent("a")
    cluster.wait_registered("a")
    deadline = time.monotonic() + 1.0
    while True:
        try:
            st = c.stats()
            break
        except kvf.KvfError as err:
            assert err.status == kvf.errors.ERR_CLOSED, str(err)
            assert time.monotonic() < deadline, f"not back in 1 s: {err}"
            time.sleep(0.005)
    assert st.registered
    assert c.reconnects == 1 and c.pool_base == base
    c.close()
