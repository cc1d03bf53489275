"""The prompt path's numpy kernel references (hybrid/kernels_big_ref.py) against the host arm's
math: the expansion against q4tp.decode (bits), the chunked delta rule against the serial scan,
the GDN glue against the small path's front, the attention passes (two GEMMs a KV group emulated
in float32 over f16 operands) against exact attention, the pair's FFN middle against
silu(gate) * up; big's launch constants against the kernels' macros; big on a fake card.

Tolerances: expansion bit-exact; f32 paths relative RMS <= 1e-5 (2e-5 for the chunked scan's
regrouped sums); paths through f16 operands relative RMS <= 3e-3.
"""

import re
from pathlib import Path

import numpy as np
import pytest

import _fakecard
from _ref64 import rel_rms
from cortiq_drv.cmf import q4tp
from cortiq_drv.graph import GraphAttn, SpecTail
from cortiq_drv.hybrid.admit import admit
from cortiq_drv.hybrid.plan import GdnL, plan_for
from cortiq_drv.hybrid.state import HState
from cortiq_drv.host.gdn import decay_beta
from cortiq_drv.host.ops import F32, rms_norm, silu
from cortiq_drv.hybrid import api, bigfit
from cortiq_drv.hybrid import kernels_big_ref as br
from cortiq_drv.hybrid import kernels_ref as kr
from cortiq_drv.hybrid.big import (CHUNK_SMEM, CHUNK_WARPS, CONV_ROWS, WY_SMEM, _Mul, att_passes, big,
                                   flash_smem)
from cortiq_drv.hybrid.launch import Stages
from cortiq_drv.hybrid.repack import pair_map, random_q4tp, repack_q4tp, repack_rows


