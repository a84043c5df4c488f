# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""Chunk keys, namespaces and checksums, computed by the C library (keys.h)
so that Python and C engines produce the same keys for the same tokens."""
import ctypes
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence

from . import _lib
from .errors import check

DTYPE_FP16 = 1
DTYPE_BF16 = 2
DTYPE_FP32 = 3
DTYPE_FP8 = 4

_DTYPE_NAMES = {"fp16": DTYPE_FP16, "float16": DTYPE_FP16,
                "bf16": DTYPE_BF16, "bfloat16": DTYPE_BF16,
                "fp32": DTYPE_FP32, "float32": DTYPE_FP32,
                "fp8": DTYPE_FP8, "float8_e4m3fn": DTYPE_FP8,
                "float8_e5m2": DTYPE_FP8}

LAYOUT_VERSION = 1
DEFAULT_CHUNK_SIZE = 256


def dtype_code(dtype) -> int:
    """A kvf_dtype_t from an int, a name ("bf16") or a torch/numpy dtype."""
    if isinstance(dtype, int):
        return dtype
    name = str(dtype).replace("torch.", "")
    try:
        return _DTYPE_NAMES[name]
    except KeyError:
        raise ValueError(f"kvfabric: no kvf_dtype_t for {dtype!r}") from None


@dataclass(frozen=True)
class Key:
    """kvf_key_t: namespace plus 128-bit digest. Hashable, comparable."""
    ns: int
    hi: int
    lo: int

    def to_c(self) -> _lib.KeyStruct:
        return _lib.KeyStruct(self.ns, self.hi, self.lo)

    @classmethod
    def from_c(cls, k: _lib.KeyStruct) -> "Key":
        return cls(k.ns, k.hi, k.lo)

    def __str__(self) -> str:
        buf = ctypes.create_string_buffer(_lib.KEY_STR_SIZE)
        c = self.to_c()
        return _lib.lib.kvf_key_format(ctypes.byref(c), buf).decode()

    @classmethod
    def parse(cls, text: str) -> "Key":
        """kvf_key_parse() of the form str(key) gives."""
        k = _lib.KeyStruct()
        check(_lib.lib.kvf_key_parse(text.encode(), ctypes.byref(k)),
              "kvf_key_parse")
        return cls.from_c(k)

    def pack(self) -> bytes:
        """Wire form (KVF_KEY_WIRE_SIZE bytes, little-endian)."""
        buf = (ctypes.c_uint8 * _lib.KEY_WIRE_SIZE)()
        c = self.to_c()
        _lib.lib.kvf_key_pack(ctypes.byref(c), buf)
        return bytes(buf)

    @classmethod
    def unpack(cls, data: bytes) -> "Key":
        if len(data) != _lib.KEY_WIRE_SIZE:
            raise ValueError(f"kvfabric: a key is {_lib.KEY_WIRE_SIZE} bytes")
        buf = (ctypes.c_uint8 * _lib.KEY_WIRE_SIZE).from_buffer_copy(data)
        k = _lib.KeyStruct()
        _lib.lib.kvf_key_unpack(buf, ctypes.byref(k))
        return cls.from_c(k)


def keys_to_c(keys: Sequence[Key]):
    """A kvf_key_t array of @p keys."""
    arr = (_lib.KeyStruct * len(keys))()
    for i, k in enumerate(keys):
        arr[i].ns, arr[i].hi, arr[i].lo = k.ns, k.hi, k.lo
    return arr


def _tokens_to_c(tokens: Iterable[int]):
    if hasattr(tokens, "tolist"):  # numpy array or torch tensor
        tokens = tokens.tolist()
    tokens = list(tokens)
    return (ctypes.c_uint32 * len(tokens))(*tokens), len(tokens)


def namespace_fingerprint(model_id: str, dtype, num_layers: int,
                          num_kv_heads: int, head_dim: int, tp_rank: int = 0,
                          tp_world: int = 1,
                          chunk_size: int = DEFAULT_CHUNK_SIZE,
                          layout_version: int = LAYOUT_VERSION) -> int:
    """kvf_namespace_fingerprint(): what makes two engines' KV comparable."""
    p = _lib.NamespaceParams()
    p.field_mask = (_lib.NS_FIELD_MODEL_ID | _lib.NS_FIELD_DTYPE |
                    _lib.NS_FIELD_NUM_LAYERS | _lib.NS_FIELD_NUM_KV_HEADS |
                    _lib.NS_FIELD_HEAD_DIM | _lib.NS_FIELD_TP |
                    _lib.NS_FIELD_CHUNK_SIZE | _lib.NS_FIELD_LAYOUT_VERSION)
    p.model_id = model_id.encode()
    p.dtype = dtype_code(dtype)
    p.num_layers = num_layers
    p.num_kv_heads = num_kv_heads
    p.head_dim = head_dim
    p.tp_rank = tp_rank
    p.tp_world = tp_world
    p.chunk_size = chunk_size
    p.layout_version = layout_version
    ns = ctypes.c_uint64()
    check(_lib.lib.kvf_namespace_fingerprint(ctypes.byref(p),
                                             ctypes.byref(ns)),
          "kvf_namespace_fingerprint")
    return ns.value


