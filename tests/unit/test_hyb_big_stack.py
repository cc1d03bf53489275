"""`big._Mul.stacked` on a fake card: weights that share an input expand (or copy, for dense f16
rows) one after another into the expansion buffer and run as one GEMM when they fit it together,
else as a GEMM (or bands) each into the same columns of the output rows."""

import numpy as np

import _fakecard
from cortiq_drv.hybrid.big import _Mul
from cortiq_drv.hybrid.launch import Stages


class GemmCtx(_fakecard.FakeCtx):
    def __init__(self):
        super().__init__()
        self.gemms = []

    def gemm(self, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, mode):
        self.gemms.append((m, n, k, int(getattr(a, "ptr", a)), int(getattr(c, "ptr", c)), ldc))


def _setup(wd_elems: int):
    ctx = GemmCtx()
    card = _fakecard.FakeCard(ctx, _fakecard.Heap(1 << 20))
    fx = card.funcs(4, 256)
    wd = card.new(wd_elems * 2)
    q = _fakecard.FakeMat(6, 40, 64, 0x1000, 0x2000, 0x3000, None)
    z = _fakecard.FakeMat(6, 24, 64, 0x5000, 0x6000, 0x7000, None)
    dense = card.upload(np.arange(8 * 64, dtype=np.uint16))
    return ctx, fx, wd, [q, z, (dense, 8)]


def test_stacked_is_one_gemm_when_the_weights_fit_together():
    ctx, fx, wd, parts = _setup(72 * 64)
    _Mul(ctx, fx, wd, 72 * 64, 5, Stages(ctx, None, False)).stacked(parts, 0x4000, 0x8000, 76, 64)
    ex = [l for l in ctx.launches if l.name == "hy_expand_pr"]
    # q at the buffer's start, z after its 40 rows; the dense rows copied after z's
    assert [int.from_bytes(l.args[3], "little") - wd.ptr for l in ex] == [0, 40 * 64 * 2]
    assert wd.read(np.uint16, 8 * 64, 64 * 64 * 2).tolist() == list(range(8 * 64))
    assert ctx.gemms == [(72, 5, 64, wd.ptr, 0x8000, 76)]


def test_stacked_falls_back_to_a_gemm_each():
    ctx, fx, wd, parts = _setup(40 * 64)
    dense = parts[2][0]
    _Mul(ctx, fx, wd, 40 * 64, 5, Stages(ctx, None, False)).stacked(parts, 0x4000, 0x8000, 76, 64)
    # each weight's rows at its columns of the output rows: q at 0, z at 40, the dense rows at 64
    assert [(g[0], g[3], g[4] - 0x8000, g[5]) for g in ctx.gemms] == [
        (40, wd.ptr, 0, 76), (24, wd.ptr, 40 * 4, 76), (8, dense.ptr, 64 * 4, 76)]
