"""The prompt path: a chunk of more than NMAX rows on cuBLAS (ports cuda_hybrid.rs `big`,
`wd_cap`, `att_rows`, `BSTAGES`; `bst` is launch.Stages over `PROF`'s row; the far-field branch
comes with a later issue).

Per layer every weight is expanded from its repacked q4tp tiles into one f16 plane buffer (`hb_wd`,
a band of tiles at a time when the matrix is larger than `CMF_HYB_WD_MB`) and multiplied by cuBLAS
f16 GEMMs with f32 output; weights that share an input (a GDN layer's qkv, z, a and b; attention's
q, k and v) go into the buffer one after another and run as one GEMM when they fit it together. The
GDN chunk goes through conv (with the q / k L2 norms), ring and the chunked delta rule
(`hy_gdn_wy`, which takes the gates from the a / b projections, then `hy_gdn_chunk`), leaving the
layer's state at the chunk's end for the small path to continue from. (The reference launches
`hy_gdn_gb32` first, storing exp(g) that `hy_gdn_wy` takes the log of again; here `hy_gdn_wy`
computes g itself, one launch and one scratch fewer.) Attention appends the chunk's
K/V rows to the f16 mirror (`hy_qk`), then runs in one kernel (`hy_flash_h`) where the head width
allows, else as two strided-batched GEMMs a KV group over the mirror with query rows in passes of
`CMF_HYB_ATT_ROWS` halved until the scores fit a memory cap. Scratch is named (`hs.scr`) and reused
across chunks; hybrid/bigfit.py sizes it and fits a chunk to the budget before anything moves
(`run_chunk` then takes the chunk in the pieces it decided). The input rows reach the card through
pinned staging. Kernels and their layouts: kernels/hyb_big.cuh, hyb_flash.cuh.
"""
from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from cortiq_drv.blas import Gemm
from cortiq_drv.cu.args import dev_ptr, kargs
from cortiq_drv.errors import CortiqError
from cortiq_drv.hybrid.bigfit import (SCAN_ROWS, BigCfg, Fit, att_passes, attn_stride, chunk_need, configured, flash,
                                      gdn_stride, pieces, wd_elems)
from cortiq_drv.hybrid.mma import KIND_Q4TP
from cortiq_drv.hybrid.launch import Stages, rope_rows
from cortiq_drv.hybrid.plan import GdnL

# Bytes of a piece of the input rows' pinned staging (`_stage_rows`), and the threads filling it.
STAGE_PIECE = 4 << 20
STAGE_THREADS = 8
# Stages of CMF_CUDA_PROF=1 on the prompt path, summed over its chunks.
BSTAGES = ("norms", "expand", "gemm", "gdn glue", "gdn scan", "attention", "act", "copies")
# The dynamic shared memory of hy_gdn_wy and hy_gdn_chunk (HB_WY_SMEM, HB_CHUNK_SMEM of
# hyb_gdn_chunk.cuh; its HB_C rows a chunk are bigfit.SCAN_ROWS).
WY_SMEM = (2 * 64 * 132 + 64 * 68 + 2 * 64) * 4
CHUNK_SMEM = (2 * 64 * 132 + 64 * 136 + 64 * 68 + 64 * 36 + 128 * 40 + 2 * 64 * 40 + 2 * 64) * 4
# Warps a block of hy_gdn_chunk (HB_CW).
CHUNK_WARPS = 16
# Rows a thread of hy_gdn_conv32 (HB_CONV_R of hyb_big.cuh).
CONV_ROWS = 8


def flash_smem(hpk: int, hd: int) -> int:
    """hy_flash_h's dynamic shared memory (HB_FLASH_SMEM of kernels/hyb_flash.cuh)."""
    return (hpk * 16 + 4 * 32) * (hd + 8) * 2


class BigProf:
    """The prompt path's stage times (`BSTAGE_NS`) and rows (`BROWS`), process-wide as the
    reference keeps them."""

    def __init__(self):
        self.rows = 0
        self.ns = [0] * len(BSTAGES)

    def report(self) -> list[str]:
        """Lines of ms per 1000 rows per stage (empty before any prompt row)."""
        if not self.rows:
            return []
        per = lambda ns: ns / 1e6 / self.rows * 1000
        return [f"cuda hybrid prompt path: {self.rows} rows"] + [
            f"  {name:>10}: {per(ns):8.3f} ms per 1000 rows" for name, ns in zip(BSTAGES, self.ns)]


PROF = BigProf()


