"""Prompt-path speed on random-payload Qwen3.5 shapes (docs/PERF.md "Prompt path"), JSON lines.

For each shape (9b, 27b of `default_model.SHAPES`) and prompt length: tokens/s of the card's prompt
path as an engine runs it (`api.batch` over all rows but the last in chunks of --chunk rows,
nothing copied back, then `api.token` for the last row with the head; one fresh sequence each
time; median of --reps after a warm-up prompt of the same length, so the figure is the steady
state with the prompt path's scratch in place; every rep's seconds are listed too), then one
profiled run (CMF_CUDA_PROF's stages: the share of time in
expansion, weight GEMMs, GDN glue and scan, attention, ...), the weight GEMMs' TFLOP/s in it, and
cuBLAS f16 alone on the same (rows, cols, rows of the prompt) shapes measured in the same run.
The Hugging Face baseline (transformers + flash-linear-attention, bf16, 9B shape, 4096 tokens,
this H200) is the issue's 26.3k tok/s.

The model lives in memory (no file): every layer of a kind is given the bytes of the first layer
of that kind (the card still holds a copy per layer, so the speed is the whole model's).
Usage: python tools/bench_prefill.py [--shapes 9b,27b] [--tokens 512,2048,4096,8192] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time

import numpy as np

HF_BASELINE = {"9b": 26_300.0}


class MemCmf:
    """The parts of `CmfFile` graph building and plans read, over payloads made on demand."""

    def __init__(self, shape, label: str):
        from cortiq_drv.cmf.layout import TensorInfo
        from cortiq_drv.convert import qwen35_arch as qa
        from cortiq_drv.convert.qwen35 import storage_dtype

        self.arch = shape.arch()
        self.uid = f"bench-{label}"
        self.tensors = {n: TensorInfo(n, storage_dtype(n, s, "q4tp"), s, 0, 0, 0)
                        for n, s in qa.expected(self.arch).items()}
        types = self.arch["layer_types"]
        self._first = {t: types.index(t) for t in set(types)}
        self._types = types
        self._cache: dict = {}

    def _rep(self, name: str) -> str:
        m = re.match(r"model\.layers\.(\d+)\.(.*)", name)
        if not m:
            return name
        return f"model.layers.{self._first[self._types[int(m.group(1))]]}.{m.group(2)}"

    def tensor(self, name: str) -> np.ndarray:
        """The payload in the tensor's own dtype (q4tp: random codes; others: small normals)."""
        from cortiq_drv.cmf.writer import encode_iter
        from cortiq_drv.default_model import random_q4tp

        rep = self._rep(name)
        if rep not in self._cache:
            t = self.tensors[rep]
            rng = np.random.default_rng(len(self._cache))
            if t.dtype == "q4tp":
                raw = random_q4tp(rng, t.shape[0], t.shape[1], 1.0 / np.sqrt(t.shape[1]))
            else:
                w = (rng.standard_normal(t.shape) * 0.02).astype(np.float32)
                raw = b"".join(bytes(p) for p in encode_iter(w, t.dtype))
            self._cache[rep] = np.frombuffer(raw, dtype=np.uint8)
        return self._cache[rep]

    def array(self, name: str) -> np.ndarray:
        from cortiq_drv.cmf.reader import decode_payload

        t = self.tensors[name]
        return decode_payload(self.tensor(name), t.dtype, t.shape, f"bench tensor {name!r}")


def _weights(g) -> list[tuple[int, int]]:
    """(rows, cols) of every weight GEMM of one prompt pass over the trunk, stacked as `big` runs
    them: qkv | z | a | b or q | k | v as one GEMM (bigfit's strides, unrounded), then out or o,
    the gate/up pair, down."""
    from cortiq_drv.graph import GraphAttn

    out = []
    for l in g.layers:
        a, f = l.attn, l.ffn
        if isinstance(a, GraphAttn.Gdn):
            out += [(a.qkv.rows + a.z.rows + 2 * a.nv, g.hidden), (a.out.rows, a.out.cols)]
        else:
            out += [(a.wq.rows + a.wk.rows + a.wv.rows, g.hidden), (a.wo.rows, a.wo.cols)]
        out += [(2 * f.gate.rows, g.hidden), (f.down.rows, f.down.cols)]
    return out


def _line(**kv) -> None:
    print(json.dumps(kv), flush=True)


def run_prompt(hs, cmf, g, geo, kv: int, n: int, chunk: int, rng) -> tuple[float, np.ndarray]:
    """Seconds of one prompt of n random rows as an engine runs it, and its first logits: rows
    [0, n - 1) through api.batch in chunks (nothing copied back), then the last row through
    api.token with the head."""
    from cortiq_drv.hybrid import api, spec

    h = rng.standard_normal((n, g.hidden)).astype(np.float32)
    logits = np.empty(g.lm_rows, np.float32)
    hs.ctx.sync()
    t0 = time.perf_counter()
    for c0 in range(0, n - 1, chunk):
        part = np.ascontiguousarray(h[c0:min(c0 + chunk, n - 1)])
        out = api.batch(hs, cmf, kv, 0, g.layers, g.invf, part, positions=range(c0, c0 + len(part)), defer=True,
                        **geo)
        if not out.ok:
            raise SystemExit(f"prompt of {n} rows: {out.reason}")
    out = api.token(hs, cmf, kv, g.layers, g.invf, h[-1].copy(), position=n - 1, lm_head=(g.lm, g.lm_rows),
                    final_norm=g.final_norm, logits=logits, **geo)
    if not out.ok:
        raise SystemExit(f"the last row of a prompt of {n}: {out.reason}")
    hs.ctx.sync()
    dt = time.perf_counter() - t0
    spec.reset(hs, kv)
    return dt, logits


