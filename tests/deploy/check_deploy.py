#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
#
# Keeps deploy/ from rotting: every file there is checked against the
# programs it configures.
#
#   check_deploy.py configs     k8s manifests' structure (deploy/k8s and
#                               the HA overlay deploy/k8s-ha); every config
#                               file (deploy/config, the ConfigMap) through
#                               the real loaders (HA ones against a real
#                               etcd when /usr/bin/etcd is here); flags and KVF_ variables used
#                               exist; `kubectl kustomize` when kubectl is
#                               here; one socket path convention and the
#                               cluster secret wired in docs, units and
#                               manifests
#   check_deploy.py systemd     systemd-analyze verify and security on the units
#   check_deploy.py monitoring  prometheus.yml, alerts.yml, the Grafana JSON;
#                               every metric and label they name is exported
#                               by a live controller and agent
#
# KVF_SOURCE_ROOT and KVF_BUILD_ROOT come from meson. Exit 77: skipped (the
# reason is printed), as meson expects.
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml

SRC = os.environ.get("KVF_SOURCE_ROOT", ".")
BUILD = os.environ.get("KVF_BUILD_ROOT", "build")
CONTROLLER = os.path.join(BUILD, "controller", "kvf-controller")
ETCD = "/usr/bin/etcd"
AGENT = os.path.join(BUILD, "agent", "kvf-agent")
SKIP = 77

failures = []


def fail(where, why):
    failures.append(f"{where}: {why}")


def done():
    for f in failures:
        print("FAIL", f)
    if failures:
        sys.exit(1)
    print("ok")
    sys.exit(0)


def src(*parts):
    return os.path.join(SRC, *parts)


