"""Numpy references of the small path's GDN and attention kernels (`kernels/hyb_gdn.cuh`,
`kernels/hyb_attn.cuh`): each function is one kernel's contract in float32, in the order
docs/MODEL.md writes the math, over the same layouts (documented on top of each kernel). The GPU
tests hold the kernels to these; the unit tests hold these to float64 math.
"""

from __future__ import annotations

import numpy as np

from ..host.gdn import conv_silu, decay_beta, delta_rule, qk_norm
from ..host.ops import F32, apply_rope, rms_norm, sigmoid, silu


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns, round to nearest even (PTX cvt.rn.bf16.f32, finite x)."""
    u = np.ascontiguousarray(x, dtype=F32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_value(b: np.ndarray) -> np.ndarray:
    """bf16 bit patterns -> float32 (exact)."""
    return (b.astype(np.uint32) << 16).view(F32)


def put3(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The three bf16 planes of f32 x (`put3`): hi = bf16(x), mid = bf16(x - hi), lo = bf16(x - hi - mid)."""
    hi = bf16_bits(x)
    r = x.astype(F32) - bf16_value(hi)
    mid = bf16_bits(r)
    lo = bf16_bits(r - bf16_value(mid))
    return hi, mid, lo


def plane_cols(cols: int) -> np.ndarray:
    """Where each of a row's first `cols` columns is stored in the planes (`hy_pcol`,
    kernels/hyb_mma.cuh): within each group of 32, column 8 a + 2 t + e at 8 t + 2 a + e (a
    partial last group spreads over the whole group's room). Stored rows s hold the rows
    s[:, plane_cols(cols)]; rows x are stored by s[:, plane_cols(cols)] = x."""
    c = np.arange(cols)
    return (c & ~31) | ((c >> 1) & 3) << 3 | ((c >> 3) & 3) << 1 | (c & 1)


def gdn_front(qkv: np.ndarray, ring: np.ndarray, taps: np.ndarray, xn: np.ndarray, aw: np.ndarray,
              bw: np.ndarray, a_log: np.ndarray, dt_bias: np.ndarray, nk: int, dk: int):
    """`hy_gdn_front`: qkv [n, cdim] raw rows after ring [kk-1, cdim] -> (cq [n, cdim], gb [n, 2nv]).

    cq: conv + SiLU, q and k heads L2-normed (q times 1/sqrt(dk)); gb: [decay | beta]."""
    cq = qk_norm(conv_silu(ring, qkv, taps)[0], nk, dk)  # [n, cdim]
    decay, beta = decay_beta(xn @ aw.T, xn @ bw.T, a_log, dt_bias)  # [n, nv]
    return cq, np.concatenate([decay, beta], axis=1).astype(F32)


def gdn_scan(cq: np.ndarray, gb: np.ndarray, s: np.ndarray, nk: int) -> tuple[np.ndarray, np.ndarray]:
    """`hy_gdn_scan` / `hy_gdn_scan4`: the delta rule over cq's rows from state s [nv, dk, dv].

    Returns (o [n, nv*dv], the state after the rows); s is not modified."""
    nv = s.shape[0]
    s = s.copy()
    o = delta_rule(cq, gb[:, nv:], gb[:, :nv], s, nk)  # [n, nv, dv]
    return o.reshape(cq.shape[0], -1), s


