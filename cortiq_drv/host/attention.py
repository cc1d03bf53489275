"""Gated full attention on the host (docs/MODEL.md "Gated full attention") and its K/V rows.

A layer's K/V rows of a sequence are kept per KV group, `[nkv, cap, hd]` float32, keys after the
k norm and the rotary turn: row r of group g is what the reference's host rows `cpu_k[g]` hold at
`r * hd` (with `cpu_base` = 0), the rows the CUDA arm's `admit` uploads to its mirror.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import CortiqError
from .ops import F32, apply_rope, rms_norm, sigmoid

# x [T, cols] -> x @ W.T [T, rows] for one of the projections "q", "k", "v", "o"
MatMul = Callable[[str, np.ndarray], np.ndarray]

# query rows one pass of `attend` takes: bounds its [rows, keys] scores
_ROW_BLOCK = 256


@dataclass(frozen=True)
class AttnGeom:
    """Head geometry shared by the attention layers: nh query heads, nkv KV heads of width hd,
    rotary width rd, score scale, norm eps and style."""

    nh: int
    nkv: int
    hd: int
    rd: int
    scale: float
    eps: float
    gemma: bool

    def __post_init__(self):
        if self.nkv <= 0 or self.nh % self.nkv != 0 or self.rd % 2 or self.rd > self.hd:
            raise CortiqError(f"attention geometry nh {self.nh} nkv {self.nkv} hd {self.hd} "
                              f"rd {self.rd}: nh a multiple of nkv, rd even and <= hd")


@dataclass(frozen=True)
class AttnConsts:
    """A layer's q / k norm weights ([hd] or None) and whether q_proj carries the output gate."""

    q_norm: np.ndarray | None
    k_norm: np.ndarray | None
    gated: bool


