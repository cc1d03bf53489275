"""The Gated DeltaNet token mixer on the host (docs/MODEL.md "Gated DeltaNet"), stepwise.

The state of a layer is one flat float32 vector `[conv ring (kk-1) * cdim | S nv * dk * dv]`, the
reference's `cpu_state` order (what `gdn_state_read` returns and `admit` seeds the card from): the
ring holds the last kk-1 raw rows, oldest first, row-major `[kk-1, cdim]`; S is `[nv, dk, dv]`.
Every row goes through the same arithmetic whether it comes alone (a decode step) or in a block
(a prompt chunk, a verify window), so a window's tape replayed equals the steps it stands for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from ..errors import CortiqError
from .ops import F32, l2_norm, rms_norm, sigmoid, silu, softplus

# x [T, cols] -> x @ W.T [T, rows] for one of the projections "qkv", "z", "a", "b", "out"
MatMul = Callable[[str, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class GdnDims:
    """A GDN layer's geometry: nk key heads, nv value heads of dk / dv, conv kernel kk."""

    nk: int
    nv: int
    dk: int
    dv: int
    kk: int

    def __post_init__(self):
        if self.nk <= 0 or self.nv % self.nk != 0 or self.kk < 1 or self.dk <= 0 or self.dv <= 0:
            raise CortiqError(f"GDN geometry nk {self.nk} nv {self.nv} dk {self.dk} dv {self.dv} "
                              f"kk {self.kk}: nv must be a multiple of nk > 0, kk >= 1")

    @property
    def cdim(self) -> int:
        return 2 * self.nk * self.dk + self.nv * self.dv

    @property
    def ring_n(self) -> int:
        return (self.kk - 1) * self.cdim

    @property
    def s_n(self) -> int:
        return self.nv * self.dk * self.dv


@dataclass(frozen=True)
class GdnConsts:
    """The layer's small float32 constants: conv taps [cdim, kk], A_log [nv], dt_bias [nv], norm [dv]."""

    taps: np.ndarray
    a_log: np.ndarray
    dt_bias: np.ndarray
    norm: np.ndarray


class GdnState:
    """One GDN layer's recurrent state of one sequence (flat, `cpu_state` order)."""

    def __init__(self, dims: GdnDims, buf: np.ndarray | None = None):
        self.dims = dims
        n = dims.ring_n + dims.s_n
        if buf is None:
            buf = np.zeros(n, dtype=F32)
        elif buf.dtype != F32 or buf.shape != (n,):
            raise CortiqError(f"GDN state of {buf.shape} {buf.dtype}, the layer wants ({n},) float32")
        self.buf = buf  # [ring_n + s_n]

    @property
    def ring(self) -> np.ndarray:
        d = self.dims
        return self.buf[:d.ring_n].reshape(d.kk - 1, d.cdim)

    @property
    def s(self) -> np.ndarray:
        d = self.dims
        return self.buf[d.ring_n:].reshape(d.nv, d.dk, d.dv)

    def load(self, buf: np.ndarray) -> None:
        """Put a saved state vector back (a snapshot, a window's start)."""
        self.buf[:] = buf


def log_decay(a: np.ndarray, a_log: np.ndarray, dt_bias: np.ndarray) -> np.ndarray:
    """g = -exp(A_log) * softplus(a + dt_bias), the log of the decay; a [T, nv]."""
    return -np.exp(a_log) * softplus(a + dt_bias)


