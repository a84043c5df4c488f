# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""End-to-end proof: prefill in one process, decode in another, KV through
kvfabric, output equal to a single-process run.

    python3 -m kvfabric.testing.e2e run [--decode-steps N] [--json]

starts a loopback cluster (kvf-controller, agents a and b), then three
separate Python processes:

* P (``role prefill``, agent a): prefills each scenario's prompt with the
  tiny GPT (vLLM cache layout), packs the chunks into pool slots and
  commits them with their keys and checksums;
* D (``role decode``, agent b): looks the keys up, retrieves the chunks
  (fetched over UCX from a), unpacks them into its own cache (SGLang
  layout), computes only what was not loaded and decodes greedily;
* R (``role reference``, no fabric): computes everything itself.

D's generated tokens and every logit must equal R's exactly
(torch.equal). Scenarios (``SCENARIOS``):

* ``prefix``: a prompt whose leading chunks P stored (chained keys);
* ``rag``: a document stored by P after one system prompt, reused by D
  after another one (document keys independent of what precedes them; see
  tiny_gpt for why the model uses block attention for documents).

* ``pd`` (``PD_SCENARIOS``, on a PD pair: agent p ``--role prefill``,
  agent d ``--role decode``): P pushes each full chunk of the prompt to the
  decoder agent by name as soon as its piece is computed (``pd_push``,
  ``final`` on the last), instead of committing it for lookup; D waits for
  the request by id (``pd_wait``), unpacks the received slots into its
  cache, releases them (``pd_release``), computes the tail and decodes. The
  model, the comparison and the report are the same.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Dict, List

import torch

import kvfabric as kvf
from .tiny_gpt import (GPTConfig, PagedCache, Segment, TinyGPT,
                       deterministic, now, plan)

CFG = GPTConfig()
MAX_TOKENS = 256


def _tokens(seed: int, n: int) -> List[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, CFG.vocab, (n,), generator=g).tolist()


def scenario_prompts(name: str):
    """(P's segments, D's segments) of a scenario."""
    if name == "prefix":
        prompt = [Segment("text", _tokens(1, 8 * CFG.chunk + 5))]
        return prompt, prompt
    if name == "pd":
        prompt = [Segment("text", _tokens(7, 8 * CFG.chunk + 5))]
        return prompt, prompt
    if name == "rag":
        doc = Segment("doc", _tokens(2, 4 * CFG.chunk))
        p = [Segment("text", _tokens(3, 37)), doc,
             Segment("text", _tokens(4, 11))]
        d = [Segment("text", _tokens(5, 29)), doc,
             Segment("text", _tokens(6, 13))]
        return p, d
    raise ValueError(f"unknown scenario {name}")


SCENARIOS = ("prefix", "rag")
PD_SCENARIOS = ("pd",)
PD_REQUEST_ID = 0x7064_0001  # the PD request both sides name


def namespaces():
    ns = kvf.namespace_fingerprint(CFG.model_id, "bf16", CFG.layers,
                                   CFG.n_kv_heads, CFG.head_dim,
                                   chunk_size=CFG.chunk)
    # document KV under block attention is another kind of KV than a
    # causal prefix's: its own namespace keeps the two apart
    ns_doc = kvf.namespace_fingerprint(CFG.model_id + "/block-attn-doc",
                                       "bf16", CFG.layers, CFG.n_kv_heads,
                                       CFG.head_dim, chunk_size=CFG.chunk)
    return ns, ns_doc


