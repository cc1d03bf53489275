"""The hybrid arm's small path behind the graph contract (ports cuda_hybrid.rs `wants`, `token`,
`batch`'s small branch, and the arm's use of `decline`).

Outcomes are the reference's: Declined where it refuses before any state the caller relies on
moved (the caller may fall back to the host arm), Failed where the card's state moved or cannot be
used (the sequence must be rebuilt), Completed otherwise.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from cortiq_drv.errors import CortiqError, Declined
from cortiq_drv.graph import BatchGraphOutcome, GraphAttn, TokenGraphOutcome
from cortiq_drv.hybrid.admit import admit
from cortiq_drv.hybrid import bigfit
from cortiq_drv.hybrid.big import run_chunk
from cortiq_drv.hybrid.graphs import KtCtx, run_small, tap_slots, taps_read
from cortiq_drv.hybrid.launch import rope_rows
from cortiq_drv.hybrid.plan import plan_for
from cortiq_drv.hybrid.state import NMAX

# Past this many declines only the count grows (`CMF_CUDA_DEBUG` prints each).
_DECLINES_KEPT = 256
# Positions of a plan's RoPE block (`_rope_row`).
ROPE_BLOCK = 256


def wants(layers, nh: int, nkv: int, hd: int) -> bool:
    """Does this stack belong to the hybrid arm? A GDN layer, or full attention with Q/K norms or
    the element-wise output gate. An empty stack (a head pass) goes here when the dense arm's
    attention kernels cannot take the geometry."""
    if not layers:
        hpk = nh // nkv if nkv > 0 else 0
        return 8 * hpk * hd * 4 > 44_000
    return any(isinstance(l.attn, GraphAttn.Gdn) or (isinstance(l.attn, GraphAttn.Full) and (
        l.attn.output_gate or l.attn.q_norm is not None or l.attn.k_norm is not None)) for l in layers)


def decline(hs, what: str, reason: str) -> str:
    """Note a refusal (`decline`): kept in the counters, on stderr under CMF_CUDA_DEBUG."""
    d = hs.counters.declines
    if len(d) < _DECLINES_KEPT:
        d.append((what, reason))
    if hs.debug:
        print(f"cuda hybrid: {what} declined: {reason}", file=sys.stderr)
    return f"{what}: {reason}"


def _upload_rows(plan, h: np.ndarray, positions) -> None:
    """The call's residual rows and RoPE rows into the plan's fixed buffers (a deferred batch:
    the stream runs on past it, so the host twin cannot carry them)."""
    plan.rows.h.upload_async(np.ascontiguousarray(h, dtype=np.float32).reshape(-1))
    tab = rope_rows(plan.invf, positions)
    if tab.size:
        plan.rows.tab.upload_async(tab)


def _rope_row(plan, position: int) -> np.ndarray:
    """The RoPE row [half * 2] of `position`, out of the plan's block of ROPE_BLOCK positions (made
    when the position leaves it): no trigonometry per token. numpy's float32 sin and cos give an
    element the same bits whatever the array's length, so the row equals `rope_rows` of the
    position alone, as a window's rows do."""
    p0, rows = plan.rope or (-ROPE_BLOCK, None)
    if not p0 <= position < p0 + ROPE_BLOCK:
        p0 = position - position % ROPE_BLOCK
        rows = rope_rows(plan.invf, range(p0, p0 + ROPE_BLOCK)).reshape(ROPE_BLOCK, -1)
        plan.rope = (p0, rows)
    return rows[position - p0]


def _stage_rows(plan, h: np.ndarray, positions) -> None:
    """A call's residual rows and RoPE rows into the plan's pinned host twin (`RowIO`), which the
    call's graph reads, with the call records, in its first kernel."""
    io, n = plan.rows.io, len(positions)
    io.h_h[:n] = h.reshape(n, -1)
    if plan.invf.size:
        for i, p in enumerate(positions):
            io.tab_h[i] = _rope_row(plan, p)


