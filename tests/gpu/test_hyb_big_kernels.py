"""The prompt path's kernels (kernels/hyb_big.cuh, hyb_gdn_chunk.cuh) on a device against their
numpy references (hybrid/kernels_big_ref.py) and the small path's (kernels_ref), on random data.

Tolerances: f16 outputs within one f16 rounding step of the reference's (their f32 inputs differ
by a few f32 ulps: exp2f, expf, another summation order), the expansion at least 99.9% bit-equal;
f32 glue relative RMS <= 1e-6 (the ring: bytes); the chunked delta rule against the serial scan
<= 2e-5 (regrouped f32 sums, 3xTF32 products); attention through cuBLAS's f16 GEMMs, and hy_flash_h, against exact
attention <= 3e-3.
"""

import numpy as np
import pytest

import _dev
from _dev import rel_rms
from cortiq_drv.cu import kargs
from cortiq_drv.hybrid import kernels_big_ref as br
from cortiq_drv.hybrid import kernels_ref as kr
from cortiq_drv.hybrid.big import CHUNK_SMEM, CHUNK_WARPS, CONV_ROWS, WY_SMEM, attend, flash_smem
from cortiq_drv.hybrid.bigfit import score_bytes
from cortiq_drv.hybrid.repack import random_q4tp, repack_q4tp

pytestmark = pytest.mark.gpu

F32, F16 = np.float32, np.float16


def f16_steps(a, b) -> np.ndarray:
    """How many f16 values apart a and b are (float16 arrays of one shape)."""
    def order(x):
        u = np.ascontiguousarray(x, F16).view(np.uint16).astype(np.int64)
        return np.where(u >= 0x8000, -(u - 0x8000), u)
    return np.abs(order(a) - order(b))


class ScratchDev(_dev.Dev):
    """A test's device buffers, freed at its end; zeroed, at least 4 bytes."""

    def new(self, nbytes):
        return super().new(max(nbytes, 4))

    def get(self, b, dtype, shape):
        return b.to_host(dtype, shape)


@pytest.fixture
def dev(ctx):
    d = ScratchDev(ctx)
    yield d
    ctx.sync()
    d.close()


