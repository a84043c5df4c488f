# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""meson install into a temporary prefix, then engines against a real agent
using only what was installed: a C engine built with `pkg-config --cflags
--libs kvfabric`, and the Python package installed with pip, which finds
the library through pkg-config (no KVF_LIB, no build tree)."""
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from conftest import SRC, _run_cluster

ENGINE_C = r"""
#include <kvfabric/kvfabric.h>
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv)
{
    kvf_client_params_t p = {.field_mask = KVF_CLIENT_PARAM_SOCKET,
                             .socket_path = argv[1]};
    uint32_t tokens[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    kvf_lookup_result_t res;
    kvf_client_t *c;
    kvf_slot_t slot;
    kvf_key_t key;
    uint64_t sum;
    size_t n;
    (void)argc;
    if (kvf_client_connect(&p, &c) != KVF_OK) {
        printf("connect: %s\n", kvf_client_last_error(NULL));
        return 1;
    }
    kvf_key_chain(0x99, tokens, 16, 16, false, &key, 1, &n);
    if (kvf_client_alloc(c, 4096, 1, &slot) != KVF_OK) return 2;
    memset((char *)kvf_client_pool_base(c) + slot.offset, 0x5a, 4096);
    sum = kvf_chunk_checksum((char *)kvf_client_pool_base(c) + slot.offset,
                             4096);
    if (kvf_client_commit(c, &key, &slot, &sum, 1) != KVF_OK) return 3;
    if (kvf_client_lookup(c, &key, 1, false, &res) != KVF_OK) return 4;
    printf("hit %u\n", res.hit_chunks);
    kvf_client_disconnect(c);
    return 0;
}
"""

PY_ENGINE = r"""
import sys
import kvfabric
print(kvfabric.lib_path)
with kvfabric.Client(sys.argv[1], timeout=10) as c:
    print("registered", c.stats().registered)
"""


@pytest.fixture
def one_agent():
    yield from _run_cluster(agents=("a",))


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    """What `meson install` put under a temporary DESTDIR."""
    root = os.environ.get("KVF_BUILD_ROOT")
    if not root or shutil.which("meson") is None:
        pytest.skip("needs KVF_BUILD_ROOT and meson: run through meson test")
    dest = tmp_path_factory.mktemp("dest")
    r = subprocess.run(["meson", "install", "--no-rebuild", "--quiet",
                        "-C", root, "--destdir", str(dest)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return dest


def one(dest: pathlib.Path, pattern: str) -> pathlib.Path:
    found = sorted(dest.rglob(pattern))
    assert found, f"meson install put no {pattern} under {dest}"
    return found[0]


def test_install_puts_everything_under_the_prefix(prefix):
    for prog in ("kvf-agent", "kvf-controller", "kvfctl", "kvf-bench"):
        assert os.access(one(prefix, f"bin/{prog}"), os.X_OK)
    one(prefix, "libkvfabric.so")
    one(prefix, "pkgconfig/kvfabric.pc")
    one(prefix, "include/kvfabric/kvfabric.h")
    one(prefix, "doc/kvfabric/operations.md")
    assert not list(prefix.rglob("bench-transport")), "a test-only program"


def test_c_engine_built_with_pkg_config(prefix, one_agent, tmp_path):
    env = dict(os.environ)
    env["PKG_CONFIG_PATH"] = str(one(prefix, "pkgconfig/kvfabric.pc").parent)
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "kvfabric"],
                           capture_output=True, text=True, env=env,
                           check=True).stdout.split()
    libdir = subprocess.run(["pkg-config", "--variable=libdir", "kvfabric"],
                            capture_output=True, text=True, env=env,
                            check=True).stdout.strip()
    assert libdir.startswith(str(prefix)), libdir
    src = tmp_path / "engine.c"
    src.write_text(ENGINE_C)
    exe = tmp_path / "engine"
    asan = "asan" in os.environ["KVF_BUILD_ROOT"]
    r = subprocess.run(["gcc", "-std=c11", str(src), "-o", str(exe)] + flags
                       + [f"-Wl,-rpath,{libdir}"]
                       + (["-fsanitize=address,undefined"] if asan else []),
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    env.pop("LD_PRELOAD", None)
    r = subprocess.run([str(exe), one_agent.sockets["a"]],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "hit 1", \
        r.stdout + r.stderr


def test_pip_installed_package_finds_the_library(prefix, one_agent, tmp_path):
    target = tmp_path / "site"
    # from a copy: setuptools writes build/ and *.egg-info beside the source
    src = tmp_path / "python"
    shutil.copytree(SRC / "python", src,
                    ignore=shutil.ignore_patterns("__pycache__", "build",
                                                  "*.egg-info"))
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",
                        "--no-deps", "--no-build-isolation", "--no-index",
                        "--target", str(target), str(src)],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (target / "kvfabric" / "_lib.py").exists()
    env = {k: v for k, v in os.environ.items()
           if k not in ("KVF_LIB", "KVF_BUILD_ROOT", "PYTHONPATH")}
    env["PYTHONPATH"] = str(target)
    env["PKG_CONFIG_PATH"] = str(one(prefix, "pkgconfig/kvfabric.pc").parent)
    r = subprocess.run([sys.executable, "-c", PY_ENGINE,
                        one_agent.sockets["a"]],
                       capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    lib_path, registered = r.stdout.strip().split("\n")[-2:]
    assert lib_path.startswith(str(prefix)), lib_path
    assert registered == "registered True", r.stdout
