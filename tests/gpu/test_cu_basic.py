"""Driver layer on a device: copies, direct launches, >48 KiB shared memory, the conversions and
reductions of common.cuh, arena views, pinned memory, and allocation failure."""

import numpy as np
import pytest

from cortiq_drv.cu import Arena, Buf, Ctx, Pinned, kargs
from cortiq_drv.cu.nvrtc import func
from cortiq_drv.errors import CudaError

pytestmark = pytest.mark.gpu


def _grid(n, block=256):
    return ((n + block - 1) // block, 1)


def test_ctx_facts(ctx):
    assert ctx.arch.startswith("sm_") and ctx.sm_count > 0
    free, total = ctx.mem_get_info()
    assert 0 < free <= total
    assert Ctx.current() is ctx


@pytest.mark.parametrize("n", [1, 15, 16, 17, 4096 + 3])
def test_copy_round_trip(ctx, n):
    rng = np.random.default_rng(n)
    a = rng.standard_normal(n).astype(np.float32)
    b = Buf.from_array(ctx, a)
    try:
        assert b.bytes == a.nbytes
        assert b.to_host(np.float32).tobytes() == a.tobytes()
        # device -> device into the back half of a bigger buffer, then read through a view
        big = Buf.new(ctx, 2 * a.nbytes)
        big.memset(0)
        big.copy_from(b, a.nbytes)
        out = big.to_host(np.float32)
        assert not out[:n].any() and out[n:].tobytes() == a.tobytes()
        assert big.view(a.nbytes, a.nbytes).to_host(np.float32).tobytes() == a.tobytes()
        big.close()
    finally:
        b.close()


def test_upload_at_offset_and_memset(ctx):
    b = Buf.new(ctx, 64)
    b.memset(0xAB)
    b.upload(np.arange(4, dtype=np.uint8), off=10)
    h = b.to_host()
    assert h[10:14].tolist() == [0, 1, 2, 3] and (h[:10] == 0xAB).all() and (h[14:] == 0xAB).all()
    b.close()


def test_fill_and_axpy(ctx, mod):
    n = 1000
    y, x = Buf.new(ctx, 4 * n), Buf.from_array(ctx, np.arange(n, dtype=np.float32))
    ctx.launch(func(mod, "fill_f32"), _grid(n), 256, 0, kargs("Qif", y, n, 2.0))
    ctx.launch(func(mod, "axpy_f32"), _grid(n), 256, 0, kargs("QQfi", y, x, 0.5, n))
    np.testing.assert_array_equal(y.to_host(np.float32), 2.0 + 0.5 * np.arange(n, dtype=np.float32))
    y.close(), x.close()


def test_dynamic_shared_memory_above_48k(ctx, mod):
    # up to 200 000 bytes of shared memory a block, as much as the card allows
    m, blocks = min(50_000, ctx.smem_optin // 4), 3
    assert 4 * m > 48 * 1024
    a = np.random.default_rng(1).standard_normal(m * blocks).astype(np.float32)
    src, dst = Buf.from_array(ctx, a), Buf.new(ctx, a.nbytes)
    f = func(mod, "reverse_smem")
    ctx.launch(f, (blocks, 1), 256, 4 * m, kargs("QQi", src, dst, m))
    assert f.smem_ok == 4 * m
    want = a.reshape(blocks, m)[:, ::-1].ravel()
    assert dst.to_host(np.float32).tobytes() == want.tobytes()
    src.close(), dst.close()


def test_conversions_round_to_nearest_even(ctx, mod):
    x = np.concatenate([np.random.default_rng(2).standard_normal(997).astype(np.float32) * 100,
                        np.float32([0.0, -0.0, 65504.0, 1e6, 1.0 + 2**-11, 1.0 + 3 * 2**-11])])
    n = x.size
    xb, hb, bb, back = (Buf.from_array(ctx, x), Buf.new(ctx, 2 * n), Buf.new(ctx, 2 * n),
                        Buf.new(ctx, 4 * n))
    ctx.launch(func(mod, "cvt_f32"), _grid(n), 256, 0, kargs("QQQQi", xb, hb, bb, back, n))
    h = hb.to_host(np.uint16)
    with np.errstate(over="ignore"):  # 1e6 overflows to inf in f16, on both sides
        assert h.tobytes() == x.astype(np.float16).tobytes()
    # bf16 round to nearest even on the top 16 bits (no NaNs in x)
    u = x.view(np.uint32).astype(np.uint64)
    want_b = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    assert bb.to_host(np.uint16).tobytes() == want_b.tobytes()
    want_back = h.view(np.float16).astype(np.float32) + (want_b.astype(np.uint32) << 16).view(np.float32)
    assert back.to_host(np.float32).tobytes() == want_back.tobytes()
    for b in (xb, hb, bb, back):
        b.close()


@pytest.mark.parametrize("cols", [1, 31, 32, 33, 1000])
def test_warp_reductions(ctx, mod, cols):
    rows = 5
    x = np.random.default_rng(cols).standard_normal((rows, cols)).astype(np.float32)
    xb, out = Buf.from_array(ctx, x), Buf.new(ctx, rows * 8)
    ctx.launch(func(mod, "row_sum_max"), (rows, 1), 32, 0, kargs("QQi", xb, out, cols))
    got = out.to_host(np.float32, (rows, 2))
    # the sum's order differs from numpy's: f32 tolerance 1e-5 relative to sum of |x|
    np.testing.assert_allclose(got[:, 0], x.sum(1), atol=1e-5 * np.abs(x).sum(1).max())
    assert got[:, 1].tobytes() == x.max(1).tobytes()
    xb.close(), out.close()


def test_activations(ctx, mod):
    x = np.linspace(-30, 30, 601, dtype=np.float32)
    xb, out = Buf.from_array(ctx, x), Buf.new(ctx, 12 * x.size)
    ctx.launch(func(mod, "act_f32"), _grid(x.size), 256, 0, kargs("QQi", xb, out, x.size))
    got = out.to_host(np.float32, (x.size, 3)).astype(np.float64)
    xd = x.astype(np.float64)
    sig = 1 / (1 + np.exp(-xd))
    # expf is within 2 ulp (2.4e-7) plus one rounding per operation: 2e-6 relative covers it
    np.testing.assert_allclose(got[:, 0], sig, rtol=2e-6, atol=1e-30)
    np.testing.assert_allclose(got[:, 1], xd * sig, rtol=2e-6, atol=1e-30)
    np.testing.assert_allclose(got[:, 2], np.logaddexp(0, xd), rtol=2e-6, atol=1e-30)
    xb.close(), out.close()


def test_arena_views_are_aligned_and_disjoint(ctx):
    ar = Arena(ctx, 4096)
    a, b, c = ar.take(10), ar.take(300), ar.take(1)
    assert a.ptr % 256 == 0 and b.ptr == a.ptr + 256 and c.ptr == b.ptr + 512
    b.upload(np.full(300, 7, np.uint8))
    a.upload(np.full(10, 1, np.uint8))
    assert (b.to_host() == 7).all() and not b.owned
    assert ar.used == 1024 and ar.fits(4096 - 1024) and not ar.fits(4096 - 1023)
    ar.close()


def test_pinned_host_upload(ctx):
    p = Pinned(64)
    arr = p.array(np.float32)
    arr[:] = np.arange(16, dtype=np.float32)
    b = Buf.new(ctx, 64)
    b.upload_async(arr)
    assert b.to_host(np.float32).tolist() == list(range(16))
    b.close(), p.close()


def test_impossible_allocation_names_out_of_memory(ctx):
    with pytest.raises(CudaError) as e:
        Buf.new(ctx, 1 << 50)
    assert e.value.name == "CUDA_ERROR_OUT_OF_MEMORY"
    assert e.value.call == "cuMemAlloc" and str(1 << 50) in str(e.value)