def _cublas(ctx, shapes, n: int, reps: int = 3) -> float:
    """TFLOP/s of cuBLAS f16 GEMMs (f32 out) over these weight shapes with n rows, timed whole."""
    from cortiq_drv.blas import Gemm
    from cortiq_drv.cu import Buf

    rmax = max(r * c for r, c in shapes)
    cmax = max(max(r, c) for r, c in shapes)
    w, x, y = Buf.new(ctx, rmax * 2), Buf.new(ctx, n * cmax * 2), Buf.new(ctx, n * cmax * 4)
    for b in (w, x):
        b.memset(0x3C)
    try:
        run = lambda: [ctx.gemm(True, False, r, n, c, 1.0, w, c, x, c, 0.0, y, r, Gemm.HALF) for r, c in shapes]
        run()
        ctx.sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            run()
        ctx.sync()
        dt = (time.perf_counter() - t0) / reps
    finally:
        for b in (w, x, y):
            b.close()
    return 2.0 * n * sum(r * c for r, c in shapes) / dt / 1e12


def card_geo(g) -> dict:
    """The geometry keywords `api.batch` / `api.token` take for graph g (room for 2^20 positions)."""
    return dict(nh=g.nh, nkv=g.nkv, hd=g.hd, rd=g.rd, hidden=g.hidden, cap=1 << 20, gemma=g.gemma, eps=g.eps,
                attn_scale=g.scale)


def bench_shape(label: str, tokens, reps: int, chunk: int) -> None:
    from cortiq_drv.default_model import SHAPES
    from cortiq_drv.graph import build
    from cortiq_drv.hybrid import big as bigmod
    from cortiq_drv.hybrid import state as hstate

    cmf = MemCmf(SHAPES[label], label)
    g = build(cmf)
    hs = hstate.current()
    geo = card_geo(g)
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    run_prompt(hs, cmf, g, geo, 1, min(chunk, 512), chunk, rng)
    _line(name="plan_build_and_warmup", shape=label, value=round(time.perf_counter() - t0, 2), unit="s")
    shapes = _weights(g)
    for n in tokens:
        ch = min(chunk, n)
        # the warm-up: the scratch for n rows allocated, as an engine past its first prompt has it
        run_prompt(hs, cmf, g, geo, 2, n, ch, rng)
        times = [run_prompt(hs, cmf, g, geo, 2, n, ch, rng)[0] for _ in range(reps)]
        tok_s = n / statistics.median(times)
        base = HF_BASELINE.get(label) if n == 4096 else None
        _line(name="prefill_tok_s", shape=label, tokens=n, chunk=ch, value=round(tok_s, 1), unit="tok/s",
              baseline=base, ratio=None if base is None else round(tok_s / base, 3),
              reps_s=[round(t, 4) for t in times])
        # one profiled run: each stage closed by a sync
        bigmod.PROF.rows, bigmod.PROF.ns = 0, [0] * len(bigmod.BSTAGES)
        hs.prof = True
        try:
            total = run_prompt(hs, cmf, g, geo, 3, n, ch, rng)[0]
        finally:
            hs.prof = False
        ns = dict(zip(bigmod.BSTAGES, bigmod.PROF.ns))
        staged = sum(ns.values()) / 1e9
        _line(name="prefill_stages", shape=label, tokens=n, unit="share",
              value={k: round(v / 1e9 / max(staged, 1e-12), 4) for k, v in ns.items()},
              seconds=round(total, 4))
        gemm_s = ns["gemm"] / 1e9
        flops = 2.0 * n * sum(r * c for r, c in shapes)
        ours = flops / max(gemm_s, 1e-12) / 1e12
        ref = _cublas(hs.ctx, shapes, n)
        _line(name="weight_gemm_tflops", shape=label, tokens=n, value=round(ours, 1), unit="TFLOP/s",
              baseline=round(ref, 1), ratio=round(ours / ref, 3), note="baseline: cuBLAS f16 alone, same shapes")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="9b,27b")
    ap.add_argument("--tokens", default="512,2048,4096,8192")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=8192, help="rows a prompt chunk (the engine's chunking)")
    a = ap.parse_args(argv)
    from cortiq_drv.cu.ctx import device_available

    ok, why = device_available()
    if not ok:
        print(f"bench_prefill: no CUDA device: {why}", file=sys.stderr)
        return 1
    for label in a.shapes.split(","):
        bench_shape(label, [int(t) for t in a.tokens.split(",")], a.reps, a.chunk)
    return 0


if __name__ == "__main__":
    sys.exit(main())