@pytest.mark.parametrize("rows,cols", [(1, 32), (16, 64), (17, 96), (40, 1056)])
def test_expand_is_decode_in_f16(rows, cols):
    rng = np.random.default_rng(rows * 31 + cols)
    p = random_q4tp(rows, cols, rng)
    nib, codes, lad = repack_q4tp(p, rows, cols)
    want = q4tp.decode(p, rows, cols).astype(np.float16)
    got = br.expand(nib, codes, lad, rows, cols)
    assert got.view(np.uint16).tobytes() == want.view(np.uint16).tobytes()
    ntile = -(-rows // 16)
    for t0 in range(ntile):
        band = br.expand(nib, codes, lad, rows, cols, t0, 1)
        assert band.tobytes() == want[16 * t0:16 * t0 + 16].tobytes()


def test_pair_gemm_then_silu_pair_is_the_ffn_middle():
    rng = np.random.default_rng(5)
    inter, cols, n = 24, 64, 5
    g, u = random_q4tp(inter, cols, rng), random_q4tp(inter, cols, rng)
    nib, codes, lad = repack_rows([(g, inter), (u, inter)], 2 * inter, cols, pair_map)
    w = br.expand(nib, codes, lad, 2 * inter, cols).astype(F32)  # [2 inter, cols] pair order
    x = rng.standard_normal((n, cols)).astype(np.float16).astype(F32)
    gu = x @ w.T
    mid = br.silu_pair_half(gu, inter).astype(F32) * F32(16)
    gw = q4tp.decode(g, inter, cols).astype(np.float16).astype(F32)
    uw = q4tp.decode(u, inter, cols).astype(np.float16).astype(F32)
    want = silu(x @ gw.T) * (x @ uw.T)
    assert rel_rms(mid, want) < 3e-3


def gdn_inputs(rng, n, nk=2, nv=4, dk=128, dv=128, kk=4, hidden=64):
    cdim = 2 * nk * dk + nv * dv
    raw = rng.standard_normal((n, cdim)).astype(F32)
    ring = rng.standard_normal((kk - 1, cdim)).astype(F32)
    taps = (rng.standard_normal((cdim, kk)) * 0.5).astype(F32)
    xn = rng.standard_normal((n, hidden)).astype(F32)
    aw = (rng.standard_normal((nv, hidden)) * 0.2).astype(F32)
    bw = (rng.standard_normal((nv, hidden)) * 0.2).astype(F32)
    a_log = rng.uniform(-2, 1, nv).astype(F32)
    dt_bias = rng.uniform(-1, 1, nv).astype(F32)
    return raw, ring, taps, xn, aw, bw, a_log, dt_bias


def test_gdn_glue_is_the_small_front():
    rng = np.random.default_rng(1)
    raw, ring, taps, xn, aw, bw, a_log, dt_bias = gdn_inputs(rng, 9)
    nk, dk = 2, 128
    cq_want, _ = kr.gdn_front(raw, ring, taps, xn, aw, bw, a_log, dt_bias, nk, dk)
    assert rel_rms(br.gdn_conv32(raw, ring, taps, nk, dk), cq_want) < 1e-6


def _assert_delta_is_scan(cq, ab, a_log, dt_bias, s0):
    """The chunked delta rule (2 key heads, its gates from the projections ab) against the serial
    scan over the host's gates of ab (decay, beta): outputs and end state."""
    nv = a_log.shape[0]
    gb = np.concatenate(decay_beta(ab[:, :nv], ab[:, nv:], a_log, dt_bias), axis=1).astype(F32)
    o_want, s_want = kr.gdn_scan(cq, gb, s0, 2)
    o, s = br.gdn_delta(cq, ab, a_log, dt_bias, s0, 2)
    assert rel_rms(o, o_want) < 2e-5
    assert rel_rms(s, s_want) < 2e-5


@pytest.mark.parametrize("n", [1, 17, 64, 65, 150])
def test_chunked_delta_rule_is_the_serial_scan(n):
    rng = np.random.default_rng(n)
    raw, ring, taps, xn, aw, bw, a_log, dt_bias = gdn_inputs(rng, n)
    cq = br.gdn_conv32(raw, ring, taps, 2, 128)
    ab = np.concatenate([xn @ aw.T, xn @ bw.T], axis=1)
    s0 = (rng.standard_normal((4, 128, 128)) * 0.1).astype(F32)
    _assert_delta_is_scan(cq, ab, a_log, dt_bias, s0)


def test_chunked_delta_rule_survives_a_vanishing_decay():
    rng = np.random.default_rng(3)
    raw, ring, taps, xn, aw, bw, a_log, dt_bias = gdn_inputs(rng, 70)
    cq = br.gdn_conv32(raw, ring, taps, 2, 128)
    ab = np.concatenate([xn @ aw.T, xn @ bw.T], axis=1)
    # a decay of exp(-thousands): 0 in f32, its log under the floor
    ab[5:9, :4] = 1e4
    s0 = np.zeros((4, 128, 128), F32)
    _assert_delta_is_scan(cq, ab, a_log, dt_bias, s0)


def test_gdn_out_h_is_the_gated_norm():
    rng = np.random.default_rng(2)
    o, z = rng.standard_normal((2, 5, 4 * 128)).astype(F32)
    norm = rng.uniform(0.5, 1.5, 128).astype(F32)
    want = kr.gdn_out(o, z, norm, 4, 1e-6)
    assert rel_rms(br.gdn_out_h(o, z, norm, 4, 1e-6).astype(F32), want) < 1e-3


def test_rmsnorm_h():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 96)).astype(F32) * 4
    w = rng.standard_normal(96).astype(F32) * 0.1
    assert rel_rms(br.rmsnorm_h(x, w, 1e-6, True).astype(F32), rms_norm(x, w, 1e-6, True)) < 1e-3


