# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""Pack/unpack between an engine's paged KV cache (torch tensors) and
kvfabric chunks, bit-identical to the C copies in gpu/ (include/kvfabric/
gpu.h), which the tests check with random tensors.

A chunk is ``KV_2LTD``: ``[2][num_layers][chunk_tokens][num_kv_heads *
head_dim]`` (K then V). Token ``i`` of a copy sits in the paged cache at
``slot_mapping[token_begin + i]`` (``slot = block * block_size + offset``;
-1 skips the token, leaving its destination untouched) and in the chunk at
token position ``chunk_offset + i``.

Cache layouts (``caches`` argument):

* ``"vllm"`` (flash-attention, NHD): one tensor per layer,
  ``[2][num_blocks][block_size][num_kv_heads][head_dim]``;
* ``"vllm_hnd"`` (flash-attention, HND; also vLLM's older CPU backend):
  ``[2][num_blocks][num_kv_heads][block_size][head_dim]``;
* ``"flashinfer"`` (NHD): ``[num_blocks][2][block_size][num_kv_heads]
  [head_dim]``; ``"flashinfer_hnd"``: ``[num_blocks][2][num_kv_heads]
  [block_size][head_dim]``;
* ``"cpu"`` (vLLM's CPU attention backend, 0.11 on): declared
  ``[num_blocks][num_kv_heads][block_size][2 * head_dim]``, which the
  backend reads as ``[num_blocks][num_kv_heads][2][block_size][head_dim]``
  (``view(B, H, 2 * block_size, D).chunk(2, dim=2)``: each head of a block
  holds its block_size K rows, then its V rows; not K|V per token);
* ``"kv"``: a (K, V) pair per layer, each
  ``[num_blocks][block_size][num_kv_heads][head_dim]``;
* ``"sglang"``: a (K, V) pair per layer, each
  ``[num_slots][num_kv_heads][head_dim]`` (block_size 1).

The C copies (``pack_c``/``unpack_c``) exist for the layouts gpu/ has
(``"vllm"``, ``"kv"``, ``"sglang"``); the torch copies take every layout.

Two implementations with one signature: ``pack``/``unpack`` in torch (any
device; what an engine calls) and ``pack_c``/``unpack_c`` through
kvf_gpu_kv_pack_cpu/kvf_gpu_kv_unpack_cpu (CPU tensors; the reference).
"""
import ctypes
from dataclasses import dataclass
from typing import Optional, Sequence

from . import _lib
from .errors import check

LAYOUTS = {"vllm": 0, "kv": 1, "sglang": 2}
# layouts only the torch copies take (gpu/ may add them under other codes)
TORCH_LAYOUTS = ("vllm_hnd", "flashinfer", "flashinfer_hnd", "cpu")

# kvf_gpu_dtype_t by element size is what the copies need; name it properly
_GPU_DTYPES = {"float16": 0, "bfloat16": 1, "float32": 2,
               "float8_e4m3fn": 3, "float8_e5m2": 3, "uint8": 3, "int8": 3}


def _gpu_dtype(dtype) -> int:
    name = str(dtype).replace("torch.", "")
    try:
        return _GPU_DTYPES[name]
    except KeyError:
        raise ValueError(f"kvfabric: no kvf_gpu_dtype_t for {dtype}") from None


@dataclass(frozen=True)
class PagedLayout:
    """The shape of an engine's paged KV cache (kvf_gpu_kv_layout_t)."""
    kind: str            # "vllm", "kv" or "sglang"
    dtype: object        # torch dtype
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    num_blocks: int      # sglang: the slot count (block_size 1)

    def __post_init__(self):
        if self.kind not in LAYOUTS and self.kind not in TORCH_LAYOUTS:
            raise ValueError(f"kvfabric: unknown layout {self.kind!r}")
        if self.kind == "sglang" and self.block_size != 1:
            raise ValueError("kvfabric: the sglang layout has block_size 1")

    @property
    def row(self) -> int:
        """Elements of one token's row (num_kv_heads * head_dim)."""
        return self.num_kv_heads * self.head_dim

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    def chunk_shape(self, chunk_tokens: int):
        return (2, self.num_layers, chunk_tokens, self.row)

    def chunk_bytes(self, chunk_tokens: int) -> int:
        """kvf_gpu_kv_chunk_bytes() of this layout (the chunk format is the
        same for every layout: 2 x layers x tokens x row elements)."""
        if self.kind not in LAYOUTS:
            return (2 * self.num_layers * chunk_tokens * self.row *
                    _elem_size(self.dtype))
        n = ctypes.c_size_t()
        lay = self._c_layout()
        check(_lib.lib.kvf_gpu_kv_chunk_bytes(ctypes.byref(lay), chunk_tokens,
                                              ctypes.byref(n)),
              "kvf_gpu_kv_chunk_bytes")
        return n.value

    def allocate(self, device="cpu", fill=None):
        """A zeroed cache of this shape in this layout (list per layer)."""
        import torch

        def t(*shape):
            x = torch.zeros(shape, dtype=self.dtype, device=device)
            return x

        h, d = self.num_kv_heads, self.head_dim
        if self.kind in _SINGLE_SHAPES:
            shape = _SINGLE_SHAPES[self.kind](self.num_blocks,
                                              self.block_size, h, d)
            return [t(*shape) for _ in range(self.num_layers)]
        if self.kind == "kv":
            return [(t(self.num_blocks, self.block_size, h, d),
                     t(self.num_blocks, self.block_size, h, d))
                    for _ in range(self.num_layers)]
        return [(t(self.num_slots, h, d), t(self.num_slots, h, d))
                for _ in range(self.num_layers)]

    # views -------------------------------------------------------------

    def rows(self, caches, layer: int, kv: int):
        """[num_slots, row] view (no copy) of layer @p layer's K (0) or V (1)
        in @p caches (token-major layouts: vllm, kv, sglang)."""
        # .view, never .reshape: a copy would swallow unpack's writes
        return caches[layer][kv].view(self.num_slots, self.row)

    @property
    def token_major(self) -> bool:
        """A token's row (heads x dim) is contiguous in the cache."""
        return self.kind in ("vllm", "kv", "sglang")

    def blocks4(self, caches, layer: int, kv: int):
        """[num_blocks][block_size][heads][dim] view (strided, no copy) of
        layer @p layer's K (0) or V (1) in @p caches."""
        t = caches[layer]
        B, bs, h, d = (self.num_blocks, self.block_size, self.num_kv_heads,
                       self.head_dim)
        if self.kind in ("vllm", "kv"):
            return t[kv].view(B, bs, h, d)
        if self.kind == "sglang":
            return t[kv].view(B, 1, h, d)
        if self.kind == "vllm_hnd":
            return t[kv].permute(0, 2, 1, 3)
        if self.kind == "flashinfer":
            return t[:, kv]
        if self.kind == "flashinfer_hnd":
            return t[:, kv].permute(0, 2, 1, 3)
        # cpu: [B][H][bs][2D] read as [B][H][2][bs][D]
        return t.view(B, h, 2, bs, d)[:, :, kv].permute(0, 2, 1, 3)

    def check_caches(self, caches) -> None:
        """Raises ValueError unless @p caches have this layout's shapes."""
        self._check_caches(caches)
        if self.kind not in _SINGLE_SHAPES:
            return
        want = tuple(_SINGLE_SHAPES[self.kind](
            self.num_blocks, self.block_size, self.num_kv_heads,
            self.head_dim))
        for i, c in enumerate(caches):
            if tuple(c.shape) != want or c.dtype != self.dtype:
                raise ValueError(
                    f"kvfabric: layer {i} cache is {tuple(c.shape)} "
                    f"{c.dtype}, layout {self.kind} wants {want} "
                    f"{self.dtype}")
            if not c.is_contiguous():
                raise ValueError(f"kvfabric: layer {i} cache is not "
                                 "contiguous")

    def _chunk4(self, chunk, chunk_tokens: Optional[int]):
        """@p chunk as [2][L][T][row] of the cache dtype (a view)."""
        if chunk.dtype != self.dtype:
            chunk = chunk.view(-1).view(self.dtype)
        if chunk_tokens is None:
            chunk_tokens = chunk.numel() // (2 * self.num_layers * self.row)
        return chunk.view(2, self.num_layers, chunk_tokens, self.row)

    def _check_caches(self, caches):
        if len(caches) != self.num_layers:
            raise ValueError(f"kvfabric: {len(caches)} cache layers, "
                             f"layout has {self.num_layers}")

    # torch implementation ----------------------------------------------

    def _plan(self, slot_mapping, token_begin, num_tokens, chunk4,
              chunk_offset, layer_begin, layer_count):
        import torch

        if num_tokens is None:
            num_tokens = slot_mapping.numel() - token_begin
        if layer_count is None:
            layer_count = self.num_layers - layer_begin
        slots = slot_mapping[token_begin:token_begin + num_tokens]
        if slots.numel() != num_tokens or num_tokens < 1:
            raise IndexError("kvfabric: token range passes the slot mapping")
        if chunk_offset + num_tokens > chunk4.shape[2]:
            raise IndexError("kvfabric: token range passes the chunk")
        if layer_begin + layer_count > self.num_layers or layer_count < 1:
            raise IndexError("kvfabric: layer group passes num_layers")
        slots = slots.to(torch.int64)
        valid = slots >= 0
        if bool((slots >= self.num_slots).any()):
            raise IndexError("kvfabric: slot beyond the cache")
        pos = torch.arange(chunk_offset, chunk_offset + num_tokens,
                           device=slots.device)
        if not bool(valid.all()):
            slots, pos = slots[valid], pos[valid]
        return slots, pos, range(layer_begin, layer_begin + layer_count)

    def _prepare(self, caches, slot_mapping, chunk, token_begin, num_tokens,
                 chunk_offset, chunk_tokens, layer_begin, layer_count):
        """What pack() and unpack() check and plan: (chunk as a 4-d view,
        slots, positions in the chunk, layers)."""
        self._check_caches(caches)
        c4 = self._chunk4(chunk, chunk_tokens)
        slots, pos, layers = self._plan(slot_mapping, token_begin, num_tokens,
                                        c4, chunk_offset, layer_begin,
                                        layer_count)
        return c4, slots, pos, layers

    def pack(self, caches, slot_mapping, chunk, token_begin: int = 0,
             num_tokens: Optional[int] = None, chunk_offset: int = 0,
             chunk_tokens: Optional[int] = None, layer_begin: int = 0,
             layer_count: Optional[int] = None) -> None:
        """Paged cache -> chunk (torch; the chunk is written in place, e.g. a
        Client.slot_tensor view of a granted slot)."""
        c4, slots, pos, layers = self._prepare(
            caches, slot_mapping, chunk, token_begin, num_tokens,
            chunk_offset, chunk_tokens, layer_begin, layer_count)
        if not self.token_major:
            bs = self.block_size
            for layer in layers:
                for kv in (0, 1):
                    src = self.blocks4(caches, layer, kv)
                    s = slots.to(src.device)
                    rows = src[s // bs, s % bs].reshape(-1, self.row)
                    c4[kv, layer].index_copy_(0, pos.to(c4.device),
                                              rows.to(c4.device))
            return
        for layer in layers:
            for kv in (0, 1):
                src = self.rows(caches, layer, kv)
                c4[kv, layer].index_copy_(
                    0, pos.to(c4.device),
                    src.index_select(0, slots.to(src.device)).to(c4.device))

    def unpack(self, caches, slot_mapping, chunk, token_begin: int = 0,
               num_tokens: Optional[int] = None, chunk_offset: int = 0,
               chunk_tokens: Optional[int] = None, layer_begin: int = 0,
               layer_count: Optional[int] = None) -> None:
        """Chunk -> paged cache (torch; the cache is written in place)."""
        c4, slots, pos, layers = self._prepare(
            caches, slot_mapping, chunk, token_begin, num_tokens,
            chunk_offset, chunk_tokens, layer_begin, layer_count)
        if not self.token_major:
            bs, h, d = self.block_size, self.num_kv_heads, self.head_dim
            for layer in layers:
                for kv in (0, 1):
                    dst = self.blocks4(caches, layer, kv)
                    s = slots.to(dst.device)
                    # index_put_ on the strided view writes the cache
                    dst[s // bs, s % bs] = c4[kv, layer].index_select(
                        0, pos.to(c4.device)).view(-1, h, d).to(dst.device)
            return
        for layer in layers:
            for kv in (0, 1):
                dst = self.rows(caches, layer, kv)
                dst.index_copy_(
                    0, slots.to(dst.device),
                    c4[kv, layer].index_select(0, pos.to(c4.device))
                    .to(dst.device))

    # C implementation (kvf_gpu_kv_pack_cpu / unpack_cpu) -----------------

    def _c_layout(self) -> _lib.GpuKvLayout:
        if self.kind not in LAYOUTS:
            raise ValueError(f"kvfabric: no C copy of layout {self.kind} "
                             "here; use pack/unpack")
        lay = _lib.GpuKvLayout()
        lay.field_mask = _lib.GPU_LAYOUT_FIELDS_ALL
        lay.layout = LAYOUTS[self.kind]
        lay.dtype = _gpu_dtype(self.dtype)
        lay.num_layers = self.num_layers
        lay.num_kv_heads = self.num_kv_heads
        lay.head_dim = self.head_dim
        lay.block_size = self.block_size
        lay.num_blocks = self.num_blocks
        return lay

    def _c_copy(self, fn, name, caches, slot_mapping, chunk, token_begin,
                num_tokens, chunk_offset, chunk_tokens, layer_begin,
                layer_count):
        import torch

        self._check_caches(caches)
        c4 = self._chunk4(chunk, chunk_tokens)
        for t in [c4] + [x for c in caches for x in
                         ((c,) if self.kind == "vllm" else c)]:
            if t.device.type != "cpu" or not t.is_contiguous():
                raise ValueError("kvfabric: the C copies take contiguous "
                                 "CPU tensors")
        sm = slot_mapping.to(torch.int64).contiguous()
        if num_tokens is None:
            num_tokens = sm.numel() - token_begin
        lay = self._c_layout()
        n = self.num_layers
        k = (ctypes.c_void_p * n)()
        v = (ctypes.c_void_p * n)()
        for i, c in enumerate(caches):
            if self.kind == "vllm":
                k[i] = c.data_ptr()
            else:
                k[i], v[i] = c[0].data_ptr(), c[1].data_ptr()
        p = _lib.GpuKvCopyParams()
        p.field_mask = (_lib.GPU_COPY_FIELD_LAYOUT |
                        _lib.GPU_COPY_FIELD_K_LAYERS |
                        _lib.GPU_COPY_FIELD_SLOT_MAPPING |
                        _lib.GPU_COPY_FIELD_SLOT_MAPPING_LEN |
                        _lib.GPU_COPY_FIELD_TOKEN_BEGIN |
                        _lib.GPU_COPY_FIELD_NUM_TOKENS |
                        _lib.GPU_COPY_FIELD_CHUNK |
                        _lib.GPU_COPY_FIELD_CHUNK_TOKENS |
                        _lib.GPU_COPY_FIELD_CHUNK_OFFSET |
                        _lib.GPU_COPY_FIELD_LAYER_BEGIN)
        p.layout = ctypes.pointer(lay)
        p.k_layers = k
        if self.kind != "vllm":
            p.field_mask |= _lib.GPU_COPY_FIELD_V_LAYERS
            p.v_layers = v
        p.slot_mapping = ctypes.cast(sm.data_ptr(),
                                     ctypes.POINTER(ctypes.c_int64))
        p.slot_mapping_len = sm.numel()
        p.token_begin = token_begin
        p.num_tokens = num_tokens
        p.chunk = c4.data_ptr()
        p.chunk_tokens = c4.shape[2]
        p.chunk_offset = chunk_offset
        p.layer_begin = layer_begin
        if layer_count is not None:
            p.field_mask |= _lib.GPU_COPY_FIELD_LAYER_COUNT
            p.layer_count = layer_count
        check(fn(ctypes.byref(p)), name)

    def _c_copy_method(fn_name: str):
        """A method that runs _c_copy through the C function @fn_name."""

        def method(self, caches, slot_mapping, chunk, token_begin: int = 0,
                   num_tokens: Optional[int] = None, chunk_offset: int = 0,
                   chunk_tokens: Optional[int] = None, layer_begin: int = 0,
                   layer_count: Optional[int] = None) -> None:
            self._c_copy(getattr(_lib.lib, fn_name), fn_name, caches,
                         slot_mapping, chunk, token_begin, num_tokens,
                         chunk_offset, chunk_tokens, layer_begin, layer_count)

        return method

    pack_c = _c_copy_method("kvf_gpu_kv_pack_cpu")
    pack_c.__doc__ = "pack() through kvf_gpu_kv_pack_cpu (CPU tensors)."
    unpack_c = _c_copy_method("kvf_gpu_kv_unpack_cpu")
    unpack_c.__doc__ = "unpack() through kvf_gpu_kv_unpack_cpu (CPU tensors)."
    del _c_copy_method

def _elem_size(dtype) -> int:
    import torch

    return torch.empty((), dtype=dtype).element_size()


# per-layer tensor shape of the single-tensor layouts, (B, bs, H, D) -> shape
_SINGLE_SHAPES = {
    "vllm": lambda B, bs, h, d: (2, B, bs, h, d),
    "vllm_hnd": lambda B, bs, h, d: (2, B, h, bs, d),
    "flashinfer": lambda B, bs, h, d: (B, 2, bs, h, d),
    "flashinfer_hnd": lambda B, bs, h, d: (B, 2, h, bs, d),
    "cpu": lambda B, bs, h, d: (B, h, bs, 2 * d),
}


def vllm_layout(kv_caches: Sequence, dtype=None, kind: Optional[str] = None,
                num_kv_heads: Optional[int] = None,
                head_dim: Optional[int] = None,
                block_size: Optional[int] = None) -> PagedLayout:
    """The PagedLayout of a list of vLLM per-layer KV cache tensors.

    @p kind names the layout (see the module doc); without it the tensor
    shape decides, with @p num_kv_heads / @p head_dim / @p block_size (from
    vLLM's config) to tell the layouts apart: a shape no layout explains, or
    one two layouts explain equally (heads == block_size and no @p kind),
    raises ValueError rather than guess."""
    t = kv_caches[0]
    shape = tuple(t.shape)
    for c in kv_caches[1:]:
        if tuple(c.shape) != shape:
            raise ValueError("kvfabric: KV cache layers differ in shape")
    kinds = [kind] if kind else list(_SINGLE_SHAPES)
    found = []
    for k in kinds:
        if k not in _SINGLE_SHAPES:
            raise ValueError(f"kvfabric: unknown vLLM layout {k!r}")
        if len(shape) != (4 if k == "cpu" else 5):
            continue
        if k == "cpu":
            B, h, bs, d2 = shape
            cand = (B, bs, h, d2 // 2) if d2 % 2 == 0 else None
        elif k in ("vllm", "vllm_hnd"):
            if shape[0] != 2:
                continue
            B = shape[1]
            a, b_, d = shape[2:]
            cand = (B, a, b_, d) if k == "vllm" else (B, b_, a, d)
        else:
            if shape[1] != 2:
                continue
            B = shape[0]
            a, b_, d = shape[2:]
            cand = (B, a, b_, d) if k == "flashinfer" else (B, b_, a, d)
        if cand is None:
            continue
        B, bs, h, d = cand
        if ((num_kv_heads is not None and h != num_kv_heads) or
                (head_dim is not None and d != head_dim) or
                (block_size is not None and bs != block_size)):
            continue
        found.append((k, cand))
    if not found:
        raise ValueError(f"kvfabric: no known vLLM KV cache layout has shape "
                         f"{shape} (heads {num_kv_heads}, head_dim "
                         f"{head_dim}, block_size {block_size})")
    if len(found) > 1:
        raise ValueError(f"kvfabric: KV cache shape {shape} fits layouts "
                         f"{[f[0] for f in found]}: name one")
    k, (B, bs, h, d) = found[0]
    lay = PagedLayout(k, dtype or t.dtype, len(kv_caches), h, d, bs, B)
    lay.check_caches(kv_caches)
    return lay


def sglang_layout(k_buffers: Sequence, dtype=None) -> PagedLayout:
    """The PagedLayout of SGLang's per-layer K buffers [slots][heads][dim]."""
    t = k_buffers[0]
    n, h, d = t.shape
    return PagedLayout("sglang", dtype or t.dtype, len(k_buffers), h, d, 1, n)