def token(hs, cmf, kv_id: int, layers, invf, h: np.ndarray, *, nh: int, nkv: int, hd: int,
          attn_scale: float, rd: int, hidden: int, position: int, cap: int, gemma: bool, eps: float,
          lm_head=None, final_norm=None, logits: np.ndarray | None = None, layer_base: int = 0,
          hidden_too: bool = False, steps: int = 1, loop_norm_at=(), o1=(),
          pick: np.ndarray | None = None) -> TokenGraphOutcome:
    """One decode step of the row h [hidden] at `position` through `layers` (`token`).

    With `lm_head` = (GraphW, rows): logits [rows] into `logits` (and h updated too when
    `hidden_too`); without: h becomes the residual row after the last layer. With `pick` (int32,
    at least 1): the greedy pick, the argmax of the head's rows (the lowest id among equals),
    taken on the card into pick[0]; the logits then come back only when `logits` is given."""
    what = "hybrid token"
    if steps != 1 or len(loop_norm_at) or any(v is not None for v in o1):
        why = "a multi-step burst, a mid-stack norm or far-field views"
        return TokenGraphOutcome.declined(decline(hs, what, why))
    if position >= cap or h.size != hidden:
        why = "position past the context cap or a row not of the hidden width"
        return TokenGraphOutcome.declined(decline(hs, what, why))
    if lm_head is not None and (logits.size < lm_head[1] if logits is not None else pick is None):
        return TokenGraphOutcome.declined(decline(hs, what, "no logits buffer of the head's rows"))
    if pick is not None and (lm_head is None or pick.size < 1 or pick.dtype != np.int32):
        return TokenGraphOutcome.declined(decline(hs, what, "a pick without the head or an int32 slot"))
    with hs.lock:
        try:
            plan = plan_for(hs, cmf, layers, layer_base, lm_head, final_norm, nh, nkv, hd, rd, hidden, gemma,
                            eps, attn_scale, invf, position)
        except Declined as e:
            return TokenGraphOutcome.declined(decline(hs, what, e.reason))
        bad = admit(hs, plan, layers, kv_id, layer_base, position, 1, 0)
        if bad is not None:
            reason = decline(hs, what, bad[1])
            return TokenGraphOutcome.failed(reason) if bad[0] else TokenGraphOutcome.declined(reason)
        t0 = time.perf_counter()
        # CMF_HYB_KT=N: the kernels of the N-th token, timed one by one
        kt = KtCtx(hs.ctx) if hs.counters.tokens_seen == hs.kt else None
        hs.counters.tokens_seen += 1
        try:
            _token_run(hs, plan, kv_id, layers, h, position, cap, logits, pick, layer_base, hidden_too, kt)
        except CortiqError as e:
            print(f"cuda hybrid token graph failed: {e}", file=sys.stderr)
            _quiet_sync(hs)
            return TokenGraphOutcome.failed(str(e))
        if kt is not None:
            kt.report()
        if hs.debug:
            hs.token_us.append(int((time.perf_counter() - t0) * 1e6))
        if position % 256 == 0:
            hs.mem_report(f"a token at {position}")
        return TokenGraphOutcome.completed()


def _into(dst: np.ndarray | None, n: int) -> np.ndarray | None:
    """The first n values of `dst` when a download can land there directly (contiguous,
    writable float32): no staging array and no copy of a 248320-float row per token."""
    if dst is None or dst.dtype != np.float32 or not dst.flags.c_contiguous or not dst.flags.writeable:
        return None
    return dst.reshape(-1)[:n]


def _token_run(hs, plan, kv_id, layers, h, position, cap, logits, pick, layer_base, hidden_too, kt) -> None:
    _stage_rows(plan, h, (position,))
    taps = tap_slots(hs, len(layers), layer_base, plan.hidden) or ()
    io = plan.rows.io
    # the id and the row come back into the host twin inside the graph
    rows = run_small(hs, plan, kv_id, layer_base, position, 1, False, plan.lm is not None, cap, taps, kt,
                     io.pick_host if pick is not None else None, staged=True)
    want_h = not rows or hidden_too
    # the logits straight into the caller's row where it can take the bytes as they are
    out = _into(logits, rows) if rows and logits is not None else None
    stage_out = rows and logits is not None and out is None
    if rows and logits is not None:
        out = np.empty(rows, dtype=np.float32) if stage_out else out
        plan.rows.logits.download_async(out)
    hs.ctx.sync()
    if taps:
        hs.taps_out = taps_read(taps, 1, plan.hidden)
    if pick is not None:
        pick.reshape(-1)[0] = io.pick_h[0]
    if stage_out:
        logits.reshape(-1)[:rows] = out
    if want_h:
        h.reshape(-1)[:] = io.h_h[0]


def _quiet_sync(hs) -> None:
    try:
        hs.ctx.sync()
    except CortiqError:
        pass


