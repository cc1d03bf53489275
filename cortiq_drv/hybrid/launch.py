"""The small path's launches (ports cuda_hybrid.rs `HFuncs`, `launch`, `head_launch`, the greedy
pick after the head, `hst`, `rope_rows`).

`launch` queues, for the rows in `plan.rows.h` (n <= NMAX) as `book` laid them out, every layer's
kernels and device copies and nothing else: no host work, no synchronisation (outside the
profile's stage marks), so a stream capture records it as it is. Argument lists follow the
kernels' comments in kernels/hyb_gdn.cuh and hyb_attn.cuh.
"""

from __future__ import annotations

import time

import numpy as np

from cortiq_drv.cu.args import kargs
from cortiq_drv.host.ops import rope_tables
from cortiq_drv.hybrid.book import attn_grid, scratch_nblk
from cortiq_drv.hybrid.mma import MmaFuncs, rmsnorm2
from cortiq_drv.hybrid.plan import GdnL
from cortiq_drv.hybrid.state import ARGMAX_BLOCKS

# Stages of CMF_CUDA_PROF=1 on the small path, each closed by a stream sync.
HSTAGES = ("norms", "gdn in", "gdn core", "gdn out", "attn in", "attn core", "attn out", "gate+up",
           "silu", "down", "head", "copies")


# The decode step's kernels besides the matvec's that start with pdl_begin() (kernels/common.cuh),
# launched as programmatic dependents.
PDL_KERNELS = ("hy_gdn_front", "hy_gdn_scan", "hy_gdn_scan4", "hy_gdn_out32", "hy_gdn_scan4_out32", "hy_qk",
               "hy_scores", "hy_values", "hy_finish", "hy_argmax")


# The most rows at which a GDN layer's column scan and gated norm run as one launch
# (hy_gdn_scan4_out32, a block a value head) rather than the reference's two (hy_gdn_scan4, a
# block for 32 value columns, then hy_gdn_out32); the same bits either way. One launch fewer wins
# while the rows are few; past them the pair's nv dv / 32 blocks (the 9B's 128 against 32) carry
# the longer scan. H200, session 22, bench_decode --shapes 9b,27b --source mem --skip-matvec
# --tokens 16 --windows 2,4,8,16, window device ms, fused at every n / at n <= 1 / at n <= 3:
# 9b n 2 2.2174 / 2.2057 / 2.2012, n 4 2.804 / 2.7805 / 2.7834, n 8 3.5763 / 3.472 / 3.4706, n 16
# 6.7811 / 6.6361 / 6.6349; 27b n 2 6.5117 / 6.6015 / 6.5124, n 4 8.3029 / 8.3302 / 8.3285, n 8
# 10.69 / 10.6033 / 10.6192, n 16 22.689 / 22.4723 / 22.4705; one-row steps unchanged. The pair
# at one row too (0) loses the step (session 23 call 10, the same command with --windows 2, device
# ms, two runs each, 3 against 0: 9b 2.0465 / 2.041 against 2.0627 / 2.0629, 27b 6.0454 / 6.0205
# against 6.1003 / 6.0814; 277 against 301 nodes on 9b). Taking the GDN front into the same
# launch loses too (session 28, hy_gdn_front_scan4_out32, not kept: each block a value head first
# runs the front's units of its head, q and k of its key head again in each of the key head's
# blocks, the last of them to be done reading the conv ring moving its q and k channels by an
# arrival count; the gates' dots ahead of pdl_begin in a second try; the same bytes as the three
# launches, GPU tests of the GDN kernels 50 passed; H200 calls 1-2, bench_decode --shapes 9b,27b
# --source mem --skip-matvec --tokens 32 --windows 2,3,8 --prompt 64, device ms, two runs each,
# second try against this: 9b step 2.0189 / 2.0173 against 1.9895 / 1.9909, 2-row window 2.2409 /
# 2.2426 against 2.1733 / 2.1716, 3-row 2.8359 / 2.8345 against 2.7123 / 2.7127; 27b step 5.9792
# / 5.9744 against 5.9227 / 5.9108; first try 9b 2.0281 / 2.033, 27b 6.0318 / 6.0352; 253 against
# 277 nodes on 9b): one block an SM doing a head's front serially costs more than the front's
# launch, whose 160 blocks (9B) run its units side by side. Nor does spreading the one launch's
# head over a cluster of four blocks of 128 threads win (session 28, not kept: each block
# hy_gdn_scan4's 32 columns, the head's norm sums of each row exchanged through distributed shared
# memory, the same bytes as the two launches, GPU suite 284 passed; H200 call 5, the command above
# with --windows 2,3,4,8, device ms, one run each, clusters at n <= 3 / clusters at every n / this):
# 9b step 2.02 / 2.0199 / 2.0013, windows n 2 2.1756 / 2.1686 / 2.1878, n 3 2.6916 / 2.6877 /
# 2.7141, n 4 2.7404 / 2.7159 / 2.7453, n 8 3.3705 / 3.3812 / 3.3711; 27b step 5.9791 / 5.9676 /
# 5.9274, n 3 8.1571 / 8.1575 / 7.9648, n 8 10.2551 / 10.2838 / 10.2385.
FUSED_SCAN_ROWS = 3


