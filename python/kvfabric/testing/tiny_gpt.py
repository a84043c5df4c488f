# SPDX-License-Identifier: Apache-2.0
# Copyright (c) 2026 The kvfabric authors
"""A small GPT-style decoder with fixed, seeded random weights (no
downloads) and a paged KV cache, for the end-to-end proof.

RMSNorm, rotary position embedding, grouped-query attention, SiLU MLP; KV
cached in bfloat16 in a vLLM (flash-attention) or SGLang layout. Tokens are
computed in *pieces*: a prompt is split into segments, each segment into
pieces of at most ``chunk`` tokens aligned to the segment start, and every
piece runs the same ops on the same shapes whether the KV it attends to was
computed here or loaded from kvfabric. With one thread and deterministic
algorithms, a run that loads part of its KV therefore produces logits equal
(torch.equal) to a run that computed everything.

Two kinds of segment:

* ``text``: causal attention over everything before it, global positions;
* ``doc``: a document placed anywhere in a prompt (RAG). Its tokens attend
  only within the document and use document-local positions, so its KV
  depends on the document's tokens alone, not on what precedes it
  ("block attention"). Only under such a scheme is reusing a document's KV
  after a different prefix exact; in a plain causal transformer every
  layer after the first mixes the preceding tokens into the KV, and reuse
  after a different prefix is an approximation (CacheBlend and similar
  recompute part of it). The reference run uses the same scheme.
"""
import math
import time
from dataclasses import dataclass, field
from typing import List, Sequence, Tuple

import torch

from ..layout import PagedLayout


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 512
    layers: int = 4
    d_model: int = 512
    n_heads: int = 8
    n_kv_heads: int = 4
    head_dim: int = 64
    ffn: int = 1024
    chunk: int = 16          # tokens per kvfabric chunk and per piece
    seed: int = 1234
    rope_base: float = 10000.0
    model_id: str = "kvfabric-tiny-gpt"

    @property
    def kv_row(self) -> int:
        return self.n_kv_heads * self.head_dim