@functools.lru_cache(maxsize=1)
def _stage_pool() -> ThreadPoolExecutor:
    """The threads that fill the pinned staging (numpy's copies release the GIL)."""
    return ThreadPoolExecutor(max_workers=STAGE_THREADS, thread_name_prefix="cortiq-stage")


def _stage_rows(hs, bh, h: np.ndarray) -> None:
    """The chunk's rows h into bh through pinned staging (`hs.pin` "hb rows"): pieces filled by the
    pool's threads, each queued for the card once filled, so the card copies one piece while
    the host fills the next (a pageable copy goes through the driver's bounce buffer at a
    fraction of the speed). The staging is written only once the card has copied the last
    chunk's rows out of it (`pin` waits for the last `pin_done`)."""
    src = np.ascontiguousarray(h, dtype=np.float32).reshape(-1)
    pin = hs.pin("hb rows", np.float32, src.size)
    step = STAGE_PIECE // 4
    spans = [(a, min(a + step, src.size)) for a in range(0, src.size, step)]
    jobs = [_stage_pool().submit(np.copyto, pin[a:e], src[a:e]) for a, e in spans]
    for (a, e), job in zip(spans, jobs):
        job.result()
        bh.upload_async(pin[a:e], a * 4)
    hs.pin_done("hb rows")