class KvRows:
    """One attention layer's K/V rows of one sequence: k, v [nkv, cap, hd], rows [0, n); with
    nh > 0 also the query rows q [nh, cap, hd] (what a far-field seal needs of a prompt).

    The store protocol the mixer uses (a sealed layer's far field can stand in): `n`,
    `attend(q, k, v)`, `truncate(n)`, `cpu_rows()`."""

    def __init__(self, nkv: int, hd: int, scale: float, nh: int = 0, cap: int = 64):
        self.scale = scale
        self.k = np.zeros((nkv, cap, hd), dtype=F32)
        self.v = np.zeros((nkv, cap, hd), dtype=F32)
        self.q = np.zeros((nh, cap, hd), dtype=F32) if nh else None
        self.n = 0

    def _reserve(self, n: int) -> None:
        cap = self.k.shape[1]
        if n <= cap:
            return
        cap = max(n, 2 * cap)
        for name in ("k", "v", "q"):
            old = getattr(self, name)
            if old is not None:
                new = np.zeros((old.shape[0], cap, old.shape[2]), dtype=F32)
                new[:, :self.n] = old[:, :self.n]
                setattr(self, name, new)

    def append(self, k: np.ndarray, v: np.ndarray) -> None:
        """Rows k, v [T, nkv, hd] at positions n .. n+T-1."""
        t = k.shape[0]
        self._reserve(self.n + t)
        self.k[:, self.n:self.n + t] = k.transpose(1, 0, 2)
        self.v[:, self.n:self.n + t] = v.transpose(1, 0, 2)
        self.n += t

    def attend(self, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Rows at positions n..: their keys k, values v [T, nkv, hd] go in, their queries
        q [T, nh, hd] read every row up to their own -> [T, nh, hd]."""
        pos0 = self.n
        if self.q is not None:
            self._reserve(pos0 + q.shape[0])
            self.q[:, pos0:pos0 + q.shape[0]] = q.transpose(1, 0, 2)
        self.append(k, v)
        return attend(q, self, pos0, self.scale)

    def rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(k, v [n, nkv, hd], q [n, nh, hd] or None): the rows held, in row order."""
        q = None if self.q is None else self.q[:, :self.n].transpose(1, 0, 2)
        return self.k[:, :self.n].transpose(1, 0, 2), self.v[:, :self.n].transpose(1, 0, 2), q

    def truncate(self, n: int) -> None:
        """Forget the rows from n on (rejected drafts, a rewind)."""
        self.n = min(self.n, n)

    def fill_zero(self, n: int) -> None:
        """Zero rows up to n: positions a draft block never saw (the reference's `admit` gap)."""
        if n > self.n:
            self._reserve(n)
            self.k[:, self.n:n] = 0
            self.v[:, self.n:n] = 0
            self.n = n

    def cpu_rows(self) -> tuple[list[np.ndarray], list[np.ndarray], int]:
        """(cpu_k, cpu_v, cpu_base) as the graph contract carries them: per group rows * hd."""
        ks = [self.k[g, :self.n].reshape(-1) for g in range(self.k.shape[0])]
        vs = [self.v[g, :self.n].reshape(-1) for g in range(self.v.shape[0])]
        return ks, vs, 0


def attend(q: np.ndarray, kv: KvRows, pos0: int, scale: float) -> np.ndarray:
    """Causal softmax attention of rows q [T, nh, hd] at positions pos0.. over kv's rows [0, pos0+T).

    Query head h reads KV group h // (nh / nkv). Softmax: c = max, e = exp(s - c), (e @ V) / sum e."""
    t, nh, hd = q.shape
    nkv = kv.k.shape[0]
    hpk = nh // nkv
    n = pos0 + t
    keys = kv.k[:, :n]  # [nkv, n, hd]
    vals = kv.v[:, :n]
    out = np.empty((t, nh, hd), dtype=F32)
    for r0 in range(0, t, _ROW_BLOCK):
        r1 = min(t, r0 + _ROW_BLOCK)
        b = r1 - r0
        qg = q[r0:r1].reshape(b, nkv, hpk, hd).transpose(1, 0, 2, 3).reshape(nkv, b * hpk, hd)
        s = np.matmul(qg, keys.transpose(0, 2, 1)) * F32(scale)  # [nkv, b*hpk, n]
        last = pos0 + r0 + np.arange(b * hpk) // hpk  # the last key each query row sees
        s = np.where(np.arange(n)[None, :] <= last[:, None], s, F32(-np.inf))
        e = np.exp(s - np.max(s, axis=-1, keepdims=True))
        o = np.matmul(e, vals) / np.sum(e, axis=-1, keepdims=True, dtype=F32)  # [nkv, b*hpk, hd]
        out[r0:r1] = o.reshape(nkv, b, hpk, hd).transpose(1, 0, 2, 3).reshape(b, nh, hd)
    return out


def attention_mixer(xn: np.ndarray, mm: MatMul, c: AttnConsts, g: AttnGeom, kv, pos0: int,
                    cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Gated attention over normed rows xn [T, hidden] at positions pos0.. through the layer's
    store `kv` (a `KvRows` or a stand-in with its protocol), which takes the rows' K/V.

    cos, sin [T, rd/2] are the rows' rotary tables. Returns [T, hidden]."""
    if kv.n != pos0:
        raise CortiqError(f"attention: the layer holds {kv.n} K/V rows, the call starts at {pos0}")
    t = xn.shape[0]
    qr = mm("q", xn).reshape(t, g.nh, -1)  # [T, nh, hd or 2hd]: per head [query | gate]
    q = qr[..., :g.hd]
    k = mm("k", xn).reshape(t, g.nkv, g.hd)
    v = mm("v", xn).reshape(t, g.nkv, g.hd)
    if c.q_norm is not None:
        q = rms_norm(q, c.q_norm, g.eps, g.gemma)
    if c.k_norm is not None:
        k = rms_norm(k, c.k_norm, g.eps, g.gemma)
    q = apply_rope(q, cos, sin)
    k = apply_rope(k, cos, sin)
    o = kv.attend(q, k, v)  # [T, nh, hd]
    if c.gated:
        o = o * sigmoid(qr[..., g.hd:])
    return mm("o", o.reshape(t, g.nh * g.hd))
