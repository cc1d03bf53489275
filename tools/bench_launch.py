"""Host time per kernel launch (arguments packed once) and per graph launch, as JSON lines.

Usage: python3 tools/bench_launch.py [--reps 7] [--n 500]
Each figure is the median over --reps runs of --n back-to-back calls, timed on the host without
the final stream sync (so it is the cost the caller pays, not the card's time)."""

from __future__ import annotations

import argparse
import json
import statistics
import time

from cortiq_drv.cu import Buf, Ctx, Event, capture, kargs
from cortiq_drv.cu.nvrtc import compile_cubin, func, load
from cortiq_drv.kernels import source


def _host_us(ctx, fn, n: int, reps: int) -> float:
    """Median host microseconds per `fn()` call over `reps` runs of `n` calls."""
    fn()
    ctx.sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n * 1e6)
        ctx.sync()
    return statistics.median(times)


def _emit(name: str, value: float, unit: str, **extra) -> None:
    print(json.dumps({"name": name, "value": round(value, 3), "unit": unit, **extra}), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--n", type=int, default=500)
    a = ap.parse_args(argv)
    ctx = Ctx.current()
    mod = load(ctx, compile_cubin(source("basic.cu"), (), ctx.arch))
    empty, axpy = func(mod, "empty_kernel"), func(mod, "axpy_f32")
    n = 1 << 12
    x, y = Buf.new(ctx, 4 * n), Buf.new(ctx, 4 * n)
    x.memset(0), y.memset(0)
    none = kargs("")
    four = kargs("QQfi", y, x, 1.0, n)
    grid = (n // 256, 1)
    common = {"device": ctx.arch, "reps": a.reps, "n": a.n}
    _emit("launch_empty_prepacked", _host_us(ctx, lambda: ctx.launch(empty, (1, 1), 32, 0, none),
                                             a.n, a.reps), "us/launch", **common)
    _emit("launch_axpy_prepacked_4args",
          _host_us(ctx, lambda: ctx.launch(axpy, grid, 256, 0, four), a.n, a.reps), "us/launch",
          **common)
    _emit("kargs_pack_4args", _host_us(ctx, lambda: kargs("QQfi", y, x, 1.0, n), a.n, a.reps),
          "us/call", **common)
    _emit("kargs_set_one", _host_us(ctx, lambda: four.set(2, 0.5), a.n, a.reps), "us/call", **common)
    for nodes in (1, 50):
        g = capture(ctx, lambda: [ctx.launch(axpy, grid, 256, 0, four) for _ in range(nodes)])
        g.upload()
        _emit(f"graph_launch_{nodes}_nodes", _host_us(ctx, g.launch, a.n, a.reps), "us/launch",
              **common)
        start, end = Event(ctx), Event(ctx)
        start.record()
        for _ in range(a.n):
            g.launch()
        end.record()
        _emit(f"graph_replay_{nodes}_nodes_device", start.elapsed_ms(end) * 1e3 / a.n,
              "us/replay", **common)
        start.close(), end.close(), g.close()
    x.close(), y.close(), mod.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
