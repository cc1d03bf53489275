"""Graph capture on a device: replay gives the bytes direct launches give, a graph re-used with
new contents of the same buffers, a failed capture leaves the stream usable, events time work."""

import numpy as np
import pytest

from cortiq_drv.cu import Buf, Event, GraphRec, Pinned, capture, kargs
from cortiq_drv.cu.nvrtc import func

pytestmark = pytest.mark.gpu

N = 4099


def _chain(ctx, mod, y, x, scales):
    """fill y with 1, then y = s * x + y for each s, then a shared-memory reverse into x."""
    grid = ((N + 255) // 256, 1)
    ctx.launch(func(mod, "fill_f32"), grid, 256, 0, kargs("Qif", y, N, 1.0))
    for s in scales:
        ctx.launch(func(mod, "axpy_f32"), grid, 256, 0, kargs("QQfi", y, x, s, N))
    ctx.launch(func(mod, "reverse_smem"), (1, 1), 256, 4 * N, kargs("QQi", y, x, N))


def test_graph_replay_equals_direct_launches(ctx, mod):
    a = np.random.default_rng(3).standard_normal(N).astype(np.float32)
    scales = [0.5, -1.25, 3.0]
    x, y = Buf.from_array(ctx, a), Buf.new(ctx, 4 * N)
    _chain(ctx, mod, y, x, scales)
    direct = (x.to_host(), y.to_host())
    x.upload(a)
    y.memset(0)
    g = capture(ctx, lambda: _chain(ctx, mod, y, x, scales))
    # capturing queued nothing: the buffers still hold what they held
    assert x.to_host().tobytes() == a.tobytes() and not y.to_host().any()
    g.launch()
    assert (x.to_host().tobytes(), y.to_host().tobytes()) == (direct[0].tobytes(), direct[1].tobytes())
    g.close(), x.close(), y.close()


def test_graph_reused_with_new_contents(ctx, mod):
    rng = np.random.default_rng(4)
    x, y = Buf.new(ctx, 4 * N), Buf.new(ctx, 4 * N)
    pin = Pinned(4 * N)
    host = pin.array(np.float32)

    def step():
        # the graph re-reads the pinned input on every replay
        x.upload_async(host)
        ctx.launch(func(mod, "fill_f32"), ((N + 255) // 256, 1), 256, 0, kargs("Qif", y, N, 0.0))
        ctx.launch(func(mod, "axpy_f32"), ((N + 255) // 256, 1), 256, 0, kargs("QQfi", y, x, 2.0, N))

    host[:] = 0
    rec = GraphRec(capture(ctx, step), (x.ptr, y.ptr))
    assert rec.matches((x.ptr, y.ptr)) and not rec.matches((y.ptr, x.ptr))
    for _ in range(3):
        a = rng.standard_normal(N).astype(np.float32)
        host[:] = a
        rec.launch()
        assert y.to_host(np.float32).tobytes() == (2.0 * a).tobytes()
    rec.close(), pin.close(), x.close(), y.close()


def test_failed_capture_leaves_the_stream_usable(ctx, mod):
    def boom():
        ctx.launch(func(mod, "empty_kernel"), (1, 1), 32, 0, kargs(""))
        raise ValueError("inside capture")

    with pytest.raises(ValueError, match="inside capture"):
        capture(ctx, boom)
    assert not ctx.capturing
    b = Buf.from_array(ctx, np.arange(8, dtype=np.uint8))
    assert b.to_host().tolist() == list(range(8))
    b.close()


def test_events_time_work(ctx, mod):
    start, end = Event(ctx), Event(ctx)
    y = Buf.new(ctx, 4 * N)
    start.record()
    for _ in range(10):
        ctx.launch(func(mod, "fill_f32"), ((N + 255) // 256, 1), 256, 0, kargs("Qif", y, N, 1.0))
    end.record()
    ms = start.elapsed_ms(end)
    assert 0.0 < ms < 1000.0
    start.close(), end.close(), y.close()
