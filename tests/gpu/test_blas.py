"""cuBLAS GEMMs against numpy (f64 reference): HALF, TF32, F32, strided-batched f16, each also
replayed from a captured graph."""

import numpy as np
import pytest

from cortiq_drv.blas import Gemm
from cortiq_drv.cu import Buf, Ctx, capture

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def ctx():
    c = Ctx.current()
    c.blas()  # the handle and workspace exist before any capture
    return c


def _rel(got, want):
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


# Relative Frobenius error bounds: f16 inputs are rounded on the host already (so only the
# accumulation differs), TF32 keeps 10 mantissa bits of each input, F32 is full precision.
_TOL = {Gemm.HALF: 1e-5, Gemm.TF32: 5e-3, Gemm.F32: 1e-5}


@pytest.mark.parametrize("mode", [Gemm.HALF, Gemm.TF32, Gemm.F32], ids=lambda m: m.name)
@pytest.mark.parametrize("rows", [1, 16, 17])
@pytest.mark.parametrize("graph", [False, True], ids=["direct", "graph"])
def test_gemm_row_major_weights(ctx, mode, rows, graph):
    # y[rows, out] = x[rows, in] W[out, in]^T, the reference's call
    out_f, in_f = 96, 160
    rng = np.random.default_rng(rows)
    dt = np.float16 if mode is Gemm.HALF else np.float32
    w = rng.standard_normal((out_f, in_f)).astype(dt)
    x = rng.standard_normal((rows, in_f)).astype(dt)
    wb, xb, yb = Buf.from_array(ctx, w), Buf.from_array(ctx, x), Buf.new(ctx, rows * out_f * 4)
    yb.memset(0)

    def run():
        ctx.gemm(True, False, out_f, rows, in_f, 1.0, wb, in_f, xb, in_f, 0.0, yb, out_f, mode)

    if graph:
        g = capture(ctx, run)
        assert not yb.to_host().any()
        g.launch()
        g.close()
    else:
        run()
    want = x.astype(np.float64) @ w.astype(np.float64).T
    assert _rel(yb.to_host(np.float32, (rows, out_f)), want) < _TOL[mode]
    wb.close(), xb.close(), yb.close()


def test_gemm_alpha_beta_and_no_transpose(ctx):
    # column-major C[m, n] = 2 A[m, k] B[k, n] + 0.5 C, f32
    m, n, k = 33, 17, 31
    rng = np.random.default_rng(7)
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n), (m, n)))
    ab, bb = Buf.from_array(ctx, a.T.copy()), Buf.from_array(ctx, b.T.copy())
    cb = Buf.from_array(ctx, c.T.copy())
    ctx.gemm(False, False, m, n, k, 2.0, ab, m, bb, k, 0.5, cb, m, Gemm.F32)
    want = 2.0 * a.astype(np.float64) @ b + 0.5 * c
    assert _rel(cb.to_host(np.float32, (n, m)).T, want) < 1e-5
    ab.close(), bb.close(), cb.close()


@pytest.mark.parametrize("graph", [False, True], ids=["direct", "graph"])
def test_strided_batched_f16(ctx, graph):
    # scores[h] = scale * K[h] Q[h]^T per head, as the reference's attention calls it:
    # K [heads, keys, hd] f16, Q [heads, rows, hd] f16 -> S [heads, rows, keys] f32
    heads, keys, rows, hd = 3, 40, 17, 64
    rng = np.random.default_rng(8)
    k = rng.standard_normal((heads, keys, hd)).astype(np.float16)
    q = rng.standard_normal((heads, rows, hd)).astype(np.float16)
    kb, qb, sb = Buf.from_array(ctx, k), Buf.from_array(ctx, q), Buf.new(ctx, heads * rows * keys * 4)
    scale = 0.125

    def run():
        ctx.gemm_strided_batched_f16(True, keys, rows, hd, scale, kb, hd, keys * hd,
                                     qb, hd, rows * hd, sb, keys, rows * keys, heads)

    if graph:
        g = capture(ctx, run)
        g.launch()
        g.close()
    else:
        run()
    want = scale * np.einsum("hkd,hrd->hrk", k.astype(np.float64), q.astype(np.float64))
    assert _rel(sb.to_host(np.float32, (heads, rows, keys)), want) < 1e-5
    kb.close(), qb.close(), sb.close()


def test_cublas_error_names_the_status(ctx):
    from cortiq_drv.errors import CublasError

    b = Buf.new(ctx, 64)
    with pytest.raises(CublasError) as e:
        ctx.gemm(False, False, 4, 4, 4, 1.0, b, 1, b, 4, 0.0, b, 4, Gemm.F32)  # lda < m
    assert e.value.status == "CUBLAS_STATUS_INVALID_VALUE"
    b.close()
