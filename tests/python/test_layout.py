# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""The torch layout helpers are bit-identical to the C copies in gpu/
(kvf_gpu_kv_pack_cpu / unpack_cpu) for random tensors: vLLM flash-attn,
separate K/V and SGLang layouts; fp16, bf16 and fp32; skipped slots,
offsets and layer groups."""
import pytest

from conftest import torch_or_skip

CASES = [
    # kind, dtype, layers, heads, dim, block_size, num_blocks
    ("vllm", "bfloat16", 4, 8, 64, 16, 12),
    ("vllm", "float16", 3, 2, 64, 4, 40),
    ("vllm", "float32", 2, 1, 32, 8, 9),
    ("kv", "bfloat16", 2, 4, 64, 16, 8),
    ("sglang", "bfloat16", 4, 8, 64, 1, 300),
    ("sglang", "float16", 2, 2, 128, 1, 97),
]


def rand_like_dtype(torch, shape, dtype, gen):
    # random bit patterns, NaNs and all: the copies move bytes
    n = 1
    for s in shape:
        n *= s
    size = torch.tensor([], dtype=dtype).element_size()
    raw = torch.randint(-2**15 if size == 2 else -2**31,
                        2**15 if size == 2 else 2**31,
                        (n,), generator=gen,
                        dtype=torch.int16 if size == 2 else torch.int32)
    return raw.view(dtype).view(shape)


def randomize(torch, caches, gen):
    for c in caches:
        for t in ((c,) if torch.is_tensor(c) else c):
            t.copy_(rand_like_dtype(torch, t.shape, t.dtype, gen))


def bits(torch, t):
    size = t.element_size()
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[size])


def same(torch, a, b):
    return torch.equal(bits(torch, a), bits(torch, b))


def caches_equal(torch, x, y):
    for cx, cy in zip(x, y):
        for tx, ty in zip((cx,) if torch.is_tensor(cx) else cx,
                          (cy,) if torch.is_tensor(cy) else cy):
            if not same(torch, tx, ty):
                return False
    return True


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_pack_and_unpack_match_c(case):
    torch = torch_or_skip()
    from kvfabric.layout import PagedLayout

    kind, dt, L, H, D, bs, nb = case
    dtype = getattr(torch, dt)
    lay = PagedLayout(kind, dtype, L, H, D, bs, nb)
    gen = torch.Generator().manual_seed(hash(case) & 0xffff)
    caches = lay.allocate()
    randomize(torch, caches, gen)
    T = 16
    assert lay.chunk_bytes(T) == 2 * L * T * H * D * \
        torch.tensor([], dtype=dtype).element_size()

    for trial in range(4):
        n_tok = 40
        slots = torch.randperm(lay.num_slots, generator=gen)[:n_tok]
        slots[3] = -1  # a skipped token
        token_begin, num_tokens, offset = trial, min(T - trial, 12), trial
        lb, lc = (0, None) if trial % 2 == 0 else (1, L - 1)

        ref = rand_like_dtype(torch, lay.chunk_shape(T), dtype, gen)
        c_py, c_c = ref.clone(), ref.clone()
        kw = dict(token_begin=token_begin, num_tokens=num_tokens,
                  chunk_offset=offset, layer_begin=lb, layer_count=lc)
        lay.pack(caches, slots, c_py, **kw)
        lay.pack_c(caches, slots, c_c, **kw)
        assert same(torch, c_py, c_c), f"pack differs, trial {trial}"
        assert not same(torch, c_py, ref)

        dst_py, dst_c = lay.allocate(), lay.allocate()
        randomize(torch, dst_py, gen)
        for x, y in zip(dst_c, dst_py):
            for tx, ty in zip((x,) if torch.is_tensor(x) else x,
                              (y,) if torch.is_tensor(y) else y):
                tx.copy_(ty)
        lay.unpack(dst_py, slots, c_py, **kw)
        lay.unpack_c(dst_c, slots, c_c, **kw)
        assert caches_equal(torch, dst_py, dst_c), \
            f"unpack differs, trial {trial}"


def test_round_trip_vllm_to_sglang_through_a_chunk():
    """A chunk packed from a vLLM cache unpacks into an SGLang cache with
    every token's K and V bit for bit (the chunk is engine-independent)."""
    torch = torch_or_skip()
    from kvfabric.layout import PagedLayout

    dtype = torch.bfloat16
    v = PagedLayout("vllm", dtype, 3, 4, 64, 16, 8)
    s = PagedLayout("sglang", dtype, 3, 4, 64, 1, 200)
    gen = torch.Generator().manual_seed(5)
    vc, sc = v.allocate(), s.allocate()
    randomize(torch, vc, gen)
    src = torch.tensor([17, 18, 19, 40, 41, 42, 43, 100, 5, 6, 7, 8, 9, 10,
                        11, 12])
    dst = torch.arange(150, 166)
    chunk = torch.empty(v.chunk_shape(16), dtype=dtype)
    v.pack(vc, src, chunk)
    s.unpack(sc, dst, chunk)
    for layer in range(3):
        for kv in (0, 1):
            assert same(torch, v.rows(vc, layer, kv)[src],
                        s.rows(sc, layer, kv)[dst])


