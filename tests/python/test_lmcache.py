# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""kvfabric.lmcache_adapter against the installed lmcache package
(build/venv-sglang, make venv-sglang): LMCache's own --l2-adapter parser
and adapter factory load the native plugin and wrap it in LMCache's
NativeConnectorL2Adapter; KV_2LTD memory objects stored through agent a
are found and loaded through agent b (fetched over UCX), byte for byte."""
import argparse
import json
import select
import time

import pytest
from conftest import doc_command

lmcache = pytest.importorskip(
    "lmcache", reason="lmcache not installed: run make venv-sglang")
torch = pytest.importorskip("torch")

from lmcache.v1.distributed.api import ObjectKey  # noqa: E402
from lmcache.v1.distributed.l2_adapters.config import (  # noqa: E402
    add_l2_adapters_args, parse_args_to_l2_adapters_config)
from lmcache.v1.distributed.l2_adapters.factory import \
    create_l2_adapter_from_registry  # noqa: E402
from lmcache.v1.memory_management import (MemoryFormat,  # noqa: E402
                                          MemoryObjMetadata, TensorMemoryObj)

LAYERS, HEADS, DIM, CHUNK = 2, 2, 16, 16
SHAPE = torch.Size([2, LAYERS, CHUNK, HEADS * DIM])  # KV_2LTD
DTYPE = torch.bfloat16


def adapter_json(socket, **over):
    params = {"socket": socket, "timeout": 20, "dtype": "bf16",
              "num_layers": LAYERS, "num_kv_heads": HEADS, "head_dim": DIM,
              "chunk_size": CHUNK}
    params.update(over)
    return json.dumps({"type": "native_plugin",
                       "module_path": "kvfabric.lmcache_adapter",
                       "class_name": "KvfabricConnector",
                       "adapter_params": params})


def make_adapter(cluster, agent, **over):
    """As LMCache's server builds its L2 tier from --l2-adapter."""
    parser = add_l2_adapters_args(argparse.ArgumentParser())
    args = parser.parse_args(["--l2-adapter",
                              adapter_json(cluster.sockets[agent], **over)])
    [cfg] = parse_args_to_l2_adapters_config(args).adapters
    return create_l2_adapter_from_registry(cfg)


def memory_obj(seed=None):
    """An LMCache KV_2LTD chunk object on CPU (random or zero bytes)."""
    n = SHAPE.numel() * DTYPE.itemsize
    raw = torch.zeros(n, dtype=torch.uint8)
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        raw.copy_(torch.randint(0, 256, (n,), generator=g,
                                dtype=torch.uint8))
    meta = MemoryObjMetadata(shape=SHAPE, dtype=DTYPE, address=0,
                             phy_size=n, ref_count=1,
                             fmt=MemoryFormat.KV_2LTD)
    return TensorMemoryObj(raw, meta, None)


def obj_key(i, rank=0, model="org/tiny-llama"):
    return ObjectKey(chunk_hash=bytes([i]) * 32, model_name=model,
                     kv_rank=rank)


def test_the_documented_command_builds_the_tier(cluster):
    """docs/integration-lmcache.md's command: its storage flags go through
    LMCache's own storage-manager parser and adapter factory."""
    from lmcache.v1.distributed.config import (add_storage_manager_args,
                                               parse_args_to_config)

    argv = doc_command("integration-lmcache.md")
    assert argv[:3] == ["python", "-m", "lmcache.v1.multiprocess.server"]
    i = argv.index("--l2-adapter")
    cfg = json.loads(argv[i + 1])
    cfg["adapter_params"].update(socket=cluster.sockets["a"], num_layers=LAYERS,
                                 num_kv_heads=HEADS, head_dim=DIM,
                                 chunk_size=CHUNK)
    argv[i + 1] = json.dumps(cfg)
    parser = add_storage_manager_args(argparse.ArgumentParser())
    config = parse_args_to_config(parser.parse_args(argv[3:]))
    [l2] = config.l2_adapter_config.adapters
    ad = create_l2_adapter_from_registry(l2)
    try:
        k, obj = obj_key(99), memory_obj(seed=99)
        assert store(ad, [k], [obj]).is_successful()
        dst = memory_obj()
        assert load(ad, [k], [dst]) == [True]
        assert bytes(dst.byte_array) == bytes(obj.byte_array)
    finally:
        ad.close()