def attention_by_passes(qg, gate, kmir, vmir, n0, scale, att_rows):
    """big's attention over mirror rows [0, n0 + n): passes of query rows, per pass the score
    GEMM, hy_softmax_h, the value GEMM (float32 over f16 operands), then hy_attn_out."""
    n, nh, hd = qg.shape
    nkv = kmir.shape[1]
    hpk = nh // nkv
    qh = br.q_half_g(qg, nkv).astype(F32)  # [nkv, n, hpk, hd]
    ao = np.zeros((nkv, n, hpk, hd), F32)
    isum = np.zeros((nkv, n * hpk), F32)
    kf, vf = kmir.astype(F32), vmir.astype(F32)
    for b0, bn in att_passes(n0, n, 0, nh, att_rows):
        l_rows = n0 + b0 + bn
        q = qh[:, b0:b0 + bn].reshape(nkv, bn * hpk, hd)
        s = F32(scale) * np.einsum("gcd,kgd->gck", q, kf[:l_rows])  # [nkv, cols, l_rows]
        p, inv = br.softmax_h(s.astype(F32), n0 + b0, 0, hpk)
        out = np.einsum("gck,kgd->gcd", p.astype(F32), vf[:l_rows])
        ao[:, b0:b0 + bn] = out.reshape(nkv, bn, hpk, hd)
        isum[:, b0 * hpk:(b0 + bn) * hpk] = inv
    return br.attn_out(ao, isum, gate)


@pytest.mark.parametrize("n0,n,att_rows", [(0, 17, 128), (5, 40, 16), (100, 33, 16)])
def test_attention_passes_are_attention(n0, n, att_rows):
    rng = np.random.default_rng(n0 + n)
    nh, nkv, hd = 8, 2, 64
    kmir = rng.standard_normal((n0 + n, nkv, hd)).astype(np.float16)
    vmir = rng.standard_normal((n0 + n, nkv, hd)).astype(np.float16)
    qg = rng.standard_normal((n, nh, hd)).astype(F32)
    gate = rng.standard_normal((n, nh, hd)).astype(F32)
    scale = 1 / np.sqrt(hd)
    want = kr.attention(qg, kmir, vmir, n0, scale, gate)
    got = attention_by_passes(qg, gate, kmir, vmir, n0, scale, att_rows).astype(F32)
    assert rel_rms(got, want) < 3e-3


def test_att_passes_cover_the_rows_and_shrink_under_the_cap():
    ps = att_passes(0, 300, 0, 16, 128)
    assert ps == [(0, 128), (128, 128), (256, 44)]
    # 1M keys x 128 rows x 16 heads x 4 bytes is past the 384 MiB cap: the pass halves to fit
    big = att_passes(1 << 20, 128, 0, 16, 128)
    assert sum(bn for _, bn in big) == 128 and all(bn == 64 for _, bn in big)
    assert att_passes(10, 16, 10, 4, 128) == [(0, 16)]


class _Macros(dict):
    """The object-like `#define`s of a kernel source as Python values (integer arithmetic without
    division), evaluated on first use; `given` (-D values) first."""

    def __init__(self, text: str, **given):
        super().__init__(given)
        self.body = {name: body.replace("\\\n", " ")
                     for name, body in re.findall(r"^#define (\w+) ((?:.*\\\n)*.*)$", text, re.M)}

    def __missing__(self, name: str) -> int:
        assert "/" not in self.body[name], name
        self[name] = eval(self.body[name], {"__builtins__": {}}, self)
        return self[name]


def test_launch_constants_are_the_kernels_macros():
    """big's launch geometry spells the kernels' macros (hyb_gdn_chunk.cuh, hyb_flash.cuh,
    hyb_big.cuh): a launch with less dynamic shared memory than the kernel uses would corrupt it;
    the small path's rows are the rows hy_gdn_scan4_out32 keeps room for (hyb_gdn.cuh)."""
    from cortiq_drv.hybrid.state import NMAX
    from cortiq_drv.kernels import source

    text = source("hyb.cu")
    m = _Macros(text)
    assert NMAX == m["HY_NMAX"]
    assert (WY_SMEM, CHUNK_SMEM) == (m["HB_WY_SMEM"], m["HB_CHUNK_SMEM"])
    assert (CHUNK_WARPS, CONV_ROWS, bigfit.SCAN_ROWS, br.CHUNK) == (m["HB_CW"], m["HB_CONV_R"], m["HB_C"], m["HB_C"])
    for hpk, hd in [(1, 64), (2, 128), (4, 256), (5, 96), (8, 256)]:
        assert flash_smem(hpk, hd) == _Macros(text, HPK=hpk, HD=hd)["HB_FLASH_SMEM"], (hpk, hd)


