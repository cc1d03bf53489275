"""Speed of the small path's q4tp matvec (hy_mmp) on the Qwen3.5-9B and 27B matrix shapes, as
JSON lines (docs/PERF.md).

Usage: python3 tools/bench_kernels.py [--models 9B,27B] [--rows 1,2,4,8,16] [--variants rule|all]
       [--matrices q,head,...] [--define NAME=VALUE ...] [--no-cublas] [--out FILE.jsonl]

For each matrix (q, k, v, o, the gate/up pair, down, GDN qkv / z / out, LM head; then the decode
step's launches of several jobs, attention's q + k + v as attn_in and GDN's qkv + z as gdn_in)
and each row count: the kernel's time with the weights rotated through copies larger than L2 (so every call
reads them from memory), the bytes it reads (repacked tiles + codes + ladders) per second, the
ratio to the read bandwidth measured in the same run (a streaming-read kernel), the ratio to the
one-row time, the tensor-core floor (`mma_flops`, the mma.sync work the call does, at the
mma.sync rate measured in the same run, `mma_rate`), the larger floor against the time
(`vs_floor`), and cuBLAS f16 GEMM (ctx.gemm, f16 weights, also rotated) on the same shape. Times
are medians over --reps replays of a captured graph of back-to-back launches (launch gaps
included, as in a decode step's graph). `--variants all` times every (TB, KS) choice as well
(at one and two rows hy_mmv, staged or not where the columns fit, and hy_mmp_1; at 3..8 rows and
KS 8 hy_mmr beside hy_mmp_1; at 9..16 rows and KS 8 four tiles a block too; variant "NT_TB_KS",
an "s" for hy_mmvs, an "r" for hy_mmr);
`--define` compiles the kernels with tuning macros (HY_MV_STAGES, HY_RUN_STAGES, HY_MB_*, HY_MV_MB_*,
HY_MVS_MB_*, HY_MR_MB, HY_MMP_WH, HY_MMR_WH) for a sweep. Only hyb.cu's weight-side pieces are compiled
(mma.weight_side_source).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys

import numpy as np

from cortiq_drv.blas import Gemm
from cortiq_drv.cu import Buf, Ctx, Event, capture, kargs
from cortiq_drv.cu.nvrtc import compile_cubin, func, load
from cortiq_drv.hybrid import mma
from cortiq_drv.hybrid.mats import DevMat
from cortiq_drv.hybrid.repack import planes_bytes, random_q4tp, repack_on_card

# Bytes the streaming-read kernel reads.
READ_BYTES = 4 << 30
# Weights are rotated through copies holding at least this many bytes (H200 L2: 50 MB).
ROTATE_BYTES = 4 * (50 << 20)
# Launches a captured graph holds at least.
GRAPH_CALLS = 16
MODELS = {
    "9B": dict(hidden=4096, nh=16, nkv=4, hd=256, ffn=12288, gk=16, gv=32, gd=128, vocab=248320),
    "27B": dict(hidden=5120, nh=24, nkv=4, hd=256, ffn=17408, gk=16, gv=48, gd=128, vocab=248320),
}
READ_SRC = r"""
extern "C" __global__ void bw_read(const uint4* p, unsigned long long n, unsigned* out) {
    const unsigned long long s = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned acc = 0;
    for (; i + 3 * s < n; i += 4 * s) {
        const uint4 a = __ldg(p + i), b = __ldg(p + i + s), c = __ldg(p + i + 2 * s), d = __ldg(p + i + 3 * s);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n; i += s) { const uint4 a = __ldg(p + i); acc ^= a.x ^ a.y ^ a.z ^ a.w; }
    if (acc == 0x9E3779B9u) out[0] = acc;
}
"""


def matrices(m: dict) -> list[tuple[str, tuple[int, ...], int, bool]]:
    """(name, rows of each job, cols, gate/up pair) of one model's matvecs (q carries the output
    gate), then the two launches of several jobs a decode step makes: attention's q + k + v and
    GDN's qkv + z."""
    h, gd = m["hidden"], m["gd"]
    q, kv, qkv, z = 2 * m["nh"] * m["hd"], m["nkv"] * m["hd"], (2 * m["gk"] + m["gv"]) * gd, m["gv"] * gd
    return [("q", (q,), h, False), ("k", (kv,), h, False), ("v", (kv,), h, False),
            ("o", (h,), m["nh"] * m["hd"], False), ("gate_up", (2 * m["ffn"],), h, True),
            ("down", (h,), m["ffn"], False), ("gdn_qkv", (qkv,), h, False), ("gdn_z", (z,), h, False),
            ("gdn_out", (h,), m["gv"] * gd, False), ("head", (m["vocab"],), h, False),
            ("attn_in", (q, kv, kv), h, False), ("gdn_in", (qkv, z), h, False)]