def deterministic():
    """Settings under which equal inputs give bit-equal outputs."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


@dataclass
class Segment:
    kind: str                # "text" or "doc"
    tokens: List[int]


@dataclass
class Piece:
    """Tokens [start, start + n) of a prompt, all in one segment."""
    start: int
    n: int
    seg: int                 # index of its segment
    seg_start: int           # index of the segment's first token
    kind: str


def plan(segments: Sequence[Segment], chunk: int) -> List[Piece]:
    pieces, pos = [], 0
    for si, s in enumerate(segments):
        for off in range(0, len(s.tokens), chunk):
            n = min(chunk, len(s.tokens) - off)
            pieces.append(Piece(pos + off, n, si, pos, s.kind))
        pos += len(s.tokens)
    return pieces


class TinyGPT:
    def __init__(self, cfg: GPTConfig = GPTConfig()):
        self.cfg = cfg
        g = torch.Generator().manual_seed(cfg.seed)
        d, f = cfg.d_model, cfg.ffn
        qd, kd = cfg.n_heads * cfg.head_dim, cfg.kv_row

        def w(*shape, scale=None):
            s = scale if scale is not None else 1.0 / math.sqrt(shape[0])
            return torch.randn(*shape, generator=g) * s

        self.emb = w(cfg.vocab, d, scale=1.0)
        self.blocks = []
        for _ in range(cfg.layers):
            self.blocks.append(dict(
                n1=1.0 + 0.1 * torch.randn(d, generator=g),
                wq=w(d, qd), wk=w(d, kd), wv=w(d, kd), wo=w(qd, d),
                n2=1.0 + 0.1 * torch.randn(d, generator=g),
                w1=w(d, f), w3=w(d, f), w2=w(f, d)))
        self.nf = 1.0 + 0.1 * torch.randn(d, generator=g)
        self.head = w(d, cfg.vocab)
        inv = 1.0 / (cfg.rope_base ** (
            torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) /
            cfg.head_dim))
        self.inv_freq = inv

    @staticmethod
    def _norm(x, wgt):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * wgt

    def _rope(self, x, pos):
        # x [n, heads, hd]; rotate pairs (even, odd) by pos * inv_freq
        ang = pos.to(torch.float32)[:, None] * self.inv_freq[None, :]
        cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
        x1, x2 = x[..., 0::2], x[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2] = x1 * cos - x2 * sin
        out[..., 1::2] = x1 * sin + x2 * cos
        return out

    def layout(self, kind: str, num_slots: int) -> PagedLayout:
        c = self.cfg
        if kind == "sglang":
            return PagedLayout("sglang", torch.bfloat16, c.layers,
                               c.n_kv_heads, c.head_dim, 1, num_slots)
        bs = 16
        return PagedLayout(kind, torch.bfloat16, c.layers, c.n_kv_heads,
                           c.head_dim, bs, (num_slots + bs - 1) // bs)

    def forward(self, cache: "PagedCache", tokens: Sequence[int], start: int,
                positions: torch.Tensor, lo: torch.Tensor,
                hooks=None) -> torch.Tensor:
        """Computes tokens at context indices [start, start + n) of the
        cache's sequence: writes their K/V (bf16) into the cache and returns
        their logits [n, vocab]. Query j attends to context indices
        [lo[j], start + j]; RoPE uses @p positions. @p hooks, if given, has
        before_layer(i) and after_layer(i) (called once this piece's K/V of
        layer i are in the cache): an engine's per-layer connector calls."""
        c = self.cfg
        n = len(tokens)
        ctx = start + n
        lay = cache.layout
        slots = cache.slots[start:ctx]
        ctx_slots = cache.slots[:ctx]
        idx = torch.arange(ctx)
        q_idx = torch.arange(start, ctx)
        allowed = (idx[None, :] >= lo[:, None]) & \
            (idx[None, :] <= q_idx[:, None])
        mask = torch.zeros(n, ctx).masked_fill_(~allowed, float("-inf"))
        group = c.n_heads // c.n_kv_heads
        x = self.emb[torch.tensor(tokens, dtype=torch.int64)]
        for li, b in enumerate(self.blocks):
            if hooks is not None:
                hooks.before_layer(li)
            h = self._norm(x, b["n1"])
            q = self._rope((h @ b["wq"]).view(n, c.n_heads, c.head_dim),
                           positions)
            k = self._rope((h @ b["wk"]).view(n, c.n_kv_heads, c.head_dim),
                           positions)
            v = (h @ b["wv"]).view(n, c.n_kv_heads, c.head_dim)
            krows, vrows = lay.rows(cache.kv, li, 0), lay.rows(cache.kv, li, 1)
            krows.index_copy_(0, slots, k.reshape(n, -1).to(torch.bfloat16))
            vrows.index_copy_(0, slots, v.reshape(n, -1).to(torch.bfloat16))
            if hooks is not None:
                hooks.after_layer(li)
            # attention always reads K/V back from the cache (bf16), for
            # this piece's tokens too: loaded and computed KV are one path
            kc = krows.index_select(0, ctx_slots).float().view(
                ctx, c.n_kv_heads, c.head_dim).repeat_interleave(group, 1)
            vc = vrows.index_select(0, ctx_slots).float().view(
                ctx, c.n_kv_heads, c.head_dim).repeat_interleave(group, 1)
            s = torch.einsum("nhd,chd->hnc", q, kc) / math.sqrt(c.head_dim)
            p = torch.softmax(s + mask[None], dim=-1)
            o = torch.einsum("hnc,chd->nhd", p, vc).reshape(n, -1)
            x = x + o @ b["wo"]
            h = self._norm(x, b["n2"])
            x = x + (torch.nn.functional.silu(h @ b["w1"]) * (h @ b["w3"])) \
                @ b["w2"]
        return self._norm(x, self.nf) @ self.head

    def run_piece(self, cache: "PagedCache", segments: Sequence[Segment],
                  pc: Piece) -> torch.Tensor:
        seg = segments[pc.seg]
        off = pc.start - pc.seg_start
        toks = seg.tokens[off:off + pc.n]
        if pc.kind == "doc":
            pos = torch.arange(off, off + pc.n)
            lo = torch.full((pc.n,), pc.seg_start, dtype=torch.int64)
        else:
            pos = torch.arange(pc.start, pc.start + pc.n)
            lo = torch.zeros(pc.n, dtype=torch.int64)
        return self.forward(cache, toks, pc.start, pos, lo)

    def decode(self, cache: "PagedCache", last_logits: torch.Tensor,
               prompt_len: int, steps: int) -> Tuple[List[int], torch.Tensor]:
        """Greedy decoding after a prompt whose last logits are given;
        returns the tokens and the logits that chose them [steps, vocab]."""
        out, logits = [], [last_logits]
        pos = prompt_len
        for i in range(steps):
            tok = int(torch.argmax(logits[-1]))
            out.append(tok)
            if i == steps - 1:
                break
            lg = self.forward(cache, [tok], pos, torch.tensor([pos]),
                              torch.zeros(1, dtype=torch.int64))
            logits.append(lg[0])
            pos += 1
        return out, torch.stack(logits)


@dataclass
class PagedCache:
    """One sequence's paged KV cache: the layer tensors and the slot of each
    context index (a shuffled block table, so slots are not the identity)."""
    layout: PagedLayout
    kv: list
    slots: torch.Tensor = field(default=None)

    @classmethod
    def create(cls, model: TinyGPT, kind: str, max_tokens: int,
               seed: int) -> "PagedCache":
        lay = model.layout(kind, max_tokens * 2)
        g = torch.Generator().manual_seed(seed)
        blocks = torch.randperm(lay.num_blocks, generator=g)
        t = torch.arange(max_tokens)
        slots = blocks[t // lay.block_size] * lay.block_size + \
            t % lay.block_size
        return cls(lay, lay.allocate(), slots)


def now() -> float:
    return time.perf_counter()
