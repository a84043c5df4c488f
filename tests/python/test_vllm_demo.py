# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""tools/demo-vllm.py (make demo-vllm) runs to its TTFT table: the tiny
model and a short prompt (quick; the times mean nothing here). Runs in
build/venv (tests/python/run_in_venv.py)."""
import os
import subprocess
import sys

from kvfabric.testing.vllm_engine import SRC


def test_demo_vllm_prints_its_table():
    env = dict(os.environ)
    r = subprocess.run([sys.executable, str(SRC / "tools" / "demo-vllm.py"),
                        "--tiny", "--tokens", "700", "--chunk", "128"],
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    rows = [l for l in r.stdout.splitlines() if l.startswith("| ")]
    assert len(rows) == 4, r.stdout
    moved = [int(l.split("|")[3].strip().replace(",", "")) for l in rows[1:]]
    assert moved[0] == 0 and moved[1] > 0 and moved[2] == moved[1]