def stored_chunks(segments) -> List[tuple]:
    """(key, first context index) of every chunk a prefill stores: full
    chunks of the leading text segment under chained keys, full chunks of
    each document under keys of the document alone."""
    ns, ns_doc = namespaces()
    C = CFG.chunk
    out, pos = [], 0
    for i, s in enumerate(segments):
        if s.kind == "text" and i == 0:
            for j, k in enumerate(kvf.key_chain(ns, s.tokens, C)):
                out.append((k, pos + j * C))
        elif s.kind == "doc":
            for j in range(len(s.tokens) // C):
                k = kvf.key_independent(ns_doc, s.tokens[:(j + 1) * C])
                out.append((k, pos + j * C))
        pos += len(s.tokens)
    return out


def _prompt_len(segments) -> int:
    return sum(len(s.tokens) for s in segments)


# roles -------------------------------------------------------------------

def _prefill_push(cl, model, segs, decoder: str, request_id: int) -> Dict:
    """P in PD mode: every full chunk of the leading text segment is packed
    and pushed to @p decoder as soon as its piece is computed, final on the
    last, so the request is complete at the decoder when the prefill ends.
    pd_push returns once the decoder verified the chunk: its time adds to
    P's (``store_ms``). The grant is released after each push (the slot
    stays ours through it)."""
    C = CFG.chunk
    cache = PagedCache.create(model, "vllm", MAX_TOKENS, seed=11)
    nbytes = cache.layout.chunk_bytes(C)
    pieces = plan(segs, C)
    push = [pc for pc in pieces if pc.seg == 0 and pc.kind == "text"
            and pc.n == C]
    t_all = t_pushed = t_push = 0.0
    done = 0
    for pc in pieces:
        t0 = now()
        model.run_piece(cache, segs, pc)
        dt = now() - t0
        t_all += dt
        if pc not in push:
            continue
        t_pushed += dt
        t0 = now()
        slot = cl.alloc(nbytes, 1)[0]
        try:
            dst = cl.slot_tensor(kvf.Slot(slot.offset, nbytes),
                                 torch.bfloat16)
            cache.layout.pack(cache.kv, cache.slots[pc.start:pc.start + C],
                              dst)
            sums = [kvf.chunk_checksum(dst)]
            del dst
            done += 1
            cl.pd_push(request_id, decoder, [kvf.Slot(slot.offset, nbytes)],
                       sums, final=(done == len(push)))
        finally:
            cl.release([slot])
        t_push += now() - t0
    return dict(prefill_ms=t_all * 1e3, stored_prefill_ms=t_pushed * 1e3,
                store_ms=t_push * 1e3, chunks=len(push), chunk_bytes=nbytes,
                prompt_tokens=_prompt_len(segs))


def role_prefill(socket: str, scenarios: List[str],
                 decoder: str = "") -> Dict:
    model = TinyGPT(CFG)
    res = {}
    with kvf.Client(socket, timeout=20, name="e2e-prefill") as cl:
        for name in scenarios:
            segs, _ = scenario_prompts(name)
            if name in PD_SCENARIOS:
                res[name] = _prefill_push(cl, model, segs, decoder,
                                          PD_REQUEST_ID)
                continue
            cache = PagedCache.create(model, "vllm", MAX_TOKENS, seed=11)
            chunks = stored_chunks(segs)
            starts = {s for _, s in chunks}
            t_all = t_stored = 0.0
            for pc in plan(segs, CFG.chunk):
                t0 = now()
                model.run_piece(cache, segs, pc)
                dt = now() - t0
                t_all += dt
                if pc.start in starts and pc.n == CFG.chunk:
                    t_stored += dt
            t0 = now()
            nbytes = cache.layout.chunk_bytes(CFG.chunk)
            slots = cl.alloc(nbytes, len(chunks))
            sums = []
            for (key, start), s in zip(chunks, slots):
                dst = cl.slot_tensor(kvf.Slot(s.offset, nbytes),
                                     torch.bfloat16)
                cache.layout.pack(cache.kv,
                                  cache.slots[start:start + CFG.chunk], dst)
                sums.append(kvf.chunk_checksum(dst))
                del dst
            cl.commit([k for k, _ in chunks],
                      [kvf.Slot(s.offset, nbytes) for s in slots], sums)
            t_store = now() - t0
            res[name] = dict(prefill_ms=t_all * 1e3,
                             stored_prefill_ms=t_stored * 1e3,
                             store_ms=t_store * 1e3, chunks=len(chunks),
                             chunk_bytes=nbytes,
                             prompt_tokens=_prompt_len(segs))
    return res


def _wait_lookup(cl, keys, want: int, timeout: float = 20.0):
    """Waits until the cluster knows @p want leading chunks: P's commits
    reach the controller asynchronously (ADMIT batches). Not timed."""
    deadline = time.monotonic() + timeout
    while True:
        r = cl.lookup(keys)
        if r.hit_chunks >= want or time.monotonic() > deadline:
            return r
        time.sleep(0.005)


def role_decode(socket: str, scenarios: List[str], steps: int,
                fabric: bool = True) -> Dict:
    """D (fabric=True) or the single-process reference (fabric=False)."""
    model = TinyGPT(CFG)
    res = {}
    cl = kvf.Client(socket, timeout=20, name="e2e-decode") if fabric \
        else None
    try:
        for name in scenarios:
            p_segs, segs = scenario_prompts(name)
            kind, seed = ("sglang", 22) if fabric else ("vllm", 33)
            cache = PagedCache.create(model, kind, MAX_TOKENS, seed=seed)
            loaded = set()
            info = dict(hit_chunks=0, local_chunks=0, load_ms=0.0,
                        missed_chunks=0)
            t_start = now()
            if fabric and name in PD_SCENARIOS:
                t_start = now()
                n = _decode_pd_load(cl, cache, PD_REQUEST_ID, loaded, info)
                info["load_ms"] = (now() - t_start) * 1e3
                info["hit_chunks"] = info["fetched_chunks"] = n
            elif fabric:
                # what D could reuse: its own prompt's stored chunks
                want = stored_chunks(segs)
                # chunks P stored for this scenario: wait for the cluster to
                # know them before the clock starts (P ran first)
                expected = {k for k, _ in stored_chunks(p_segs)}
                groups = _key_groups(want)
                for g in groups:
                    n_exp = 0
                    for k, _ in g:
                        if k not in expected:
                            break
                        n_exp += 1
                    _wait_lookup(cl, [k for k, _ in g], n_exp)
                before = cl.stats().fetched_chunks
                t_start = now()
                for g in groups:
                    keys = [k for k, _ in g]
                    r = cl.lookup(keys)
                    info["hit_chunks"] += r.hit_chunks
                    info["local_chunks"] += r.local_chunks
                    if r.hit_chunks == 0:
                        continue
                    got, missing = cl.retrieve(keys[:r.hit_chunks])
                    for (k, start), s, miss in zip(g, got, missing):
                        if miss:  # recompute exactly those
                            info["missed_chunks"] += 1
                            continue
                        nbytes = cache.layout.chunk_bytes(CFG.chunk)
                        src = cl.slot_tensor(kvf.Slot(s.offset, nbytes),
                                             torch.bfloat16)
                        cache.layout.unpack(
                            cache.kv, cache.slots[start:start + CFG.chunk],
                            src)
                        del src
                        loaded.add(start)
                    cl.release(got)
                info["load_ms"] = (now() - t_start) * 1e3
                info["fetched_chunks"] = cl.stats().fetched_chunks - before
            t_c = now()
            last = None
            computed = 0
            for pc in plan(segs, CFG.chunk):
                if pc.start in loaded and pc.n == CFG.chunk:
                    continue
                last = model.run_piece(cache, segs, pc)
                computed += pc.n
            info["compute_ms"] = (now() - t_c) * 1e3
            info["ttft_ms"] = (now() - t_start) * 1e3
            info["computed_tokens"] = computed
            info["prompt_tokens"] = _prompt_len(segs)
            toks, logits = model.decode(cache, last[-1], _prompt_len(segs),
                                        steps)
            info["tokens"] = toks
            info["logits"] = logits
            res[name] = info
    finally:
        if cl is not None:
            cl.close()
    return res


def _decode_pd_load(cl, cache, request_id: int, loaded: set,
                    info: Dict) -> int:
    """D in PD mode: waits for the pushed request (either order with the
    push), unpacks chunk i into context tokens [i*C, (i+1)*C), releases
    the receive slots. Returns the chunks received."""
    C = CFG.chunk
    nbytes = cache.layout.chunk_bytes(C)
    slots = cl.pd_wait(request_id, timeout=60)
    try:
        for i, s in enumerate(slots):
            if s.length != nbytes:  # not this model's chunk: recompute
                info["missed_chunks"] += 1
                continue
            src = cl.slot_tensor(s, torch.bfloat16)
            cache.layout.unpack(cache.kv, cache.slots[i * C:(i + 1) * C],
                                src)
            del src
            loaded.add(i * C)
    finally:
        cl.pd_release(request_id)
    return len(slots)


def _key_groups(chunks):
    """Chunks split into lookup groups: a run of chained keys, then each
    document's keys (a lookup answers the leading hits of one group)."""
    groups, cur, prev = [], [], None
    for k, start in chunks:
        if cur and start != prev + CFG.chunk:
            groups.append(cur)
            cur = []
        cur.append((k, start))
        prev = start
    if cur:
        groups.append(cur)
    return groups


# driver ------------------------------------------------------------------

def _spawn(args: List[str], out: pathlib.Path, timeout: float):
    env = dict(os.environ)
    here = str(pathlib.Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-m", "kvfabric.testing.e2e", "role",
                        "--out", str(out)] + args, env=env,
                       capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"role {args} failed ({p.returncode}):\n"
                           f"{p.stdout}\n{p.stderr}")
    return torch.load(out)


