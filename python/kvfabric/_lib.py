# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""ctypes declarations of libkvfabric.so (include/kvfabric/*.h).

The library is found, in order, through:

1. ``KVF_LIB``: a path to libkvfabric.so;
2. ``KVF_BUILD_ROOT``: a meson build directory (``client/libkvfabric.so``);
3. the source tree this package sits in: ``build/release``, then
   ``build/asan`` (an ASan build needs the ASan runtime preloaded, see
   python/README.md);
4. an installed kvfabric (``meson install``): ``pkg-config --variable=libdir
   kvfabric``;
5. the system (``ctypes.util.find_library("kvfabric")``).

Everything here mirrors the C headers one to one; the Pythonic layer is in
``client.py``, ``keys.py`` and ``layout.py``.
"""
import ctypes
import ctypes.util
import os
import pathlib
import subprocess

c_u8 = ctypes.c_uint8
c_u32 = ctypes.c_uint32
c_u64 = ctypes.c_uint64
c_i64 = ctypes.c_int64
c_size = ctypes.c_size_t
c_bool = ctypes.c_bool
c_char_p = ctypes.c_char_p
c_void_p = ctypes.c_void_p
c_int = ctypes.c_int


class KeyStruct(ctypes.Structure):
    """kvf_key_t"""
    _fields_ = [("ns", c_u64), ("hi", c_u64), ("lo", c_u64)]


class NamespaceParams(ctypes.Structure):
    """kvf_namespace_params_t"""
    _fields_ = [
        ("field_mask", c_u64),
        ("model_id", c_char_p),
        ("dtype", c_int),
        ("num_layers", c_u32),
        ("num_kv_heads", c_u32),
        ("head_dim", c_u32),
        ("tp_rank", c_u32),
        ("tp_world", c_u32),
        ("chunk_size", c_u32),
        ("layout_version", c_u32),
    ]


class ClientParams(ctypes.Structure):
    """kvf_client_params_t"""
    _fields_ = [
        ("field_mask", c_u64),
        ("socket_path", c_char_p),
        ("timeout_ns", c_u64),
        ("name", c_char_p),
        ("secret_file", c_char_p),
    ]


class SlotStruct(ctypes.Structure):
    """kvf_slot_t"""
    _fields_ = [("offset", c_u64), ("length", c_u64)]


class LookupResult(ctypes.Structure):
    """kvf_lookup_result_t"""
    _fields_ = [("hit_chunks", c_u32), ("local_chunks", c_u32),
                ("lease_id", c_u64)]


class ClientStats(ctypes.Structure):
    """kvf_client_stats_t"""
    _fields_ = [
        ("pool_capacity", c_u64),
        ("pool_used", c_u64),
        ("chunks", c_u64),
        ("local_hits", c_u64),
        ("misses", c_u64),
        ("fetched_chunks", c_u64),
        ("evictions", c_u64),
        ("node_id", c_u32),
        ("registered", c_bool),
    ]


GPU_MAX_LAYERS = 256


class GpuKvLayout(ctypes.Structure):
    """kvf_gpu_kv_layout_t"""
    _fields_ = [
        ("field_mask", c_u64),
        ("layout", c_int),
        ("dtype", c_int),
        ("num_layers", c_u32),
        ("num_kv_heads", c_u32),
        ("head_dim", c_u32),
        ("block_size", c_u32),
        ("num_blocks", c_u64),
    ]


class GpuKvCopyParams(ctypes.Structure):
    """kvf_gpu_kv_copy_params_t"""
    _fields_ = [
        ("field_mask", c_u64),
        ("layout", ctypes.POINTER(GpuKvLayout)),
        ("k_layers", ctypes.POINTER(c_void_p)),
        ("v_layers", ctypes.POINTER(c_void_p)),
        ("slot_mapping", ctypes.POINTER(c_i64)),
        ("slot_mapping_len", c_u64),
        ("token_begin", c_u64),
        ("num_tokens", c_u64),
        ("chunk", c_void_p),
        ("chunk_tokens", c_u64),
        ("chunk_offset", c_u64),
        ("layer_begin", c_u32),
        ("layer_count", c_u32),
    ]


# enums and field masks (keys.h, kvfabric.h, gpu.h)
CLIENT_PARAM_SOCKET = 1 << 0
CLIENT_PARAM_TIMEOUT = 1 << 1
CLIENT_PARAM_NAME = 1 << 2
CLIENT_PARAM_SECRET = 1 << 3

NS_FIELD_MODEL_ID = 1 << 0
NS_FIELD_DTYPE = 1 << 1
NS_FIELD_NUM_LAYERS = 1 << 2
NS_FIELD_NUM_KV_HEADS = 1 << 3
NS_FIELD_HEAD_DIM = 1 << 4
NS_FIELD_TP = 1 << 5
NS_FIELD_CHUNK_SIZE = 1 << 6
NS_FIELD_LAYOUT_VERSION = 1 << 7

GPU_LAYOUT_FIELDS_ALL = (1 << 7) - 1
GPU_COPY_FIELD_LAYOUT = 1 << 0
GPU_COPY_FIELD_K_LAYERS = 1 << 1
GPU_COPY_FIELD_V_LAYERS = 1 << 2
GPU_COPY_FIELD_SLOT_MAPPING = 1 << 3
GPU_COPY_FIELD_SLOT_MAPPING_LEN = 1 << 4
GPU_COPY_FIELD_TOKEN_BEGIN = 1 << 5
GPU_COPY_FIELD_NUM_TOKENS = 1 << 6
GPU_COPY_FIELD_CHUNK = 1 << 7
GPU_COPY_FIELD_CHUNK_TOKENS = 1 << 8
GPU_COPY_FIELD_CHUNK_OFFSET = 1 << 9
GPU_COPY_FIELD_LAYER_BEGIN = 1 << 10
GPU_COPY_FIELD_LAYER_COUNT = 1 << 11

KEY_STR_SIZE = 50
KEY_WIRE_SIZE = 24

P = ctypes.POINTER

# name: (restype, argtypes)
_PROTOS = {
    "kvf_strerror": (c_char_p, [c_int]),
    "kvf_status_name": (c_char_p, [c_int]),
    "kvf_namespace_fingerprint": (c_int, [P(NamespaceParams), P(c_u64)]),
    "kvf_key_chain": (c_int, [c_u64, P(c_u32), c_size, c_u32, c_bool,
                              P(KeyStruct), c_size, P(c_size)]),
    "kvf_key_independent": (c_int, [c_u64, P(c_u32), c_size, P(KeyStruct)]),
    "kvf_key_from_digest": (c_int, [c_u64, c_void_p, c_size, P(KeyStruct)]),
    "kvf_chunk_checksum": (c_u64, [c_void_p, c_size]),
    "kvf_key_equal": (c_bool, [P(KeyStruct), P(KeyStruct)]),
    "kvf_key_pack": (None, [P(KeyStruct), P(c_u8)]),
    "kvf_key_unpack": (None, [P(c_u8), P(KeyStruct)]),
    "kvf_key_format": (c_char_p, [P(KeyStruct), ctypes.c_char_p]),
    "kvf_key_parse": (c_int, [c_char_p, P(KeyStruct)]),
    "kvf_client_connect": (c_int, [P(ClientParams), P(c_void_p)]),
    "kvf_client_disconnect": (None, [c_void_p]),
    "kvf_client_pool_base": (c_void_p, [c_void_p]),
    "kvf_client_pool_size": (c_u64, [c_void_p]),
    "kvf_client_last_error": (c_char_p, [c_void_p]),
    "kvf_client_reconnects": (c_u64, [c_void_p]),
    "kvf_client_alloc": (c_int, [c_void_p, c_u64, c_u32, P(SlotStruct)]),
    "kvf_client_commit": (c_int, [c_void_p, P(KeyStruct), P(SlotStruct),
                                  P(c_u64), c_u32]),
    "kvf_client_lookup": (c_int, [c_void_p, P(KeyStruct), c_u32, c_bool,
                                  P(LookupResult)]),
    "kvf_client_retrieve": (c_int, [c_void_p, P(KeyStruct), c_u32,
                                    P(SlotStruct), P(c_bool)]),
    "kvf_client_retrieve_checksums": (c_int, [c_void_p, P(KeyStruct), c_u32,
                                              P(SlotStruct), P(c_bool),
                                              P(c_u64)]),
    "kvf_client_verify": (c_bool, [c_void_p, P(SlotStruct), c_u64]),
    "kvf_client_stats": (c_int, [c_void_p, P(ClientStats)]),
    "kvf_client_release": (c_int, [c_void_p, P(SlotStruct), c_u32]),
    "kvf_gpu_kv_row_bytes": (c_int, [P(GpuKvLayout), P(c_size)]),
    "kvf_gpu_kv_chunk_bytes": (c_int, [P(GpuKvLayout), c_u64, P(c_size)]),
    "kvf_gpu_kv_layout_check": (c_int, [P(GpuKvLayout)]),
    "kvf_gpu_kv_pack_cpu": (c_int, [P(GpuKvCopyParams)]),
    "kvf_gpu_kv_unpack_cpu": (c_int, [P(GpuKvCopyParams)]),
    "kvf_gpu_is_available": (c_bool, [P(c_char_p)]),
}

# The PD calls (kvfabric.h, "PD mode"): every libkvfabric built from this
# tree exports them; HAS_PD stays so that an older installed library still
# loads (without the Client.pd_* methods).
_PD_PROTOS = {
    "kvf_pd_push": (c_int, [c_void_p, c_u64, c_char_p, P(SlotStruct),
                            P(c_u64), c_u32, c_bool]),
    "kvf_pd_push_start": (c_int, [c_void_p, c_u64, c_char_p, P(SlotStruct),
                                  P(c_u64), c_u32, c_bool]),
    "kvf_pd_push_wait": (c_int, [c_void_p, c_u64, c_u64]),
    "kvf_pd_wait": (c_int, [c_void_p, c_u64, c_u64, P(SlotStruct), c_u32,
                            P(c_u32)]),
    "kvf_pd_wait_checksums": (c_int, [c_void_p, c_u64, c_u64, P(SlotStruct),
                                      P(c_u64), c_u32, P(c_u32)]),
    "kvf_pd_release": (c_int, [c_void_p, c_u64]),
}


def _pkg_config_libdir():
    """The libdir of an installed kvfabric.pc (meson install), or None."""
    try:
        out = subprocess.run(["pkg-config", "--variable=libdir", "kvfabric"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    libdir = out.stdout.strip()
    return libdir if out.returncode == 0 and libdir else None


def _candidates():
    env = os.environ.get("KVF_LIB")
    if env:
        yield env
        return
    root = os.environ.get("KVF_BUILD_ROOT")
    if root:
        yield os.path.join(root, "client", "libkvfabric.so")
    src = pathlib.Path(__file__).resolve().parents[2]
    for b in ("release", "asan"):
        yield str(src / "build" / b / "client" / "libkvfabric.so")
    libdir = _pkg_config_libdir()
    if libdir:
        yield os.path.join(libdir, "libkvfabric.so")
    found = ctypes.util.find_library("kvfabric")
    if found:
        yield found


def _load():
    errors = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            errors.append(f"{path}: not found")
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            msg = str(e)
            if "ASan runtime does not come first" in msg or "libasan" in msg:
                msg += (" (a sanitized build: run python with LD_PRELOAD="
                        "$(gcc -print-file-name=libasan.so) and "
                        "ASAN_OPTIONS=detect_leaks=0, or set KVF_LIB to a "
                        "release build's libkvfabric.so)")
            errors.append(f"{path}: {msg}")
    raise ImportError("kvfabric: cannot load libkvfabric.so; tried:\n  " +
                      "\n  ".join(errors or ["(no candidate)"]))


lib, lib_path = _load()

for _name, (_res, _args) in _PROTOS.items():
    _fn = getattr(lib, _name)
    _fn.restype = _res
    _fn.argtypes = _args

HAS_PD = all(hasattr(lib, n) for n in _PD_PROTOS)
if HAS_PD:
    for _name, (_res, _args) in _PD_PROTOS.items():
        _fn = getattr(lib, _name)
        _fn.restype = _res
        _fn.argtypes = _args