def wait_result(fd, query, timeout=20.0):
    """query() until not None, waking on the adapter's event fd, within
    @p timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = query()
        if got is not None:
            return got
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("lmcache adapter result")
        select.select([fd], [], [], min(left, 0.1))


def store(ad, keys, objs):
    tid = ad.submit_store_task(keys, objs)
    return wait_result(ad.get_store_event_fd(),
                       lambda: ad.pop_completed_store_tasks().get(tid))


def lookup(ad, keys):
    tid = ad.submit_lookup_and_lock_task(keys, {})
    bm = wait_result(ad.get_lookup_and_lock_event_fd(),
                     lambda: ad.query_lookup_and_lock_result(tid))
    ad.submit_unlock(keys)
    return bits(bm, len(keys))


def load(ad, keys, objs):
    tid = ad.submit_load_task(keys, objs)
    bm = wait_result(ad.get_load_event_fd(),
                     lambda: ad.query_load_result(tid))
    return bits(bm, len(keys))


def bits(bm, n):
    return [bool(bm.test(i)) for i in range(n)]


def test_lmcache_loader_builds_the_kvfabric_tier(cluster):
    from lmcache.v1.distributed.l2_adapters.native_connector_l2_adapter \
        import NativeConnectorL2Adapter

    from kvfabric.lmcache_adapter import KvfabricConnector

    ad = make_adapter(cluster, "a")
    try:
        assert isinstance(ad, NativeConnectorL2Adapter)
        assert isinstance(ad._client, KvfabricConnector)
        assert ad.report_status()["is_healthy"]
    finally:
        ad.close()


def test_chunks_stored_on_one_node_load_on_another(cluster):
    a, b = make_adapter(cluster, "a"), make_adapter(cluster, "b")
    try:
        keys = [obj_key(i) for i in range(1, 5)]
        objs = [memory_obj(seed=i) for i in range(4)]
        assert lookup(b, keys) == [False] * 4
        res = store(a, keys, objs)
        assert res.is_successful()
        assert res.bytes_transferred() == 4 * SHAPE.numel() * DTYPE.itemsize
        assert lookup(a, keys) == [True] * 4

        deadline = time.monotonic() + 20
        while lookup(b, keys) != [True] * 4:
            assert time.monotonic() < deadline, "b never saw a's chunks"
            time.sleep(0.02)
        dst = [memory_obj() for _ in keys]
        assert load(b, keys, dst) == [True] * 4
        for x, y in zip(objs, dst):
            assert bytes(x.byte_array) == bytes(y.byte_array)
        with cluster.client("b") as c:
            assert c.stats().fetched_chunks >= 4
    finally:
        a.close()
        b.close()


def test_lookup_is_per_key_and_namespaced(cluster):
    ad = make_adapter(cluster, "a")
    try:
        keys = [obj_key(i) for i in range(10, 15)]
        objs = [memory_obj(seed=i) for i in range(5)]
        # keys 0, 1 and 3 stored
        store(ad, [keys[i] for i in (0, 1, 3)], [objs[i] for i in (0, 1, 3)])
        assert lookup(ad, keys) == [True, True, False, True, False]
        dst = [memory_obj() for _ in keys]
        assert load(ad, keys, dst) == [True, True, False, True, False]
        assert bytes(dst[3].byte_array) == bytes(objs[3].byte_array)
        # another kv rank, model or salt is another namespace
        others = [obj_key(10, rank=1), obj_key(10, model="org/other"),
                  ObjectKey(chunk_hash=bytes([10]) * 32,
                            model_name="org/tiny-llama", kv_rank=0,
                            cache_salt="user-7")]
        assert lookup(ad, others) == [False] * 3
    finally:
        ad.close()


def test_connector_maps_lmcache_keys_with_the_key_helpers(cluster):
    """The key and the bytes in the pool are what the docs promise:
    key_from_digest(namespace_fingerprint(<model>@<rank>@<group>, ...),
    chunk_hash), the object's bytes as the chunk."""
    import kvfabric
    from lmcache.v1.distributed.l2_adapters.native_connector_l2_adapter \
        import _object_key_to_string

    ad = make_adapter(cluster, "a")
    try:
        k = obj_key(42)
        obj = memory_obj(seed=42)
        store(ad, [k], [obj])
        text = _object_key_to_string(k)
        model, rank, group, digest = text.split("@")
        ns = kvfabric.namespace_fingerprint(
            f"{model}@{rank}@{group}", "bf16", LAYERS, HEADS, DIM,
            chunk_size=CHUNK)
        key = kvfabric.key_from_digest(ns, bytes.fromhex(digest))
        assert ad._client.key(text) == key
        with cluster.client("a") as c:
            [slot], missing = c.retrieve([key])
            assert missing == [False]
            assert bytes(c.slot_view(slot)) == bytes(obj.byte_array)
            c.release([slot])
    finally:
        ad.close()


def test_a_failed_batch_completes_with_its_error(cluster):
    """LMCache waits for every future id: a batch that fails (a key that is
    not LMCache's, a buffer of another size) completes, never hangs."""
    from kvfabric.lmcache_adapter import KvfabricConnector

    c = KvfabricConnector("bf16", LAYERS, HEADS, DIM, CHUNK,
                          socket=cluster.sockets["a"], timeout=20)
    try:
        bad = c.submit_batch_exists(["not-a-key"])
        good = "m@00000000@0@" + "ab" * 32
        obj = memory_obj(seed=1)
        stored = c.submit_batch_set([good], [obj.byte_array])
        small = memoryview(bytearray(16))
        short = c.submit_batch_get([good], [small])
        done = {}
        deadline = time.monotonic() + 20
        while len(done) < 3:
            assert time.monotonic() < deadline, f"only {done} completed"
            select.select([c.event_fd()], [], [], 0.1)
            for fid, ok, err, bools in c.drain_completions():
                done[fid] = (ok, err, bools)
        assert done[bad][0] is False and "not an LMCache key" in done[bad][1]
        assert done[stored] == (True, "", [True])
        assert done[short] == (False, "", [False])
    finally:
        c.close()
