# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""P/D with `vllm serve` (the OpenAI server) behind the project's proxy
(python -m kvfabric.pd_proxy), the commands of docs/integration-vllm.md:
P (kv_producer, agent --role prefill) and D (kv_consumer, agent --role
decode); every completion through the proxy equals vLLM alone's, and D
loaded all but the last prompt token. Runs in build/venv
(tests/python/run_in_venv.py)."""
import os
import random
import subprocess
import sys
import time
import urllib.request

import pytest

from kvfabric.testing.vllm_engine import (SRC, VllmEngine, VllmServer,
                                          completion, free_port, kv_config,
                                          tiny_llama_dir)

C = 128


def _prompt(n, seed):
    r = random.Random(seed)
    return [r.randrange(3, 2000) for _ in range(n)]


@pytest.fixture(scope="module")
def pd_agents():
    from conftest import _run_cluster

    yield from _run_cluster(agents=("p", "d"), pool_size="128M",
                            roles={"p": "prefill", "d": "decode"},
                            pd_buffer_size="32M")


def test_pd_through_proxy_with_vllm_serve(tmp_path, pd_agents):
    model = tiny_llama_dir(str(tmp_path))
    prompts = [_prompt(2 * C + 1, 1), _prompt(4 * C + 1, 2),
               _prompt(C + 60, 3)]
    with VllmEngine(model, None, cpu=1, block_size=C) as alone:
        ref = alone.generate(prompts, max_tokens=6)
    d_node = pd_agents.node_name("d")
    p = VllmServer(model, kv_config(pd_agents.sockets["p"], "kv_producer",
                                    C, decoder=d_node), cpu=0)
    d = None
    proxy = None
    try:
        d = VllmServer(model, kv_config(pd_agents.sockets["d"],
                                        "kv_consumer", C), cpu=1)
        port = free_port()
        env = dict(os.environ, PYTHONPATH=str(SRC / "python"))
        proxy = subprocess.Popen(
            [sys.executable, "-m", "kvfabric.pd_proxy", "--port", str(port),
             "--prefill", p.url, "--decode", d.url,
             "--decoder-node", d_node], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "proxy not up"
                assert proxy.poll() is None, proxy.stdout.read()
                time.sleep(0.2)
        for pr, r in zip(prompts, ref):
            out = completion(url, model, pr, 6)
            assert out["choices"][0]["token_ids"] == r["token_ids"]
        sp, sd = p.stats(), d.stats()
        full = [(len(x) - 1) // C for x in prompts]
        assert sp["pd_pushed_chunks"] == sum(full), sp
        assert sd["pd_received_chunks"] == sum(full), sd
        assert sd["hit_tokens"] == C * sum(full), sd
    finally:
        if proxy is not None:
            proxy.terminate()
            proxy.wait(10)
        for s in (d, p):
            if s is not None:
                s.close()