def decay_beta(a: np.ndarray, b: np.ndarray, a_log: np.ndarray,
               dt_bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """decay = exp(g) (`log_decay`), beta = sigmoid(b); a, b [T, nv]."""
    return np.exp(log_decay(a, a_log, dt_bias)), sigmoid(b)


def conv_silu(ring: np.ndarray, raw: np.ndarray, taps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Causal depthwise conv + SiLU of raw [T, cdim] after ring [kk-1, cdim], taps [cdim, kk]:
    (silu(conv) [T, cdim], the rows ring ; raw [kk-1+T, cdim] whose last kk-1 are the next ring)."""
    kk = taps.shape[1]
    t = raw.shape[0]
    ext = np.concatenate([ring, raw], axis=0)  # [kk-1+T, cdim]
    acc = taps[:, 0] * ext[0:t]
    for j in range(1, kk):
        acc = acc + taps[:, j] * ext[j:j + t]
    return silu(acc), ext


def qk_norm(cq: np.ndarray, nk: int, dk: int) -> np.ndarray:
    """The conv rows cq [T, cdim] with the q and k heads L2-normed, q then times 1/sqrt(dk) (a copy)."""
    t = cq.shape[0]
    out = cq.copy()
    qk = l2_norm(cq[:, :2 * nk * dk].reshape(t, 2 * nk, dk))
    qk[:, :nk] *= F32(1.0 / np.sqrt(dk))
    out[:, :2 * nk * dk] = qk.reshape(t, -1)
    return out  # [T, cdim]


def delta_rule(cq: np.ndarray, beta: np.ndarray, decay: np.ndarray, s: np.ndarray,
               nk: int) -> np.ndarray:
    """The delta rule over qk-normed rows cq [T, cdim] one row at a time from s [nv, dk, dv]
    (moved on in place); returns o [T, nv, dv]. Value head h reads key head h // (nv / nk)."""
    nv, dk, dv = s.shape
    t = cq.shape[0]
    nkd = nk * dk
    q = np.repeat(cq[:, :nkd].reshape(t, nk, dk), nv // nk, axis=1)  # [T, nv, dk]
    k = np.repeat(cq[:, nkd:2 * nkd].reshape(t, nk, dk), nv // nk, axis=1)
    v = cq[:, 2 * nkd:].reshape(t, nv, dv)
    o = np.empty((t, nv, dv), dtype=F32)
    for i in range(t):
        s *= decay[i][:, None, None]
        kv = np.matmul(k[i][:, None, :], s)[:, 0, :]  # [nv, dv]
        delta = (v[i] - kv) * beta[i][:, None]
        s += k[i][:, :, None] * delta[:, None, :]
        o[i] = np.matmul(q[i][:, None, :], s)[:, 0, :]
    return o


def gdn_scan(state: GdnState, raw: np.ndarray, beta: np.ndarray, decay: np.ndarray,
             taps: np.ndarray) -> np.ndarray:
    """Rows raw [T, cdim] through the conv and the delta rule, in order; returns o [T, nv, dv].

    Ports the arithmetic of the reference's GDN core (`hy_gdn_*`) one row at a time."""
    d = state.dims
    conv, ext = conv_silu(state.ring, raw, taps)
    if d.kk > 1:
        state.ring[:] = ext[raw.shape[0]:]
    return delta_rule(qk_norm(conv, d.nk, d.dk), beta, decay, state.s, d.nk)


def gdn_output(o: np.ndarray, z: np.ndarray, norm: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm(o, norm) per head (plain w) times silu(z); o [T, nv, dv], z [T, nv*dv] -> [T, nv*dv]."""
    t, nv, dv = o.shape
    y = rms_norm(o, norm, eps, gemma=False) * silu(z.reshape(t, nv, dv))
    return y.reshape(t, nv * dv)


class GdnTape:
    """A verify window's record for one layer: the state at the window start and each row's inputs
    (raw rows, beta, decay), so a partial acceptance goes back and replays the accepted rows."""

    def __init__(self, start: np.ndarray, raw: np.ndarray, beta: np.ndarray, decay: np.ndarray,
                 taps: np.ndarray):
        self.start = start  # [ring_n + s_n]
        self.raw = raw  # [n, cdim]
        self.beta = beta  # [n, nv]
        self.decay = decay  # [n, nv]
        self.taps = taps  # [cdim, kk]

    def replay(self, state: GdnState, keep: int) -> None:
        """The state back to the window start, then the first `keep` rows (the reference's
        `spec_restore`: restore scan + restore ring)."""
        state.load(self.start)
        gdn_scan(state, self.raw[:keep], self.beta[:keep], self.decay[:keep], self.taps)


def gdn_mixer(xn: np.ndarray, mm: MatMul, c: GdnConsts, state: GdnState, eps: float,
              tape: bool = False) -> tuple[np.ndarray, GdnTape | None]:
    """The GDN token mixer over normed rows xn [T, hidden] from `state` (moved on): [T, hidden].

    With `tape`, also the window's tape (the state before these rows and their inputs)."""
    start = state.buf.copy() if tape else None
    raw = mm("qkv", xn)  # [T, cdim]
    z = mm("z", xn)  # [T, nv*dv]
    decay, beta = decay_beta(mm("a", xn), mm("b", xn), c.a_log, c.dt_bias)  # [T, nv]
    o = gdn_scan(state, raw, beta, decay, c.taps)
    y = mm("out", gdn_output(o, z, c.norm, eps))
    rec = GdnTape(start, raw, beta, decay, c.taps) if tape else None
    return y, rec


_HF = {"qkv": "in_proj_qkv", "z": "in_proj_z", "a": "in_proj_a", "b": "in_proj_b",
       "out": "out_proj"}


def gdn_layer(x: np.ndarray, weights: Mapping[str, np.ndarray], *, nk: int, nv: int, dk: int,
              dv: int, kk: int, eps: float) -> np.ndarray:
    """One GDN token mixer over rows x [T, hidden] from a zero state; returns [T, hidden].

    `weights` by the Hugging Face names: in_proj_qkv, in_proj_z, in_proj_a, in_proj_b, A_log,
    dt_bias, conv1d ([cdim, 1, kk] or flat), norm, out_proj."""
    dims = GdnDims(nk, nv, dk, dv, kk)
    missing = [n for n in (*_HF.values(), "A_log", "dt_bias", "conv1d", "norm") if n not in weights]
    if missing:
        raise CortiqError(f"gdn_layer: weights missing {', '.join(missing)}")
    w = {k: np.asarray(weights[n], dtype=F32) for k, n in _HF.items()}
    taps = np.asarray(weights["conv1d"], dtype=F32)
    if taps.size != dims.cdim * kk:
        raise CortiqError(f"gdn_layer: conv1d has {taps.size} values, want cdim {dims.cdim} x kk {kk}")
    c = GdnConsts(taps.reshape(dims.cdim, kk), np.asarray(weights["A_log"], dtype=F32).reshape(nv),
                  np.asarray(weights["dt_bias"], dtype=F32).reshape(nv),
                  np.asarray(weights["norm"], dtype=F32).reshape(dv))
    y, _ = gdn_mixer(np.asarray(x, dtype=F32), lambda k, a: a @ w[k].T, c, GdnState(dims), eps)
    return y
