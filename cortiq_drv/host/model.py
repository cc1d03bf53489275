"""The host arm: the whole Qwen3.5-family hybrid in numpy float32 from a CMF (docs/MODEL.md).

`HostModel` interprets the same `HybridGraph` the CUDA arm is handed (`cortiq_drv.graph.build`):
embedding, every layer (GDN or gated attention, then the dense FFN), final norm, LM head, and the
MTP block (`cortiq_drv.host.mtp`). State lives in a `Sequence`; `run` takes rows at the sequence's
position (a prompt chunk, a decode step, or a verify window with its GDN tapes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import knobs
from ..cmf import CmfFile
from ..errors import CortiqError
from ..graph import GraphAttn, GraphLayer, GraphW, HybridGraph, build
from .attention import AttnConsts, AttnGeom, KvRows, attention_mixer
from .gdn import GdnConsts, GdnDims, GdnState, GdnTape, gdn_mixer
from .ops import F32, rms_norm, rope_tables, silu
from .sequence import Sequence, Window
from .weights import WeightCache

# the mixers' projection keys -> GraphAttn fields
_ATTR = {"q": "wq", "k": "wk", "v": "wv", "o": "wo"}


@dataclass
class HostRows:
    """What `HostModel.run` gives back: logits [T or 1, lm_rows] (None without a head) and the
    residual rows h [T, hidden] after the last layer, before the final norm (the MTP block's input)."""

    logits: np.ndarray | None
    hidden: np.ndarray


def dense_ffn(xn: np.ndarray, mm) -> np.ndarray:
    """down(silu(gate xn) * up xn) for normed rows xn [T, hidden]; mm(key, x) = x @ W_key.T."""
    return mm("down", silu(mm("gate", xn)) * mm("up", xn))


class HostModel:
    """A CMF's model on the host. `weight_budget`: bytes of decoded float32 weights kept (default
    the `CORTIQ_DRV_HOST_WEIGHT_MB` knob)."""

    def __init__(self, cmf, *, weight_budget: int | None = None):
        self.cmf = cmf
        self.graph: HybridGraph = build(cmf)
        g = self.graph
        self.weights = WeightCache(cmf, weight_budget if weight_budget is not None
                                   else knobs.get().host_weight_bytes)
        self.geom = AttnGeom(g.nh, g.nkv, g.hd, g.rd, g.scale, g.eps, g.gemma)
        self.vocab = g.lm_rows
        self._gdn = {i: _gdn_parts(l.attn) for i, l in enumerate(g.layers)
                     if isinstance(l.attn, GraphAttn.Gdn)}

    @classmethod
    def open(cls, path, **kw) -> "HostModel":
        """Open the CMF at `path` (`CmfFile.open`) and build its host model."""
        return cls(CmfFile.open(path), **kw)

    def new_sequence(self, keep_queries: bool = False) -> Sequence:
        """An empty sequence with room for every layer's state; `keep_queries`: the attention
        layers also keep their query rows (`KvRows.rows()`, what a far-field seal reads)."""
        g = self.graph
        nh = g.nh if keep_queries else 0
        kv = {i: KvRows(g.nkv, g.hd, g.scale, nh) for i, l in enumerate(g.layers)
              if isinstance(l.attn, GraphAttn.Full)}
        gdn = {i: GdnState(dims) for i, (dims, _) in self._gdn.items()}
        mtp = KvRows(g.nkv, g.hd, g.scale) if g.mtp is not None else None
        return Sequence(kv, gdn, mtp)

    def mm(self, w: GraphW, x: np.ndarray) -> np.ndarray:
        """x [T, cols] @ W.T -> [T, rows] for a graph weight, decoded through the weight store."""
        return self.weights.matmul(w.name, x)

    def embed(self, ids) -> np.ndarray:
        """Embedding rows [T, hidden] of token ids (checked against the table)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        bad = ids[(ids < 0) | (ids >= self.graph.embed.rows)]
        if bad.size:
            raise CortiqError(f"token id {int(bad[0])} is outside the vocabulary "
                              f"[0, {self.graph.embed.rows})")
        return self.weights.rows(self.graph.embed.name, ids)

    def head(self, h: np.ndarray, final_norm: np.ndarray | None = None) -> np.ndarray:
        """Logits [T, lm_rows] of residual rows h: LMHead(RMSNorm(h, final norm)). Ids past the
        tokenizer's real vocabulary are padding: their logits are here, masking is the caller's."""
        g = self.graph
        fn = g.final_norm if final_norm is None else final_norm
        return self.mm(g.lm, rms_norm(h, fn, g.eps, g.gemma))

    def layer(self, h: np.ndarray, l: GraphLayer, state: KvRows | GdnState, pos0: int,
              cos: np.ndarray, sin: np.ndarray, tape: bool = False,
              gdn: tuple[GdnDims, GdnConsts] | None = None) -> tuple[np.ndarray, GdnTape | None]:
        """One decoder layer over residual rows h [T, hidden] at positions pos0..; `state` is the
        layer's K/V rows or GDN state (moved on). Returns (h, the GDN tape when asked)."""
        g = self.graph
        xn = rms_norm(h, l.input_norm, g.eps, g.gemma)
        a = l.attn
        mm = lambda key, x: self.mm(getattr(a, _ATTR.get(key, key)), x)
        rec = None
        if isinstance(a, GraphAttn.Gdn):
            y, rec = gdn_mixer(xn, mm, gdn[1], state, g.eps, tape)
        else:
            y = attention_mixer(xn, mm, AttnConsts(a.q_norm, a.k_norm, a.output_gate), self.geom,
                                state, pos0, cos, sin)
        h = h + y
        xn = rms_norm(h, l.post_norm, g.eps, g.gemma)
        f = l.ffn
        h = h + dense_ffn(xn, lambda key, x: self.mm(getattr(f, key), x))
        return h, rec

    def rope(self, pos0: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(cos, sin) [n, rd/2] of positions pos0 .. pos0+n-1."""
        return rope_tables(self.graph.invf, np.arange(pos0, pos0 + n))

    def run(self, seq: Sequence, ids, *, head: str | None = "all", window: bool = False) -> HostRows:
        """Token rows `ids` through the trunk at the sequence's position, which moves on by len(ids).

        head: "all" (logits of every row), "last" (of the last row), None (no head).
        window: a verify window: each GDN layer keeps a tape so `seq.accept(keep)` can go back to
        this call's start and keep only the first rows. A pending window is committed first."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        t = ids.shape[0]
        cap = self.graph.max_positions
        if t == 0:
            raise CortiqError("run: no rows")
        if cap and seq.pos + t > cap:
            raise CortiqError(f"run: rows up to position {seq.pos + t} pass the context limit {cap}")
        if head not in ("all", "last", None):
            raise CortiqError(f"run: head {head!r} is not 'all', 'last' or None")
        h = self.embed(ids)
        seq.commit()
        pos0 = seq.pos
        cos, sin = self.rope(pos0, t)
        tapes = {}
        for i, l in enumerate(self.graph.layers):
            gdn = self._gdn.get(i)
            state = seq.gdn[i] if gdn else seq.kv[i]
            h, rec = self.layer(h, l, state, pos0, cos, sin, window, gdn)
            if rec is not None:
                tapes[i] = rec
        seq.pos = pos0 + t
        if window:
            seq.window = Window(pos0, t, tapes)
        logits = None if head is None else self.head(h if head == "all" else h[-1:])
        return HostRows(logits, h)

    def prefill(self, seq: Sequence, ids) -> np.ndarray:
        """Logits [T, lm_rows] of every row of `ids` (a prompt or a chunk of one)."""
        return self.run(seq, ids).logits

    def decode(self, seq: Sequence, token: int) -> np.ndarray:
        """Logits [lm_rows] of one token at the sequence's position."""
        return self.run(seq, [token]).logits[0]

    def verify(self, seq: Sequence, ids) -> np.ndarray:
        """A verify window over `ids` (the tip and its drafts): logits [n, lm_rows]; follow with
        `seq.accept(keep)` (or any further call, which keeps every row)."""
        return self.run(seq, ids, window=True).logits

    def mtp_draft(self, seq: Sequence, hidden: np.ndarray, token: int, position: int, k: int,
                  rows: int | None = None) -> list[int]:
        """k greedy drafts of the MTP block (see `cortiq_drv.host.mtp.draft`)."""
        from .mtp import draft

        return draft(self, seq, hidden, token, position, k, rows)


def _gdn_parts(a: GraphAttn.Gdn) -> tuple[GdnDims, GdnConsts]:
    dims = GdnDims(a.nk, a.nv, a.dk, a.dv, a.kk)
    taps = np.asarray(a.conv1d, dtype=F32).reshape(dims.cdim, a.kk)
    return dims, GdnConsts(taps, a.a_log, a.dt_bias, a.norm)
