"""The numpy references of the small path's GDN / attention kernels (`hybrid/kernels_ref.py`) against
independent float64 math written from docs/MODEL.md, and the kernels themselves compiling for
every attention geometry without local-memory spills (NVRTC, no GPU needed).

Tolerances: relative RMS <= 1e-5 for float32 paths against float64; bits where bits are defined
(bf16 rounding, f16 conversion, argmax).
"""

import math
import re

import numpy as np
import pytest

from _ref64 import rel_rms
from cortiq_drv.hybrid import kernels_ref as kr

F32 = np.float32


def _gdn_inputs(rng, n, nk=2, nv=4, dk=16, dv=16, kk=4, hidden=64):
    cdim = 2 * nk * dk + nv * dv
    return dict(
        qkv=rng.standard_normal((n, cdim)).astype(F32),
        ring=rng.standard_normal((kk - 1, cdim)).astype(F32),
        taps=(0.5 * rng.standard_normal((cdim, kk))).astype(F32),
        xn=rng.standard_normal((n, hidden)).astype(F32),
        aw=(0.1 * rng.standard_normal((nv, hidden))).astype(F32),
        bw=(0.1 * rng.standard_normal((nv, hidden))).astype(F32),
        a_log=rng.uniform(-1, 1, nv).astype(F32),
        dt_bias=rng.uniform(-1, 1, nv).astype(F32),
    ), (nk, nv, dk, dv, kk)


def _front64(p, nk, dk):
    """Conv over the history, SiLU, L2 norms, gates: loops in float64."""
    qkv, ring, taps = (np.asarray(p[k], np.float64) for k in ("qkv", "ring", "taps"))
    n, cdim = qkv.shape
    kk = taps.shape[1]
    hist = np.concatenate([ring, qkv])
    cq = np.zeros((n, cdim))
    for r in range(n):
        for c in range(cdim):
            x = sum(taps[c, j] * hist[r + j, c] for j in range(kk))
            cq[r, c] = x / (1 + math.exp(-x))
        for u in range(2 * nk):
            seg = cq[r, u * dk:(u + 1) * dk]
            seg /= math.sqrt(np.dot(seg, seg) + 1e-6)
            if u < nk:
                seg /= math.sqrt(dk)
    xn = np.asarray(p["xn"], np.float64)
    a = xn @ np.asarray(p["aw"], np.float64).T
    b = xn @ np.asarray(p["bw"], np.float64).T
    sp = np.log1p(np.exp(a + p["dt_bias"]))
    decay = np.exp(-np.exp(np.asarray(p["a_log"], np.float64)) * sp)
    return cq, np.concatenate([decay, 1 / (1 + np.exp(-b))], axis=1)


@pytest.mark.parametrize("n", [1, 5, 16])
def test_front_against_float64(n):
    p, (nk, nv, dk, dv, kk) = _gdn_inputs(np.random.default_rng(n), n)
    cq, gb = kr.gdn_front(**p, nk=nk, dk=dk)
    cq64, gb64 = _front64(p, nk, dk)
    assert cq.dtype == F32 and gb.dtype == F32 and gb.shape == (n, 2 * nv)
    assert rel_rms(cq, cq64) < 1e-5
    assert rel_rms(gb, gb64) < 1e-5