class HFuncs(MmaFuncs):
    """The kernels of one hyb.cu module (compiled for one HPK, HD): the matvec's and these;
    PDL_KERNELS are marked `pdl`."""

    def __init__(self, ctx, module):
        super().__init__(ctx, module)
        names = dict(front="hy_gdn_front", scan="hy_gdn_scan", scan4="hy_gdn_scan4", out32="hy_gdn_out32",
                     scan4_out32="hy_gdn_scan4_out32",
                     rs_scan="hy_gdn_restore_scan", rs_scan4="hy_gdn_restore_scan4",
                     rs_ring="hy_gdn_restore_ring", qk="hy_qk", scores="hy_scores", values="hy_values",
                     finish="hy_finish", argmax="hy_argmax", gather="hy_embed_gather", to_half="hy_to_half",
                     copy16="hy_copy16",
                     # the prompt path's (kernels/hyb_big.cuh, hyb_gdn_chunk.cuh, hybrid/big.py)
                     expand_pr="hy_expand_pr", rmsnorm="hy_rmsnorm",
                     conv32="hy_gdn_conv32", ring="hy_gdn_ring", wy="hy_gdn_wy", chunk="hy_gdn_chunk",
                     out_h="hy_gdn_out_h", q_half_g="hy_q_half_g",
                     softmax_h="hy_softmax_h", attn_out="hy_attn_out", silu_pair="hy_silu_pair_half",
                     flash="hy_flash_h")
        for attr, name in names.items():
            setattr(self, attr, module.func(name))
        for name in PDL_KERNELS:
            module.func(name).pdl = True


class Stages:
    """`hst` and `bst` (CMF_CUDA_PROF): with the profile on, each mark syncs `ctx`'s stream and
    adds the time since the last one to acc[s] (a row of stage totals: the small path's for calls
    of n rows, the prompt path's); off, marks cost nothing."""

    def __init__(self, ctx, acc, on: bool):
        self.ctx, self.acc, self.on = ctx, acc, on
        self.t = time.perf_counter_ns()

    def mark(self, s: int) -> None:
        if self.on:
            self.ctx.sync()
            now = time.perf_counter_ns()
            self.acc[s] += now - self.t
            self.t = now