class _Mul:
    """y [b][ldy] = alpha W x + beta y for a repacked q4tp W and f16 rows x [b][cols]: the
    weight expanded into `wd` (`wd_elems` elements; a band of tiles at a time when it is larger),
    then a GEMM. `stacked` runs weights that share x as one GEMM when they fit `wd` together."""

    def __init__(self, ctx, fx, wd, wd_elems: int, b: int, st: Stages):
        self.ctx, self.fx, self.wd, self.wd_elems, self.b, self.st = ctx, fx, wd, wd_elems, b, st

    def _expand(self, m, dst: int, t0: int = 0, nt: int = 0) -> None:
        """Tiles [t0, t0 + nt) of q4tp matrix m as f16 rows at dst (`hy_expand_pr`; nt 0: the
        whole matrix, the reference's `expand_p`)."""
        if m.kind != KIND_Q4TP:
            raise CortiqError("a weight other than repacked q4tp on the prompt path")
        nt = nt or -(-m.rows // 16)
        threads = nt * (m.cols // 32) * 32
        self.ctx.launch(self.fx.expand_pr, (-(-threads // 256), 1), 256, 0,
                        kargs("QQQQiiii", m.w, m.aux0, m.aux1, dst, m.rows, m.cols, t0, nt))

    def __call__(self, m, x, y, ldy: int, alpha: float = 1.0, beta: float = 0.0) -> None:
        ctx, wd = self.ctx, self.wd
        if m.rows * m.cols <= self.wd_elems:
            self._expand(m, wd)
            self.st.mark(1)
            ctx.gemm(True, False, m.rows, self.b, m.cols, alpha, wd, m.cols, x, m.cols, beta, y, ldy, Gemm.HALF)
            self.st.mark(2)
            return
        tiles = -(-m.rows // 16)
        band = max(self.wd_elems // m.cols // 16, 1)
        for t0 in range(0, tiles, band):
            nt = min(band, tiles - t0)
            r0 = t0 * 16
            nr = min(nt * 16, m.rows - r0)
            self._expand(m, wd, t0, nt)
            self.st.mark(1)
            ctx.gemm(True, False, nr, self.b, m.cols, alpha, wd, m.cols, x, m.cols, beta, dev_ptr(y) + r0 * 4, ldy,
                     Gemm.HALF)
            self.st.mark(2)

    def stacked(self, parts, x, y, ldy: int, cols: int) -> None:
        """y [b][ldy] = [P_0; P_1; ...] x for rows x [b][cols], the rows of the weights P_i
        (repacked q4tp matrices, or (Buf, rows): dense f16 rows) one after another in each output
        row: expanded (copied) into `wd` one after another and multiplied by one GEMM when they
        fit it together (a thin weight then costs no GEMM of its own), else a GEMM (or bands)
        each."""
        rows = [p[1] if isinstance(p, tuple) else p.rows for p in parts]
        if sum(rows) * cols > self.wd_elems:
            r0 = 0
            for p, r in zip(parts, rows):
                at = dev_ptr(y) + r0 * 4
                if isinstance(p, tuple):
                    self.ctx.gemm(True, False, r, self.b, cols, 1.0, p[0], cols, x, cols, 0.0, at, ldy, Gemm.HALF)
                else:
                    self(p, x, at, ldy)
                r0 += r
            return
        r0 = 0
        for p, r in zip(parts, rows):
            if isinstance(p, tuple):
                self.wd.view(r0 * cols * 2, r * cols * 2).copy_from(p[0].view(0, r * cols * 2))
            else:
                self._expand(p, dev_ptr(self.wd) + r0 * cols * 2)
            r0 += r
        self.st.mark(1)
        self.ctx.gemm(True, False, r0, self.b, cols, 1.0, self.wd, cols, x, cols, 0.0, y, ldy, Gemm.HALF)
        self.st.mark(2)


def _gdn(hs, plan, g: GdnL, gs, b: int, bxn, bh, mul: _Mul, st: Stages, scr) -> None:
    """A GDN layer over the chunk: qkv, z and a / b (one GEMM, `gdn_stride`), the glue, the
    chunked scan with the gates (the state at the chunk's end), the gated norm, out added to the
    residual."""
    ctx, fx, hidden = hs.ctx, plan.fx, plan.hidden
    vd = g.nv * g.dv
    # each row [qkv | z | a | b] (the gate projections from the f16 copies of the f32 rows)
    ys = gdn_stride(g)
    yq = scr("hb_qkv")
    yz = dev_ptr(yq) + g.cdim * 4
    yab = dev_ptr(yq) + (g.cdim + vd) * 4
    cq = scr("hb_cq")
    yo = scr("hb_o")
    yof = scr("hb_of")
    mul.stacked([g.qkv, g.z, (g.a_h, g.nv), (g.b_h, g.nv)], bxn, yq, ys, hidden)
    # the conv rows with the q and k heads' L2 norms (dk = 128, the plan's)
    groups = -(-b // CONV_ROWS)
    ctx.launch(fx.conv32, (-(-groups * (g.cdim // 4) // 256), 1), 256, 0,
               kargs("QiQQQiiii", yq, ys, gs.ring if g.kk > 1 else 0, g.taps, cq, b, g.cdim, g.kk, g.nk))
    if g.kk > 1:
        ctx.launch(fx.ring, (-(-g.cdim // 256), 1), 256, 0, kargs("QQiiii", gs.ring, yq, ys, b, g.cdim, g.kk))
    st.mark(3)
    # the chunked rule: every chunk's gates and state-free part at once, then the state chunk by
    # chunk
    wg = scr("hb_wg")
    ww = scr("hb_ww")
    wu = scr("hb_wu")
    wp = scr("hb_wp")
    ctx.launch(fx.wy, (-(-b // SCAN_ROWS), g.nv), 256, WY_SMEM,
               kargs("QQiQQQQQQiiii", cq, yab, ys, g.a_log, g.dt_bias, wg, ww, wu, wp, b, g.cdim, g.nv, g.nk))
    ctx.launch(fx.chunk, (vd // 32, 1), 32 * CHUNK_WARPS, CHUNK_SMEM,
               kargs("QQQQQQQiiii", cq, wg, ww, wu, wp, gs.s, yo, b, g.cdim, g.nv, g.nk))
    st.mark(4)
    ctx.launch(fx.out_h, (-(-b * g.nv // 8), 1), 256, 0,
               kargs("QQiQQiifi", yo, yz, ys, g.norm, yof, g.nv, g.dv, plan.eps, b))
    st.mark(3)
    mul(g.out, yof, bh, hidden, 1.0, 1.0)


def attend(ctx, fx, kp, vp, qgh, aog, bis, bs, bp, pos0: int, b: int, col_base: int, nkv: int, hpk: int, hd: int,
           scale: float, att_rows: int) -> None:
    """The chunk's attention over the mirror rows [0, pos0 + b - col_base), pass by pass (the
    score GEMM, `hy_softmax_h`, the value GEMM) of at most `att_rows` query rows: ao and isum
    group-major (kernels/hyb_big.cuh); the scores S in bs (f32) and the weights P in bp (f16),
    each as large as `bigfit.score_bytes` says for these rows at least."""
    nh, lda, grow = nkv * hpk, nkv * hd, hpk * hd
    for b0, bn in att_passes(pos0, b, col_base, nh, att_rows):
        p0 = pos0 + b0
        l_rows, cols = p0 + bn - col_base, bn * hpk
        # the mirrors hold f16 rows: both GEMMs on f16 operands (the query copy, the weights)
        ctx.gemm_strided_batched_f16(True, l_rows, cols, hd, scale, kp, lda, hd, dev_ptr(qgh) + b0 * grow * 2, hd,
                                     b * grow, bs, l_rows, l_rows * cols, nkv)
        ctx.launch(fx.softmax_h, (nkv * cols, 1), 256, 0,
                   kargs("QQQiiiiii", bs, bp, dev_ptr(bis) + b0 * hpk * 4, l_rows, p0, col_base, hpk, cols, b * hpk))
        ctx.gemm_strided_batched_f16(False, hd, cols, l_rows, 1.0, vp, lda, hd, bp, l_rows, l_rows * cols,
                                     dev_ptr(aog) + b0 * grow * 4, hd, b * grow, nkv)


def _attn(hs, plan, a, m, pos0: int, b: int, bxn, bh, btab, mul: _Mul, st: Stages, cfg: BigCfg, scr) -> None:
    """A gated attention layer over the chunk: q, k, v (one GEMM, `attn_stride`); norms, rotary,
    the chunk's K/V rows into the mirror; attention (`hy_flash_h`, else per pass the score GEMM,
    the masked softmax, the value GEMM, then the normalised, gated output); o added to the
    residual."""
    ctx, fx = hs.ctx, plan.fx
    nh, nkv, hd, hpk, hidden = plan.nh, plan.nkv, plan.hd, plan.hpk, plan.hidden
    qr, ys = a.q.rows, attn_stride(a, nkv, hd)
    yq = scr("hb_q")
    qgh = scr("hb_qgh")
    gt = scr("hb_gate")
    bao = scr("hb_ao")
    mul.stacked([a.q, a.k, a.v], bxn, yq, ys, hidden)
    if m.stored != pos0 or m.cap < pos0 + b:
        raise CortiqError(f"K/V mirror holds {m.stored} of {m.cap} rows, the chunk is {b} rows at {pos0}")
    slot0, col_base = m.stored, 0
    m.stored += b
    on = flash(plan, cfg)
    # the f32 query copy only for the score GEMM's path (hy_flash_h reads the f16 one)
    qg = 0 if on else scr("hb_qg")
    ctx.launch(fx.qk, (nh + nkv, b), hd, 0,
               kargs("QiQQiQQQQQQQiiifiiiiQQ", yq, ys, dev_ptr(yq) + qr * 4, dev_ptr(yq) + (qr + nkv * hd) * 4, ys,
                     a.qn, a.kn, qg, gt, m.k, m.v, btab, nh, nkv, plan.half, plan.eps, int(plan.gemma),
                     int(a.gated), slot0, b, 0, qgh if on else 0))
    if on:
        ctx.launch(fx.flash, (-(-b // 16), nkv), 32 * hpk, flash_smem(hpk, hd),
                   kargs("QQQQQiiif", qgh, m.k, m.v, gt if a.gated else 0, bao, b, pos0, nkv, plan.scale))
    else:
        aog = scr("hb_aog")
        bis = scr("hb_is")
        ctx.launch(fx.q_half_g, (-(-b * nh * hd // 256), 1), 256, 0, kargs("QQiiii", qg, qgh, b, nh, hpk, hd))
        attend(ctx, fx, m.k, m.v, qgh, aog, bis, scr("hb_s"), scr("hb_p"), pos0, b, col_base, nkv, hpk, hd,
               plan.scale, cfg.att_rows)
        ctx.launch(fx.attn_out, (-(-b * nh * hd // 256), 1), 256, 0,
                   kargs("QQQQiiii", aog, bis, gt if a.gated else 0, bao, nh, b, hpk, hd))
    st.mark(5)
    mul(a.o, bao, bh, hidden, 1.0, 1.0)


def _ffn(hs, plan, pl, b: int, bxn, bh, mul: _Mul, st: Stages, scr) -> None:
    """The dense FFN over the chunk: the post norm, gate/up as one GEMM in the pair's row order,
    silu(gate) * up / 16 in f16, down with alpha 16 added to the residual."""
    ctx, fx, inter = hs.ctx, plan.fx, pl.inter
    bgu = scr("hb_gu")
    bmh = scr("hb_mh")
    ctx.launch(fx.rmsnorm, (b, 1), 256, 0, kargs("QQQifi", bh, pl.post_norm, bxn, plan.hidden, plan.eps,
                                                 int(plan.gemma)))
    st.mark(0)
    mul(pl.gu, bxn, bgu, 2 * inter)
    ctx.launch(fx.silu_pair, (-(-b * (inter // 8) // 256), 1), 256, 0, kargs("QQii", bgu, bmh, inter, b))
    st.mark(6)
    mul(pl.down, bmh, bh, plan.hidden, 16.0, 1.0)


def big(hs, plan, kv_id: int, layer_base: int, positions, h: np.ndarray, defer: bool = False,
        f: Fit | None = None) -> None:
    """Rows h [b, hidden] at contiguous `positions` through the plan's layers on the prompt path
    (`big`); every layer's state admitted at positions[0] with room for b rows (`admit`). h
    becomes the residual rows after the last layer, unless `defer`: then nothing comes back and
    the stream runs on (a prompt's chunks before its last). `f`: the chunk's fit (`prepare`: the
    band, passes and score sizing, the named scratch sized for its pieces; None: the knobs'
    configuration, the scratch sized for these rows alone); the rows of a call are its own
    (`run_chunk` splits a chunk)."""
    ctx, fx = hs.ctx, plan.fx
    positions = [int(p) for p in positions]
    b, pos0, hidden = len(positions), positions[0], plan.hidden
    if f is None:
        cfg = configured(b, hs.kv_hint)
        f = Fit(cfg, chunk_need(plan, b, pos0, cfg), ())
    cfg, sizes = f.cfg, f.sizes
    st = Stages(ctx, PROF.ns, hs.prof)
    # the named scratch, each as large as the fit sized it (`prepare` has allocated them)
    scr = lambda name: hs.scr(name, sizes[name])
    bh = scr("hb_h")
    bxn = scr("hb_xn")
    # the expansion buffer: the largest weight or stack of weights, or a band of rows of it
    wd = scr("hb_wd")
    want = hs.taps_wanted
    tapping = bool(want) and layer_base == 0 and all(l < len(plan.layers) for l in want)
    tapped = np.empty((len(want), b, hidden), dtype=np.float32) if tapping else None
    tab = rope_rows(plan.invf, positions)
    btab = scr("hb_tab")
    _stage_rows(hs, bh, h)
    if tab.size:
        btab.upload_async(tab)
    PROF.rows += b
    st.mark(7)
    mul = _Mul(ctx, fx, wd, wd_elems(plan, cfg.wd_bytes), b, st)
    for li, pl in enumerate(plan.layers):
        key = (kv_id, layer_base + li)
        ctx.launch(fx.rmsnorm, (b, 1), 256, 0, kargs("QQQifi", bh, pl.in_norm, bxn, hidden, plan.eps,
                                                     int(plan.gemma)))
        st.mark(0)
        if isinstance(pl.mix, GdnL):
            gs = hs.gdn.get(key)
            if gs is None or gs.next_pos != pos0:
                raise CortiqError(f"GDN state of layer {li} missing or not at row {pos0}")
            _gdn(hs, plan, pl.mix, gs, b, bxn, bh, mul, st, scr)
            gs.next_pos, gs.tape = pos0 + b, None
        else:
            m = hs.kv.get(key)
            if m is None:
                raise CortiqError(f"K/V mirror of layer {li} missing")
            _attn(hs, plan, pl.mix, m, pos0, b, bxn, bh, btab, mul, st, cfg, scr)
        _ffn(hs, plan, pl, b, bxn, bh, mul, st, scr)
        if tapping and li in want:
            # pageable: done when it returns
            bh.download_async(tapped[list(want).index(li)])
    if tapping:
        ctx.sync()
        hs.taps_out = tapped
    if not defer:
        out = np.empty((b, hidden), dtype=np.float32)
        bh.download_async(out)
        ctx.sync()
        h.reshape(-1)[:] = out.reshape(-1)
    st.mark(7)
    hs.mem_report(f"a prompt chunk of {b} rows at {pos0}")


def run_chunk(hs, plan, kv_id: int, layer_base: int, positions, h: np.ndarray, defer: bool, f: Fit) -> None:
    """A prompt chunk through `big` in the pieces `bigfit.prepare` decided, in order (each takes
    the scratch `prepare` allocated); the pieces' taps joined."""
    positions = [int(p) for p in positions]
    b = len(positions)
    rows = h.reshape(b, plan.hidden)
    taps = []
    for s, e in pieces(b, f.cfg.rows):
        hs.taps_out = None
        big(hs, plan, kv_id, layer_base, positions[s:e], rows[s:e], defer, f)
        if hs.taps_out is not None:
            taps.append(hs.taps_out)
    # [layer][row][hidden] a piece
    hs.taps_out = np.concatenate(taps, axis=1) if taps else None