def ring_move(ring: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """The conv ring [kk-1, cdim] after raw rows [n, cdim]: the last kk-1 rows of the two, in order."""
    k1 = ring.shape[0]
    ext = np.concatenate([ring, raw])
    return ext[ext.shape[0] - k1:].copy()


def gdn_out(o: np.ndarray, z: np.ndarray, norm: np.ndarray, nv: int, eps: float, sig: bool = False,
            gemma: bool = False) -> np.ndarray:
    """`hy_gdn_out32`: per head RMSNorm(o, w) * gate(z); o, z [n, nv*dv] -> [n, nv*dv]."""
    n = o.shape[0]
    oh, zh = o.reshape(n, nv, -1), z.reshape(n, nv, -1)
    y = rms_norm(oh, norm, eps, gemma) * (sigmoid(zh) if sig else silu(zh))
    return y.reshape(n, -1)


def gdn_scan_out(cq: np.ndarray, gb: np.ndarray, s: np.ndarray, nk: int, z: np.ndarray, norm: np.ndarray,
                 eps: float, sig: bool = False, gemma: bool = False):
    """`hy_gdn_scan4_out32`: `gdn_scan`, then `gdn_out` of its rows: (o, y [n, nv*dv], the state
    after the rows)."""
    o, s = gdn_scan(cq, gb, s, nk)
    return o, gdn_out(o, z, norm, s.shape[0], eps, sig, gemma), s


def attn_qk(q: np.ndarray, k: np.ndarray, v: np.ndarray, qn, kn, tab: np.ndarray, nh: int, hd: int,
            eps: float, gemma: bool, gated: bool):
    """`hy_qk`: q [n, qs], k, v [n, nkv*hd], tab [n, half, 2] (sin, cos) ->
    (qg [n, nh, hd], gate [n, nh, hd] or None, k16, v16 [n, nkv, hd] as float16)."""
    n = q.shape[0]
    qh = q[:, :nh * hd * (2 if gated else 1)].reshape(n, nh, -1)
    qx, gate = qh[..., :hd], (qh[..., hd:2 * hd].copy() if gated else None)
    kx = k.reshape(n, -1, hd)
    if qn is not None:
        qx = rms_norm(qx, qn, eps, gemma)
    if kn is not None:
        kx = rms_norm(kx, kn, eps, gemma)
    sin, cos = tab[..., 0], tab[..., 1]
    qg, kr = apply_rope(qx, cos, sin), apply_rope(kx, cos, sin)
    return qg.astype(F32), gate, kr.astype(np.float16), v.reshape(n, -1, hd).astype(np.float16)


def attention(qg: np.ndarray, kmir: np.ndarray, vmir: np.ndarray, n0: int, scale: float,
              gate=None) -> np.ndarray:
    """`hy_scores` + `hy_values` + `hy_finish`: row r attends mirror rows 0 .. n0 + r.

    qg [n, nh, hd] f32; kmir, vmir [rows, nkv, hd] float16; gate [n, nh, hd] or None -> [n, nh*hd]."""
    n, nh, hd = qg.shape
    hpk = nh // kmir.shape[1]
    out = np.empty((n, nh, hd), dtype=F32)
    for r in range(n):
        keys = n0 + r + 1
        kf = kmir[:keys].astype(F32)  # [keys, nkv, hd]
        vf = vmir[:keys].astype(F32)
        for h in range(nh):
            s = (kf[:, h // hpk] @ qg[r, h]) * F32(scale)  # [keys]
            p = np.exp(s - s.max())
            out[r, h] = (p @ vf[:, h // hpk]) / p.sum()
    if gate is not None:
        out = out * sigmoid(gate)
    return out.reshape(n, nh * hd)


def argmax(logits: np.ndarray) -> np.ndarray:
    """`hy_argmax`: per row the index of the largest value, the lowest among equals; NaN never wins."""
    x = np.where(np.isnan(logits), -np.inf, logits)
    return np.argmax(x, axis=1).astype(np.int32)


def embed_gather(tiles: np.ndarray, codes: np.ndarray, lad: np.ndarray, hidden: int, tok: int) -> np.ndarray:
    """`hy_embed_gather`: row `tok` of a q4tp matrix in the tensor-core layout -> [hidden] f32.

    tiles u32 [ntile, gpr, 32 lanes, 2]; codes u8 [ntile, gpr, 16]; lad f32 [rows, 2] (lo, step)."""
    gpr = hidden // 32
    t, i = divmod(tok, 16)
    k = np.arange(32)
    q, tig = k // 8, (k // 2) % 4
    lane, m = (i % 8) * 4 + tig, 2 * (q % 2) + (i >= 8)
    words = tiles.reshape(-1, gpr, 32, 2)[t][:, lane, q // 2]  # [gpr, 32]
    nib = (words >> (4 * m + 16 * (k & 1)).astype(np.uint32)) & 15
    code = codes.reshape(-1, gpr, 16)[t, :, i].astype(F32)  # [gpr]
    lo, step = lad[tok]
    scale = np.exp2(F32(lo) + code * F32(step))  # [gpr]
    return ((nib.astype(F32) - F32(8)) * scale[:, None]).reshape(hidden)


def to_half(x: np.ndarray) -> np.ndarray:
    """`hy_to_half`: float32 -> float16 bit patterns, round to nearest even."""
    with np.errstate(over="ignore"):
        return x.astype(np.float16).view(np.uint16)