# ---- big on a fake card: what it launches and asks cuBLAS for ------------------------------

class GemmCtx(_fakecard.FakeCtx):
    """A fake context that also records cuBLAS calls."""

    def __init__(self):
        super().__init__()
        self.gemms = []

    def gemm(self, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, mode):
        self.gemms.append(("gemm", m, n, k, alpha, int(getattr(c, "ptr", c)), ldc, beta))

    def gemm_strided_batched_f16(self, ta, m, n, k, alpha, a, lda, sa, b, ldb, sb, c, ldc, sc, count, tb=False,
                                 beta=0.0):
        self.gemms.append(("batched", ta, m, n, k, lda, sa, ldb, sb, ldc, sc, count))


def kernel_formats() -> dict:
    """Every `extern "C"` kernel of the hybrid sources (hyb_big.cuh included) as kargs codes."""
    out = {}
    for path in sorted((Path(_fakecard.__file__).parents[2] / "cortiq_drv" / "kernels").glob("hyb_*.cuh")):
        for fn, params in _fakecard._SIG.findall(path.read_text()):
            if fn == _fakecard._MACRO:
                continue
            ps = [p.strip() for p in params.split(",") if p.strip()]
            out[fn] = "".join("Q" if "*" in p or p.startswith("u64") else "f" if p.split()[-2] == "float"
                              else "i" for p in ps)
    return out


def _prompt(hyb_tiny, chunks):
    """A fresh fake card; the tiny model's prompt through big in chunks of these sizes."""
    cmf, g = hyb_tiny
    ctx = GemmCtx()
    hs = HState(ctx, _fakecard.FakeCard(ctx, _fakecard.Heap(256 << 20)))
    p = plan_for(hs, cmf, g.layers, 0, None, None, g.nh, g.nkv, g.hd, g.rd, g.hidden, g.gemma, g.eps, g.scale,
                 g.invf, 0)
    pos = 0
    for n in chunks:
        assert admit(hs, p, g.layers, 1, 0, pos, n, 0) is None
        h = np.ones((n, g.hidden), F32)
        big(hs, p, 1, 0, range(pos, pos + n), h)
        pos += n
    return hs, ctx, p, g


def test_big_launches_match_the_kernel_signatures(hyb_tiny):
    hs, ctx, p, g = _prompt(hyb_tiny, [40, 17])
    fmts = kernel_formats()
    names = [l.name for l in ctx.launches]
    for l in ctx.launches:
        assert l.fmt == fmts[l.name], l.name
    n_gdn = sum(isinstance(l.attn, GraphAttn.Gdn) for l in g.layers)
    assert names.count("hy_gdn_chunk") == names.count("hy_gdn_wy") == 2 * n_gdn
    assert names.count("hy_qk") == 2 * (len(g.layers) - n_gdn)
    # the state moved on: GDN rows and mirror rows at the prompt's end
    assert all(s.next_pos == 57 for s in hs.gdn.values())
    assert all(m.stored == 57 for m in hs.kv.values())