def _report(p, d, r, scenarios) -> Dict:
    report = {}
    for name in scenarios:
        dd, rr, pp = d[name], r[name], p[name]
        report[name] = dict(
            tokens_equal=dd["tokens"] == rr["tokens"],
            logits_equal=bool(torch.equal(dd["logits"], rr["logits"])),
            tokens=dd["tokens"],
            prompt_tokens=dd["prompt_tokens"],
            reused_tokens=dd["prompt_tokens"] - dd["computed_tokens"],
            hit_chunks=dd["hit_chunks"], local_chunks=dd["local_chunks"],
            fetched_chunks=dd["fetched_chunks"],
            missed_chunks=dd["missed_chunks"],
            chunk_bytes=pp["chunk_bytes"],
            p_prefill_ms=round(pp["prefill_ms"], 2),
            p_prefill_of_reused_ms=round(pp["stored_prefill_ms"], 2),
            p_store_ms=round(pp["store_ms"], 2),
            d_load_ms=round(dd["load_ms"], 2),
            d_compute_ms=round(dd["compute_ms"], 2),
            d_ttft_ms=round(dd["ttft_ms"], 2),
            ref_ttft_ms=round(rr["ttft_ms"], 2),
            ttft_saved_ms=round(rr["ttft_ms"] - dd["ttft_ms"], 2))
    return report


