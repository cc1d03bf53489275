"""The small path's weight side on a device (kernels/hyb_mma.cuh, hybrid/repack, mma, mats):
card repack == host repack byte for byte; every hy_mmp / hy_mmv variant against the float64 product of
the decoded q4tp weights, its three epilogues, and the bit-for-bit row invariance; rows_matvec;
hy_split / hy_rmsnorm2; the VRAM budget and the plan arena.

Tolerances (relative RMS against float64): plain and residual outputs 2e-6 (exact 4-bit weights
times three bf16 planes, f32 accumulation: ~1e-7 expected; two planes would give ~5e-6, bf16
activations ~1e-3); the gate/up pair 2e-5 (its output planes keep 16 bits: 2^-17 an element)."""

import numpy as np
import pytest

from cortiq_drv import knobs
from cortiq_drv.cmf import f16, q4tp
from cortiq_drv.cu import Buf, capture
from cortiq_drv.cu.nvrtc import compile_cubin, load
from cortiq_drv.errors import Declined
from cortiq_drv.host.ops import silu
from cortiq_drv.hybrid import kernels_ref as kr
from cortiq_drv.hybrid import mma
from cortiq_drv.hybrid.mats import MatStore
from cortiq_drv.hybrid.repack import (pair_map, planes_bytes, random_q4tp, repack_on_card,
                                      repack_q4tp, repack_rows, repack_rows_on_card)

pytestmark = pytest.mark.gpu
# (NT, TB, KS, staged): NT 0: hy_mmv (one or two rows; staged: hy_mmvs), 1 and 2: hy_mmp_{NT}
VARIANTS = [(*v, st) for v in mma.MMP_VARIANTS for st in (False, True) if v[0] == 0 or not st]


def vid(v):
    return "%d_%d_%d" % v[:3] + ("s" if v[3] else "")


@pytest.fixture(scope="module")
def fx(ctx):
    # hyb.cu's weight-side pieces alone (the same kernels, a third of the compile)
    return mma.MmaFuncs(ctx, load(ctx, compile_cubin(mma.weight_side_source(), {}, ctx.arch)))


@pytest.fixture
def bufs():
    held = []
    yield held
    for b in held:
        b.close()


@pytest.fixture
def store(ctx, fx):
    s = MatStore(ctx, fx)
    yield s
    s.close()


def planes(ctx, x, bufs, stride=None):
    """x [n, cols] f32 as uploaded planes with `stride` elements a row (room for 16 rows), each
    row's columns in fragment order."""
    n, cols = x.shape
    stride = stride or cols
    out = []
    for plane in kr.put3(x):
        a = np.zeros((mma.NMAX, stride), dtype=np.uint16)
        a[:n, kr.plane_cols(cols)] = plane
        out.append(Buf.from_array(ctx, a))
    bufs.extend(out)
    return mma.Planes(out[0].ptr, out[1].ptr, out[2].ptr, stride)


def rel_rms(got, ref):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return float(np.sqrt(((got - ref) ** 2).sum() / (ref ** 2).sum()))


def launch(ctx, fx, ms, p, n, var, y):
    y.memset(0xFF)
    ms.launch(ctx, fx, p, n, *var)
    return y.to_host(np.float32)


@pytest.mark.parametrize("rows,cols", [(48, 96), (40, 64), (17, 1056), (1, 32), (33, 4096)])
def test_card_repack_matches_host(ctx, fx, rows, cols):
    p = random_q4tp(rows, cols, np.random.default_rng(rows + cols))
    hn, hc, hl = repack_q4tp(p, rows, cols)
    t, cc, ld = repack_on_card(ctx, fx, [p], rows, rows, cols)
    try:
        assert t.view(0, hn.nbytes).to_host().tobytes() == hn.tobytes()
        assert cc.to_host().tobytes() == hc.tobytes()
        assert ld.view(0, hl.nbytes).to_host().tobytes() == hl.tobytes()
        params_off, codes_off, stride = q4tp.sections(rows, cols)
        b = np.frombuffer(p, np.uint8)
        t2, cc2, ld2 = repack_rows_on_card(ctx, fx, b[:params_off], b[params_off:codes_off],
                                           b[codes_off:], stride, rows, cols)
        assert t2.view(0, hn.nbytes).to_host().tobytes() == hn.tobytes()
        assert cc2.to_host().tobytes() == hc.tobytes()
        assert ld2.view(0, hl.nbytes).to_host().tobytes() == hl.tobytes()
        t2.close()
    finally:
        t.close()