def batch(hs, cmf, kv_id: int, layer_base: int, layers, invf, h: np.ndarray, *, nh: int, nkv: int, hd: int,
          rd: int, hidden: int, positions, cap: int, gemma: bool, eps: float, attn_scale: float, spec=None,
          argmax_out: np.ndarray | None = None, defer: bool = False, o1=()) -> BatchGraphOutcome:
    """Rows h [b, hidden] at contiguous `positions` through `layers` (`batch`): the small path up
    to NMAX rows, the prompt path (`big`) past that.

    With `spec` (a SpecTail): a verify window, each GDN layer keeping a tape (`spec_restore`),
    the head over every row into `spec.logits_out` [b, rows], or, with `argmax_out` (int32 [b]),
    each row's argmax picked on the card instead. h becomes the residual rows after the last
    layer, unless `defer` (no spec): then nothing comes back and the stream runs on."""
    what = "hybrid batch"
    positions = [int(p) for p in positions]
    b = len(positions)
    if any(v is not None for v in o1):
        return BatchGraphOutcome.declined(decline(hs, what, "a sealed far field (not on this path)"))
    if (b == 0 or h.size != b * hidden or any(q != p + 1 for p, q in zip(positions, positions[1:]))
            or positions[-1] >= cap):
        return BatchGraphOutcome.declined(decline(hs, what, "rows not contiguous or past the context cap"))
    if spec is not None and (spec.pick is not None or b > NMAX):
        why = "a verify window longer than the small path, or a device pick"
        return BatchGraphOutcome.declined(decline(hs, what, why))
    with hs.lock:
        lm = None if spec is None else (spec.lm, spec.lm_rows)
        fnorm = None if spec is None else spec.final_norm
        try:
            plan = plan_for(hs, cmf, layers, layer_base, lm, fnorm, nh, nkv, hd, rd, hidden, gemma, eps,
                            attn_scale, invf, positions[0])
        except Declined as e:
            return BatchGraphOutcome.declined(decline(hs, what, e.reason))
        bad = admit(hs, plan, layers, kv_id, layer_base, positions[0], b, hs.kv_hint)
        if bad is not None:
            reason = decline(hs, what, bad[1])
            return BatchGraphOutcome.failed(reason) if bad[0] else BatchGraphOutcome.declined(reason)
        fit = None
        if b > NMAX:
            # a prompt chunk: the prompt path (hybrid/big.py), which books for itself, within the
            # budget (hybrid/bigfit.py: its scratch allocated before any state moves)
            hs.admitted = None
            try:
                fit = bigfit.prepare(hs, plan, b, positions[0])
            except Declined as e:
                return BatchGraphOutcome.declined(decline(hs, what, e.reason))
        try:
            if fit is not None:
                run_chunk(hs, plan, kv_id, layer_base, positions, h, defer, fit)
            else:
                _batch_run(hs, plan, kv_id, layer_base, layers, h, positions, cap, spec, argmax_out, defer)
        except CortiqError as e:
            print(f"cuda hybrid batch graph failed: {e}", file=sys.stderr)
            _quiet_sync(hs)
            return BatchGraphOutcome.failed(str(e))
        return BatchGraphOutcome.completed()


def _batch_run(hs, plan, kv_id, layer_base, layers, h, positions, cap, spec, argmax_out, defer) -> None:
    b, hidden = len(positions), plan.hidden
    verify = spec is not None
    # a call that waits for its results stages its rows in the host twin and gets them (and its
    # picks) back there, as a token does; a deferred one queues uploads and the stream runs on
    staged = verify or not defer
    io = plan.rows.io
    if staged:
        _stage_rows(plan, h, positions)
    else:
        _upload_rows(plan, h, positions)
    taps = tap_slots(hs, len(layers), layer_base, hidden) or ()
    # a greedy verify: each row's argmax on the card (in the graph) into the twin, not the logits
    greedy = verify and argmax_out is not None
    rows = run_small(hs, plan, kv_id, layer_base, positions[0], b, verify, verify, cap, taps,
                     pick=io.pick_host if greedy else None, staged=staged)
    out = None
    if verify and not greedy:
        out = np.empty((b, rows), dtype=np.float32)
        plan.rows.logits.download_async(out)
    if not staged:
        # nothing comes back (tap rows are read all the same)
        if taps:
            hs.taps_out = taps_read(taps, b, hidden)
        return
    hs.ctx.sync()
    if taps:
        hs.taps_out = taps_read(taps, b, hidden)
    if greedy:
        argmax_out.reshape(-1)[:b] = io.pick_h[:b]
    elif verify:
        spec.logits_out = out
    h.reshape(-1)[:] = io.h_h[:b].reshape(-1)
