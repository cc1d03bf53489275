"""The small path's calls: booked, then launched directly or replayed from a recorded graph
(ports cuda_hybrid.rs `graphs_on`, `run_small`, `tap_slots`, `report`, and the per-kernel times of
`CMF_HYB_KT`).

A graph is keyed as the reference keys it: (plan, sequence, first layer, rows, tape, head, taps),
and whether the head's greedy pick (`hy_argmax`) follows it.
It holds the pointers it was recorded with (every layer's state buffers, the attention scratch,
the tap slots); a call whose pointers moved (a mirror or the scratch grew) records it again.
Everything else a graph reads lives at fixed addresses: the plan's row buffers and job tables, and
`plan.ci`, which takes each call's records before the launch.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from cortiq_drv.cu import Event, GraphRec
from cortiq_drv.hybrid.book import book
from cortiq_drv.hybrid.launch import HSTAGES, Stages, head_launch, launch, pick_launch
from cortiq_drv.hybrid.state import NMAX


class KtCtx:
    """A context whose launches are each timed by a pair of events (`CMF_HYB_KT=N`: the N-th
    token's kernels, launched one by one)."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.stream = ctx.stream
        self.times: list = []

    def _timed(self, name, go) -> None:
        e0, e1 = Event(self.ctx), Event(self.ctx)
        e0.record()
        go()
        e1.record()
        self.times.append((name, e0, e1))

    def launch(self, f, grid, block, smem, args) -> None:
        self._timed(f.name, lambda: self.ctx.launch(f, grid, block, smem, args))

    def launch_3d(self, f, grid, block, smem, args) -> None:
        self._timed(f.name, lambda: self.ctx.launch_3d(f, grid, block, smem, args))

    def sync(self) -> None:
        self.ctx.sync()

    def report(self) -> None:
        """Each kernel's launches and milliseconds on stderr, largest total first."""
        tot: dict = {}
        for name, e0, e1 in self.times:
            k, ms = tot.get(name, (0, 0.0))
            tot[name] = (k + 1, ms + e0.elapsed_ms(e1))
            e0.close()
            e1.close()
        print(f"cuda hybrid kernel times ({len(self.times)} launches):", file=sys.stderr)
        for name, (k, ms) in sorted(tot.items(), key=lambda x: -x[1][1]):
            print(f"  {name:>24}: {k:4d} launches, {ms:8.3f} ms", file=sys.stderr)


def graphs_on(hs, kt: bool) -> bool:
    """Graphs unless `CMF_CUDA_GRAPH=0`, the profile (its stage syncs) or a timed token."""
    return hs.use_graphs and not hs.prof and not kt


def tap_slots(hs, nlayers: int, layer_base: int, hidden: int):
    """The drafter taps of a call (`tap_slots`): [(plan layer, slot Buf of NMAX rows)] for every
    asked layer of a call over the whole stack; None when nothing was asked or the call does not
    reach every asked layer."""
    want = hs.taps_wanted
    if not want or layer_base != 0 or any(l >= nlayers for l in want):
        return None
    buf = hs.scr("hy_taps", len(want) * NMAX * hidden * 4)
    return [(l, buf.view(s * NMAX * hidden * 4, NMAX * hidden * 4)) for s, l in enumerate(want)]


def taps_read(slots, n: int, hidden: int) -> np.ndarray:
    """The kept tap rows `[slot][row][hidden]` (synchronises)."""
    out = np.empty((len(slots), n, hidden), dtype=np.float32)
    for s, (_, b) in enumerate(slots):
        b.download_async(out[s])
    slots[0][1].ctx.sync()
    return out


def graph_key(plan, kv_id: int, layer_base: int, n: int, tape: bool, head: bool, taps,
              pick: bool = False, staged: bool = False) -> tuple:
    """A small-path graph's key: a call with taps records copies a call without them has not,
    one with the pick an argmax one without it has not, a staged one (a token) the copies of its
    row in and out."""
    return (plan.id, kv_id, layer_base, n, tape, head, tuple(l for l, _ in taps), pick, staged)


def run_small(hs, plan, kv_id: int, layer_base: int, pos0: int, n: int, tape: bool, head: bool,
              kcap: int, taps=(), kt: KtCtx | None = None, pick=None, staged: bool = False) -> int:
    """The small path over the rows in `plan.rows.h` (and `plan.rows.tab`), with the head when
    `head` and each row's argmax into `pick` (int32 [n] in the plan's pinned host twin, its
    `RowIO.pick_host`) when given: book, upload the call records, then replay the graph recorded
    with the same pointers, or record one now, or launch directly. `staged` (a call that waits
    for its results): the rows and their RoPE rows wait in `plan.rows.io`'s pinned host twin and
    the records join them there; the call's first kernel brings them onto the card and its last
    one takes the rows back (`RowIO`: no copy call; the caller syncs before its next call).
    Otherwise the rows are already queued and the records go on their own. Returns the head's
    rows (0 without)."""
    bk = book(hs, plan, kv_id, layer_base, pos0, n, tape, kcap)
    rows = plan.lm[1] if head and plan.lm is not None else 0
    pick = pick if rows else None
    io = plan.rows.io
    if staged:
        io.ci_h[:len(bk.ci)] = bk.ci
    elif len(bk.ci):
        plan.ci.upload_async(bk.ci)
    hs.counters.calls_n[min(n, NMAX)] += 1

    def body(ctx, st=None):
        if staged:
            io.launch_in(ctx, plan.fx, n)
        launch(ctx, plan, bk, n, tape, taps, st)
        if head:
            head_launch(ctx, plan, n, st)
        if pick is not None:
            pick_launch(ctx, plan, n, pick)
        if staged:
            io.launch_out(ctx, plan.fx, n)

    if not graphs_on(hs, kt is not None):
        body(kt or hs.ctx, Stages(hs.ctx, hs.counters.stage_ns[min(n, NMAX)], hs.prof))
        hs.counters.launched_ns = time.perf_counter_ns()
        return rows
    key = graph_key(plan, kv_id, layer_base, n, tape, head, taps, pick is not None, staged)
    sig = bk.sig() + tuple(b.ptr for _, b in taps) + ((pick.ptr,) if pick is not None else ())
    rec = hs.graphs.get(key)
    hs.counters.graph_run += 1
    if rec is None or not rec.matches(sig):
        hs.counters.graph_rec += 1
        if hs.debug:
            why = "new key" if rec is None else (
                f"{sum(a != b for a, b in zip(rec.sig, sig))} of {len(sig)} pointers moved")
            hs.log(f"recording a graph for {n} rows (tape {tape}, head {head}): {why}")
        if rec is not None:
            rec.close()
        rec = hs.graphs[key] = GraphRec(hs.card.capture(lambda: body(hs.ctx)), sig)
    rec.launch()
    hs.counters.launched_ns = time.perf_counter_ns()
    return rows


def report(hs) -> None:
    """`report`: the graph counters (CMF_CUDA_DEBUG) and the stage times per call (CMF_CUDA_PROF)
    on stderr."""
    c = hs.counters
    if hs.debug:
        print(f"cuda hybrid graphs: {c.graph_rec} recorded, {c.graph_run} replays", file=sys.stderr)
    if not hs.prof or not sum(c.calls_n):
        return
    print(f"cuda hybrid small path: {sum(c.calls_n)} calls", file=sys.stderr)
    for n in range(1, NMAX + 1):
        k = c.calls_n[n]
        if k:
            ms = c.stage_ns[n] / 1e6 / k
            parts = " | ".join(f"{name} {t:.3f}" for name, t in zip(HSTAGES, ms))
            print(f"  {n:>2} rows, {k} calls, {ms.sum():.2f} ms a call: {parts}", file=sys.stderr)
