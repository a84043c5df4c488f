# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""docs/integration-vllm.md's command blocks are the source of truth: this
test extracts every command of its ```sh blocks and runs it, changed only
where a test must (listed in SUBSTITUTIONS below: loopback addresses and
free ports, paths under a temporary folder, small pools, the test model's
flags), then checks that the set-up works:

* the P/D block: the cluster secret, kvf-controller, the prefill agent,
  `vllm serve` P (kv_producer), the decode agent, `vllm serve` D
  (kv_consumer), the proxy: completions through the proxy equal P's own
  answer for the same prompt; P pushed and D received every full chunk
  but the one holding the last prompt token;
* the first block (`make vllm-venv`, the exports, `vllm serve` kv_both) on
  the decode node's agent: it commits the prompt's chunks.

A command the test does not know fails it (the doc changed: teach the
test). Runs in build/venv (tests/python/run_in_venv.py); the controller and
agents are the ASan build's, vLLM loads the release libkvfabric.so."""
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from kvfabric.testing import cluster as kcl
from kvfabric.testing.vllm_engine import (SRC, _vllm_env, completion,
                                          free_port, serve_test_flags,
                                          tiny_llama_dir)

DOC = SRC / "docs" / "integration-vllm.md"
BLOCK = 128  # vLLM's block size here; the doc's chunk_size is a multiple

# what the test changes in the doc's commands, and why
SUBSTITUTIONS = """
  0.0.0.0:7400, ctl:7400         -> 127.0.0.1:<free port> (loopback only)
  http://<host>:<port>, --port N -> 127.0.0.1 and a free port per doc port
  /run/kvfabric/                 -> <tmp>/<node>/ (node: the agent's --name;
                                    a vllm serve: the last agent started)
  /etc/kvfabric/cluster.secret   -> <tmp>/cluster.secret (64 hex digits)
  --pool-size 32G, --pd-buffer-size 8G -> 128M, 32M
  kvf-controller                 -> + --http 127.0.0.1:0
  kvf-agent                      -> + --listen 127.0.0.1:0 --http ''
                                    --transports tcp
  vllm serve                     -> + the tiny model's flags (serve_test_flags)
  kv_connector_extra_config      -> + stats_dir (the test reads the counters)
"""
SIZES = {"--pool-size": "128M", "--pd-buffer-size": "32M"}


def doc_blocks(text):
    """The commands of each ```sh block: lists of argv (comments dropped,
    backslash-newlines joined, quoted JSON kept whole)."""
    blocks = []
    for body in re.findall(r"^```sh\n(.*?)^```", text, re.M | re.S):
        cmds, cur = [], ""
        for line in body.splitlines():
            if not cur and (not line.strip() or
                            line.lstrip().startswith("#")):
                continue
            cur += line + "\n"
            if line.rstrip().endswith("\\"):
                continue
            try:
                argv = shlex.split(cur.replace("\\\n", " "), comments=True)
            except ValueError:  # inside a quoted argument
                continue
            cmds.append(argv)
            cur = ""
        assert not cur, f"unterminated command in {DOC}: {cur}"
        blocks.append(cmds)
    return blocks


class DocRun:
    """Runs the doc's commands with the substitutions above."""

    def __init__(self, tmp, model):
        self.tmp = str(tmp)
        self.model = model
        self.build = kcl.build_root()
        self.ports = {}          # doc port -> free port
        self.node_dir = None     # the last agent's folder
        self.env = {}            # the doc's exports
        self.procs = []          # (kind, name, Popen, log path)
        self.servers = {}        # doc port -> (url, stats dir)
        self.secret = os.path.join(self.tmp, "cluster.secret")
        with open(os.open(self.secret, os.O_WRONLY | os.O_CREAT, 0o600),
                  "w") as f:
            f.write(os.urandom(32).hex() + "\n")

    def port(self, doc_port):
        return self.ports.setdefault(int(doc_port), free_port())

    def sub(self, a):
        a = a.replace("$PWD", str(SRC)).replace("$MODEL", self.model)
        a = a.replace("/etc/kvfabric/cluster.secret", self.secret)
        a = re.sub(r"(?:0\.0\.0\.0|ctl):(\d+)",
                   lambda m: f"127.0.0.1:{self.port(m.group(1))}", a)
        a = re.sub(r"http://[\w.-]+:(\d+)",
                   lambda m: f"http://127.0.0.1:{self.port(m.group(1))}", a)
        if self.node_dir is not None:
            a = a.replace("/run/kvfabric/", self.node_dir + "/")
        return a

    def argv(self, cmd):
        out, i = [], 0
        while i < len(cmd):
            a = cmd[i]
            if a in SIZES and i + 1 < len(cmd):
                out += [a, SIZES[a]]
                i += 2
                continue
            if a == "--port" and i + 1 < len(cmd):
                out += [a, str(self.port(cmd[i + 1]))]
                i += 2
                continue
            out.append(self.sub(a))
            i += 1
        return out

    def _spawn(self, kind, name, argv, env):
        log = os.path.join(self.tmp, f"{kind}-{name}.log")
        with open(log, "wb") as f:
            p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, env=env,
                                 preexec_fn=kcl._die_with_parent)
        self.procs.append((kind, name, p, log))
        return p

    def log(self, name):
        for _k, n, _p, log in self.procs:
            if n == name:
                with open(log, "rb") as f:
                    return f.read()[-8000:].decode(errors="replace")
        return ""

    def fabric_env(self):
        env = kcl.child_env()
        env.update(self.env)
        return env

    def run(self, cmd, cpu=0):
        """Starts one doc command; returns what it started (or None)."""
        prog = cmd[0]
        if prog == "make":
            # the environment this test runs in is what it makes
            assert cmd == ["make", "vllm-venv"], cmd
            return None
        if prog == "export":
            for kv in cmd[1:]:
                k, _, v = kv.partition("=")
                self.env[k] = self.sub(v)
            return None
        if prog == "kvf-controller":
            argv = [str(self.build / "controller" / prog)] + \
                self.argv(cmd[1:]) + ["--http", "127.0.0.1:0"]
            self._spawn("controller", "ctl", argv, self.fabric_env())
            addr = argv[argv.index("--listen") + 1].rsplit(":", 1)
            self._wait(lambda: _connects(addr[0], int(addr[1])),
                       "controller listening", "ctl")
            return "controller"
        if prog == "kvf-agent":
            name = cmd[cmd.index("--name") + 1]
            self.node_dir = os.path.join(self.tmp, name)
            argv = [str(self.build / "agent" / prog)] + \
                self.argv(cmd[1:]) + ["--listen", "127.0.0.1:0",
                                      "--http", "", "--transports", "tcp"]
            sock = argv[argv.index("--socket") + 1]
            os.makedirs(os.path.dirname(sock), exist_ok=True)
            self._spawn("agent", name, argv, self.fabric_env())
            self._wait(lambda: self._registered(sock), f"agent {name}",
                       name)
            return ("agent", name, sock)
        if cmd[:2] == ["build/venv/bin/vllm", "serve"]:
            argv = self.argv(cmd)
            argv[0] = str(SRC / cmd[0])
            i = argv.index("--kv-transfer-config") + 1
            ktc = json.loads(argv[i])  # the doc's JSON must be JSON
            stats = os.path.join(self.tmp, f"stats-{len(self.procs)}")
            os.makedirs(stats)
            ktc["kv_connector_extra_config"]["stats_dir"] = stats
            argv[i] = json.dumps(ktc)
            argv += serve_test_flags(BLOCK)
            env = _vllm_env(cpu, self.tmp)
            alias = env["PYTHONPATH"].split(os.pathsep)[1:]
            env.update(self.env)
            env["PYTHONPATH"] = os.pathsep.join(
                [env.get("PYTHONPATH", "")] + alias)
            port = int(argv[argv.index("--port") + 1])
            name = f"vllm-{port}-{len(self.procs)}"
            self._spawn("vllm", name, argv, env)
            url = f"http://127.0.0.1:{port}"
            self.servers[port] = (url, stats, name)
            return ("vllm", url, stats, name)
        if cmd[:3] == ["python3", "-m", "kvfabric.pd_proxy"]:
            argv = [sys.executable] + self.argv(cmd[1:])
            env = dict(os.environ, PYTHONPATH=str(SRC / "python"))
            env.update(self.env)
            self._spawn("proxy", "proxy", argv, env)
            url = f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"
            self.wait_health(url, "proxy", 30)
            return ("proxy", url)
        pytest.fail(f"{DOC.name} has a command this test does not know: "
                    f"{shlex.join(cmd)} (teach tests/python/"
                    f"test_vllm_docs.py)")

    def _registered(self, sock):
        if not os.path.exists(sock):
            return False
        import kvfabric as kvf

        try:
            with kvf.Client(sock, timeout=2) as c:
                return c.stats().registered
        except kvf.KvfError:
            return False

    def _wait(self, cond, what, name, timeout=60):
        deadline = time.monotonic() + timeout
        p = next(p for _k, n, p, _l in self.procs if n == name)
        while not cond():
            assert p.poll() is None, f"{what}: exited\n{self.log(name)}"
            assert time.monotonic() < deadline, \
                f"{what}: not ready in {timeout}s\n{self.log(name)}"
            time.sleep(0.05)

    def wait_health(self, url, name, timeout=400):
        def up():
            try:
                with urllib.request.urlopen(url + "/health", timeout=2):
                    return True
            except OSError:
                return False
        self._wait(up, f"{name} /health", name, timeout)

    def stop(self, name):
        for _k, n, p, _l in self.procs:
            if n == name and p.poll() is None:
                p.terminate()
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        return next(p.returncode for _k, n, p, _l in self.procs
                    if n == name)

    def stop_all(self):
        """Stops everything, vLLM and the proxy first; the agents' and the
        controller's exit codes (0: no crash, no leak)."""
        codes = {}
        for kind in ("proxy", "vllm", "agent", "controller"):
            for k, n, _p, _l in self.procs:
                if k == kind:
                    rc = self.stop(n)
                    if kind in ("agent", "controller"):
                        codes[n] = rc
        return codes