def run_e2e(cluster, workdir, scenarios=SCENARIOS, steps: int = 8,
            timeout: float = 400) -> Dict:
    """Runs P on agent a, then D on agent b, and R alone; returns the
    report (per scenario: equal, tokens, timings)."""
    workdir = pathlib.Path(workdir)
    sc = ",".join(scenarios)
    p = _spawn(["--role", "prefill", "--socket", cluster.sockets["a"],
                "--scenarios", sc], workdir / "p.pt", timeout)
    d = _spawn(["--role", "decode", "--socket", cluster.sockets["b"],
                "--scenarios", sc, "--steps", str(steps)],
               workdir / "d.pt", timeout)
    r = _spawn(["--role", "reference", "--scenarios", sc, "--steps",
                str(steps)], workdir / "r.pt", timeout)
    return _report(p, d, r, scenarios)


def run_pd(cluster, workdir, steps: int = 8, timeout: float = 400) -> Dict:
    """PD push on a prefill/decode pair (cluster agents ``p`` with --role
    prefill and ``d`` with --role decode): P on agent p pushes to d's node
    by name, then D on agent d waits, loads and decodes; R alone. For
    ``pd``, ``p_store_ms`` is P's time in alloc+pack+checksum+push (the
    push returns once d verified the bytes), ``d_load_ms`` D's wait + unpack
    + release, ``hit_chunks``/``fetched_chunks`` the chunks received."""
    workdir = pathlib.Path(workdir)
    sc = ",".join(PD_SCENARIOS)
    p = _spawn(["--role", "prefill", "--socket", cluster.sockets["p"],
                "--decoder", cluster.node_name("d"), "--scenarios", sc],
               workdir / "pd-p.pt", timeout)
    d = _spawn(["--role", "decode", "--socket", cluster.sockets["d"],
                "--scenarios", sc, "--steps", str(steps)],
               workdir / "pd-d.pt", timeout)
    r = _spawn(["--role", "reference", "--scenarios", sc, "--steps",
                str(steps)], workdir / "pd-r.pt", timeout)
    return _report(p, d, r, PD_SCENARIOS)


def print_report(report: Dict) -> None:
    cols = ["prompt_tokens", "reused_tokens", "hit_chunks", "fetched_chunks",
            "p_prefill_of_reused_ms", "p_store_ms", "d_load_ms", "ref_ttft_ms",
            "d_ttft_ms", "ttft_saved_ms", "tokens_equal", "logits_equal"]
    print(f"{'':28}" + "".join(f"{n:>12}" for n in report))
    for c in cols:
        print(f"  {c:26}" + "".join(f"{str(report[n][c]):>12}"
                                     for n in report))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m kvfabric.testing.e2e")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("role")
    r.add_argument("--role", choices=("prefill", "decode", "reference"),
                   required=True)
    r.add_argument("--socket")
    r.add_argument("--decoder", default="",
                   help="PD scenarios: the decoder agent's node name")
    r.add_argument("--scenarios", default=",".join(SCENARIOS))
    r.add_argument("--steps", type=int, default=8)
    r.add_argument("--out", required=True)
    run = sub.add_parser("run")
    run.add_argument("--scenarios", default=",".join(SCENARIOS))
    run.add_argument("--steps", type=int, default=8)
    run.add_argument("--no-pd", action="store_true",
                     help="skip the PD push scenario (its own agent pair)")
    run.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    deterministic()
    if a.cmd == "role":
        sc = a.scenarios.split(",")
        if a.role == "prefill":
            out = role_prefill(a.socket, sc, a.decoder)
        else:
            out = role_decode(a.socket, sc, a.steps,
                              fabric=(a.role == "decode"))
        torch.save(out, a.out)
        return 0
    import tempfile

    from .cluster import Cluster

    sc = [x for x in a.scenarios.split(",") if x]
    rep = {}
    with tempfile.TemporaryDirectory() as tmp:
        if sc:
            with Cluster(agents=("a", "b")) as cl:
                rep.update(run_e2e(cl, tmp, sc, a.steps))
        if not a.no_pd:
            with Cluster(agents=("p", "d"),
                         roles={"p": "prefill", "d": "decode"},
                         pd_buffer_size="16M") as cl:
                rep.update(run_pd(cl, tmp, a.steps))
    if a.json:
        print(json.dumps(rep))
    else:
        print_report(rep)
    ok = all(v["tokens_equal"] and v["logits_equal"] for v in rep.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