def key_chain(ns: int, tokens, chunk_size: int,
              include_partial: bool = False) -> List[Key]:
    """kvf_key_chain(): the chained prefix keys of a token sequence, one per
    chunk (full chunks only unless @p include_partial)."""
    arr, n = _tokens_to_c(tokens)
    cap = n // chunk_size + 1 if chunk_size > 0 else 1
    out = (_lib.KeyStruct * cap)()
    got = ctypes.c_size_t()
    check(_lib.lib.kvf_key_chain(ns, arr, n, chunk_size, include_partial, out,
                                 cap, ctypes.byref(got)), "kvf_key_chain")
    return [Key.from_c(out[i]) for i in range(got.value)]


def key_independent(ns: int, tokens) -> Key:
    """kvf_key_independent(): H(ns, tokens), whatever precedes the tokens."""
    arr, n = _tokens_to_c(tokens)
    k = _lib.KeyStruct()
    check(_lib.lib.kvf_key_independent(ns, arr, n, ctypes.byref(k)),
          "kvf_key_independent")
    return Key.from_c(k)


def key_from_digest(ns: int, digest: bytes) -> Key:
    """kvf_key_from_digest(): a key from an engine's own block digest."""
    k = _lib.KeyStruct()
    check(_lib.lib.kvf_key_from_digest(ns, digest, len(digest),
                                       ctypes.byref(k)), "kvf_key_from_digest")
    return Key.from_c(k)


def _buffer_address(data):
    """(address, nbytes, keepalive) of a bytes-like, numpy array or CPU torch
    tensor, which must be contiguous."""
    if hasattr(data, "data_ptr"):  # torch.Tensor
        if not data.is_contiguous() or data.device.type != "cpu":
            raise ValueError("kvfabric: tensor must be contiguous, on CPU")
        return data.data_ptr(), data.numel() * data.element_size(), data
    if hasattr(data, "__array_interface__"):  # numpy
        if not data.flags["C_CONTIGUOUS"]:
            raise ValueError("kvfabric: array must be C-contiguous")
        return data.__array_interface__["data"][0], data.nbytes, data
    mv = memoryview(data)
    if mv.readonly:
        buf = ctypes.create_string_buffer(mv.tobytes(), mv.nbytes)
        return ctypes.addressof(buf), mv.nbytes, buf
    buf = (ctypes.c_char * mv.nbytes).from_buffer(mv)
    return ctypes.addressof(buf), mv.nbytes, buf


def chunk_checksum(data, nbytes: Optional[int] = None) -> int:
    """kvf_chunk_checksum() (XXH3-64) of a bytes-like object, numpy array or
    CPU tensor (no copy for arrays and tensors)."""
    addr, n, _keep = _buffer_address(data)
    if nbytes is not None:
        if nbytes > n:
            raise ValueError("kvfabric: nbytes beyond the buffer")
        n = nbytes
    return _lib.lib.kvf_chunk_checksum(addr, n)