def program_env():
    """The test's environment without KVF_ settings a program would read."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVF_")}
    # leak checks stay on: a clean exit must also be a leak-free exit
    return env


def help_flags(binary):
    out = subprocess.run([binary, "--help"], capture_output=True, text=True,
                         env=program_env(), timeout=60).stdout
    flags = set(re.findall(r"--[a-z][a-z0-9-]*", out))
    # keys that are no flags (secrets): their env variable is still valid
    for key in re.findall(r"^  ([a-z_]+) \(YAML key or env only\)", out, re.M):
        flags.add("--" + key.replace("_", "-"))
    return flags


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_until(what, cond, secs=30):
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    raise RuntimeError(f"timed out after {secs}s waiting for {what}")


def http_get(addr, path):
    with urllib.request.urlopen(f"http://{addr}{path}", timeout=10) as r:
        return r.read().decode()


class Proc:
    """A child process with its output in a log file; stop() checks exit 0."""

    def __init__(self, argv, log, env=None):
        self.argv, self.log = argv, log
        self.out = open(log, "w")
        self.p = subprocess.Popen(argv, stdout=self.out,
                                  stderr=subprocess.STDOUT,
                                  env=env or program_env())

    def text(self):
        with open(self.log) as f:
            return f.read()

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.out.close()
        return self.p.returncode


def start_etcd(tmp):
    """A one-member etcd on free loopback ports; returns (proc, url)."""
    tmp = tempfile.mkdtemp(dir=tmp)
    client = f"http://127.0.0.1:{free_port()}"
    peer = f"http://127.0.0.1:{free_port()}"
    proc = Proc([ETCD, "--name", "check", "--data-dir",
                 os.path.join(tmp, "etcd"), "--listen-client-urls", client,
                 "--advertise-client-urls", client, "--listen-peer-urls",
                 peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", f"check={peer}"],
                os.path.join(tmp, "etcd.log"))

    def healthy():
        if proc.p.poll() is not None:
            raise RuntimeError(f"etcd exited: {proc.text()}")
        try:
            return "true" in http_get(client[len("http://"):], "/health")
        except OSError:
            return False

    wait_until("etcd", healthy)
    return proc, client


def start_controller(tmp, config=None, env=None):
    """kvf-controller on ephemeral ports; returns (proc, control, http).
    With KVF_ETCD in @env it campaigns there: it is up once it leads."""
    tmp = tempfile.mkdtemp(dir=tmp)  # a port file of its own
    ports = os.path.join(tmp, "ports")
    argv = [CONTROLLER]
    if config:
        argv += ["--config", config]
    argv += ["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
             "--port-file", ports]
    penv = program_env()
    penv.update(env or {})
    proc = Proc(argv, os.path.join(tmp, "controller.log"), penv)

    def up():
        if proc.p.poll() is not None:
            raise RuntimeError(f"kvf-controller exited {proc.p.returncode}: "
                               f"{proc.text()}")
        if not os.path.exists(ports):
            return False
        with open(ports) as f:
            # a standby (HA) writes an empty control line until it leads
            return f.readline().strip() != ""

    wait_until("kvf-controller's port file", up)
    with open(ports) as f:
        ctl, http = f.read().split()[:2]
    return proc, ctl, http


def start_agent(tmp, ctl, name):
    http = f"127.0.0.1:{free_port()}"
    argv = [AGENT, "--controller", ctl, "--name", name, "--socket",
            os.path.join(tmp, name + ".sock"), "--listen", "127.0.0.1:0",
            "--http", http, "--pool-size", "64M", "--max-chunk", "1M",
            "--transports", "tcp"]
    proc = Proc(argv, os.path.join(tmp, name + ".log"))

    def registered():
        if proc.p.poll() is not None:
            raise RuntimeError(f"kvf-agent exited {proc.p.returncode}: "
                               f"{proc.text()}")
        try:
            return '"registered":true' in http_get(http, "/healthz")
        except OSError:
            return False

    wait_until(f"agent {name} to register", registered)
    return proc, http


# ---- configs -------------------------------------------------------------

API = {"Namespace": "v1", "ConfigMap": "v1", "Service": "v1",
       "Deployment": "apps/v1", "DaemonSet": "apps/v1",
       "StatefulSet": "apps/v1"}
WORKLOADS = ("Deployment", "DaemonSet", "StatefulSet")


def load_k8s(folder="k8s"):
    docs = []
    kdir = src("deploy", folder)
    for fn in sorted(os.listdir(kdir)):
        if not fn.endswith(".yaml") or fn == "kustomization.yaml":
            continue
        with open(os.path.join(kdir, fn)) as f:
            for d in yaml.safe_load_all(f):
                if d is not None:
                    docs.append((fn, d))
    return docs


def check_kustomization(docs, folder="k8s", bases=()):
    with open(src("deploy", folder, "kustomization.yaml")) as f:
        k = yaml.safe_load(f)
    listed = set(k.get("resources", []))
    files = {fn for fn, _ in docs} | set(bases)
    if listed != files:
        fail(f"deploy/{folder}/kustomization.yaml",
             f"resources {sorted(listed)} != manifests {sorted(files)}")
    return k


def check_flags_and_env(where, container, known_flags):
    for arg in container.get("args", []):
        flag = arg.split("=", 1)[0]
        if flag.startswith("--") and flag not in known_flags:
            fail(where, f"flag {flag} is not in --help")
    for e in container.get("env", []):
        name = e.get("name", "")
        if name.startswith("KVF_"):
            flag = "--" + name[4:].lower().replace("_", "-")
            if flag not in known_flags:
                fail(where, f"env {name}: no key {name[4:].lower()}")


def check_workload(fn, d, configmaps, flags):
    where = f"deploy/k8s/{fn}: {d['kind']} {d['metadata']['name']}"
    spec = d.get("spec", {})
    tmpl = spec.get("template", {})
    labels = tmpl.get("metadata", {}).get("labels", {})
    sel = spec.get("selector", {}).get("matchLabels", {})
    if not sel or any(labels.get(k) != v for k, v in sel.items()):
        fail(where, f"selector {sel} does not match template labels {labels}")
    pod = tmpl.get("spec", {})
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    ann = tmpl.get("metadata", {}).get("annotations", {})
    containers = pod.get("containers", [])
    if not containers:
        fail(where, "no containers")
    ports = set()
    for c in pod.get("initContainers", []) + containers:
        cw = f"{where} container {c.get('name')}"
        for key in ("name", "image"):
            if not c.get(key):
                fail(cw, f"no {key}")
        for m in c.get("volumeMounts", []):
            if m["name"] not in volumes:
                fail(cw, f"mounts unknown volume {m['name']}")
        cmd = (c.get("command") or [""])[0]
        if cmd in flags:
            check_flags_and_env(cw, c, flags[cmd])
        for p in c.get("ports", []):
            ports.add(p.get("name"))
            ports.add(p.get("containerPort"))
        for probe in ("readinessProbe", "livenessProbe"):
            check = c.get(probe, {})
            port = check.get("httpGet", check.get("tcpSocket", {})).get("port")
            if probe in c and port not in ports:
                fail(cw, f"{probe} port {port} is not a container port")
    if ann.get("prometheus.io/scrape") == "true":
        if int(ann.get("prometheus.io/port", 0)) not in ports:
            fail(where, "prometheus.io/port is not a container port")
    for v in volumes.values():
        cm = v.get("configMap")
        if cm is None:
            continue
        if cm["name"] not in configmaps:
            fail(where, f"volume {v['name']}: no ConfigMap {cm['name']}")
            continue
        for item in cm.get("items", []):
            if item["key"] not in configmaps[cm["name"]]:
                fail(where, f"ConfigMap {cm['name']} has no key {item['key']}")
    return labels, ports


def container_env(docs, program):
    """KVF_ variables a manifest sets for @program, $(REFS) filled in."""
    env = {}
    for _, d in docs:
        pod = d.get("spec", {}).get("template", {}).get("spec", {})
        for c in pod.get("containers", []):
            if (c.get("command") or [""])[0] != program:
                continue
            for e in c.get("env", []):
                if e["name"].startswith("KVF_") and "value" in e:
                    env[e["name"]] = re.sub(r"\$\([A-Z_]+\)", "10.0.0.7",
                                            e["value"])
    return env


def check_agent_config(where, path, extra_env=None):
    env = program_env()
    env.update(extra_env or {})
    secret = None
    if "KVF_CLUSTER_SECRET_FILE" in env:
        # --print-config checks the secret file: stand one in for the
        # manifest's path, which only exists in the pod
        fd, secret = tempfile.mkstemp(prefix="kvf-secret-")
        os.write(fd, b"0123456789abcdef0123456789abcdef\n")
        os.close(fd)
        env["KVF_CLUSTER_SECRET_FILE"] = secret
    r = subprocess.run([AGENT, "--config", path, "--print-config"],
                       capture_output=True, text=True, env=env, timeout=60)
    if secret is not None:
        os.unlink(secret)
    if r.returncode != 0:
        fail(where, f"kvf-agent --print-config refused it: "
             f"{r.stdout}{r.stderr}")


def check_controller_config(where, path, tmp, extra_env=None):
    env = dict(extra_env or {})
    etcd = None
    with open(path) as f:
        is_ha = ("KVF_ETCD" in env or
                 bool((yaml.safe_load(f) or {}).get("etcd")))
    if is_ha:
        # HA on etcd: campaign on a real local etcd instead of the file's
        if not os.access(ETCD, os.X_OK):
            print(f"note: {where}: {ETCD} not installed; HA config not run")
            return
        etcd, url = start_etcd(tmp)
        env["KVF_ETCD"] = url
        env["KVF_ETCD_PREFIX"] = "/check-deploy"
        # a long lease: this checks the settings, not failover timing, and
        # a big initial_keys table takes seconds under ASan on a busy host
        env["KVF_ETCD_LEASE"] = "20s"
        env["KVF_ADVERTISE"] = ""
        env["KVF_ADVERTISE_HTTP"] = ""
    try:
        proc, _, http = start_controller(tmp, path, env)
    except RuntimeError as e:
        fail(where, str(e))
        if etcd is not None:
            etcd.stop()
        return
    health = http_get(http, "/healthz").strip()
    if (health != "ok") and not (is_ha and health.startswith("{") and
                                 json.loads(health).get("role") == "leader"):
        fail(where, f"controller not healthy: {health}")
    rc = proc.stop()
    if rc != 0:
        fail(where, f"kvf-controller exited {rc}: {proc.text()}")
    if etcd is not None:
        etcd.stop()


def pod_env(docs, kind, name):
    """KVF_ variables of the first container of workload @kind/@name."""
    for _, d in docs:
        if d.get("kind") == kind and d["metadata"]["name"] == name:
            c = d["spec"]["template"]["spec"]["containers"][0]
            return {e["name"]: e.get("value") for e in c.get("env", [])
                    if e["name"].startswith("KVF_")}
    return None


def check_ha_overlay(flags, configmaps, tmp):
    """deploy/k8s-ha: the base with a StatefulSet of three controllers on
    etcd; agents told the same etcd endpoints and prefix."""
    where = "deploy/k8s-ha"
    docs = load_k8s("k8s-ha")
    k = check_kustomization(docs, "k8s-ha", ["../k8s"])
    for fn, d in docs:
        if d.get("apiVersion") != API.get(d.get("kind")):
            fail(f"{where}/{fn}", f"{d.get('kind')}: unexpected kind or "
                 "apiVersion")
        if d.get("metadata", {}).get("namespace") != "kvfabric":
            fail(f"{where}/{fn}", "not in namespace kvfabric")
        if d.get("kind") in WORKLOADS:
            check_workload(f"../k8s-ha/{fn}", d, configmaps, flags)
    sts = [d for _, d in docs if d.get("kind") == "StatefulSet"]
    if len(sts) != 1 or sts[0]["spec"].get("replicas", 1) < 3:
        fail(where, "want one StatefulSet of at least three controllers")
        return
    sts = sts[0]
    c = sts["spec"]["template"]["spec"]["containers"][0]
    if "livenessProbe" in c:
        fail(where, "a liveness probe would kill the standbys (no port)")
    if c.get("readinessProbe", {}).get("tcpSocket", {}).get("port") != \
            "control":
        fail(where, "readiness must be the control port (only the leader "
             "binds it; a standby may answer /healthz)")
    headless = [d for _, d in docs if d.get("kind") == "Service" and
                d["spec"].get("clusterIP") == "None"]
    if not headless or headless[0]["metadata"]["name"] != \
            sts["spec"].get("serviceName"):
        fail(where, "the StatefulSet's serviceName is no headless Service")
    ctl_env = {e["name"]: e.get("value") for e in c.get("env", [])}
    # agents: the DaemonSet patched with KVF_ETCD / KVF_ETCD_PREFIX
    agent_env = {}
    for p in k.get("patches", []):
        if p.get("target", {}).get("kind") != "DaemonSet":
            continue
        for op in yaml.safe_load(p.get("patch", "")) or []:
            value = op.get("value", {})
            if isinstance(value, dict) and "name" in value:
                agent_env[value["name"]] = value.get("value")
    for name in agent_env:
        flag = "--" + name[4:].lower().replace("_", "-")
        if flag not in flags["kvf-agent"]:
            fail(where, f"agent env {name}: no key {name[4:].lower()}")
    for name in ("KVF_ETCD", "KVF_ETCD_PREFIX"):
        if not ctl_env.get(name) or ctl_env.get(name) != agent_env.get(name):
            fail(where, f"{name}: controllers {ctl_env.get(name)!r}, agents "
                 f"{agent_env.get(name)!r}: must be the same")
    # the controller's ConfigMap file with the StatefulSet's env, for real
    path = os.path.join(tmp, "controller-ha.yaml")
    with open(path, "w") as f:
        f.write(configmaps.get("kvfabric-config", {}).get("controller.yaml",
                                                           ""))
    check_controller_config("ConfigMap controller.yaml (with the "
                            "StatefulSet's env)", path, tmp,
                            {k: v for k, v in ctl_env.items()
                             if k.startswith("KVF_") and
                             k != "KVF_CLUSTER_SECRET_FILE"})
    return docs


def check_rendered_ha(kubectl, tmp):
    """`kubectl kustomize` of the overlay copied under @tmp (beside k8s/)."""
    r = subprocess.run([kubectl, "kustomize", os.path.join(tmp, "k8s-ha")],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        fail("kubectl kustomize deploy/k8s-ha", r.stderr.strip())
        return
    objs = [d for d in yaml.safe_load_all(r.stdout) if d]
    kinds = {(d["kind"], d["metadata"]["name"]) for d in objs}
    for want in (("StatefulSet", "kvf-controller"),
                 ("Service", "kvf-controller"),
                 ("Service", "kvf-controller-peers"),
                 ("DaemonSet", "kvf-agent")):
        if want not in kinds:
            fail("kubectl kustomize deploy/k8s-ha", f"no {want[0]} {want[1]}")
    if ("Deployment", "kvf-controller") in kinds:
        fail("kubectl kustomize deploy/k8s-ha",
             "the single-controller Deployment is still there")
    agent = pod_env([(None, d) for d in objs], "DaemonSet", "kvf-agent")
    if not agent or "KVF_ETCD" not in agent:
        fail("kubectl kustomize deploy/k8s-ha", "agents are not told KVF_ETCD")


def cmd_configs():
    docs = load_k8s()
    flags = {"kvf-agent": help_flags(AGENT),
             "kvf-controller": help_flags(CONTROLLER)}
    check_kustomization(docs)
    configmaps = {}
    names = set()
    for fn, d in docs:
        kind = d.get("kind")
        meta = d.get("metadata", {})
        where = f"deploy/k8s/{fn}: {kind} {meta.get('name')}"
        if kind not in API:
            fail(where, "unexpected kind")
            continue
        if d.get("apiVersion") != API[kind]:
            fail(where, f"apiVersion {d.get('apiVersion')}, want {API[kind]}")
        if not meta.get("name"):
            fail(where, "no metadata.name")
        if kind != "Namespace" and meta.get("namespace") != "kvfabric":
            fail(where, "not in namespace kvfabric")
        if (kind, meta.get("name")) in names:
            fail(where, "defined twice")
        names.add((kind, meta.get("name")))
        if kind == "ConfigMap":
            configmaps[meta["name"]] = d.get("data", {})
    workloads = {}
    for fn, d in docs:
        if d.get("kind") in WORKLOADS:
            workloads[d["metadata"]["name"]] = check_workload(
                fn, d, configmaps, flags)
    for fn, d in docs:
        if d.get("kind") != "Service":
            continue
        where = f"deploy/k8s/{fn}: Service {d['metadata']['name']}"
        sel = d["spec"].get("selector", {})
        match = [ports for labels, ports in workloads.values()
                 if all(labels.get(k) == v for k, v in sel.items())]
        if not match:
            fail(where, f"selector {sel} matches no workload")
            continue
        for p in d["spec"].get("ports", []):
            if p.get("targetPort", p.get("port")) not in match[0]:
                fail(where, f"targetPort {p.get('targetPort')} not exposed")

    with tempfile.TemporaryDirectory(prefix="kvf-deploy-") as tmp:
        data = configmaps.get("kvfabric-config", {})
        for key in ("controller.yaml", "agent.yaml"):
            if key not in data:
                fail("deploy/k8s/configmap.yaml", f"no {key}")
        path = os.path.join(tmp, "agent.yaml")
        with open(path, "w") as f:
            f.write(data.get("agent.yaml", ""))
        check_agent_config("ConfigMap agent.yaml (with the DaemonSet's env)",
                           path, container_env(docs, "kvf-agent"))
        path = os.path.join(tmp, "controller.yaml")
        with open(path, "w") as f:
            f.write(data.get("controller.yaml", ""))
        check_controller_config("ConfigMap controller.yaml", path, tmp)
        ha_docs = check_ha_overlay(flags, configmaps, tmp) or []
        cdir = src("deploy", "config")
        for fn in sorted(os.listdir(cdir)):
            path = os.path.join(cdir, fn)
            if fn.startswith("agent"):
                check_agent_config(f"deploy/config/{fn}", path)
            elif fn.startswith("controller"):
                check_controller_config(f"deploy/config/{fn}", path, tmp)
            else:
                fail(f"deploy/config/{fn}", "neither agent* nor controller*")

    check_wiring(docs + ha_docs)
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        print("note: kubectl not installed; `kubectl kustomize` not run")
    else:
        # offline: renders and parses every manifest, needs no API server;
        # the Secret is generated from cluster.secret, which an operator
        # makes (never committed): a copy of deploy/k8s gets one
        with tempfile.TemporaryDirectory(prefix="kvf-k8s-") as tmp:
            kdir = os.path.join(tmp, "k8s")
            shutil.copytree(src("deploy", "k8s"), kdir)
            shutil.copytree(src("deploy", "k8s-ha"),
                            os.path.join(tmp, "k8s-ha"))
            with open(os.path.join(kdir, "cluster.secret"), "w") as f:
                f.write("0123456789abcdef0123456789abcdef\n")
            r = subprocess.run([kubectl, "kustomize", kdir],
                               capture_output=True, text=True, timeout=120)
            check_rendered_ha(kubectl, tmp)
        if r.returncode != 0:
            fail("kubectl kustomize deploy/k8s", r.stderr.strip())
        else:
            kinds = [d["kind"] for d in yaml.safe_load_all(r.stdout) if d]
            if len(kinds) != len(docs) + 1:
                fail("kubectl kustomize deploy/k8s",
                     f"rendered {len(kinds)} objects, want {len(docs) + 1}")
            elif "Secret" not in kinds:
                fail("kubectl kustomize deploy/k8s", "no Secret rendered")
    done()


# ---- wiring: socket paths and the cluster secret ---------------------------

SOCKET = re.compile(r"/run/kvfabric/[^\s`\"',)]*\.sock")
SOCKET_CONVENTION = re.compile(r"^/run/kvfabric/gpu(\d+|\{rank\}|%i|N)/agent\.sock$")
SOCKET_DEFAULT = "/run/kvfabric/agent.sock"
# pages that document the programs' built-in defaults
DEFAULT_PAGES = {"docs/configuration.md", "docs/protocol.md"}
SECRET_PATH = "/etc/kvfabric/cluster.secret"
PROGRAMS = ("kvf-controller", "kvf-agent", "kvfctl")


def text_files():
    """(relative path, text) of the docs and deploy files."""
    out = []
    for top in ("docs", "deploy"):
        for root, _, files in os.walk(src(top)):
            for fn in sorted(files):
                path = os.path.join(root, fn)
                try:
                    with open(path) as f:
                        out.append((os.path.relpath(path, SRC), f.read()))
                except UnicodeDecodeError:
                    continue
    with open(src("README.md")) as f:
        out.append(("README.md", f.read()))
    return out


def check_sockets():
    for rel, text in text_files():
        for n, line in enumerate(text.splitlines(), 1):
            for path in SOCKET.findall(line):
                if SOCKET_CONVENTION.match(path):
                    continue
                if path == SOCKET_DEFAULT and (rel in DEFAULT_PAGES or
                                               "default" in line):
                    continue
                fail(f"{rel}:{n}", f"socket {path} does not follow "
                     "/run/kvfabric/gpuN/agent.sock")


def shell_commands(text):
    """(line number, logical command, exported names) of ```sh blocks."""
    out = []
    for block in re.finditer(r"^```sh\n(.*?)^```", text, re.M | re.S):
        start = text[:block.start()].count("\n") + 2
        exported, cmd, first = set(), "", None
        for i, line in enumerate(block.group(1).splitlines()):
            if first is None:
                first = start + i
            cmd += line.rstrip("\\") + " "
            if line.endswith("\\"):
                continue
            m = re.match(r"\s*export (KVF_[A-Z_]+)=", cmd)
            if m:
                exported.add(m.group(1))
            out.append((first, cmd.strip(), set(exported)))
            cmd, first = "", None
    return out


def check_doc_secrets():
    for rel in ("docs/operations.md", "docs/integration-vllm.md"):
        with open(src(rel)) as f:
            text = f.read()
        for n, cmd, exported in shell_commands(text):
            words = [w for w in cmd.split() if not re.match(r"^[A-Z_]+=", w)]
            if not words or words[0] not in PROGRAMS:
                continue
            if (f"KVF_CLUSTER_SECRET_FILE={SECRET_PATH}" not in cmd and
                    "KVF_CLUSTER_SECRET_FILE" not in exported):
                fail(f"{rel}:{n}", f"{words[0]} started without "
                     f"KVF_CLUSTER_SECRET_FILE={SECRET_PATH}")
        if SECRET_PATH not in text:
            fail(rel, f"never names the secret file {SECRET_PATH}")


def check_unit_secrets():
    sdir = src("deploy", "systemd")
    for fn in sorted(os.listdir(sdir)):
        if not fn.endswith(".service"):
            continue
        with open(os.path.join(sdir, fn)) as f:
            lines = set(f.read().splitlines())
        for must in (f"LoadCredential=cluster.secret:{SECRET_PATH}",
                     "Environment=KVF_CLUSTER_SECRET_FILE=%d/cluster.secret"):
            if must not in lines:
                fail(f"deploy/systemd/{fn}", f"missing '{must}'")


def check_k8s_secrets(docs):
    with open(src("deploy", "k8s", "kustomization.yaml")) as f:
        k = yaml.safe_load(f)
    generated = {g["name"] for g in k.get("secretGenerator", [])
                 if "cluster.secret" in g.get("files", [])}
    if not generated:
        fail("deploy/k8s/kustomization.yaml",
             "no secretGenerator from cluster.secret")
    for fn, d in docs:
        if d.get("kind") not in WORKLOADS:
            continue
        where = f"deploy/k8s/{fn}: {d['kind']} {d['metadata']['name']}"
        pod = d["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        secret_vols = {n for n, v in volumes.items()
                       if v.get("secret", {}).get("secretName") in generated}
        # volumes an init container fills from a read-only Secret mount
        filled = set()
        for c in pod.get("initContainers", []):
            mounts = c.get("volumeMounts", [])
            if any(m["name"] in secret_vols and m.get("readOnly")
                   for m in mounts):
                filled |= {m["name"] for m in mounts
                           if m["name"] not in secret_vols}
        for c in pod.get("containers", []):
            if (c.get("command") or [""])[0] not in PROGRAMS:
                continue
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            path = env.get("KVF_CLUSTER_SECRET_FILE")
            if not path:
                fail(f"{where} container {c['name']}",
                     "no KVF_CLUSTER_SECRET_FILE: an unauthenticated cluster")
                continue
            mount = [m for m in c.get("volumeMounts", [])
                     if os.path.dirname(path) == m["mountPath"]]
            if not mount:
                fail(f"{where} container {c['name']}",
                     f"{path}: its directory is not mounted")
            elif not mount[0].get("readOnly"):
                fail(f"{where} container {c['name']}",
                     f"{mount[0]['mountPath']} is not read-only")
            elif (mount[0]["name"] not in secret_vols and
                  mount[0]["name"] not in filled):
                fail(f"{where} container {c['name']}",
                     f"{path} does not come from the Secret")


def check_wiring(docs):
    check_sockets()
    check_doc_secrets()
    check_unit_secrets()
    check_k8s_secrets(docs)


# ---- systemd ---------------------------------------------------------------

UNITS = {
    # unit file: (binary, instance to verify, exposure threshold x10, musts)
    "kvf-controller.service": (CONTROLLER, None, 20,
                               ["MemoryDenyWriteExecute=yes",
                                "PrivateDevices=yes"]),
    "kvf-agent@.service": (AGENT, "gpu0", 40,
                           ["LimitMEMLOCK=infinity",
                            "RuntimeDirectory=kvfabric/%i"]),
    # HA on etcd: an instance per cluster, back as a standby after exit 3/4
    "kvf-controller-ha@.service": (CONTROLLER, "prod", 20,
                                   ["MemoryDenyWriteExecute=yes",
                                    "PrivateDevices=yes", "RestartSec=1s"]),
}
MUSTS = ["User=kvfabric", "ProtectSystem=strict", "ProtectHome=yes",
         "PrivateTmp=yes", "NoNewPrivileges=yes", "Restart=on-failure",
         "CapabilityBoundingSet="]


def cmd_systemd():
    sa = shutil.which("systemd-analyze")
    if sa is None:
        print("skip: systemd-analyze is not installed (Debian package systemd)")
        sys.exit(SKIP)
    with tempfile.TemporaryDirectory(prefix="kvf-units-") as tmp:
        for unit, (binary, inst, threshold, musts) in UNITS.items():
            path = src("deploy", "systemd", unit)
            with open(path) as f:
                text = f.read()
            lines = set(text.splitlines())
            for m in MUSTS + musts:
                if m not in lines:
                    fail(unit, f"missing '{m}'")
            execs = re.findall(r"^ExecStart=(\S+)(.*)$", text, re.M)
            if len(execs) != 1:
                fail(unit, "want exactly one ExecStart")
                continue
            exe, args = execs[0]
            known = help_flags(binary)
            for flag in re.findall(r"--[a-z][a-z0-9-]*", args):
                if flag not in known:
                    fail(unit, f"ExecStart flag {flag} is not in --help")
            conf = re.search(r"--config (\S+)", args)
            if conf:
                name = os.path.basename(conf.group(1)).replace("%i", inst or "")
                if not os.path.exists(src("deploy", "config", name)):
                    fail(unit, f"no example deploy/config/{name}")
            # verify with the built binary in place of the installed one
            name = unit.replace("@.", f"@{inst}.") if inst else unit
            with open(os.path.join(tmp, name), "w") as f:
                f.write(text.replace(exe, os.path.abspath(binary)))
            r = subprocess.run([sa, "verify", os.path.join(tmp, name)],
                               capture_output=True, text=True, timeout=120)
            out = (r.stdout + r.stderr).strip()
            if r.returncode != 0 or out:
                fail(unit, f"systemd-analyze verify: {out}")
            r = subprocess.run([sa, "security", "--offline=yes",
                                f"--threshold={threshold}",
                                os.path.join(tmp, name)],
                               capture_output=True, text=True, timeout=120)
            level = re.search(r"Overall exposure level for \S+: ([0-9.]+)",
                              r.stdout)
            if level is None:
                print(f"note: systemd-analyze security --offline not "
                      f"supported here: {r.stderr.strip()}")
            elif r.returncode != 0:
                fail(unit, f"exposure {level.group(1)} above "
                     f"{threshold / 10:.1f}: harden it again")
            else:
                print(f"{unit}: exposure {level.group(1)}")
    done()


# ---- monitoring ------------------------------------------------------------

DURATION = re.compile(r"^[0-9]+(ms|s|m|h|d|w|y)$")


def exprs_of_alerts(path):
    with open(path) as f:
        doc = yaml.safe_load(f)
    out, seen = [], set()
    for g in doc.get("groups", []):
        if not g.get("name") or not g.get("rules"):
            fail(path, "a group without name or rules")
        for r in g.get("rules", []):
            where = f"{path}: {r.get('alert')}"
            if not r.get("alert") or not r.get("expr"):
                fail(path, f"rule without alert or expr: {r}")
                continue
            if r["alert"] in seen:
                fail(where, "defined twice")
            seen.add(r["alert"])
            if "for" in r and not DURATION.match(str(r["for"])):
                fail(where, f"bad for: {r['for']}")
            if r.get("labels", {}).get("severity") not in (
                    "info", "warning", "critical"):
                fail(where, "labels.severity must be info|warning|critical")
            if not r.get("annotations", {}).get("summary"):
                fail(where, "no annotations.summary")
            out.append((where, r["expr"]))
    for name in ("KvfabricLowHitRate", "KvfabricFetchLatencyHigh",
                 "KvfabricNodesDead", "KvfabricChecksumFailures"):
        if name not in seen:
            fail(path, f"no {name} rule")
    return out, doc


def exprs_of_grafana(path):
    with open(path) as f:
        dash = json.load(f)
    out, ids = [], set()
    for key in ("title", "uid", "panels", "schemaVersion"):
        if key not in dash:
            fail(path, f"no {key}")
    for p in dash.get("panels", []):
        where = f"{path}: panel {p.get('title')}"
        if p.get("id") in ids:
            fail(where, "duplicate id")
        ids.add(p.get("id"))
        if "gridPos" not in p or not p.get("title"):
            fail(where, "no gridPos or title")
        if p.get("type") == "row":
            continue
        refs = set()
        if not p.get("targets"):
            fail(where, "no targets")
        for t in p.get("targets", []):
            if not t.get("expr") or t.get("refId") in refs:
                fail(where, "target without expr or with a duplicate refId")
            refs.add(t.get("refId"))
            out.append((where, t.get("expr", "")))
    return out


def scrape(text):
    """{metric name: [label dicts]} from Prometheus text format."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s", line)
        if m is None:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(3) or ""))
        samples.setdefault(m.group(1), []).append(labels)
    return samples


def check_exprs(exprs, samples):
    for where, expr in exprs:
        for name in set(re.findall(r"\bkvf_[a-z0-9_]+\b", expr)):
            if name not in samples:
                fail(where, f"{name} is not exported by kvf-controller or "
                     f"kvf-agent")
        for name, sel in re.findall(r"\b(kvf_[a-z0-9_]+)\{([^}]*)\}", expr):
            want = dict(re.findall(r'(\w+)\s*=\s*"([^"]*)"', sel))
            if name in samples and not any(
                    all(ls.get(k) == v for k, v in want.items())
                    for ls in samples[name]):
                fail(where, f"{name}{{{sel}}} matches no exported series")


def cmd_monitoring():
    mdir = src("deploy", "monitoring")
    with open(os.path.join(mdir, "prometheus.yml")) as f:
        prom = yaml.safe_load(f)
    jobs = [s.get("job_name") for s in prom.get("scrape_configs", [])]
    if len(jobs) != len(set(jobs)) or None in jobs:
        fail("prometheus.yml", f"job names missing or repeated: {jobs}")
    for rf in prom.get("rule_files", []):
        if not os.path.exists(os.path.join(mdir, rf)):
            fail("prometheus.yml", f"rule file {rf} does not exist")
    alerts, _ = exprs_of_alerts(os.path.join(mdir, "alerts.yml"))
    for where, expr in alerts:
        for job in re.findall(r'job="([^"]+)"', expr):
            if job not in jobs:
                fail(where, f"job {job} is not a scrape job")
    grafana = exprs_of_grafana(os.path.join(mdir, "grafana-dashboard.json"))

    with tempfile.TemporaryDirectory(prefix="kvf-mon-") as tmp:
        procs = []
        try:
            ctl_proc, ctl, http = start_controller(tmp)
            procs.append(ctl_proc)
            agent_proc, agent_http = start_agent(tmp, ctl, "mon-agent")
            procs.append(agent_proc)
            samples = scrape(http_get(http, "/metrics"))
            samples.update(scrape(http_get(agent_http, "/metrics")))
        finally:
            for p in reversed(procs):
                rc = p.stop()
                if rc != 0:
                    fail(p.argv[0], f"exited {rc}: {p.text()}")
    check_exprs(alerts + grafana, samples)

    promtool = shutil.which("promtool")
    if promtool is None:
        print("note: promtool not installed; structure checked here instead")
    else:
        for args in (["check", "rules", os.path.join(mdir, "alerts.yml")],
                     ["check", "config", os.path.join(mdir, "prometheus.yml")]):
            r = subprocess.run([promtool] + args, capture_output=True,
                               text=True, timeout=120)
            if r.returncode != 0:
                fail("promtool " + " ".join(args), r.stdout + r.stderr)
    done()


if __name__ == "__main__":
    cmds = {"configs": cmd_configs, "systemd": cmd_systemd,
            "monitoring": cmd_monitoring}
    if len(sys.argv) != 2 or sys.argv[1] not in cmds:
        sys.exit(f"usage: check_deploy.py {{{'|'.join(cmds)}}}")
    cmds[sys.argv[1]]()