def _gdn(ctx, plan, g: GdnL, views, n: int, tape: bool, st: Stages) -> None:
    """A GDN layer: qkv and z, the front, the scan (and the tape), the gated norm, out."""
    fx, r, geo, planes = plan.fx, plan.rows, plan.geom, plan.planes()
    s, ring, t_qkv, t_cq, t_gb, s_save, ring_save = views
    g.ms_in.run(ctx, fx, planes, plan.hidden, n)
    st.mark(1)
    # dk = 128 (every Qwen3.5-family file): the column scan, which keeps the tape's state copy
    col_scan = g.dk == 128 and g.dv % 32 == 0
    if tape and not col_scan:
        s_save.copy_from(s.view(0, g.nv * g.dk * g.dv * 4))
    # the front keeps the tape's raw rows (the ring replays from them; at the projection's own row
    # stride) and the ring as the window found it. The reference copies both before the front:
    # two device copies a GDN layer in the window's graph, which cost the 9B's windows 55-77 us
    # on the H200 (bench_decode's verify_window lines, n = 2..16)
    tq, rs = (t_qkv, ring_save if g.kk > 1 else 0) if tape else (0, 0)
    # the front's gate blocks read xn before pdl_begin, so at least one launch (ms_in's) must stand
    # between the norm that writes it and the front (common.cuh's PDL rule): H200, session 29,
    # `bench_decode --shapes 9b,27b --source mem --skip-matvec --tokens 32 --windows 2,8 --prompt
    # 64`, device ms, two runs each, against the dots after pdl_begin: 9b step 1.9828 / 1.9801
    # against 1.9926 / 1.9997, 8-row window 3.3187 / 3.3255 against 3.3665 / 3.366, 2-row 2.172 /
    # 2.1784 against 2.1695 / 2.1743; 27b step 5.8964 / 5.9107 against 5.9281 / 5.9661, 8-row window
    # 10.1904 / 10.1887 against 10.2496 / 10.2529
    ctx.launch(fx.front, (g.cdim // g.dk + 2 * g.nv, n), max(g.dk, 64), 0,
               kargs("QiQQQiiiiiQiQQQQQiQQ", r.qkv, geo.cdmax, ring, g.taps, t_cq, n, g.cdim, g.kk, g.nk,
                     g.dk, r.xn, plan.hidden, g.a, g.b, g.a_log, g.dt_bias, t_gb, g.nv, tq, rs))
    # the scan, with blocks after it that move the conv ring, then the gated norm (plain w and the
    # gate silu on Qwen3.5: sig 0, gemma 0): one launch for both where a head fits a block and the
    # call is short (FUSED_SCAN_ROWS); the same bits either way
    fused = col_scan and g.dv <= 128 and n <= FUSED_SCAN_ROWS
    save = s_save if tape else 0
    ring_p = ring if g.kk > 1 else 0
    out_args = (r.z, geo.vdmax, g.norm, r.of)
    planes_args = (planes.p0, planes.p1, planes.p2, planes.stride)
    if fused:
        ring_blocks = -(-g.cdim // (4 * g.dv)) if g.kk > 1 else 0
        ctx.launch(fx.scan4_out32, (g.nv + ring_blocks, 1), 4 * g.dv, 0,
                   kargs("QQQQiiiiiQQiiQQiQQfiiQQQi", t_cq, t_gb, s, r.o, n, g.cdim, g.nv, g.nk, g.dv, ring_p,
                         r.qkv, geo.cdmax, g.kk, save, *out_args, plan.eps, 0, 0, *planes_args))
    elif col_scan:
        ring_blocks = -(-g.cdim // 128) if g.kk > 1 else 0
        ctx.launch(fx.scan4, (g.nv * g.dv // 32 + ring_blocks, 1), 128, 0,
                   kargs("QQQQiiiiiQQiiQ", t_cq, t_gb, s, r.o, n, g.cdim, g.nv, g.nk, g.dv, ring_p, r.qkv,
                         geo.cdmax, g.kk, save))
    else:
        ring_blocks = -(-g.cdim // 256) if g.kk > 1 else 0
        ctx.launch(fx.scan, (-(-g.nv * g.dv // 8) + ring_blocks, 1), 256, 0,
                   kargs("QQQQiiiiiiQQii", t_cq, t_gb, s, r.o, n, g.cdim, g.nv, g.nk, g.dk, g.dv, ring_p,
                         r.qkv, geo.cdmax, g.kk))
    if not fused:
        ctx.launch(fx.out32, (n * g.nv, 1), g.dv, 0,
                   kargs("QQiQQiifiiQQQi", r.o, *out_args, g.nv, g.dv, plan.eps, 0, 0, *planes_args))
    st.mark(2)
    g.ms_out.run(ctx, fx, planes, g.nv * g.dv, n)
    st.mark(3)


def _attn(ctx, plan, a, kv, rec, cip: int, scratch, n: int, tab, st: Stages) -> None:
    """A gated attention layer: q, k, v; norms, rotary and the mirror rows; scores, values,
    the gated finish into the planes; o."""
    fx, r, planes = plan.fx, plan.rows, plan.planes()
    nh, nkv, hd = plan.nh, plan.nkv, plan.hd
    kp, vp = kv
    s_p, mx_p, p_p, e_p = scratch
    n0, slot0, rb, ncap, nbcap = (int(x) for x in rec[:5])
    a.ms_in.run(ctx, fx, planes, plan.hidden, n)
    st.mark(4)
    ctx.launch(fx.qk, (nh + nkv, n), hd, 0,
               kargs("QiQQiQQQQQQQiiifiiiiQQ", r.q, plan.geom.qrow, r.k, r.v, nkv * hd, a.qn, a.kn, r.qg,
                     r.gate, kp, vp, tab, nh, nkv, plan.half, plan.eps, int(plan.gemma), int(a.gated),
                     slot0, n, cip, 0))
    # a grid for any record the scratch holds: blocks walk key blocks, those past the call's keys
    # leave
    grid = (attn_grid(nkv, n, fx.sm_count, scratch_nblk(scratch, nh)), nkv, n)
    ctx.launch_3d(fx.scores, grid, 256, 0,
                  kargs("QQQQiiifiiiiQ", r.qg, kp, s_p, mx_p, n0, 0, nkv, plan.scale, rb, ncap, nbcap, n,
                        cip))
    ctx.launch_3d(fx.values, grid, 256, 0,
                  kargs("QQQQQiiiiiiiQ", s_p, mx_p, vp, p_p, e_p, n0, 0, nkv, rb, ncap, nbcap, n, cip))
    ctx.launch(fx.finish, (nh, n), 256, 0,
               kargs("QQQQQQiiiiiQ", p_p, e_p, r.gate if a.gated else 0, planes.p0, planes.p1, planes.p2,
                     planes.stride, n0, rb, nh, nbcap, cip))
    st.mark(5)
    a.ms_out.run(ctx, fx, planes, nh * hd, n)
    st.mark(6)


def launch(ctx, plan, bk, n: int, tape: bool, taps=(), st: Stages | None = None) -> None:
    """Every layer over the n rows in `plan.rows.h` (`launch`); `tape` keeps what a verify
    window needs to step back; `taps` [(layer, Buf)] copy the residual rows after a layer."""
    st = st or Stages(None, None, False)
    fx, r, planes = plan.fx, plan.rows, plan.planes()
    hidden, eps, gemma = plan.hidden, plan.eps, plan.gemma
    st.mark(11)
    ai = 0
    for li, pl in enumerate(plan.layers):
        rmsnorm2(ctx, fx, r.h, pl.in_norm, r.xn, hidden, eps, gemma, planes, n)
        st.mark(0)
        if isinstance(pl.mix, GdnL):
            _gdn(ctx, plan, pl.mix, bk.layers[li], n, tape, st)
        else:
            _attn(ctx, plan, pl.mix, bk.layers[li], bk.ci[ai * 8:ai * 8 + 8], plan.ci.ptr + ai * 32,
                  bk.scratch, n, r.tab, st)
            ai += 1
        rmsnorm2(ctx, fx, r.h, pl.post_norm, None, hidden, eps, gemma, planes, n)
        st.mark(0)
        # gate/up with silu(gate) * up made in its epilogue, into the middle's planes
        pl.ms_gu.run(ctx, fx, planes, hidden, n)
        st.mark(7)
        pl.ms_dn.run(ctx, fx, plan.mid(), pl.inter, n)
        st.mark(9)
        for tl, dst in taps:
            if tl == li:
                dst.copy_from(r.h.view(0, n * hidden * 4))


def head_launch(ctx, plan, n: int, st: Stages | None = None) -> int:
    """The head over the rows in `plan.rows.h`: logits [n][rows] into `plan.rows.logits`."""
    if plan.lm is None:
        return 0
    st = st or Stages(None, None, False)
    _, rows, js = plan.lm
    planes = plan.planes()
    rmsnorm2(ctx, plan.fx, plan.rows.h, plan.final_norm, None, plan.hidden, plan.eps, plan.gemma, planes, n)
    js.run(ctx, plan.fx, planes, plan.hidden, n)
    st.mark(10)
    return rows


def pick_launch(ctx, plan, n: int, ids) -> None:
    """Each row's argmax over the head's rows (`hy_argmax`, the lowest index among equals) into
    `ids` (int32 [n]: the pinned host twin's `RowIO.pick_host`): the head's row count is the
    sampleable ids', so padding is never picked.
    ARGMAX_BLOCKS blocks a row, their parts and arrival counts in the plan's `RowIO`."""
    rows, io = plan.lm[1], plan.rows.io
    ctx.launch(plan.fx.argmax, (ARGMAX_BLOCKS, n), 256, 0,
               kargs("QiiQiQQ", plan.rows.logits, rows, rows, ids, 0, io.apart, io.acnt))


def rope_rows(invf: np.ndarray, positions) -> np.ndarray:
    """(sin, cos) per row and frequency, [row][pair][2] f32: the host's `rope_tables` (angle =
    f32(position) * invf) in the layout the kernels read."""
    cos, sin = rope_tables(invf, np.asarray(positions))  # [rows, half] each
    tab = np.empty(cos.shape + (2,), dtype=np.float32)
    tab[..., 0] = sin
    tab[..., 1] = cos
    return tab