@pytest.mark.parametrize("inter,cols", [(24, 64), (40, 96), (8, 1056)])
def test_card_pair_repack_matches_host(ctx, fx, inter, cols):
    rng = np.random.default_rng(inter * cols)
    g, u = random_q4tp(inter, cols, rng), random_q4tp(inter, cols, rng)
    hn, hc, hl = repack_rows([(g, inter), (u, inter)], 2 * inter, cols, pair_map)
    t, cc, ld = repack_on_card(ctx, fx, [g, u], inter, 2 * inter, cols)
    try:
        assert t.view(0, hn.nbytes).to_host().tobytes() == hn.tobytes()
        assert cc.to_host().tobytes() == hc.tobytes()
        assert ld.view(0, hl.nbytes).to_host().tobytes() == hl.tobytes()
    finally:
        t.close()


def two_mats(store, cols, rng):
    """Two matrices of one width (40 and 17 rows: odd tile counts, a ragged last tile) and their
    float64 weights."""
    out = []
    for key, rows in (("a", 40), ("b", 17)):
        p = random_q4tp(rows, cols, rng)
        out.append((store.hmat(key, p, rows, cols), q4tp.decode(p, rows, cols).astype(np.float64)))
    return out


# Groups a warp walks: 1056: 4 or 5 at KS 8 (2 or 3 at KS 16), too few for an unrolled run of
# whole stages (hy_mmp_run's UNR, TB 2); 4096: 16 (8), unrolled runs alone; 5152: 20 or 21 (10
# or 11), unrolled runs, whole stages after them and a last partial stage.
WIDTHS = [1056, 4096, 5152]


@pytest.mark.parametrize("cols", WIDTHS)
@pytest.mark.parametrize("var", VARIANTS, ids=vid)
def test_mmp_matches_decode(ctx, fx, store, bufs, cols, var):
    rng = np.random.default_rng(cols + 100 * var[0] + 10 * var[1] + var[2] + 1000 * var[3])
    (ma, wa), (mb, wb) = two_mats(store, cols, rng)
    ya, yb = Buf.new(ctx, 16 * 48 * 4), Buf.new(ctx, 16 * 20 * 4)
    res = rng.standard_normal((16, 20)).astype(np.float32)
    rb = Buf.from_array(ctx, res)
    bufs += [ya, yb, rb]
    ms = mma.mmaset(ctx, [mma.JobSpec(ma, ya.ptr, 0, 48, 40), mma.JobSpec(mb, yb.ptr, rb.ptr, 20, 17)])
    worst = 0.0
    for n in range(1, mma.rows_cap(var[0]) + 1):
        x = rng.standard_normal((n, cols)).astype(np.float32)
        p = planes(ctx, x, bufs)
        ya.memset(0xFF)
        yb.memset(0xFF)
        ms.launch(ctx, fx, p, n, *var)
        ga = ya.to_host(np.float32, (16, 48))[:n, :40]
        gb = yb.to_host(np.float32, (16, 20))[:n, :17]
        ref_a = x.astype(np.float64) @ wa.T
        ref_b = res[:n, :17].astype(np.float64) + x.astype(np.float64) @ wb.T
        worst = max(worst, rel_rms(ga, ref_a), rel_rms(gb, ref_b))
        # the padding of the outputs' rows is not written
        assert np.isnan(ya.to_host(np.float32, (16, 48))[:n, 40:]).all()
    assert worst <= 2e-6, f"hy_mmp_{var}: relative RMS {worst:.3g}"


