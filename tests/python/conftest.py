# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""pytest set-up: the kvfabric package from python/, the build from
KVF_BUILD_ROOT (meson test sets it), a loopback cluster fixture."""
import os
import pathlib
import re
import shlex
import sys

import pytest

SRC = pathlib.Path(os.environ.get("KVF_SOURCE_ROOT",
                                  pathlib.Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(SRC / "python"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))


def torch_or_skip():
    """torch, or a skip saying why (python3-torch is installed by make's
    set-up; only where it cannot be installed does a test skip)."""
    try:
        import torch
    except ImportError as e:
        pytest.skip(f"python3-torch not installed ({e}); "
                    "make test installs it with apt")
    return torch


def doc_command(doc: str):
    """The argv of the one ``sh`` block of docs/@p doc (line continuations
    joined), for tests that run what a page tells users to run."""
    text = (SRC / "docs" / doc).read_text()
    [block] = re.findall(r"```sh\n(.*?)```", text, re.S)
    return shlex.split(block.replace("\\\n", " "))


def _run_cluster(**kw):
    """controller + agents; every process stopped at the end, and each must
    exit 0 (under ASan that includes no leaks)."""
    from kvfabric.testing.cluster import Cluster

    cl = Cluster(**kw)
    cl.start()
    try:
        yield cl
    finally:
        codes = cl.stop()
        logs = cl.logs()
        cl.cleanup()
    bad = {k: v for k, v in codes.items() if v != 0}
    assert not bad, f"processes exited badly: {bad}\n{logs}"


@pytest.fixture
def cluster():
    """controller + agents a and b (role both)."""
    yield from _run_cluster(agents=("a", "b"))


@pytest.fixture
def pd_cluster():
    """controller + a PD pair: agent p (--role prefill) and agent d (--role
    decode, a 16 MiB receive region), as tests/integration/test_pd.c starts
    them; P pushes to d by its node name, ``pd_cluster.node_name("d")``."""
    yield from _run_cluster(agents=("p", "d"),
                            roles={"p": "prefill", "d": "decode"},
                            pd_buffer_size="16M")