def test_bad_ranges_raise():
    torch = torch_or_skip()
    import kvfabric
    from kvfabric.layout import PagedLayout

    lay = PagedLayout("vllm", torch.float16, 2, 2, 64, 4, 4)
    caches = lay.allocate()
    chunk = torch.zeros(lay.chunk_shape(4), dtype=torch.float16)
    slots = torch.arange(8)
    with pytest.raises(IndexError):
        lay.pack(caches, slots, chunk)  # 8 tokens into a 4-token chunk
    with pytest.raises(kvfabric.KvfError) as e:
        lay.pack_c(caches, slots, chunk)
    assert e.value.name == "KVF_ERR_RANGE"
    with pytest.raises(IndexError):
        lay.unpack(caches, torch.tensor([99, 0, 1, 2]), chunk)
    with pytest.raises(ValueError):
        PagedLayout("paged", torch.float16, 1, 1, 1, 1, 1)


# layout -> (per-layer tensor, logical K and V [B][bs][H][D]) for the
# layouts only the torch copies take, built from the same logical KV
def _logical_to(torch, kind, k, v):
    B, bs, h, d = k.shape
    if kind == "vllm_hnd":
        return torch.stack([k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)])
    if kind == "flashinfer":
        return torch.stack([k, v], dim=1)
    if kind == "flashinfer_hnd":
        return torch.stack([k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)],
                           dim=1)
    assert kind == "cpu"
    # vLLM's CPU backend: [B][H][bs][2D] read as [B][H][2][bs][D]
    t = torch.stack([k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)], dim=2)
    return t.contiguous().view(B, h, bs, 2 * d)


@pytest.mark.parametrize("kind", ["vllm_hnd", "flashinfer",
                                  "flashinfer_hnd", "cpu"])
def test_other_vllm_layouts_match_flash_nhd(kind):
    """Every vLLM layout packs the chunk the flash-attention NHD layout
    packs from the same KV (bit for bit), and unpacks it back; the layout
    is found from the shape."""
    torch = torch_or_skip()
    from kvfabric.layout import PagedLayout, vllm_layout

    gen = torch.Generator().manual_seed(7)
    L, h, d, bs, B, T = 2, 2, 64, 16, 6, 40
    ref = PagedLayout("vllm", torch.bfloat16, L, h, d, bs, B)
    nhd = ref.allocate()
    randomize(torch, nhd, gen)
    other = [_logical_to(torch, kind, c[0], c[1]).contiguous() for c in nhd]
    lay = vllm_layout(other, num_kv_heads=h, head_dim=d, block_size=bs)
    assert lay.kind == kind and lay.num_blocks == B
    sm = torch.randperm(B * bs, generator=gen)[:T]
    sm[5] = -1
    want = torch.zeros(ref.chunk_shape(T), dtype=torch.bfloat16)
    got = torch.zeros(ref.chunk_shape(T), dtype=torch.bfloat16)
    ref.pack(nhd, sm, want)
    lay.pack(other, sm, got)
    assert same(torch, want, got)
    assert lay.chunk_bytes(T) == ref.chunk_bytes(T)
    back = lay.allocate()
    lay.unpack(back, sm, got)
    again = torch.zeros_like(got)
    lay.pack(back, sm, again)
    assert same(torch, want, again)


def test_vllm_layout_refuses_unknown_or_ambiguous_shapes():
    torch = torch_or_skip()
    from kvfabric.layout import vllm_layout

    with pytest.raises(ValueError):
        vllm_layout([torch.zeros(3, 4, 5)])
    # heads == block_size: NHD and HND both fit; naming one settles it
    t = [torch.zeros(2, 4, 8, 8, 64, dtype=torch.float16)]
    with pytest.raises(ValueError):
        vllm_layout(t, head_dim=64)
    assert vllm_layout(t, kind="vllm_hnd").kind == "vllm_hnd"
    with pytest.raises(ValueError):  # wrong heads for the model
        vllm_layout([torch.zeros(2, 4, 16, 8, 64)], num_kv_heads=4)