@pytest.mark.parametrize("var", VARIANTS, ids=vid)
def test_residual_in_place(ctx, fx, store, bufs, var):
    rng = np.random.default_rng(5 + var[0] + var[1] + var[2])
    cols = 1056
    (ma, wa), _ = two_mats(store, cols, rng)
    n = mma.rows_cap(var[0])
    h = rng.standard_normal((n, 40)).astype(np.float32)
    hb = Buf.from_array(ctx, h)
    bufs.append(hb)
    ms = mma.mmaset(ctx, [mma.JobSpec(ma, hb.ptr, hb.ptr, 40, 40)])
    x = rng.standard_normal((n, cols)).astype(np.float32)
    ms.launch(ctx, fx, planes(ctx, x, bufs), n, *var)
    got = hb.to_host(np.float32, (n, 40))
    err = rel_rms(got, h.astype(np.float64) + x.astype(np.float64) @ wa.T)
    assert err <= 2e-6, f"residual in place: relative RMS {err:.3g}"


@pytest.mark.parametrize("var", VARIANTS, ids=vid)
def test_pair_epilogue(ctx, fx, store, bufs, var):
    rng = np.random.default_rng(11 + var[0] + 2 * var[1] + var[2])
    inter, cols = 40, 1056
    g, u = random_q4tp(inter, cols, rng), random_q4tp(inter, cols, rng)
    m = store.hmat_pair("gu", g, u, inter, cols)
    wg, wu = (q4tp.decode(b, inter, cols).astype(np.float64) for b in (g, u))
    stride = 64
    p0, p1 = Buf.new(ctx, 16 * stride * 2), Buf.new(ctx, 16 * stride * 2)
    bufs += [p0, p1]
    ms = mma.mmaset_pair(ctx, m, p0, p1, stride)
    worst = 0.0
    for n in range(1, mma.rows_cap(var[0]) + 1):
        x = rng.standard_normal((n, cols)).astype(np.float32)
        ms.launch(ctx, fx, planes(ctx, x, bufs), n, *var)
        hi = f16.from_bf16(p0.to_host(np.uint16, (16, stride))[:n, kr.plane_cols(inter)]).astype(np.float64)
        lo = f16.from_bf16(p1.to_host(np.uint16, (16, stride))[:n, kr.plane_cols(inter)]).astype(np.float64)
        a, b = x.astype(np.float64) @ wg.T, x.astype(np.float64) @ wu.T
        worst = max(worst, rel_rms(hi + 2 * lo, silu(a) * b))
    assert worst <= 2e-5, f"pair {var}: relative RMS {worst:.3g}"