def _connects(host, port):
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def _stats(stats_dir):
    out = {}
    for f in os.listdir(stats_dir):
        if f.endswith(".json"):
            with open(os.path.join(stats_dir, f)) as fh:
                for k, v in json.load(fh).items():
                    out[k] = out.get(k, 0) + v
    return out


def _prompt(n, seed):
    import random

    r = random.Random(seed)
    return [r.randrange(3, 2000) for _ in range(n)]


def test_every_command_of_the_doc_runs(tmp_path, monkeypatch):
    blocks = doc_blocks(DOC.read_text())
    assert len(blocks) == 2, "the doc's sh blocks changed: teach the test"
    single, pd = blocks
    model = tiny_llama_dir(str(tmp_path))
    run = DocRun(tmp_path, model)
    # the exports of every block first, as a reader of the page does
    for cmd in single + pd:
        if cmd[0] == "export":
            run.run(cmd)
    assert {"PYTHONPATH", "KVF_LIB", "KVF_CLUSTER_SECRET_FILE"} <= \
        set(run.env), run.env
    # the test's own clients talk to the agents with the same secret
    monkeypatch.setenv("KVF_CLUSTER_SECRET_FILE", run.secret)
    ran = 0
    try:
        # the P/D block, in order; the two servers start side by side
        started = []
        for cmd in pd:
            if cmd[0] == "export":
                ran += 1
                continue
            vllm_n = sum(1 for s in started if s and s[0] == "vllm")
            started.append(run.run(cmd, cpu=vllm_n))
            ran += 1
        servers = [s for s in started if s and s[0] == "vllm"]
        agents = [s for s in started if s and s[0] == "agent"]
        (proxy,) = [s for s in started if s and s[0] == "proxy"]
        assert len(servers) == 2 and len(agents) == 2
        for _k, url, _st, name in servers:
            run.wait_health(url, name)
        (_k, p_url, p_stats, _n), (_k, _u, d_stats, _n) = servers
        chunk = 256  # the doc's chunk_size
        prompts = [_prompt(2 * chunk + 1, 1), _prompt(3 * chunk + 1, 2)]
        for pr in prompts:
            via = completion(proxy[1], model, pr, 6)
            direct = completion(p_url, model, pr, 6)
            assert via["choices"][0]["token_ids"] == \
                direct["choices"][0]["token_ids"]
        full = sum((len(p) - 1) // chunk for p in prompts)
        sp, sd = _stats(p_stats), _stats(d_stats)
        assert sp["pd_pushed_chunks"] == full, sp
        assert sd["pd_received_chunks"] == full, sd
        assert sd["hit_tokens"] == full * chunk, sd
        # the first block's server has P's port (8100): P, D and the proxy
        # stop first
        run.stop("proxy")
        for _k, _u, _st, name in servers:
            run.stop(name)

        # the first block: kv_both on the last agent (the decode node's)
        for cmd in single:
            ran += 1
            if cmd[0] == "export":
                continue
            s = run.run(cmd, cpu=0)
        assert s and s[0] == "vllm"
        run.wait_health(s[1], s[3])
        completion(s[1], model, _prompt(3 * chunk + 10, 3), 2)
        assert _stats(s[2])["saved_chunks"] == 3
        import kvfabric as kvf

        with kvf.Client(agents[-1][2], timeout=10) as c:
            assert c.stats().chunks >= 3
        assert ran == len(single) + len(pd)
    finally:
        codes = run.stop_all()
    assert all(rc == 0 for rc in codes.values()), \
        (codes, {n: run.log(n) for n in codes})