def test_front_and_ring_over_split_calls_equal_one_call():
    p, (nk, nv, dk, dv, kk) = _gdn_inputs(np.random.default_rng(7), 9)
    whole, _ = kr.gdn_front(**p, nk=nk, dk=dk)
    ring, parts = p["ring"], []
    for a, b in [(0, 2), (2, 3), (3, 9)]:
        q = dict(p, qkv=p["qkv"][a:b], xn=p["xn"][a:b], ring=ring)
        parts.append(kr.gdn_front(**q, nk=nk, dk=dk)[0])
        ring = kr.ring_move(ring, p["qkv"][a:b])
    np.testing.assert_allclose(np.concatenate(parts), whole, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(ring, p["qkv"][-(kk - 1):])


@pytest.mark.parametrize("n", [1, 2, 5])
def test_ring_move_keeps_the_last_rows_oldest_first(n):
    rng = np.random.default_rng(n)
    ring = rng.standard_normal((3, 8)).astype(F32)
    raw = rng.standard_normal((n, 8)).astype(F32)
    np.testing.assert_array_equal(kr.ring_move(ring, raw), np.concatenate([ring, raw])[-3:])
    assert kr.ring_move(np.zeros((0, 8), F32), raw).shape == (0, 8)


def _scan64(cq, gb, s, nk):
    nv, dk, dv = s.shape
    s = np.asarray(s, np.float64).copy()
    o = np.zeros((cq.shape[0], nv * dv))
    for r in range(cq.shape[0]):
        for h in range(nv):
            hk = h // (nv // nk)
            q = cq[r, hk * dk:(hk + 1) * dk].astype(np.float64)
            k = cq[r, (nk + hk) * dk:(nk + hk + 1) * dk].astype(np.float64)
            v = cq[r, 2 * nk * dk + h * dv:2 * nk * dk + (h + 1) * dv].astype(np.float64)
            s[h] *= gb[r, h]
            delta = (v - s[h].T @ k) * gb[r, nv + h]
            s[h] += np.outer(k, delta)
            o[r, h * dv:(h + 1) * dv] = s[h].T @ q
    return o, s


@pytest.mark.parametrize("n", [1, 4, 16])
def test_scan_against_float64(n):
    rng = np.random.default_rng(10 + n)
    nk, nv, dk, dv = 2, 4, 16, 8
    cdim = 2 * nk * dk + nv * dv
    cq = (0.3 * rng.standard_normal((n, cdim))).astype(F32)
    gb = np.concatenate([rng.uniform(0.5, 1, (n, nv)), rng.uniform(0, 1, (n, nv))], 1).astype(F32)
    s0 = (0.1 * rng.standard_normal((nv, dk, dv))).astype(F32)
    o, s = kr.gdn_scan(cq, gb, s0, nk)
    o64, s64 = _scan64(cq, gb, s0, nk)
    assert rel_rms(o, o64) < 1e-5 and rel_rms(s, s64) < 1e-5
    assert o.shape == (n, nv * dv) and s.dtype == F32


def test_scan_first_row_from_zero_is_beta_k_outer_v():
    # S = beta k v^T from a zero state, so o = beta (q . k) v
    rng = np.random.default_rng(3)
    nk, nv, dk, dv = 1, 2, 8, 4
    cq = rng.standard_normal((1, 2 * nk * dk + nv * dv)).astype(F32)
    gb = np.array([[0.9, 0.8, 0.25, 0.5]], F32)
    o, s = kr.gdn_scan(cq, gb, np.zeros((nv, dk, dv), F32), nk)
    q, k, v = cq[0, :dk], cq[0, dk:2 * dk], cq[0, 2 * dk:].reshape(nv, dv)
    for h in range(nv):
        np.testing.assert_allclose(s[h], gb[0, nv + h] * np.outer(k, v[h]), rtol=1e-6)
        np.testing.assert_allclose(o[0].reshape(nv, dv)[h], gb[0, nv + h] * np.dot(q, k) * v[h], rtol=1e-5)


@pytest.mark.parametrize("sig,gemma", [(False, False), (True, True)])
def test_gdn_out_against_float64(sig, gemma):
    rng = np.random.default_rng(5)
    n, nv, dv, eps = 3, 4, 16, 1e-6
    o, z = (rng.standard_normal((n, nv * dv)).astype(F32) for _ in range(2))
    w = rng.standard_normal(dv).astype(F32)
    y = kr.gdn_out(o, z, w, nv, eps, sig, gemma)
    o64, z64 = o.reshape(n, nv, dv).astype(np.float64), z.reshape(n, nv, dv).astype(np.float64)
    g = 1 / (1 + np.exp(-z64))
    want = o64 / np.sqrt((o64 ** 2).mean(-1, keepdims=True) + eps) * ((1 + w) if gemma else w) * (g if sig else z64 * g)
    assert rel_rms(y, want.reshape(n, -1)) < 1e-5


def test_put3_planes_round_to_nearest_even_and_sum_back():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(4096) * np.exp2(rng.integers(-20, 20, 4096))).astype(F32)
    hi, mid, lo = kr.put3(x)
    hv = kr.bf16_value(hi).astype(np.float64)
    # hi is the nearest bf16 (8 significant bits): within half an ulp of x
    assert (np.abs(x - hv) <= np.abs(x) * 2.0 ** -8).all()
    back = hv + kr.bf16_value(mid) + kr.bf16_value(lo)
    assert (np.abs(back - x) <= np.abs(x) * 2.0 ** -24).all()
    # ties go to the even bf16: 1 + 2^-8 is halfway between 1 and 1 + 2^-7
    assert kr.bf16_bits(np.array([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8], F32)).tolist() == [0x3F80, 0x3F82]