@pytest.mark.parametrize("ks", [8, 16])
@pytest.mark.parametrize("cols", WIDTHS)
def test_rows_bit_for_bit_in_any_call(ctx, fx, store, bufs, ks, cols):
    """Row i of an n-row call (any NT, TB, form, position in the call) == the row in a one-row
    call."""
    rng = np.random.default_rng(ks + cols)
    (ma, _), _ = two_mats(store, cols, rng)
    y = Buf.new(ctx, 16 * 40 * 4)
    bufs.append(y)
    ms = mma.mmaset(ctx, [mma.JobSpec(ma, y.ptr, 0, 40, 40)])
    x = rng.standard_normal((16, cols)).astype(np.float32)
    one = np.stack([launch(ctx, fx, ms, planes(ctx, x[i:i + 1], bufs), 1, (1, 1, ks), y)[:40]
                    for i in range(16)])
    forms = [(0, 1, False, False), (0, 2, False, False), (0, 1, True, False), (0, 2, True, False),
             (1, 1, False, False), (1, 2, False, False), (2, 1, False, False), (2, 2, False, False)]
    # hy_mmr: KS 8, 3..8 rows; four tiles a block: hy_mmp_2 at KS 8
    forms += [(1, 1, False, True), (1, 2, False, True), (2, 4, False, False)] if ks == 8 else []
    for nt, tb, st, lean in forms:
        for n in [1, 2, 3, 5, 8, 9, 13, 16]:
            if n > mma.rows_cap(nt) or (lean and n < 3):
                continue
            var = (nt, tb, ks, st, lean)
            got = launch(ctx, fx, ms, planes(ctx, x[:n], bufs), n, var, y).reshape(16, 40)
            assert got[:n].tobytes() == one[:n].tobytes(), f"{nt}_{tb}_{ks} staged={st} lean={lean} n={n}"
            rev = launch(ctx, fx, ms, planes(ctx, x[:n][::-1].copy(), bufs), n, var, y)
            assert rev.reshape(16, 40)[:n][::-1].tobytes() == one[:n].tobytes(), f"reversed n={n}"


@pytest.mark.parametrize("pair", [False, True], ids=["plain", "pair"])
@pytest.mark.parametrize("ks", [8, 16])
def test_many_items_rows_bit_for_bit(ctx, fx, store, bufs, ks, pair):
    """Sets of many items a block: a matrix of 32 760 rows (2048 tiles, the last ragged), or a
    pair of two 16 376-row halves (2047 tiles), 64 wide. Row i of every multi-row call equals the
    row in a one-row call bit for bit; the one-row outputs against float64 as in
    test_mmp_matches_decode and test_pair_epilogue."""
    rng = np.random.default_rng(70 + ks + pair)
    rows, cols, stride = 32760, 64, 16384
    if pair:
        inter = rows = 16376  # each half's rows: the outputs a row
        g, u = random_q4tp(inter, cols, rng), random_q4tp(inter, cols, rng)
        ms_mat = store.hmat_pair("items", g, u, inter, cols)
        wg, wu = (q4tp.decode(b, inter, cols).astype(np.float64) for b in (g, u))
        outs = [Buf.new(ctx, 16 * stride * 2) for _ in range(2)]
        ms = mma.mmaset_pair(ctx, ms_mat, outs[0], outs[1], stride)
    else:
        pl = random_q4tp(rows, cols, rng)
        w = q4tp.decode(pl, rows, cols).astype(np.float64)
        outs = [Buf.new(ctx, 16 * rows * 4)]
        ms = mma.mmaset(ctx, [mma.JobSpec(store.hmat("items", pl, rows, cols), outs[0].ptr, 0, rows, rows)])
    bufs += outs
    x = rng.standard_normal((16, cols)).astype(np.float32)

    def call(xs, var):
        """The outputs of the rows xs in one call: f32 [n][rows], or the pair's bf16 planes
        [n][2][inter]."""
        n = len(xs)
        for o in outs:
            o.memset(0xFF)
        ms.launch(ctx, fx, planes(ctx, xs, bufs), n, *var)
        if pair:
            return np.stack([o.to_host(np.uint16, (16, stride))[:n, kr.plane_cols(rows)] for o in outs], axis=1)
        return outs[0].to_host(np.float32, (16, rows))[:n]

    ones = np.concatenate([call(x[i:i + 1], (0, 2, ks, False)) for i in range(16)])
    for n in (3, 4, 5, 8, 9, 16):
        nt = (n + 7) // 8
        for tb in (1, 2, 4) if (nt, 4, ks) in fx.mmp else (1, 2):
            got = call(x[:n], (nt, tb, ks, False))
            assert got.tobytes() == ones[:n].tobytes(), f"n={n} tb={tb}"
    xd = x.astype(np.float64)
    if pair:
        hi, lo = (f16.from_bf16(ones[:, k]).astype(np.float64) for k in (0, 1))
        a, b = xd @ wg.T, xd @ wu.T
        err, tol = rel_rms(hi + 2 * lo, silu(a) * b), 2e-5
    else:
        err, tol = rel_rms(ones, xd @ w.T), 2e-6
    assert err <= tol, f"relative RMS {err:.3g}"