@pytest.mark.parametrize("flash", [False, True])
def test_big_gemm_shapes(hyb_tiny, env, flash):
    env(CORTIQ_DRV_FLASH=int(flash))
    hs, ctx, p, g = _prompt(hyb_tiny, [40, 17])
    weights = [x for x in ctx.gemms if x[0] == "gemm"]
    # q | k | v or qkv | z | a | b as one GEMM (bigfit's strides), o or out; gate/up and down, per
    # layer and chunk
    assert len(weights) == 2 * 4 * len(g.layers)
    assert {x[2] for x in weights} == {40, 17}
    stacks = {(x[1], x[6]) for x in weights if x[7] == 0.0 and x[4] == 1.0 and x[1] == x[6]}
    want = {(bigfit.gdn_stride(l.mix), bigfit.gdn_stride(l.mix)) if isinstance(l.mix, GdnL) else
            (bigfit.attn_stride(l.mix, g.nkv, g.hd),) * 2 for l in p.layers}
    assert want <= stacks
    # down: alpha 16 into the residual (beta 1)
    inter = g.layers[0].ffn.gate.rows
    downs = [x for x in weights if x[4] == 16.0]
    assert len(downs) == 2 * len(g.layers) and all(x[3] == inter and x[7] == 1.0 for x in downs)
    hpk = g.nh // g.nkv
    scores = [x for x in ctx.gemms if x[0] == "batched" and x[1]]
    # hy_qk's f32 query copy (argument 7) only for the score GEMMs' path, and sized only there
    qgs = {int.from_bytes(l.args[7], "little") for l in ctx.launches if l.name == "hy_qk"}
    assert (qgs == {0}) == flash and ("hb_qg" in hs.scratch) != flash
    if flash:
        # attention in one kernel: no score GEMMs
        assert not scores and [l.name for l in ctx.launches].count("hy_flash_h") == 2 * sum(
            not isinstance(l.mix, GdnL) for l in p.layers)
        return
    # one pass a chunk (att_rows 128); the second chunk's keys are every row so far
    assert [(x[2], x[3], x[4], x[11]) for x in scores] == [(40, 40 * hpk, g.hd, g.nkv), (57, 17 * hpk, g.hd, g.nkv)]
    assert all(x[5] == g.nkv * g.hd and x[6] == g.hd and x[10] == x[2] * x[3] for x in scores)


def test_mul_expands_in_bands():
    ctx = GemmCtx()
    fx = _fakecard.FakeCard(ctx, _fakecard.Heap(1 << 20)).funcs(4, 256)
    m = _fakecard.FakeMat(6, 100, 64, 0x1000, 0x2000, 0x3000, None)
    mul = _Mul(ctx, fx, 0x9000, 2 * 16 * 64, 5, Stages(ctx, None, False))
    mul(m, 0x4000, 0x8000, 100)
    ex = [l for l in ctx.launches if l.name == "hy_expand_pr"]
    assert [int.from_bytes(l.args[6], "little", signed=True) for l in ex] == [0, 2, 4, 6]
    assert [int.from_bytes(l.args[7], "little", signed=True) for l in ex] == [2, 2, 2, 1]
    assert [(x[1], x[5] - 0x8000) for x in ctx.gemms] == [(32, 0), (32, 128), (32, 256), (4, 384)]
    ctx2 = GemmCtx()
    _Mul(ctx2, fx, 0x9000, 100 * 64, 5, Stages(ctx2, None, False))(m, 0x4000, 0x8000, 100)
    # the whole matrix in one launch: all seven tiles from tile 0
    assert [(l.name, int.from_bytes(l.args[6], "little"), int.from_bytes(l.args[7], "little"))
            for l in ctx2.launches] == [("hy_expand_pr", 0, 7)] and ctx2.gemms[0][1:4] == (100, 5, 64)


def test_batch_takes_a_prompt_chunk_to_big(hyb_tiny):
    cmf, g = hyb_tiny
    ctx = GemmCtx()
    hs = HState(ctx, _fakecard.FakeCard(ctx, _fakecard.Heap(256 << 20)))
    kw = dict(nh=g.nh, nkv=g.nkv, hd=g.hd, rd=g.rd, hidden=g.hidden, cap=4096, gemma=g.gemma, eps=g.eps,
              attn_scale=g.scale)
    h = np.ones((17, g.hidden), F32)
    assert api.batch(hs, cmf, 1, 0, g.layers, g.invf, h, positions=range(17), **kw).ok
    assert "hy_gdn_chunk" in [l.name for l in ctx.launches]
    assert all(s.next_pos == 17 for s in hs.gdn.values())
    # a verify window of 17 rows stays declined
    sp = SpecTail(g.lm, g.lm_rows, g.final_norm)
    assert api.batch(hs, cmf, 1, 0, g.layers, g.invf, h, positions=range(17, 34), spec=sp, **kw).status == "declined"