def test_plane_cols_put_each_lanes_fragments_in_its_16_bytes():
    """The planes' fragment order: a permutation within each group of 32 that is its own inverse,
    and lane t's 8 stored elements at 8 t of a group are the B fragment's column pairs 2 t + 8 a
    (a = 0..3: b0, b1 of k-step 0, b0, b1 of k-step 1), in that order."""
    pc = kr.plane_cols(96)
    assert sorted(pc.tolist()) == list(range(96))
    assert (pc // 32 == np.arange(96) // 32).all()
    assert (pc[pc] == np.arange(96)).all()
    stored = np.empty(96, dtype=np.int64)
    stored[pc] = np.arange(96)
    for g in range(3):
        for t in range(4):
            want = [32 * g + 2 * t + 8 * a + e for a in range(4) for e in range(2)]
            assert stored[32 * g + 8 * t:32 * g + 8 * t + 8].tolist() == want


@pytest.mark.parametrize("gated,normed,gemma", [(True, True, True), (False, False, False)])
def test_attn_qk_against_float64(gated, normed, gemma):
    rng = np.random.default_rng(int(gated) + 2 * int(normed))
    n, nh, nkv, hd, rd, theta, eps = 3, 4, 2, 32, 16, 10000.0, 1e-6
    q = rng.standard_normal((n, nh * hd * (2 if gated else 1))).astype(F32)
    k, v = (rng.standard_normal((n, nkv * hd)).astype(F32) for _ in range(2))
    qn, kn = ((rng.standard_normal(hd).astype(F32), rng.standard_normal(hd).astype(F32)) if normed
              else (None, None))
    pos = np.array([0, 7, 1000])
    ang = pos[:, None] * theta ** (-2.0 * np.arange(rd // 2) / rd)
    tab = np.stack([np.sin(ang), np.cos(ang)], -1).astype(F32)  # [n, half, 2]
    qg, gate, k16, v16 = kr.attn_qk(q, k, v, qn, kn, tab, nh, hd, eps, gemma, gated)

    def want(x, w):
        x = x.astype(np.float64)
        if w is not None:
            x = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps) * ((1 + w) if gemma else w)
        z = (x[..., :rd // 2] + 1j * x[..., rd // 2:rd]) * np.exp(1j * ang.astype(np.float32))[:, None, :]
        return np.concatenate([z.real, z.imag, x[..., rd:]], -1)

    qh = q.reshape(n, nh, -1)
    assert rel_rms(qg, want(qh[..., :hd], qn)) < 1e-5
    assert rel_rms(k16.astype(F32), want(k.reshape(n, nkv, hd), kn)) < 1e-3  # f16 rows
    np.testing.assert_array_equal(v16, v.reshape(n, nkv, hd).astype(np.float16))
    if gated:
        np.testing.assert_array_equal(gate, qh[..., hd:])
    else:
        assert gate is None


@pytest.mark.parametrize("n0,n", [(0, 1), (14, 1), (16, 1), (40, 16)])
def test_attention_against_float64(n0, n):
    rng = np.random.default_rng(n0 + n)
    nh, nkv, hd, scale = 4, 2, 16, 0.25
    qg = rng.standard_normal((n, nh, hd)).astype(F32)
    km, vm = (rng.standard_normal((n0 + n + 3, nkv, hd)).astype(np.float16) for _ in range(2))
    gate = rng.standard_normal((n, nh, hd)).astype(F32)
    got = kr.attention(qg, km, vm, n0, scale, gate).reshape(n, nh, hd)
    for r in range(n):
        keys = n0 + r + 1
        for h in range(nh):
            g = h // (nh // nkv)
            s = km[:keys, g].astype(np.float64) @ qg[r, h] * scale
            p = np.exp(s - s.max())
            want = (p / p.sum()) @ vm[:keys, g].astype(np.float64) / (1 + np.exp(-gate[r, h]))
            assert rel_rms(got[r, h], want) < 1e-5


def test_argmax_lowest_index_among_ties_and_nan_never_wins():
    x = np.zeros((4, 300), F32)
    x[0, [7, 200]] = 5.0
    x[1, 3] = np.nan
    x[1, 250] = 1.0
    x[2] = -np.inf
    x[3] = np.nan
    assert kr.argmax(x).tolist() == [7, 250, 0, 0]


def _repack(nib, codes):
    """Dense nibbles [rows, cols] and codes [rows, gpr] into the tensor-core layout, written from
    the layout's definition (row gid + 8 (m & 1), columns 16 s + 2 tig + 8 (m >> 1) and +1)."""
    rows, cols = nib.shape
    ntile, gpr = -(-rows // 16), cols // 32
    full = np.full((ntile * 16, cols), 8, np.uint32)
    full[:rows] = nib
    cfull = np.zeros((ntile * 16, gpr), np.uint8)
    cfull[:rows] = codes
    tiles = np.zeros((ntile, gpr, 32, 2), np.uint32)
    for t in range(ntile):
        for g in range(gpr):
            for lane in range(32):
                gid, tig = lane >> 2, lane & 3
                for s in range(2):
                    w = 0
                    for m in range(4):
                        r = t * 16 + gid + 8 * (m & 1)
                        c = g * 32 + 16 * s + 2 * tig + 8 * (m >> 1)
                        w |= int(full[r, c]) << (4 * m) | int(full[r, c + 1]) << (4 * m + 16)
                    tiles[t, g, lane, s] = w
    return tiles, cfull.reshape(ntile, 16, gpr).transpose(0, 2, 1).copy()


def test_embed_gather_reads_the_tensor_core_layout():
    rng = np.random.default_rng(2)
    rows, hidden = 21, 64
    nib = rng.integers(0, 16, (rows, hidden)).astype(np.uint32)
    codes = rng.integers(0, 32, (rows, hidden // 32)).astype(np.uint8)
    lad = np.stack([rng.uniform(-9, -5, rows), rng.uniform(0, 0.2, rows)], 1).astype(F32)
    tiles, ctile = _repack(nib, codes)
    for tok in (0, 7, 8, 15, 16, 20):
        want = (nib[tok].astype(np.float64) - 8) * np.exp2(
            lad[tok, 0] + np.repeat(codes[tok], 32).astype(np.float64) * lad[tok, 1])
        got = kr.embed_gather(tiles, ctile, lad, hidden, tok)
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_to_half_rounds_to_nearest_even():
    x = np.array([1.0, 1 + 2.0 ** -11, 1 + 3 * 2.0 ** -11, 70000.0, -1e-8], F32)
    assert kr.to_half(x).tolist() == [0x3C00, 0x3C00, 0x3C02, 0x7C00, 0x8000]


_SMALL = ("hy_gdn_front", "hy_gdn_scan", "hy_gdn_scan4", "hy_gdn_out32", "hy_gdn_scan4_out32",
          "hy_gdn_restore_scan", "hy_gdn_restore_scan4", "hy_gdn_restore_ring", "hy_qk", "hy_scores",
          "hy_values", "hy_finish", "hy_argmax", "hy_embed_gather", "hy_to_half", "hy_copy16")


@pytest.mark.parametrize("hpk,hd", [(1, 64), (2, 128), (4, 256), (8, 64), (16, 128), (16, 256)])
def test_small_kernels_compile_without_spills(nvrtc_ok, hpk, hd):
    from cortiq_drv.cu import nvrtc
    from cortiq_drv.kernels import source

    opts = nvrtc.options_for({"HPK": hpk, "HD": hd}, "sm_90", ["-Xptxas=-v"])
    _, log = nvrtc.compile_program(source("hyb.cu"), opts, "hyb.cu")
    props = dict(re.findall(r"Function properties for (\w+)\n(.*)", log))
    for name in _SMALL:
        assert name in props, f"{name} missing from the module"
        assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in props[name], (name, props[name])