def grid(n):
    return (-(-n // 256), 1)


@pytest.mark.parametrize("rows,cols", [(17, 96), (40, 1056), (300, 4096)])
def test_expand(ctx, kern, dev, rows, cols):
    rng = np.random.default_rng(rows)
    nib, codes, lad = repack_q4tp(random_q4tp(rows, cols, rng), rows, cols)
    want = br.expand(nib, codes, lad, rows, cols)
    t, c, l = dev.put(nib), dev.put(codes), dev.put(lad)
    wd = dev.new(rows * cols * 2)
    # the whole matrix: all its tiles from tile 0
    ntile = -(-rows // 16)
    ctx.launch(kern("hy_expand_pr"), grid(ntile * cols), 256, 0, kargs("QQQQiiii", t, c, l, wd, rows, cols, 0, ntile))
    got = dev.get(wd, F16, (rows, cols))
    steps = f16_steps(got, want)
    assert steps.max() <= 1 and (steps == 0).mean() >= 0.999
    # a band of two tiles from tile 1 (the last band may be short)
    t0, nt = 1, 2
    nr = min(16 * nt, rows - 16 * t0)
    band = dev.new(16 * nt * cols * 2)
    ctx.launch(kern("hy_expand_pr"), grid(nt * cols), 256, 0, kargs("QQQQiiii", t, c, l, band, rows, cols, t0, nt))
    assert dev.get(band, F16, (16 * nt, cols))[:nr].tobytes() == got[16 * t0:16 * t0 + nr].tobytes()


@pytest.mark.parametrize("gemma", [0, 1])
def test_rmsnorm(ctx, kern, dev, gemma):
    rng = np.random.default_rng(gemma)
    x = (rng.standard_normal((5, 1000)) * 3).astype(F32)
    w = (rng.standard_normal(1000) * 0.1).astype(F32)
    y = dev.new(5 * 1000 * 2)
    ctx.launch(kern("hy_rmsnorm"), (5, 1), 256, 0, kargs("QQQifi", dev.put(x), dev.put(w), y, 1000, 1e-6, gemma))
    assert f16_steps(dev.get(y, F16, (5, 1000)), br.rmsnorm_h(x, w, 1e-6, bool(gemma))).max() <= 1


def gdn_case(seed, n, nk=2, nv=4, kk=4, hidden=64):
    rng = np.random.default_rng(seed)
    dk = dv = 128
    cdim = 2 * nk * dk + nv * dv
    return dict(
        raw=rng.standard_normal((n, cdim)).astype(F32), ring=rng.standard_normal((kk - 1, cdim)).astype(F32),
        taps=(rng.standard_normal((cdim, kk)) * 0.5).astype(F32), xn=rng.standard_normal((n, hidden)).astype(F32),
        aw=(rng.standard_normal((nv, hidden)) * 0.2).astype(F32),
        bw=(rng.standard_normal((nv, hidden)) * 0.2).astype(F32), a_log=rng.uniform(-2, 1, nv).astype(F32),
        dt_bias=rng.uniform(-1, 1, nv).astype(F32), s=(rng.standard_normal((nv, dk, dv)) * 0.1).astype(F32),
        nk=nk, nv=nv, cdim=cdim, kk=kk)


@pytest.mark.parametrize("n", [17, 200])
def test_gdn_glue(ctx, kern, dev, n):
    c = gdn_case(n, n)
    nk, cdim, kk = c["nk"], c["cdim"], c["kk"]
    raw, ring = dev.put(c["raw"]), dev.put(c["ring"])
    cq = dev.new(n * cdim * 4)
    ctx.launch(kern("hy_gdn_conv32"), grid(-(-n // CONV_ROWS) * cdim // 4), 256, 0,
               kargs("QiQQQiiii", raw, cdim, ring, dev.put(c["taps"]), cq, n, cdim, kk, nk))
    ctx.launch(kern("hy_gdn_ring"), grid(cdim), 256, 0, kargs("QQiiii", ring, raw, cdim, n, cdim, kk))
    want_cq = br.gdn_conv32(c["raw"], c["ring"], c["taps"], nk, 128)
    assert rel_rms(dev.get(cq, F32, (n, cdim)), want_cq) < 1e-6
    assert dev.get(ring, F32, (kk - 1, cdim)).tobytes() == kr.ring_move(c["ring"], c["raw"]).tobytes()


def run_wy_chunk(ctx, kern, dev, c, cq, ab, s, n, nk):
    """hy_gdn_wy then hy_gdn_chunk over rows cq [n, cdim] and gate projections ab [n, 2 nv] (a | b;
    a_log, dt_bias: case c's) from the state buffer s (updated in place) -> the device buffers
    (g, w, u, p, o)."""
    cdim, nv = c["cdim"], c["nv"]
    cq = dev.put(cq)
    # a | b inside wider rows, as big's one GEMM leaves them
    abw = dev.put(np.ascontiguousarray(np.pad(ab, ((0, 0), (0, 6)), constant_values=np.nan)))
    g, w, u, p = dev.new(nv * n * 4), dev.new(nv * n * 512), dev.new(nv * n * 512), dev.new(nv * n * 256)
    o = dev.new(n * nv * 128 * 4)
    ctx.launch(kern("hy_gdn_wy"), (-(-n // 64), nv), 256, WY_SMEM,
               kargs("QQiQQQQQQiiii", cq, abw, 2 * nv + 6, dev.put(c["a_log"]), dev.put(c["dt_bias"]), g, w, u, p,
                     n, cdim, nv, nk))
    ctx.launch(kern("hy_gdn_chunk"), (nv * 4, 1), 32 * CHUNK_WARPS, CHUNK_SMEM,
               kargs("QQQQQQQiiii", cq, g, w, u, p, s, o, n, cdim, nv, nk))
    return g, w, u, p, o


def gdn_rows(c, nk):
    """The case's conv / norm rows as hy_gdn_conv32 leaves them, the gate projections ab (a | b)
    and the small front's gates gb (decay | beta) the serial scan takes: (cq, ab, gb)."""
    cq, gb = kr.gdn_front(c["raw"], c["ring"], c["taps"], c["xn"], c["aw"], c["bw"], c["a_log"], c["dt_bias"], nk,
                          128)
    return cq, np.concatenate([c["xn"] @ c["aw"].T, c["xn"] @ c["bw"].T], axis=1).astype(F32), gb


# many chunks with a short last one (1500 = 23 * 64 + 28) and the 9B shape's head ratio (nv = 2 nk)
@pytest.mark.parametrize("n,nk,nv", [(1, 2, 4), (17, 2, 4), (64, 2, 4), (65, 1, 2), (300, 2, 4), (1000, 4, 8),
                                     (1500, 2, 4)])
def test_gdn_wy_then_chunk_is_the_serial_scan(ctx, kern, dev, n, nk, nv):
    c = gdn_case(n + 7, n, nk, nv)
    cq_h, ab, gb_h = gdn_rows(c, nk)
    o_want, s_want = kr.gdn_scan(cq_h, gb_h, c["s"], nk)
    s = dev.put(c["s"])
    g, w, u, p, o = run_wy_chunk(ctx, kern, dev, c, cq_h, ab, s, n, nk)
    for got, want, shape in zip((g, w, u, p), br.gdn_wy(cq_h, ab, c["a_log"], c["dt_bias"], nk),
                                ((nv, n), (nv, n, 128), (nv, n, 128), (nv, n, 64))):
        assert rel_rms(dev.get(got, F32, shape), want) < 1e-5
    assert rel_rms(dev.get(o, F32, (n, nv * 128)), o_want) < 2e-5
    assert rel_rms(dev.get(s, F32, c["s"].shape), s_want) < 2e-5


@pytest.mark.parametrize("n1,n2", [(100, 77), (64, 1), (37, 200)])
def test_gdn_chunk_continues_its_state(ctx, kern, dev, n1, n2):
    """Two calls (rows [0, n1), then [n1, n1 + n2) from the state the first left) against one
    serial scan over all the rows: the state in and out of hy_gdn_chunk is the scan's."""
    nk, nv = 2, 4
    c = gdn_case(n1 * 1000 + n2, n1 + n2, nk, nv)
    cq_h, ab, gb_h = gdn_rows(c, nk)
    o_want, s_want = kr.gdn_scan(cq_h, gb_h, c["s"], nk)
    s = dev.put(c["s"])
    *_, o1 = run_wy_chunk(ctx, kern, dev, c, cq_h[:n1], ab[:n1], s, n1, nk)
    *_, o2 = run_wy_chunk(ctx, kern, dev, c, cq_h[n1:], ab[n1:], s, n2, nk)
    got = np.concatenate([dev.get(o1, F32, (n1, nv * 128)), dev.get(o2, F32, (n2, nv * 128))])
    assert rel_rms(got, o_want) < 2e-5
    assert rel_rms(dev.get(s, F32, c["s"].shape), s_want) < 2e-5


def test_gdn_out_h(ctx, kern, dev):
    rng = np.random.default_rng(9)
    o, z = rng.standard_normal((2, 7, 4 * 128)).astype(F32)
    zs = np.ascontiguousarray(np.pad(z, ((0, 0), (0, 32))))
    norm = rng.uniform(0.5, 1.5, 128).astype(F32)
    y = dev.new(7 * 512 * 2)
    ctx.launch(kern("hy_gdn_out_h"), (-(-7 * 4 // 8), 1), 256, 0,
               kargs("QQiQQiifi", dev.put(o), dev.put(zs), 544, dev.put(norm), y, 4, 128, 1e-6, 7))
    assert f16_steps(dev.get(y, F16, (7, 512)), br.gdn_out_h(o, z, norm, 4, 1e-6)).max() <= 1


def test_q_half_g_and_attn_out(ctx, kern, dev):
    rng = np.random.default_rng(10)
    n, nkv, hpk, hd = 5, 2, 4, 64
    nh = nkv * hpk
    qg = rng.standard_normal((n, nh, hd)).astype(F32)
    qh = dev.new(qg.size * 2)
    ctx.launch(kern("hy_q_half_g"), grid(qg.size), 256, 0, kargs("QQiiii", dev.put(qg), qh, n, nh, hpk, hd))
    assert dev.get(qh, F16, (nkv, n, hpk, hd)).tobytes() == br.q_half_g(qg, nkv).tobytes()
    ao = rng.standard_normal((nkv, n, hpk, hd)).astype(F32)
    isum = rng.uniform(0.1, 1, (nkv, n * hpk)).astype(F32)
    gate = rng.standard_normal((n, nh, hd)).astype(F32)
    for gp, gw in ((dev.put(gate), gate), (0, None)):
        out = dev.new(n * nh * hd * 2)
        ctx.launch(kern("hy_attn_out"), grid(n * nh * hd), 256, 0,
                   kargs("QQQQiiii", dev.put(ao), dev.put(isum), gp, out, nh, n, hpk, hd))
        assert f16_steps(dev.get(out, F16, (n, nh * hd)), br.attn_out(ao, isum, gw)).max() <= 1


@pytest.mark.parametrize("l_rows,p0,col_base,hpk", [(20, 10, 0, 4), (700, 600, 0, 2), (300, 290, 7, 1)])
def test_softmax_h(ctx, kern, dev, l_rows, p0, col_base, hpk):
    rng = np.random.default_rng(l_rows)
    nkv, bn = 2, 3
    cols = bn * hpk
    s = (rng.standard_normal((nkv, cols, l_rows)) * 4).astype(F32)
    p = dev.new(s.size * 2)
    isum = dev.new(nkv * 2 * cols * 4)
    ctx.launch(kern("hy_softmax_h"), (nkv * cols, 1), 256, 0,
               kargs("QQQiiiiii", dev.put(s), p, isum, l_rows, p0, col_base, hpk, cols, 2 * cols))
    pw, iw = br.softmax_h(s, p0, col_base, hpk)
    assert f16_steps(dev.get(p, F16, s.shape), pw).max() <= 1
    assert rel_rms(dev.get(isum, F32, (nkv, 2 * cols))[:, :cols], iw) < 1e-5


def test_silu_pair_half(ctx, kern, dev):
    rng = np.random.default_rng(11)
    n, inter = 9, 40
    gu = (rng.standard_normal((n, 2 * inter)) * 3).astype(F32)
    mh = dev.new(n * inter * 2)
    ctx.launch(kern("hy_silu_pair_half"), grid(n * inter), 256, 0, kargs("QQii", dev.put(gu), mh, inter, n))
    assert f16_steps(dev.get(mh, F16, (n, inter)), br.silu_pair_half(gu, inter)).max() <= 1


@pytest.mark.parametrize("n0,n,att_rows,hpk,hd", [(0, 40, 128, 4, 256), (100, 300, 64, 4, 256), (5, 77, 16, 2, 128)])
def test_attention_passes_on_cublas(ctx, kern, dev, n0, n, att_rows, hpk, hd):
    """hy_q_half_g, big's `attend` (two strided-batched GEMMs a KV group and hy_softmax_h per
    pass), hy_attn_out against exact attention over the mirror rows."""
    rng = np.random.default_rng(n0 + n)
    nkv = 2
    nh = nkv * hpk
    kmir = rng.standard_normal((n0 + n, nkv, hd)).astype(F16)
    vmir = rng.standard_normal((n0 + n, nkv, hd)).astype(F16)
    qg = rng.standard_normal((n, nh, hd)).astype(F32)
    gate = rng.standard_normal((n, nh, hd)).astype(F32)
    scale = 1 / np.sqrt(hd)
    qh, aog = dev.new(n * nh * hd * 2), dev.new(n * nh * hd * 4)
    bis, out = dev.new(n * nh * 4), dev.new(n * nh * hd * 2)
    ctx.launch(kern("hy_q_half_g", hpk, hd), grid(qg.size), 256, 0, kargs("QQiiii", dev.put(qg), qh, n, nh, hpk, hd))
    fx = type("Fx", (), {"softmax_h": kern("hy_softmax_h", hpk, hd)})
    bs, bp = (dev.new(x) for x in score_bytes(n0, n, 0, nkv, hpk, att_rows, 0))
    attend(ctx, fx, dev.put(kmir), dev.put(vmir), qh, aog, bis, bs, bp, n0, n, 0, nkv, hpk, hd, scale, att_rows)
    ctx.launch(kern("hy_attn_out", hpk, hd), grid(n * nh * hd), 256, 0,
               kargs("QQQQiiii", aog, bis, dev.put(gate), out, nh, n, hpk, hd))
    want = kr.attention(qg, kmir, vmir, n0, scale, gate)
    assert rel_rms(dev.get(out, F16, (n, nh * hd)).astype(F32), want) < 3e-3


@pytest.mark.parametrize("n0,n,hpk,hd,gated", [(0, 40, 4, 256, True), (100, 300, 4, 256, True), (5, 77, 2, 128, False),
                                               (0, 1, 4, 256, True), (33, 129, 2, 128, True)])
def test_flash_attention(ctx, kern, dev, n0, n, hpk, hd, gated):
    """hy_flash_h (queries as hy_qk's f16 copy, rows [n0, n0 + n) of the mirror just written)
    against exact attention; the mirror rows past them hold NaN, which no output may see."""
    rng = np.random.default_rng(n0 + n + hpk)
    nkv = 2
    nh = nkv * hpk
    kmir = rng.standard_normal((n0 + n, nkv, hd)).astype(F16)
    vmir = rng.standard_normal((n0 + n, nkv, hd)).astype(F16)
    nan = np.full((40, nkv, hd), np.nan, F16)
    qg = rng.standard_normal((n, nh, hd)).astype(F32)
    gate = rng.standard_normal((n, nh, hd)).astype(F32) if gated else None
    scale = 1 / np.sqrt(hd)
    out = dev.new(n * nh * hd * 2)
    ctx.launch(kern("hy_flash_h", hpk, hd), (-(-n // 16), nkv), 32 * hpk, flash_smem(hpk, hd),
               kargs("QQQQQiiif", dev.put(qg.astype(F16)), dev.put(np.concatenate([kmir, nan])),
                     dev.put(np.concatenate([vmir, nan])), dev.put(gate) if gated else 0, out, n, n0, nkv, scale))
    want = kr.attention(qg, kmir, vmir, n0, scale, gate)
    got = dev.get(out, F16, (n, nh * hd)).astype(F32)
    assert np.isfinite(got).all()
    assert rel_rms(got, want) < 3e-3
