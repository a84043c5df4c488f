#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""Prints the closing table of `make demo` from the JSON lines its phases
wrote: one column per phase, every figure as measured in this run.

    tools/demo-report.py "TITLE=FILE" ...
"""
import json
import sys


def load(paths):
    """The last JSON line of each of PATH[+PATH...], merged (later wins)."""
    merged = {}
    for path in paths.split("+"):
        merged.update(load_one(path))
    return merged


def load_one(path):
    with open(path) as f:
        lines = [ln for ln in f.read().splitlines() if ln.startswith("{")]
    if not lines:
        sys.exit(f"demo-report: no JSON line in {path}")
    return json.loads(lines[-1])


def pct(part, whole):
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def main():
    phases = []
    for arg in sys.argv[1:]:
        title, _, path = arg.partition("=")
        phases.append((title, load(path)))
    if not phases:
        sys.exit("usage: demo-report.py TITLE=FILE ...")

    rows = [
        ("prompts / PD requests", lambda p: str(p.get("prompts", p.get("requests", "-")))),
        ("chunks pushed (PD)", lambda p: str(p["chunks_pushed"])),
        ("chunks stored (prefilled)", lambda p: str(p.get("chunks_stored", "-"))),
        ("local hit rate", lambda p: pct(p["chunks_hit"] - p["chunks_fetched"],
                                         p["chunks_hit"] + p["chunks_stored"])
         if "chunks_hit" in p else "-"),
        ("remote hit rate (peer fetch)", lambda p: pct(p["chunks_fetched"],
                                                       p["chunks_hit"] + p["chunks_stored"])
         if "chunks_hit" in p else "-"),
        ("bytes moved between agents", lambda p: f"{p.get('bytes_moved', 0) / 1e9:.2f} GB"),
        ("fetch GB/s (incl. lookup)", lambda p: f"{p['fetch_GBps']:.2f}"
         if p.get("chunks_fetched") else "-"),
        ("PD push p50 / p99 (ms)", lambda p: f"{p['p50_us'] / 1e3:.1f} / {p['p99_us'] / 1e3:.1f}"
         if "p50_us" in p else "-"),
        ("PD push GB/s", lambda p: f"{p['GBps']:.2f}" if "GBps" in p else "-"),
        ("prefill tokens saved", lambda p: f"{p['tokens_saved']} of {p['prompt_tokens']}"
         if "tokens_saved" in p else "-"),
        ("chunks read back wrong", lambda p: str(p.get("wrong_bytes", 0))),
    ]
    width = max(len(r[0]) for r in rows) + 2
    cols = [max(len(t), 12) + 2 for t, _ in phases]
    print(" " * width + "".join(t.rjust(c) for (t, _), c in zip(phases, cols)))
    for label, fn in rows:
        cells = []
        for (_, p), c in zip(phases, cols):
            try:
                cells.append(fn(p).rjust(c))
            except (KeyError, ZeroDivisionError, TypeError):
                cells.append("-".rjust(c))
        print(label.ljust(width) + "".join(cells))
    wrong = sum(p.get("wrong_bytes", 0) for _, p in phases)
    return 0 if wrong == 0 else 3


if __name__ == "__main__":
    sys.exit(main())
