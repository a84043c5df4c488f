# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""kvfabric: Python binding of libkvfabric (the kvfabric client library).

    import kvfabric
    ns = kvfabric.namespace_fingerprint("my-model", "bf16", 32, 8, 128,
                                        chunk_size=256)
    keys = kvfabric.key_chain(ns, prompt_tokens, 256)
    with kvfabric.Client("/run/kvfabric/agent.sock") as c:
        hit = c.lookup(keys).hit_chunks
        ...

See python/README.md. Layout helpers (torch) are in kvfabric.layout; the
vLLM connector in kvfabric.vllm_connector.
"""
from ._lib import HAS_PD, lib_path
from .client import Client, LookupResult, Slot, Stats
from .errors import KvfError, status_name, strerror
from .keys import (DTYPE_BF16, DTYPE_FP8, DTYPE_FP16, DTYPE_FP32, Key,
                   chunk_checksum, dtype_code, key_chain, key_from_digest,
                   key_independent, namespace_fingerprint)

__all__ = [
    "HAS_PD", "lib_path", "Client", "LookupResult", "Slot", "Stats",
    "KvfError", "status_name", "strerror", "DTYPE_BF16", "DTYPE_FP8",
    "DTYPE_FP16", "DTYPE_FP32", "Key", "chunk_checksum", "dtype_code",
    "key_chain", "key_from_digest", "key_independent",
    "namespace_fingerprint",
]
__version__ = "0.1.0"