# The mma.sync rate: every warp runs MMA_CHAINS independent chains of m16n8k16 bf16 products
# (f32 accumulate, the matvec's instruction), MMA_ITERS each.
MMA_CHAINS = 8
MMA_ITERS = 4096
MMA_SRC = r"""
extern "C" __global__ void mma_rate(int iters, float* out) {
    const unsigned a = 0x3F803F80u, b = 0x3F003F00u;  // bf16 pairs (1, 1) and (0.5, 0.5)
    float d[%d][4] = {};
    for (int i = 0; i < iters; ++i) {
#pragma unroll
        for (int k = 0; k < %d; ++k)
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%%0,%%1,%%2,%%3}, "
                         "{%%4,%%5,%%6,%%7}, {%%8,%%9}, {%%0,%%1,%%2,%%3};"
                         : "+f"(d[k][0]), "+f"(d[k][1]), "+f"(d[k][2]), "+f"(d[k][3])
                         : "r"(a), "r"(a), "r"(a), "r"(a), "r"(b), "r"(b));
    }
    float s = 0.0f;
    for (int k = 0; k < %d; ++k) s += d[k][0] + d[k][1] + d[k][2] + d[k][3];
    if (s == 1234.5f) out[0] = s;
}
""" % (MMA_CHAINS, MMA_CHAINS, MMA_CHAINS)


def graph_us(ctx, calls, reps: int) -> float:
    """Median microseconds per call of a captured graph replaying `calls` back to back."""
    g = capture(ctx, lambda: [c() for c in calls])
    e0, e1 = Event(ctx), Event(ctx)
    try:
        g.launch()
        g.launch()
        ctx.sync()
        times = []
        for _ in range(reps):
            e0.record()
            for _ in range(3):
                g.launch()
            e1.record()
            times.append(e0.elapsed_ms(e1) * 1e3 / (3 * len(calls)))
        return statistics.median(times)
    finally:
        g.close()
        e0.close()
        e1.close()


