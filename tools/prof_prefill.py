"""Where the prompt path's card time goes, kernel by kernel, with no sync between them (the
CMF_CUDA_PROF stages sync at every mark, so each stage also carries the host's launch time).

On bench_prefill's random-payload shape: one warm prompt, then for each variant (hy_flash_h or
the score GEMM passes, their rows) tokens/s (the median of --reps) and its first logits against the
first variant's, and for those in --events one prompt with an event pair around every launch,
GEMM, the input upload and the head's token step: card milliseconds by kernel name (GEMMs by
shape) and the card's idle time between them, as JSON lines.
Usage: python tools/prof_prefill.py [--shape 9b] [--tokens 4096] [--variants ...] [--reps 3]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_prefill import MemCmf, card_geo, run_prompt  # noqa: E402


class Recorder:
    """Event pairs around the calls of ctx (launch, gemm, gemm_strided_batched_f16) and around
    two module functions (the input upload, the token step), each tagged with a name."""

    def __init__(self, ctx, n_events: int = 12000):
        from cortiq_drv.cu import Event

        self.ctx = ctx
        self.pool = [Event(ctx) for _ in range(n_events)]
        self.used = 0
        self.marks: list[tuple[str, object, object]] = []
        self.depth = 0

    def pair(self, name: str, fn, *a, **kw):
        """fn(*a, **kw) between two events (calls inside it not recorded apart)."""
        if self.depth:
            return fn(*a, **kw)
        e0, e1 = self.pool[self.used], self.pool[self.used + 1]
        self.used += 2
        self.depth += 1
        e0.record()
        try:
            out = fn(*a, **kw)
        finally:
            e1.record()
            self.depth -= 1
        self.marks.append((name, e0, e1))
        return out

    def patch(self, big, api):
        """Wrap the calls; returns what `unpatch` puts back."""
        ctx, orig = self.ctx, (self.ctx.launch, self.ctx.gemm, self.ctx.gemm_strided_batched_f16)
        ctx.launch = lambda f, *a: self.pair(f.name, orig[0], f, *a)
        ctx.gemm = lambda ta, tb, m, n, k, *a: self.pair(f"gemm m={m} n={n} k={k}", orig[1], ta, tb, m, n, k, *a)
        ctx.gemm_strided_batched_f16 = lambda ta, *a, **kw: self.pair(
            "bgemm " + ("scores" if ta else "values"), orig[2], ta, *a, **kw)
        stage, token = big._stage_rows, api.token
        big._stage_rows = lambda *a: self.pair("upload rows", stage, *a)
        api.token = lambda *a, **kw: self.pair("token step", token, *a, **kw)
        return stage, token

    def unpatch(self, big, api, saved) -> None:
        for name in ("launch", "gemm", "gemm_strided_batched_f16"):
            del self.ctx.__dict__[name]
        big._stage_rows, api.token = saved
        for e in self.pool:
            e.close()

    def report(self) -> dict:
        self.ctx.sync()
        by = collections.defaultdict(lambda: [0.0, 0])
        busy = 0.0
        for name, e0, e1 in self.marks:
            ms = e0.elapsed_ms(e1)
            by[name][0] += ms
            by[name][1] += 1
            busy += ms
        span = self.marks[0][1].elapsed_ms(self.marks[-1][2])
        top = sorted(by.items(), key=lambda kv: -kv[1][0])
        return dict(span_ms=round(span, 2), busy_ms=round(busy, 2), idle_ms=round(span - busy, 2),
                    kernels={k: [round(v[0], 3), v[1]] for k, v in top})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="9b")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--variants", default="passes:0:128,flash:1:128", help="name:flash:att_rows,...")
    ap.add_argument("--events", default="flash", help="variants to profile by events")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args(argv)
    from cortiq_drv import knobs
    from cortiq_drv.default_model import SHAPES
    from cortiq_drv.graph import build
    from cortiq_drv.hybrid import api
    from cortiq_drv.hybrid import big as bigmod
    from cortiq_drv.hybrid import state as hstate

    cmf = MemCmf(SHAPES[a.shape], a.shape)
    g = build(cmf)
    hs = hstate.current()
    geo = card_geo(g)
    n = a.tokens
    # bench_prefill's prompt in one chunk: (seconds, the first logits)
    run = lambda seed: run_prompt(hs, cmf, g, geo, 2, n, n, np.random.default_rng(seed))
    os.environ["CORTIQ_DRV_FLASH"] = "0"
    knobs.reset()
    run(0)
    first = None
    for v in a.variants.split(","):
        name, fl, att = v.split(":")
        os.environ["CORTIQ_DRV_FLASH"] = fl
        os.environ["CMF_HYB_ATT_ROWS"] = att
        knobs.reset()
        _, logits = run(1)
        first = logits if first is None else first
        err = float(np.sqrt(np.mean((logits - first) ** 2) / max(np.mean(first ** 2), 1e-30)))
        times = [run(2)[0] for _ in range(a.reps)]
        print(json.dumps(dict(variant=name, tok_s=round(n / statistics.median(times), 1),
                              reps_s=[round(t, 4) for t in times], logits_rel_rms_vs_first=round(err, 6),
                              argmax_same=bool(np.argmax(logits) == np.argmax(first)))), flush=True)
        if name in a.events.split(","):
            rec = Recorder(hs.ctx)
            saved = rec.patch(bigmod, api)
            wall = run(2)[0]
            out = rec.report()
            rec.unpatch(bigmod, api, saved)
            out = dict(variant=name, wall_ms=round(wall * 1e3, 2), **out)
            print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