@pytest.mark.parametrize("ks", [8, 16])
def test_staged_blocks_walk_many_items(ctx, fx, store, bufs, ks):
    """hy_mmvs on a grid of two blocks, each walking several items (the LM head's case: the staged
    columns reused, each next item's first B fragments read from them) == hy_mmv, bit for bit."""
    rng = np.random.default_rng(50 + ks)
    cols = 1056
    m = store.hmat("many", random_q4tp(200, cols, rng), 200, cols)
    y = Buf.new(ctx, 16 * 200 * 4)
    bufs.append(y)
    ms = mma.mmaset(ctx, [mma.JobSpec(m, y.ptr, 0, 200, 200)])
    p = planes(ctx, rng.standard_normal((1, cols)).astype(np.float32), bufs)
    for tb in (1, 2):
        want = launch(ctx, fx, ms, p, 1, (0, tb, ks, False), y)
        key = (tb, ks, cols, 1)
        fx.mmvs_shape[key] = (fx.staged_shape(tb, ks, cols, 1)[0], 2)
        ms._calls.clear()
        try:
            got = launch(ctx, fx, ms, p, 1, (0, tb, ks, True), y)
        finally:
            del fx.mmvs_shape[key]
            ms._calls.clear()
        assert got.tobytes() == want.tobytes(), tb


def test_graph_replay_equals_direct(ctx, fx, store, bufs):
    rng = np.random.default_rng(21)
    (ma, _), _ = two_mats(store, 1056, rng)
    y = Buf.new(ctx, 16 * 40 * 4)
    bufs.append(y)
    ms = mma.mmaset(ctx, [mma.JobSpec(ma, y.ptr, 0, 40, 40)])
    p = planes(ctx, rng.standard_normal((5, 1056)).astype(np.float32), bufs)
    direct = launch(ctx, fx, ms, p, 5, ms.variant(5), y)
    y.memset(0xFF)
    g = capture(ctx, lambda: ms.run(ctx, fx, p, 1056, 5))
    try:
        g.launch()
        assert y.to_host(np.float32).tobytes() == direct.tobytes()
    finally:
        g.close()


def test_rows_matvec(ctx, fx, store):
    rng = np.random.default_rng(37)
    p = random_q4tp(72, 1056, rng)
    m = store.hmat("rm", p, 72, 1056)
    x = rng.standard_normal((37, 1056)).astype(np.float32)
    y = mma.rows_matvec(ctx, fx, m, x)
    err = rel_rms(y, x.astype(np.float64) @ q4tp.decode(p, 72, 1056).astype(np.float64).T)
    assert err <= 2e-6, f"rows_matvec: relative RMS {err:.3g}"
    for i in (0, 15, 16, 36):
        assert mma.rows_matvec(ctx, fx, m, x[i:i + 1]).tobytes() == y[i:i + 1].tobytes(), i


def test_split_is_put3(ctx, fx, bufs):
    rng = np.random.default_rng(2)
    n, cols, xs, os_ = 5, 96, 104, 136
    x = (rng.standard_normal((n, xs)) * np.exp2(rng.integers(-30, 30, (n, xs)))).astype(np.float32)
    xb = Buf.from_array(ctx, x)
    pb = [Buf.new(ctx, n * os_ * 2) for _ in range(3)]
    bufs += [xb, *pb]
    for b in pb:
        b.memset(0)
    mma.split(ctx, fx, mma.Planes(pb[0].ptr, pb[1].ptr, pb[2].ptr, os_), xb, xs, cols, n)
    for got, want in zip(pb, kr.put3(x[:, :cols])):
        g = got.to_host(np.uint16, (n, os_))
        assert g[:, kr.plane_cols(cols)].tobytes() == want.tobytes()
        assert (g[:, cols:] == 0).all()


