"""Numpy references of the prompt path's kernels (`kernels/hyb_big.cuh`, the chunked delta rule's
in `kernels/hyb_gdn_chunk.cuh`): each function is one kernel's contract in float32 over the same
layouts (documented on top of each kernel); f16 outputs are float16 arrays (round to nearest even,
as PTX cvt.rn). The GPU tests hold the kernels to these; the unit tests hold these to the host
arm's math (`host/`, `kernels_ref`).
"""

from __future__ import annotations

import numpy as np

from ..cmf import q4tp
from ..host.gdn import conv_silu, log_decay, qk_norm
from ..host.ops import F32, rms_norm, sigmoid, silu
from .kernels_ref import gdn_out

# rows a step of hy_gdn_chunk
CHUNK = 64
# log decay is clamped here so differences of cumulative sums stay finite
LOG_FLOOR = -80.0


def expand(tiles: np.ndarray, codes: np.ndarray, lad: np.ndarray, rows: int, cols: int, t0: int = 0,
           nt: int | None = None) -> np.ndarray:
    """`hy_expand_pr`: tiles [t0, t0 + nt) (nt None: to the last) of a repacked q4tp matrix
    (hy_repack's layout: tiles u32 [ntile, gpr, 32, 2], codes u8 [ntile, gpr, 16], lad f32
    [rows, 2]) -> float16 [min(16 nt, rows - 16 t0), cols]."""
    ntile, gpr = -(-rows // 16), cols // 32
    nt = ntile - t0 if nt is None else nt
    words = tiles.reshape(ntile, gpr, 32, 2)[t0:t0 + nt].astype(np.int64)  # [nt, gpr, 32, 2]
    q = np.zeros((nt, 16, gpr, 32), dtype=np.int64)
    for i in range(16):
        gid, hh = i & 7, i >> 3
        for tig in range(4):
            for s in range(2):
                x = words[:, :, gid * 4 + tig, s]  # [nt, gpr]
                for mh in range(2):
                    m = hh + 2 * mh
                    c = 16 * s + 8 * mh + 2 * tig
                    q[:, i, :, c] = (x >> (4 * m)) & 15
                    q[:, i, :, c + 1] = (x >> (4 * m + 16)) & 15
    nr = min(16 * nt, rows - 16 * t0)
    code = codes.reshape(ntile, gpr, 16)[t0:t0 + nt].transpose(0, 2, 1).reshape(-1, gpr)[:nr]
    lo, st = lad.reshape(rows, 2)[16 * t0:16 * t0 + nr].T
    rung = np.take_along_axis(q4tp.ladders(lo, st), code.astype(np.int64), axis=1)  # [nr, gpr]
    w = (q.reshape(-1, gpr, 32)[:nr] - 8).astype(F32) * rung[..., None]
    return w.reshape(nr, cols).astype(np.float16)


def rmsnorm_h(x: np.ndarray, w: np.ndarray, eps: float, gemma: bool) -> np.ndarray:
    """`hy_rmsnorm`: rows x [n, hidden] normed (1 + w in gemma style) -> float16."""
    return rms_norm(x, w, eps, gemma).astype(np.float16)


def gdn_conv32(raw: np.ndarray, ring: np.ndarray, taps: np.ndarray, nk: int, dk: int) -> np.ndarray:
    """`hy_gdn_conv32`: raw [n, cdim] after ring [kk-1, cdim], taps [cdim, kk] -> silu(conv)
    [n, cdim], its q and k heads L2-normed, q then times 1/sqrt(dk)."""
    return qk_norm(conv_silu(ring, raw, taps)[0], nk, dk)


def _chunks(n: int, chunk: int):
    return [(c0, min(n, c0 + chunk)) for c0 in range(0, n, chunk)]


def _qk(rows: np.ndarray, nk: int, dk: int, rep: int) -> tuple[np.ndarray, np.ndarray]:
    """The q and k heads of cq rows [c, cdim], each key head repeated for its `rep` value heads ->
    (q, k) [nv, c, dk]."""
    c = rows.shape[0]
    q = np.repeat(rows[:, :nk * dk].reshape(c, nk, dk), rep, axis=1).transpose(1, 0, 2)
    k = np.repeat(rows[:, nk * dk:2 * nk * dk].reshape(c, nk, dk), rep, axis=1).transpose(1, 0, 2)
    return q, k


def gdn_wy(cq: np.ndarray, ab: np.ndarray, a_log: np.ndarray, dt_bias: np.ndarray, nk: int, chunk: int = CHUNK):
    """`hy_gdn_wy`: the gates and the state-free part of the chunked delta rule over cq [n, cdim]
    and the gate projections ab [n, 2nv] (a | b) -> (g [nv, n], w [nv, n, dk], u [nv, n, dv],
    p [nv, n, chunk]) as hyb_gdn_chunk.cuh defines them. (I + A) X = R by rows here; the kernel
    substitutes in blocks of 16 rows, the same solve."""
    n, nv = cq.shape[0], a_log.shape[0]
    dk = dv = cq.shape[1] // (2 * nk + nv)
    rep = nv // nk
    g = np.empty((nv, n), F32)
    w = np.empty((nv, n, dk), F32)
    u = np.empty((nv, n, dv), F32)
    p = np.zeros((nv, n, chunk), F32)
    for c0, c1 in _chunks(n, chunk):
        rows, c = cq[c0:c1], c1 - c0
        q, k = _qk(rows, nk, dk, rep)  # [nv, c, dk]
        v = rows[:, 2 * nk * dk:].reshape(c, nv, dv).transpose(1, 0, 2)  # [nv, c, dv]
        lg = np.maximum(log_decay(ab[c0:c1, :nv], a_log, dt_bias).T, F32(LOG_FLOOR))  # [nv, c]
        beta = sigmoid(ab[c0:c1, nv:2 * nv]).T[..., None]  # [nv, c, 1]
        gc = np.cumsum(lg, axis=1, dtype=F32)
        diff = gc[:, :, None] - gc[:, None, :]  # [nv, t, s]
        low = np.tril(np.ones((c, c), dtype=bool))
        dec = np.where(low, np.exp(np.where(low, diff, 0)), F32(0)).astype(F32)
        a = np.where(np.tril(low, -1), beta * dec * (k @ k.transpose(0, 2, 1)), F32(0))
        rhs = np.concatenate([beta * np.exp(gc)[..., None] * k, beta * v], axis=2)  # [nv, c, dk + dv]
        x = np.empty_like(rhs)
        for t in range(c):
            x[:, t] = rhs[:, t] - np.einsum("hs,hsj->hj", a[:, t, :t], x[:, :t])
        g[:, c0:c1] = gc
        w[:, c0:c1], u[:, c0:c1] = x[..., :dk], x[..., dk:]
        p[:, c0:c1, :c] = dec * (q @ k.transpose(0, 2, 1))
    return g, w, u, p


def gdn_chunk(cq: np.ndarray, g: np.ndarray, w: np.ndarray, u: np.ndarray, p: np.ndarray, s: np.ndarray,
              nk: int, chunk: int = CHUNK) -> tuple[np.ndarray, np.ndarray]:
    """`hy_gdn_chunk`: the state through the chunks from s [nv, dk, dv] with hy_gdn_wy's g, w, u,
    p -> (o [n, nv*dv], the state after the rows); s is not modified."""
    nv, dk, dv = s.shape
    n = cq.shape[0]
    rep = nv // nk
    s = s.copy()
    o = np.empty((n, nv, dv), F32)
    for c0, c1 in _chunks(n, chunk):
        c = c1 - c0
        q, k = _qk(cq[c0:c1], nk, dk, rep)
        gc = g[:, c0:c1]
        d = u[:, c0:c1] - w[:, c0:c1] @ s  # [nv, c, dv]
        o[c0:c1] = (np.exp(gc)[..., None] * (q @ s) + p[:, c0:c1, :c] @ d).transpose(1, 0, 2)
        wt = np.exp(gc[:, -1:] - gc)[..., None] * d
        s = np.exp(gc[:, -1])[:, None, None] * s + k.transpose(0, 2, 1) @ wt
    return o.reshape(n, nv * dv), s.astype(F32)


def gdn_delta(cq: np.ndarray, ab: np.ndarray, a_log: np.ndarray, dt_bias: np.ndarray, s: np.ndarray,
              nk: int) -> tuple[np.ndarray, np.ndarray]:
    """`hy_gdn_wy` then `hy_gdn_chunk`: the delta rule over cq's rows, gates from ab [n, 2nv]
    (a | b), from s [nv, dk, dv]."""
    return gdn_chunk(cq, *gdn_wy(cq, ab, a_log, dt_bias, nk), s, nk)


def gdn_out_h(o: np.ndarray, z: np.ndarray, norm: np.ndarray, nv: int, eps: float) -> np.ndarray:
    """`hy_gdn_out_h`: per head RMSNorm(o, norm) * silu(z); o, z [n, nv*dv] -> float16 [n, nv*dv]."""
    return gdn_out(o, z, norm, nv, eps).astype(np.float16)


def q_half_g(qg: np.ndarray, nkv: int) -> np.ndarray:
    """`hy_q_half_g`: qg [n, nh, hd] -> float16 [nkv, n, hpk, hd] (group-major)."""
    n, nh, hd = qg.shape
    return qg.reshape(n, nkv, nh // nkv, hd).transpose(1, 0, 2, 3).astype(np.float16)


def softmax_h(s: np.ndarray, p0: int, col_base: int, hpk: int) -> tuple[np.ndarray, np.ndarray]:
    """`hy_softmax_h`: scores s [nkv, cols, l_rows] -> (P float16 [nkv, cols, l_rows], isum
    [nkv, cols]); column c sees keys k with col_base + k <= p0 + c // hpk."""
    nkv, cols, l_rows = s.shape
    lim = np.minimum(l_rows, p0 + np.arange(cols) // hpk - col_base + 1)  # [cols]
    vis = np.arange(l_rows)[None, :] < lim[:, None]  # [cols, l_rows]
    m = np.where(vis, s, -np.inf).max(axis=-1, keepdims=True)
    e = np.where(vis, np.exp(np.where(vis, s - m, 0)), F32(0)).astype(np.float16)
    return e, (F32(1) / e.astype(F32).sum(axis=-1)).astype(F32)


def attn_out(ao: np.ndarray, isum: np.ndarray, gate) -> np.ndarray:
    """`hy_attn_out`: ao [nkv, n, hpk, hd], isum [nkv, n*hpk], gate [n, nh, hd] or None ->
    float16 [n, nh*hd]."""
    nkv, n, hpk, hd = ao.shape
    y = ao * isum.reshape(nkv, n, hpk)[..., None]
    y = y.transpose(1, 0, 2, 3).reshape(n, nkv * hpk, hd)
    if gate is not None:
        y = y * sigmoid(gate)
    return y.reshape(n, -1).astype(np.float16)


def silu_pair_half(gu: np.ndarray, inter: int) -> np.ndarray:
    """`hy_silu_pair_half`: gu [n, 2 inter] in pair order -> float16 silu(gate) * up / 16 [n, inter]."""
    n = gu.shape[0]
    t = gu.reshape(n, inter // 8, 2, 8)
    return (silu(t[:, :, 0]) * t[:, :, 1] * F32(0.0625)).reshape(n, inter).astype(np.float16)
