# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""A loopback cluster of real processes for tests and examples: one
kvf-controller and N kvf-agents, the way tests/integration starts them.

Ports: the controller binds port 0 and writes its ports to --port-file;
agents bind port 0 for UCX and run without HTTP; registration is read
through the client (kvf_client_stats().registered). Sockets live in a
private temporary directory. Children die with this process
(PR_SET_PDEATHSIG) and ``stop()`` reaps every one of them.

Binaries come from ``KVF_BUILD_ROOT`` (a meson build directory), else the
source tree's build/release, else build/asan.
"""
import ctypes
import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Dict, List, Optional

from ..client import Client
from ..errors import KvfError


def build_root() -> pathlib.Path:
    env = os.environ.get("KVF_BUILD_ROOT")
    if env:
        return pathlib.Path(env)
    src = pathlib.Path(__file__).resolve().parents[3]
    for b in ("release", "asan"):
        d = src / "build" / b
        if (d / "agent" / "kvf-agent").exists():
            return d
    raise FileNotFoundError("kvfabric: no build found; set KVF_BUILD_ROOT")


def _die_with_parent():
    libc = ctypes.CDLL(None)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def child_env() -> Dict[str, str]:
    """Environment of the agent and controller processes: ours without the
    ASan preload the Python side may need, with KVF_CHILD_ASAN_OPTIONS (leak
    checks on) replacing ASAN_OPTIONS when set."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if "KVF_CHILD_ASAN_OPTIONS" in env:
        env["ASAN_OPTIONS"] = env["KVF_CHILD_ASAN_OPTIONS"]
    return env


class Proc:
    def __init__(self, name: str, argv: List[str], log_path: str):
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.popen = subprocess.Popen(argv, stdout=self._log,
                                      stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL,
                                      env=child_env(),
                                      preexec_fn=_die_with_parent)

    def log(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-16384:].decode(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, grace: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after @p grace seconds; returns the exit
        status (128 + signal when killed by one)."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._log.close()
        rc = self.popen.returncode
        return 128 - rc if rc < 0 else rc


def _wait(cond, timeout: float, what: str, proc: Optional[Proc] = None):
    """Polls @p cond until true or @p timeout seconds (a deadline-bounded
    wait, not a synchronization sleep)."""
    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return
        if proc is not None and not proc.alive():
            raise RuntimeError(f"{proc.name} exited early: {proc.log()}")
        if time.monotonic() > deadline:
            extra = f": {proc.log()}" if proc is not None else ""
            raise TimeoutError(f"kvfabric: {what} within {timeout}s{extra}")
        time.sleep(0.005)


class Cluster:
    """controller + agents on loopback. Use as a context manager."""

    def __init__(self, agents=("a", "b"), pool_size: str = "64M",
                 max_chunk: str = "4M", root: Optional[pathlib.Path] = None,
                 extra_agent_args: Optional[List[str]] = None,
                 roles: Optional[Dict[str, str]] = None,
                 pd_buffer_size: Optional[str] = None,
                 extra_controller_args: Optional[List[str]] = None):
        """@p roles: agent name -> ``--role`` (``prefill``, ``decode`` or
        ``both``, the default) for PD pairs; @p pd_buffer_size: the
        ``--pd-buffer-size`` of agents that receive (decode, both)."""
        self.root = pathlib.Path(root) if root else build_root()
        self.dir = tempfile.mkdtemp(prefix="kvf-pytest-")
        self.controller: Optional[Proc] = None
        self.agents: Dict[str, Proc] = {}
        self.sockets: Dict[str, str] = {}
        self.names = list(agents)
        self.pool_size = pool_size
        self.max_chunk = max_chunk
        self.extra_agent_args = list(extra_agent_args or [])
        self.exit_codes: Dict[str, int] = {}
        self.roles = dict(roles or {})
        self.pd_buffer_size = pd_buffer_size
        self.extra_controller_args = list(extra_controller_args or [])

    def start(self) -> "Cluster":
        try:
            self._start_controller()
            for n in self.names:
                self.start_agent(n)
            for n in self.names:
                self.wait_registered(n)
        except BaseException:
            self.stop()  # the error carries the failing process's log
            self.cleanup()
            raise
        return self

    def _start_controller(self):
        port_file = os.path.join(self.dir, "ports")
        self.controller = Proc(
            "kvf-controller",
            [str(self.root / "controller" / "kvf-controller"),
             "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
             "--port-file", port_file] + self.extra_controller_args,
            os.path.join(self.dir, "controller.log"))

        def ready():
            try:
                with open(port_file) as f:
                    lines = f.read().split("\n")
                return len(lines) >= 2 and lines[1] != ""
            except OSError:
                return False

        _wait(ready, 20, "controller port file", self.controller)
        with open(port_file) as f:
            self.controller_addr = f.readline().strip()

    def node_name(self, name: str) -> str:
        """The node name agent @p name registers under (a PD push names its
        decoder by it)."""
        return f"py-{name}"

    def start_agent(self, name: str):
        sock = os.path.join(self.dir, f"agent-{name}.sock")
        self.sockets[name] = sock
        pd = []
        if name in self.roles:
            pd += ["--role", self.roles[name]]
        if self.pd_buffer_size is not None:
            pd += ["--pd-buffer-size", self.pd_buffer_size]
        self.agents[name] = Proc(
            f"kvf-agent {name}",
            [str(self.root / "agent" / "kvf-agent"),
             "--controller", self.controller_addr,
             "--name", self.node_name(name),
             "--socket", sock, "--http", "", "--listen", "127.0.0.1:0",
             "--pool-size", self.pool_size, "--max-chunk", self.max_chunk,
             "--transports", "tcp",
             "--fetch-timeout", "5s"] + pd + self.extra_agent_args,
            os.path.join(self.dir, f"agent-{name}.log"))

    def wait_registered(self, name: str, timeout: float = 30):
        proc = self.agents[name]

        def registered():
            if not os.path.exists(self.sockets[name]):
                return False
            try:
                with Client(self.sockets[name], timeout=2) as c:
                    return c.stats().registered
            except KvfError:
                return False

        _wait(registered, timeout, f"agent {name} registered", proc)

    def client(self, name: str, **kw) -> Client:
        kw.setdefault("timeout", 20)
        return Client(self.sockets[name], **kw)

    def stop(self) -> Dict[str, int]:
        """Stops agents, then the controller; returns exit codes by name
        (non-zero means a crash or, under ASan, a leak)."""
        for n, p in self.agents.items():
            self.exit_codes[f"agent-{n}"] = p.stop()
        if self.controller is not None:
            self.exit_codes["controller"] = self.controller.stop()
        self.agents = {}
        self.controller = None
        return self.exit_codes

    def logs(self) -> str:
        out = []
        for f in sorted(os.listdir(self.dir)):
            if f.endswith(".log"):
                with open(os.path.join(self.dir, f), "rb") as fh:
                    out.append(f"--- {f}\n" +
                               fh.read()[-8192:].decode(errors="replace"))
        return "\n".join(out)

    def cleanup(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "Cluster":
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        self.cleanup()