def read_bandwidth(ctx, reps: int) -> float:
    """Bytes per second a streaming read of READ_BYTES reaches (TB/s)."""
    f = func(load(ctx, compile_cubin(READ_SRC, (), ctx.arch)), "bw_read")
    nbytes = READ_BYTES
    buf, out = Buf.new(ctx, nbytes), Buf.new(ctx, 4)
    buf.memset(1)
    args = kargs("QQQ", buf, nbytes // 16, out)
    try:
        us = graph_us(ctx, [lambda: ctx.launch(f, (ctx.sm_count * 8, 1), 256, 0, args)], reps)
        return nbytes / us / 1e6
    finally:
        buf.close()
        out.close()


def mma_rate(ctx, reps: int) -> float:
    """TFLOP/s of mma.sync m16n8k16 bf16 (f32 accumulate) on the whole card: 8 warps a block, 4
    blocks an SM, each warp's MMA_CHAINS chains independent."""
    f = func(load(ctx, compile_cubin(MMA_SRC, (), ctx.arch)), "mma_rate")
    out = Buf.new(ctx, 4)
    grid = 4 * ctx.sm_count
    args = kargs("iQ", MMA_ITERS, out)
    try:
        us = graph_us(ctx, [lambda: ctx.launch(f, (grid, 1), 256, 0, args)], reps)
        return grid * 8 * MMA_ITERS * MMA_CHAINS * (2 * 16 * 8 * 16) / us / 1e6
    finally:
        out.close()


def mma_flops(parts, cols: int, n: int) -> int:
    """The mma.sync work of a call of `n` rows over matrices of `parts` rows (a gate/up pair: both
    halves'): every 16-row tile times `cols` times the 8 B columns of each n-tile the n rows' three
    planes fill (hy_ntc), two flops a product."""
    tiles = sum(-(-rows // 16) for rows in parts)
    return 2 * tiles * 16 * cols * 8 * mma.mmr_ntc(n)


def read_bw_line(ctx, bw: float) -> dict:
    """A run's first JSON line: the read bandwidth and what measured it (arch, SMs, and whether
    the kernels marked pdl went as programmatic dependents: Ctx.pdl_on)."""
    return dict(bench="read_bw", tbps=round(bw, 3), bytes=READ_BYTES, device=ctx.arch, sms=ctx.sm_count,
                pdl=ctx.pdl_on)


def variant_name(var) -> str:
    """A launch choice (nt, tb, ks, staged, lean) as its lines name it: "NT_TB_KS", then "s" for
    hy_mmvs, "r" for hy_mmr."""
    nt, tb, ks, staged, lean = var
    return f"{nt}_{tb}_{ks}" + ("s" if staged else "") + ("r" if lean else "")


def parse_variant(text: str, n: int) -> tuple:
    """`variant_name`'s text as (nt, tb, ks, staged, lean), for a call of `n` rows; ValueError
    naming what is wrong when no kernel runs that variant at n rows."""
    m = re.fullmatch(r"(\d+)_(\d+)_(\d+)(s?)(r?)", text)
    if m is None:
        raise ValueError(f"variant {text!r}: not NT_TB_KS with an optional s (staged) or r (hy_mmr)")
    nt, tb, ks = (int(v) for v in m.groups()[:3])
    staged, lean = bool(m.group(4)), bool(m.group(5))
    if (nt, tb, ks) not in mma.MMP_VARIANTS:
        raise ValueError(f"variant {text!r}: no hy_mmp kernel {nt}_{tb}_{ks}")
    if not 1 <= n <= mma.rows_cap(nt):
        raise ValueError(f"variant {text!r}: carries 1..{mma.rows_cap(nt)} rows, not {n}")
    if staged and nt:
        raise ValueError(f"variant {text!r}: only hy_mmv (NT 0) stages its columns")
    if lean and not mma.mmr_fits(nt, tb, ks, n):
        raise ValueError(f"variant {text!r}: hy_mmr runs 3..8 rows at NT 1, TB 1 or 2, KS 8, not {n} rows")
    return nt, tb, ks, staged, lean


def mma_rate_line(tflops: float) -> dict:
    """The run's mma.sync rate (the tensor-core floor's divisor)."""
    return dict(bench="mma_rate", tflops=round(tflops, 1), instr="mma.sync.m16n8k16.bf16.f32")


class Rotated:
    """k copies of one launch's repacked matrices (together >= ROTATE_BYTES) and an MmaSet over
    each copy: one matrix of parts[0] rows (a gate/up pair when `pair`), or one job a part."""

    def __init__(self, ctx, fx, parts, cols, pair, rng):
        if pair and len(parts) != 1:
            raise ValueError(f"a gate/up pair is one matrix, not {len(parts)} parts")
        mats = []  # (rows, tiles, codes, ladders) of each part, repacked once
        for rows in parts:
            if pair:
                srcs, src_rows = [random_q4tp(rows // 2, cols, rng), random_q4tp(rows // 2, cols, rng)], rows // 2
            else:
                srcs, src_rows = [random_q4tp(rows, cols, rng)], rows
            mats.append((rows, *repack_on_card(ctx, fx, srcs, src_rows, rows, cols)))
        self.bytes = sum(planes_bytes(rows, cols) for rows in parts)
        k = max(1, -(-ROTATE_BYTES // self.bytes))
        copies = [[t for _, t, _, _ in mats]]
        for _ in range(k - 1):
            copies.append([Buf.new(ctx, t.bytes) for _, t, _, _ in mats])
            for c, (_, t, _, _) in zip(copies[-1], mats):
                c.copy_from(t)
        self.copies = [c for cs in copies for c in cs]
        self.y = Buf.new(ctx, mma.NMAX * sum(parts) * 4)
        self.sets = []
        for cs in copies:
            specs, yat = [], self.y.ptr
            for c, (rows, t, cc, ld) in zip(cs, mats):
                m = DevMat(mma.KIND_Q4TP, rows, cols, c, c.view(cc.ptr - t.ptr, cc.bytes),
                           c.view(ld.ptr - t.ptr, ld.bytes), 0)
                if pair:
                    half = mma.NMAX * (rows // 2) * 2
                    self.sets.append(mma.mmaset_pair(ctx, m, yat, yat + half, rows // 2))
                else:
                    specs.append(mma.JobSpec(m, yat, 0, rows, rows))
                yat += mma.NMAX * rows * 4
            if not pair:
                self.sets.append(mma.mmaset(ctx, specs))
        ctx.sync()

    def close(self):
        for c in self.copies:
            c.close()
        self.y.close()


def cublas_us(ctx, rows, cols, n, reps) -> float:
    """cuBLAS f16 GEMM y [n, rows] f32 = x [n, cols] W^T, W f16 rotated like the q4tp copies."""
    wbytes = rows * cols * 2
    k = max(1, -(-ROTATE_BYTES // wbytes))
    ws = [Buf.new(ctx, wbytes) for _ in range(k)]
    x, y = Buf.new(ctx, mma.NMAX * cols * 2), Buf.new(ctx, mma.NMAX * rows * 4)
    try:
        for b in [*ws, x]:
            b.memset(0x3C)
        reps_k = -(-GRAPH_CALLS // k)
        calls = [lambda w=w: ctx.gemm(True, False, rows, n, cols, 1.0, w, cols, x, cols, 0.0, y,
                                      rows, Gemm.HALF) for w in ws] * reps_k
        return graph_us(ctx, calls, reps)
    finally:
        for b in [*ws, x, y]:
            b.close()


def bench_matrix(ctx, fx, model, name, parts, cols, pair, a, bw, mma_tflops, emit) -> None:
    rows = sum(parts)
    rot = Rotated(ctx, fx, parts, cols, pair, np.random.default_rng(rows + cols))
    planes = [Buf.new(ctx, mma.NMAX * cols * 2) for _ in range(3)]
    for b in planes:
        b.memset(0x3F)
    p = mma.Planes(planes[0].ptr, planes[1].ptr, planes[2].ptr, cols)
    t1 = None

    def forms(v, tb, ks, n):
        """(staged, lean): hy_mmv unstaged, and staged too where its columns fit; hy_mmp_1, and
        hy_mmr too at 3..8 rows and KS 8."""
        if v == 0:
            return [(False, False)] + ([(True, False)] if fx.staged_shape(tb, ks, cols, n) else [])
        return [(False, False)] + ([(False, True)] if mma.mmr_fits(v, tb, ks, n) else [])

    try:
        for n in a.rows:
            rule = rot.sets[0].choice(fx, n)
            nt = rule[0]
            nts = (0, 1) if n <= 2 else (nt,)  # hy_mmv (and hy_mmvs) beside hy_mmp_1 at one or two rows
            choices = [rule] if a.variants == "rule" else [
                (v, tb, ks, *f) for v in nts for tb in mma.TBS for ks in (8, 16) if (v, tb, ks) in fx.mmp
                for f in forms(v, tb, ks, n)]
            reps_k = -(-GRAPH_CALLS // len(rot.sets))
            for var in choices:
                calls = [lambda s=s: s.launch(ctx, fx, p, n, *var) for s in rot.sets] * reps_k
                us = graph_us(ctx, calls, a.reps)
                if var == rule and n == a.rows[0]:
                    t1 = us
                tbps = rot.bytes / us / 1e6
                mem_floor, mma_floor = rot.bytes / bw / 1e6, mma_flops(parts, cols, n) / mma_tflops / 1e6
                line = dict(bench="hy_mmp", model=model, matrix=name, rows=rows, cols=cols, n=n,
                            variant=variant_name(var),
                            rule=var == rule, us=round(us, 2),
                            bytes=rot.bytes, tbps=round(tbps, 3), read_tbps=round(bw, 3),
                            ratio=round(tbps / bw, 3), vs_first_n=round(us / t1, 3) if t1 else None,
                            mem_floor_us=round(mem_floor, 2), mma_floor_us=round(mma_floor, 2),
                            vs_floor=round(max(mem_floor, mma_floor) / us, 3))
                if var == rule and not a.no_cublas:
                    cu = cublas_us(ctx, rows, cols, n, a.reps)
                    line.update(cublas_f16_us=round(cu, 2), cublas_f16_tbps=round(rows * cols * 2 / cu / 1e6, 3),
                                speedup_vs_cublas=round(cu / us, 2))
                emit(line)
    finally:
        rot.close()
        for b in planes:
            b.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="9B,27B")
    ap.add_argument("--rows", default="1,2,4,8,16")
    ap.add_argument("--matrices", default="", help="comma-separated names (default: all)")
    ap.add_argument("--variants", choices=("rule", "all"), default="rule")
    ap.add_argument("--define", action="append", default=[], help="NAME=VALUE for hyb.cu")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--no-cublas", action="store_true")
    ap.add_argument("--out", default=None, help="also append the JSON lines to this file")
    a = ap.parse_args(argv)
    a.rows = [int(v) for v in a.rows.split(",")]
    ctx = Ctx.current()
    defines = dict(d.split("=", 1) for d in a.define)
    # the launches' ring sizes follow swept ring depths
    fx = mma.MmaFuncs(ctx, load(ctx, compile_cubin(mma.weight_side_source(), defines, ctx.arch)),
                      int(defines.get("HY_MV_STAGES", mma.MV_STAGES)),
                      int(defines.get("HY_RUN_STAGES", mma.RUN_STAGES)))
    out = open(a.out, "a") if a.out else None

    def emit(line):
        line = {**line, "defines": a.define} if a.define else line
        text = json.dumps(line)
        print(text, flush=True)
        if out:
            out.write(text + "\n")
            out.flush()

    bw, tflops = read_bandwidth(ctx, a.reps), mma_rate(ctx, a.reps)
    emit(read_bw_line(ctx, bw))
    emit(mma_rate_line(tflops))
    want = set(a.matrices.split(",")) if a.matrices else None
    for model in a.models.split(","):
        for name, parts, cols, pair in matrices(MODELS[model]):
            if want is None or name in want:
                bench_matrix(ctx, fx, model, name, parts, cols, pair, a, bw, tflops, emit)
    if out:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