@pytest.mark.parametrize("gemma", [False, True])
def test_rmsnorm2(ctx, fx, bufs, gemma):
    rng = np.random.default_rng(3 + gemma)
    n, hidden, ps = 3, 2496, 2560
    x = rng.standard_normal((n, hidden)).astype(np.float32)
    w = rng.standard_normal(hidden).astype(np.float32)
    xb, wb, xf = Buf.from_array(ctx, x), Buf.from_array(ctx, w), Buf.new(ctx, n * hidden * 4)
    pb = [Buf.new(ctx, n * ps * 2) for _ in range(3)]
    bufs += [xb, wb, xf, *pb]
    p = mma.Planes(pb[0].ptr, pb[1].ptr, pb[2].ptr, ps)
    mma.rmsnorm2(ctx, fx, xb, wb, xf, hidden, 1e-6, gemma, p, n)
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64 ** 2).mean(axis=1, keepdims=True) + 1e-6) * ((1 + w) if gemma else w)
    y = xf.to_host(np.float32, (n, hidden))
    assert rel_rms(y, ref) <= 1e-6
    for got, want in zip(pb, kr.put3(y)):
        assert got.to_host(np.uint16, (n, ps))[:, kr.plane_cols(hidden)].tobytes() == want.tobytes()
    # without the f32 output the planes are the same
    for b in pb:
        b.memset(0)
    mma.rmsnorm2(ctx, fx, xb, wb, None, hidden, 1e-6, gemma, p, n)
    for got, want in zip(pb, kr.put3(y)):
        assert got.to_host(np.uint16, (n, ps))[:, kr.plane_cols(hidden)].tobytes() == want.tobytes()


def test_budget_declines_a_matrix_that_does_not_fit(ctx, store, monkeypatch):
    p = random_q4tp(512, 4096, np.random.default_rng(4))
    monkeypatch.setenv("CMF_GPU_VRAM_MB", "1")
    knobs.reset()
    try:
        held = ctx.resident
        with pytest.raises(Declined, match="do not fit"):
            store.hmat("big", p, 512, 4096)
        assert ctx.resident == held and "big" not in store.mats
    finally:
        monkeypatch.delenv("CMF_GPU_VRAM_MB")
        knobs.reset()


def test_arena_holds_a_plans_matrices(ctx, fx, store, bufs):
    rng = np.random.default_rng(6)
    cols = 1056
    shapes = [("q", 40), ("k", 17), ("o", 64)]
    pays = {k: random_q4tp(r, cols, rng) for k, r in shapes}
    g, u = random_q4tp(24, cols, rng), random_q4tp(24, cols, rng)
    need = sum(planes_bytes(r, cols) for _, r in shapes) + planes_bytes(48, cols)
    with store.plan_arena(need) as arena:
        mats = [store.hmat(k, pays[k], r, cols) for k, r in shapes]
        mats.append(store.hmat_pair("gu", g, u, 24, cols))
    assert len(store.arenas) == 1 and arena.used <= need
    base = arena.buf.ptr
    for m in mats:
        assert not m.w.owned and base <= m.w.ptr < base + need and m.held == 0
    y = Buf.new(ctx, 16 * 64 * 4)
    bufs.append(y)
    ms = mma.mmaset(ctx, [mma.JobSpec(mats[2], y.ptr, 0, 64, 64)])
    x = rng.standard_normal((3, cols)).astype(np.float32)
    ms.run(ctx, fx, planes(ctx, x, bufs), cols, 3)
    got = y.to_host(np.float32, (16, 64))[:3]
    ref = x.astype(np.float64) @ q4tp.decode(pays["o"], 64, cols).astype(np.float64).T
    assert rel_rms(got, ref) <= 2e-6
