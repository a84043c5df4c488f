# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""kvfabric.sglang against the installed sglang package (build/venv-sglang,
make venv-sglang): SGLang's own StorageBackendFactory loads the backend as
``--hicache-storage-backend dynamic`` does, SGLang's own CPU host KV pool
(MHATokenToKVPoolHost) is registered, pages keyed by SGLang's own chained
page hashes go through the zero-copy v1 calls into agent a and come back
out of agent b (fetched over UCX), byte for byte."""
import json
import time

import pytest
from conftest import doc_command

sglang = pytest.importorskip(
    "sglang", reason="sglang not installed: run make venv-sglang")
torch = pytest.importorskip("torch")

from sglang.srt.mem_cache.device_pool_info import (  # noqa: E402
    KVBufferLayout, KVBuffers, MHABufferInfo)
from sglang.srt.mem_cache.hicache_storage import (  # noqa: E402
    HiCacheStorage, HiCacheStorageConfig)
from sglang.srt.mem_cache.pool_host.base import \
    host_memory_budget_scope  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import \
    MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import \
    StorageBackendFactory  # noqa: E402
from sglang.srt.mem_cache.utils import get_hash_str  # noqa: E402

LAYERS, HEADS, DIM, PAGE = 3, 2, 16, 8
DTYPE = torch.bfloat16


def eventually(fn, want, timeout=20.0):
    """fn() until it returns @p want or @p timeout seconds pass (chunks
    another agent committed reach the controller's index asynchronously);
    returns the last value."""
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(0.01)


def host_pool(layout="page_first_direct", tokens=256, page=PAGE):
    """SGLang's host KV pool on CPU, over CPU stand-ins of the device
    buffers (only their geometry is read)."""
    k = tuple(torch.zeros(tokens, HEADS, DIM, dtype=DTYPE)
              for _ in range(LAYERS))
    v = tuple(torch.zeros(tokens, HEADS, DIM, dtype=DTYPE)
              for _ in range(LAYERS))
    ptrs = [torch.tensor([t.data_ptr() for t in x], dtype=torch.uint64)
            for x in (k, v)]
    info = MHABufferInfo(
        buffers=KVBuffers(k=k, v=v, k_data_ptrs=ptrs[0], v_data_ptrs=ptrs[1],
                          layout=KVBufferLayout.NHD),
        page_size=page, head_num=HEADS, head_dim=DIM, v_head_dim=DIM,
        dtype=DTYPE, device=torch.device("cpu"))
    # SGLang sizes a pool against the machine's free RAM less a reserve of
    # GBs; these pools are a few MiB, booked against a budget of their own
    # so that a busy machine does not fail them
    with host_memory_budget_scope(1 << 30):
        pool = MHATokenToKVPoolHost(info, 2.0, 0, page, layout,
                                    pin_memory=False, device="cpu",
                                    device_capacity_tokens=tokens,
                                    start_layer=0, end_layer=LAYERS)
    pool._keep = (k, v)
    return pool


def storage_config(socket, tp_rank=0, tp_size=1, mla=False, **extra):
    cfg = {"backend_name": "kvfabric", "module_path": "kvfabric.sglang",
           "class_name": "KvfabricStore", "interface_v1": 1,
           "socket": socket, "timeout": 20}
    cfg.update(extra)
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1,
        attn_cp_rank=0, attn_cp_size=1, is_mla_model=mla,
        enable_storage_metrics=False,
        is_page_first_layout=True, model_name="org/tiny-llama",
        extra_config=cfg)


def make_store(cluster, agent, pool, **kw):
    """As HiCacheController.attach_storage_backend does it."""
    cfg = storage_config(cluster.sockets[agent], **kw)
    store = StorageBackendFactory.create_backend("dynamic", cfg, pool)
    store.register_mem_pool_host(pool)
    return store


def page_hashes(tokens):
    """SGLang's chained page keys (hex SHA-256), as its radix cache makes
    them."""
    return get_hash_str(tokens, None, PAGE)


def fill(pool, indices, seed, page=PAGE):
    """Random bytes into the pages at @p indices (every K and V buffer)."""
    g = torch.Generator().manual_seed(seed)
    for p in range(0, len(indices), page):
        page = pool.get_data_page(int(indices[p]), flat=False)
        page.copy_(torch.randn(page.shape, generator=g).to(DTYPE))


def pages(pool, indices):
    return [pool.get_data_page(int(indices[p]), flat=True).clone()
            for p in range(0, len(indices), PAGE)]


def test_factory_loads_the_backend_as_sglang_does(cluster):
    from kvfabric.sglang import KvfabricStore

    pool = host_pool()
    store = make_store(cluster, "a", pool)
    try:
        assert isinstance(store, KvfabricStore)
        assert isinstance(store, HiCacheStorage)
        assert store.page_bytes == 2 * LAYERS * PAGE * HEADS * DIM * 2
    finally:
        store.close()


def test_the_documented_command_configures_the_backend(cluster):
    """docs/integration-sglang.md's command, parsed by SGLang's own server
    arguments; its backend name, extra config, layout and page size build
    the backend through SGLang's factory, and a page stored through agent a
    comes back through agent b."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    argv = doc_command("integration-sglang.md")
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(argv[3:])
    assert args.enable_hierarchical_cache
    stores = []
    try:
        for agent in ("a", "b"):
            extra = json.loads(args.hicache_storage_backend_extra_config)
            extra["socket"] = cluster.sockets[agent]
            cfg = storage_config(None)
            cfg.extra_config = extra
            pool = host_pool(args.hicache_mem_layout, page=args.page_size)
            store = StorageBackendFactory.create_backend(
                args.hicache_storage_backend, cfg, pool)
            store.register_mem_pool_host(pool)
            stores.append((store, pool))
        (a, pool_a), (b, pool_b) = stores
        keys = get_hash_str(list(range(7, 7 + args.page_size)), None,
                            args.page_size)
        src = pool_a.alloc(args.page_size)
        fill(pool_a, src, seed=6, page=args.page_size)
        assert a.batch_set_v1(keys, src) == [True]
        assert eventually(lambda: b.batch_exists(keys), 1) == 1
        dst = pool_b.alloc(args.page_size)
        assert b.batch_get_v1(keys, dst) == [True]
        assert torch.equal(
            pool_a.get_data_page(int(src[0])).view(torch.int16),
            pool_b.get_data_page(int(dst[0])).view(torch.int16))
    finally:
        for store, _ in stores:
            store.close()


def test_pages_set_on_one_node_are_got_on_another(cluster):
    """Zero-copy v1 calls: set through agent a, exists and get through
    agent b (its own host pool and indices); the bytes are equal, and b
    fetched them from a."""
    pool_a, pool_b = host_pool(), host_pool()
    a = make_store(cluster, "a", pool_a)
    b = make_store(cluster, "b", pool_b)
    try:
        tokens = list(range(1000, 1000 + 6 * PAGE))
        keys = page_hashes(tokens)
        assert len(keys) == 6 and all(len(k) == 64 for k in keys)
        src = pool_a.alloc(6 * PAGE)
        fill(pool_a, src, seed=1)
        assert b.batch_exists(keys) == 0
        assert a.batch_set_v1(keys, src) == [True] * 6
        assert a.batch_exists(keys) == 6
        assert eventually(lambda: b.batch_exists(keys), 6) == 6

        pool_b.alloc(3 * PAGE)  # other indices than on a
        dst = pool_b.alloc(6 * PAGE)
        assert not torch.equal(dst, src)
        assert b.batch_get_v1(keys, dst) == [True] * 6
        for x, y in zip(pages(pool_a, src), pages(pool_b, dst)):
            assert torch.equal(x.view(torch.int16), y.view(torch.int16))
        assert b.get_stats()["fetched_chunks"] >= 6

        # storing again is accepted and writes nothing new
        chunks = a.get_stats()["chunks"]
        assert a.batch_set_v1(keys, src) == [True] * 6
        assert a.get_stats()["chunks"] == chunks
    finally:
        a.close()
        b.close()


def test_batch_exists_counts_leading_pages(cluster):
    pool = host_pool()
    store = make_store(cluster, "a", pool)
    try:
        keys = page_hashes(list(range(4 * PAGE)))
        idx = pool.alloc(4 * PAGE)
        fill(pool, idx, seed=2)
        # pages 0, 1 and 3 stored, 2 not
        for i in (0, 1, 3):
            assert store.batch_set_v1(
                [keys[i]], idx[i * PAGE:(i + 1) * PAGE]) == [True]
        assert store.batch_exists(keys) == 2
        assert store.exists(keys[3]) and not store.exists(keys[2])
        assert store.batch_exists(keys[2:]) == 0
        assert store.batch_exists(keys[3:]) == 1
        got = store.batch_get_v1(keys, pool.alloc(4 * PAGE))
        assert got == [True, True, False, True]
    finally:
        store.close()


def test_tensor_api_get_set_exists(cluster):
    """The generic (non-v1) path SGLang uses without interface_v1: flat
    data pages in and out."""
    pool_a, pool_b = host_pool(), host_pool()
    a = make_store(cluster, "a", pool_a, interface_v1=0)
    b = make_store(cluster, "b", pool_b, interface_v1=0)
    try:
        keys = page_hashes(list(range(77, 77 + 2 * PAGE)))
        idx = pool_a.alloc(2 * PAGE)
        fill(pool_a, idx, seed=3)
        data = pages(pool_a, idx)
        assert not a.exists(keys[0])
        assert a.set(keys[0], data[0])
        assert a.batch_set(keys[1:], data[1:])
        assert eventually(lambda: b.batch_exists(keys), 2) == 2
        assert b.exists(keys[0])
        out = b.batch_get(keys, [pool_b.get_dummy_flat_data_page()
                                 for _ in keys])
        for x, y in zip(data, out):
            assert torch.equal(x.view(torch.int16), y.view(torch.int16))
        one = b.get(keys[1], pool_b.get_dummy_flat_data_page())
        assert torch.equal(one.view(torch.int16), data[1].view(torch.int16))
        assert b.get(page_hashes(list(range(PAGE)))[0],
                     pool_b.get_dummy_flat_data_page()) is None
    finally:
        a.close()
        b.close()


def test_page_first_direct_chunks_are_kv_2ltd(cluster):
    """page_first_direct pages are kvfabric's KV_2LTD chunks
    ([2][layers][tokens][heads*dim]) byte for byte, under the namespace of
    the kvfabric key helpers with chunk size = page size."""
    import kvfabric
    from kvfabric.sglang import LAYOUT_KV_2LTD

    pool = host_pool("page_first_direct")
    store = make_store(cluster, "a", pool)
    try:
        keys = page_hashes(list(range(5, 5 + PAGE)))
        idx = pool.alloc(PAGE)
        fill(pool, idx, seed=4)
        assert store.batch_set_v1(keys, idx) == [True]
        ns = kvfabric.namespace_fingerprint(
            "org-tiny-llama", "bf16", LAYERS, HEADS, DIM, tp_rank=0,
            tp_world=1, chunk_size=PAGE, layout_version=LAYOUT_KV_2LTD)
        assert store.ns == ns
        key = kvfabric.key_from_digest(ns, bytes.fromhex(keys[0]))
        with cluster.client("a") as c:
            [slot], missing = c.retrieve([key])
            assert missing == [False]
            chunk = c.slot_tensor(slot, DTYPE).view(2, LAYERS, PAGE,
                                                    HEADS * DIM).clone()
            c.release([slot])
        page = pool.kv_buffer[:, int(idx[0]) // PAGE]  # [2][L][T][H][D]
        assert torch.equal(chunk.view(torch.int16),
                           page.reshape(2, LAYERS, PAGE,
                                        HEADS * DIM).view(torch.int16))
    finally:
        store.close()


def test_namespaces_per_rank_and_layout(cluster):
    """MHA: each TP rank has its own pages; the layout is part of the
    namespace. MLA: ranks share, and only the writer rank stores."""
    pool = host_pool()
    idx = pool.alloc(PAGE)
    fill(pool, idx, seed=5)
    keys = page_hashes(list(range(300, 300 + PAGE)))
    r0 = make_store(cluster, "a", pool, tp_rank=0, tp_size=2)
    # on the same agent, where a stored chunk is visible at once
    r1 = make_store(cluster, "a", pool, tp_rank=1, tp_size=2)
    pf = make_store(cluster, "a", host_pool("page_first"), tp_rank=0,
                    tp_size=2)
    try:
        assert r0.batch_set_v1(keys, idx) == [True]
        assert r0.batch_exists(keys) == 1
        assert r1.batch_exists(keys) == 0
        assert pf.batch_exists(keys) == 0
        assert len({r0.ns, r1.ns, pf.ns}) == 3
    finally:
        for s in (r0, r1, pf):
            s.close()

    keys = page_hashes(list(range(400, 400 + PAGE)))
    # MLA geometry from extra_config (the v1 page calls are not used)
    geo = {"dtype": "bf16", "num_layers": LAYERS, "num_kv_heads": 1,
           "head_dim": DIM, "page_size": PAGE}
    w = StorageBackendFactory.create_backend(
        "dynamic", storage_config(cluster.sockets["a"], 0, 2, True, **geo),
        None)
    r = StorageBackendFactory.create_backend(
        "dynamic", storage_config(cluster.sockets["b"], 1, 2, True, **geo),
        None)
    try:
        assert w.ns == r.ns
        page = torch.ones(LAYERS, PAGE, DIM, dtype=DTYPE)
        assert r.set(keys[0], page)  # not the writer: accepted, not stored
        assert not w.exists(keys[0])
        assert w.set(keys[0], page)
        assert eventually(lambda: r.exists(keys[0]), True)
    finally:
        w.close()
        r.close()
