"""Decode speed of the card's small path on random-payload Qwen3.5 shapes (issue 6, docs/PERF.md),
as JSON lines on stdout (and appended to --out).

For each shape of `default_model.SHAPES` (9b, 27b): the model written into a temporary directory
by `default_model.build_model` (random q4tp payloads; `--source mem` makes the payloads in memory
instead, `bench_prefill.MemCmf`), a prompt of --prompt rows through the prompt path, then decode
steps as the engine runs greedy ones (`api.token`, the head over every row of the LM head, the
pick on the card: only the id and the residual row back). One line per shape:

- `ms_per_token`: wall time of a step, median over --tokens steps after --warmup;
- `device_ms_per_token`: the step's recorded graph replayed back to back (events), and
  `host_us_per_token` = wall - device (booking, uploads, the id and row downloads, Python), and
  `host_us_api`: from entering `token` to its graph launch returning (median);
- `bytes_per_token`: what a step must read (every repacked matrix's tiles, codes and ladders, the
  GDN gate projections, GDN states read and written, the K/V rows at the position), `read_tbps`
  of a 4 GiB streaming read measured in the same run (`bench_kernels.read_bandwidth`),
  `floor_ms` = bytes / read bandwidth and `ratio` = floor_ms / ms_per_token (issue 6: >= 0.6 on 9b);
- `graph_nodes`: the kernel launches one step records (counted in a direct step; a decode step
  has no device copies); `graph_launch_us`: the host time of one replay's launch (median).

Then one `verify_window` line per --windows row count n (docs/PERF.md "Verify window"): windows
of n rows as the engine's greedy speculative rounds run them (`api.batch` with a `SpecTail`: the
GDN tapes, the head over every row, each row's argmax picked on the card, the ids and the rows
back), each accepted whole: `ms` wall (median of --reps after one that records the graph),
`device_ms` its graph replayed back to back, and `ratio` = device_ms / the one-row step's
device_ms (target <= 1.3 at n = 8).

With --breakdown, more lines per shape: `decode_host`, the token path's parts (microseconds a
step, each timed by a wrapper) and cProfile's costliest functions over 32 steps (microseconds a
step, own time); `decode_kernels`, each kernel's microseconds in a step (every launch of a direct
step recorded, then each replayed 10 times in a graph of its own), and `verify_window_kernels`
the same for a window of each --windows row count (device_ms less total_us: what the kernels
timed alone do not explain, the gaps between them in the graph).

With --ablate, one `decode_ablation` line per shape: the one-row step's graph recorded again
without each class of kernels (ABLATE: the norms, the GDN front, the GDN scan and gated norm, the
attention core, the matvecs), `device_ms` replayed as above, and `cost_us` = the full step's
device time less it: what the class costs in the graph, gaps included, where --breakdown times
each kernel alone. The step's outputs are wrong then (timing only; states move).

After each shape's lines, one `decode_choices` line: the variant (bench_kernels' "NT_TB_KS", "s"
staged, "r" hy_mmr) each q4tp set of the shape ran at each row count, by set key
"ROWS@ITEMSxCOLS" (a call's rows, the set's work items at two tiles a block, its input width),
and the keys --force put in place of the rules' choice: --force KEY=VARIANT,... runs those sets
on the variants given (the same KS keeps the same bits), for measuring a choice in the step's
graph; a key that matched no set of any shape ends the run with an error.

With --timeline, the kernels are built with their timeline records (kernels/common.cuh,
HY_TIMELINE: every figure of the run then comes from them) and one `decode_timeline` line per
shape gives, per kernel name, what its launches cost the one-row step's replayed graph:
`timeline_classes`' launches, seg_us, lead_us, body_us and drain_us.

Then each matvec's TB/s at --rows rows (`bench_kernels.bench_matrix`, lines with bench "hy_mmp").
Usage: python tools/bench_decode.py [--shapes 9b,27b] [--tokens 64] [--prompt 512] [--rows 1,4,8,16]
       [--windows 2,4,8,16] [--source file|mem] [--dir DIR] [--skip-matvec] [--breakdown] [--ablate]
       [--timeline] [--force KEY=VARIANT,...] [--out FILE.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

# sibling tools, importable when this file runs as a script
sys.path.insert(0, str(Path(__file__).resolve().parent))

KV_ID = 7
# Records the kernels' timeline holds with --timeline (HY_TIMELINE): a 27b step makes about 181k.
TIMELINE_RECORDS = 1 << 19


# The kernel classes --ablate leaves out of a step: kernel names, or name prefixes ending in "_".
ABLATE = {"norms": ("hy_rmsnorm2",), "gdn_front": ("hy_gdn_front",),
          "gdn_scan": ("hy_gdn_scan", "hy_gdn_scan4", "hy_gdn_out32", "hy_gdn_scan4_out32"),
          "attention": ("hy_qk", "hy_scores", "hy_values", "hy_finish"),
          "matvecs": ("hy_mmv_", "hy_mmvs_", "hy_mmp_", "hy_mmr_")}


def in_class(name: str, members) -> bool:
    """Whether kernel `name` is one of an ABLATE class's `members`."""
    return any(name.startswith(m) if m.endswith("_") else name == m for m in members)


class _Forwarding:
    """A context wrapper: every attribute it does not define is the real context's (`_ctx`), read
    and written there."""

    def __init__(self, ctx, **own):
        self.__dict__.update(_ctx=ctx, **own)

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def __setattr__(self, name, value) -> None:
        setattr(self._ctx, name, value)


class _Skipping(_Forwarding):
    """A context that drops the launches of the kernels in `members` (an ABLATE class) and hands
    everything else to the real one."""

    def __init__(self, ctx, members):
        super().__init__(ctx, _members=members)

    def launch(self, f, grid, block, smem, args) -> None:
        self.launch_3d(f, (grid[0], grid[1], 1), block, smem, args)

    def launch_3d(self, f, grid, block, smem, args) -> None:
        if not in_class(f.name, self._members):
            self._ctx.launch_3d(f, grid, block, smem, args)


class _Counting(_Forwarding):
    """A context that counts kernel launches (and keeps them: (method, args)) and hands everything
    to the real one."""

    def __init__(self, ctx):
        super().__init__(ctx, kept=[])

    @property
    def launches(self) -> int:
        return len(self.kept)

    def launch(self, *a) -> None:
        self.kept.append(("launch", a))
        self._ctx.launch(*a)

    def launch_3d(self, *a) -> None:
        self.kept.append(("launch_3d", a))
        self._ctx.launch_3d(*a)


def set_key(ms, n: int) -> str:
    """`decode_choices`' key of a call of n rows over the q4tp set `ms`: "ROWS@ITEMSxCOLS"."""
    return f"{n}@{ms.blocks[2]}x{ms.cols}"


def parse_force(text: str) -> dict:
    """--force's "KEY=VARIANT,..." as {key: (nt, tb, ks, staged, lean)}; ValueError naming the
    entry that is not a set key and a variant that runs its rows."""
    import bench_kernels as bk

    out = {}
    for item in filter(None, text.split(",")):
        key, _, var = item.partition("=")
        m = re.fullmatch(r"(\d+)@\d+x\d+", key)
        if m is None or not var:
            raise ValueError(f"--force {item!r}: not ROWS@ITEMSxCOLS=VARIANT")
        out[key] = bk.parse_variant(var, int(m.group(1)))
    return out


class Choices:
    """While a shape runs: the variant each q4tp set ran at each row count (`seen`, by `set_key`,
    as bench_kernels' `variant_name`), `force`'s variants put in place of `MmaSet.choice`'s, and
    the forced keys that met a set (`matched`)."""

    def __init__(self, force: dict):
        self.force, self.seen, self.matched = force, {}, set()

    def __enter__(self) -> Choices:
        import bench_kernels as bk

        from cortiq_drv.hybrid import mma

        self.real = real = mma.MmaSet.choice

        def choice(ms, fx, n):
            key = set_key(ms, n)
            got = self.force.get(key)
            if got is None:
                got = real(ms, fx, n)
            else:
                self.matched.add(key)
            self.seen[key] = bk.variant_name(got)
            return got

        mma.MmaSet.choice = choice
        return self

    def __exit__(self, *exc) -> None:
        from cortiq_drv.hybrid import mma

        mma.MmaSet.choice = self.real


def step_bytes(g, pos: int) -> dict:
    """Bytes a decode step at `pos` reads, by part (tiles + codes + ladders of each matrix)."""
    from cortiq_drv.graph import GraphAttn
    from cortiq_drv.hybrid.repack import planes_bytes

    w = planes_bytes(g.lm_rows, g.hidden)
    state, kv, small = 0, 0, 0
    for l in g.layers:
        a, f = l.attn, l.ffn
        w += planes_bytes(2 * f.gate.rows, g.hidden) + planes_bytes(f.down.rows, f.down.cols)
        if isinstance(a, GraphAttn.Gdn):
            w += sum(planes_bytes(m.rows, m.cols) for m in (a.qkv, a.z, a.out))
            small += 2 * a.nv * g.hidden * 4
            cdim = 2 * a.nk * a.dk + a.nv * a.dv
            state += 2 * (a.nv * a.dk * a.dv + (a.kk - 1) * cdim) * 4
        else:
            w += sum(planes_bytes(m.rows, m.cols) for m in (a.wq, a.wk, a.wv, a.wo))
            kv += 2 * (pos + 1) * g.nkv * g.hd * 2
    return {"weights": w, "gdn_state": state, "kv": kv, "small": small}


def _model(label: str, source: str, tmp: Path):
    """(cmf, seconds to make it) of the shape's random-payload model."""
    from cortiq_drv.cmf import CmfFile
    from cortiq_drv.default_model import SHAPES, build_model

    t0 = time.perf_counter()
    if source == "mem":
        from bench_prefill import MemCmf

        return MemCmf(SHAPES[label], label), time.perf_counter() - t0
    path = build_model(SHAPES[label], tmp / f"{label}.cmf", label)
    return CmfFile.open(path), time.perf_counter() - t0


def _prompt(hs, cmf, g, geo, n: int, rng) -> None:
    """n random rows from row 0 as the engine runs a prompt: all but the last through the prompt
    path (nothing back), the last through `token` with the head."""
    from cortiq_drv.engine_cuda import CARD_CHUNK, prompt_chunks
    from cortiq_drv.hybrid import api

    h = rng.standard_normal((n, g.hidden)).astype(np.float32)
    for s, e in prompt_chunks(n - 1, CARD_CHUNK):
        out = api.batch(hs, cmf, KV_ID, 0, g.layers, g.invf, np.ascontiguousarray(h[s:e]),
                        positions=range(s, e), defer=True, **geo)
        if not out.ok:
            raise SystemExit(f"prompt rows {s}..{e}: {out.status}: {out.reason}")
    _steps(hs, cmf, g, geo, n - 1, 1, rng)


def _steps(hs, cmf, g, geo, pos0: int, n: int, rng, api_us: list | None = None) -> list[float]:
    """n decode steps from pos0 as the engine's greedy steps run them (the pick on the card, only
    the id and the residual row back): seconds each; `api_us` gets each step's microseconds from
    entering `token` to its graph launch returning."""
    from cortiq_drv.hybrid import api

    pick = np.empty(1, dtype=np.int32)
    times = []
    for i in range(n):
        h = rng.standard_normal(g.hidden).astype(np.float32)
        t0 = time.perf_counter_ns()
        out = api.token(hs, cmf, KV_ID, g.layers, g.invf, h, position=pos0 + i, lm_head=(g.lm, g.lm_rows),
                        final_norm=g.final_norm, pick=pick, hidden_too=True, **geo)
        times.append((time.perf_counter_ns() - t0) / 1e9)
        if api_us is not None:
            api_us.append((hs.counters.launched_ns - t0) / 1e3)
        if not out.ok:
            raise SystemExit(f"decode at {pos0 + i}: {out.status}: {out.reason}")
    return times


def _windows(hs, cmf, g, geo, pos: int, ns, reps: int, rng) -> list[tuple[int, list[float]]]:
    """Greedy verify windows of each n in `ns` from pos as the engine runs them (`EngineCuda.verify`,
    the window then accepted whole): [(n, wall seconds of each window after the first)]."""
    from cortiq_drv.graph import SpecTail
    from cortiq_drv.hybrid import api

    out = []
    for n in ns:
        times = []
        for i in range(reps + 1):
            h = rng.standard_normal((n, g.hidden)).astype(np.float32)
            ids = np.empty(n, dtype=np.int32)
            t0 = time.perf_counter_ns()
            res = api.batch(hs, cmf, KV_ID, 0, g.layers, g.invf, h, positions=range(pos, pos + n),
                            spec=SpecTail(g.lm, g.lm_rows, g.final_norm), argmax_out=ids, **geo)
            if not res.ok:
                raise SystemExit(f"verify window of {n} rows at {pos}: {res.status}: {res.reason}")
            if i:
                times.append((time.perf_counter_ns() - t0) / 1e9)
            pos += n
        out.append((n, times))
    return out


def _plan(hs, cmf, g):
    """The plan of the steps and windows (the whole stack with its head), or None."""
    return hs.plans.get((cmf.uid, 0, len(g.layers), True))


def _graph(hs, cmf, g, n: int = 1):
    """The recorded graph of the one-row step, or with n > 1 of the n-row greedy verify window;
    None when there is none."""
    from cortiq_drv.hybrid.graphs import graph_key

    plan = _plan(hs, cmf, g)
    key = None if plan is None else graph_key(plan, KV_ID, 0, n, n > 1, True, (), pick=True, staged=True)
    return None if key is None else hs.graphs.get(key)


def _device_ms(hs, cmf, g, reps: int, n: int = 1) -> tuple:
    """(milliseconds a replay of the one-row step's graph, or with n > 1 the n-row greedy verify
    window's, takes back to back, microseconds of host time its launch takes after a sync,
    median of 16), (None, None) without a graph."""
    from cortiq_drv.cu import Event

    rec = _graph(hs, cmf, g, n)
    if rec is None:
        return None, None
    launch_ns = []
    for _ in range(16):
        hs.ctx.sync()
        t0 = time.perf_counter_ns()
        rec.launch()
        launch_ns.append(time.perf_counter_ns() - t0)
    e0, e1 = Event(hs.ctx), Event(hs.ctx)
    try:
        rec.launch()
        e0.record()
        for _ in range(reps):
            rec.launch()
        e1.record()
        return e0.elapsed_ms(e1) / reps, statistics.median(launch_ns) / 1e3
    finally:
        e0.close()
        e1.close()


def _counted(hs, run) -> _Counting:
    """run() (a decode step or a window) launched directly through a counting context (its
    launches kept)."""
    real, graphs = hs.ctx, hs.use_graphs
    hs.ctx, hs.use_graphs = _Counting(real), False
    try:
        run()
        return hs.ctx
    finally:
        hs.ctx, hs.use_graphs = real, graphs


def _timeline_records(hs, cmf, g) -> np.ndarray:
    """The timeline records [k][4] (kernels/common.cuh, HY_TIMELINE) of one replay of the one-row
    step's graph, after two that warm it."""
    rec = _graph(hs, cmf, g)
    mod = _plan(hs, cmf, g).fx.module
    count, records = mod.symbol("hy_tl_n"), mod.symbol("hy_tl")
    # all on the stream, in order: the warm replays, the count zeroed, the timed replay
    rec.launch()
    rec.launch()
    count.memset(0)
    rec.launch()
    k = int(count.to_host(np.uint32)[0])
    if k * 32 > records.bytes:
        raise SystemExit(f"--timeline: a step makes {k} records, the kernels hold {records.bytes // 32}")
    return records.view(0, k * 32).to_host(np.uint64, (k, 4))


def timeline_classes(records: np.ndarray, names: list) -> dict:
    """Per kernel name of a step's timeline `records` (`_timeline_records`; `names`: the step's
    recording launches in order): [launches, seg_us, lead_us, body_us, drain_us] summed over its
    launches. A launch's grids are ordered by their first block's wait returning; seg: from that
    to the next launch's (what the launch costs the step), lead: from the launch before's to this
    one's first block entering pdl_begin (its blocks resident and through their prologue); for
    the kernels whose blocks record their end (hy_tl_end: the matvecs, hy_rmsnorm2) body: to its
    last block's end, drain: from there to the next launch's first wait return (the last launch's
    seg and drain: to its own last record)."""
    end = np.uint64(1 << 63)
    starts = records[(records[:, 0] & end) == 0]
    ends = records[(records[:, 0] & end) != 0]
    grids = {}
    for grid, t0, t1, _ in starts.tolist():
        entry = grids.setdefault(grid, [t0, t1, None])
        entry[0], entry[1] = min(entry[0], t0), min(entry[1], t1)
    for grid, t, _, _ in ends.tolist():
        entry = grids[grid ^ (1 << 63)]
        entry[2] = t if entry[2] is None else max(entry[2], t)
    order = sorted(grids.values(), key=lambda v: v[1])
    if len(order) != len(names):
        raise SystemExit(f"--timeline: {len(order)} grids recorded, {len(names)} recording launches in the step")
    out: dict = {}
    for i, ((entered, waited, last), name) in enumerate(zip(order, names)):
        nxt = order[i + 1][1] if i + 1 < len(order) else max(waited, last or 0)
        row = out.setdefault(name, [0, 0.0, 0.0, 0.0, 0.0])
        row[0] += 1
        row[1] += (nxt - waited) / 1e3
        row[2] += (entered - order[i - 1][1]) / 1e3 if i else 0.0
        if last is not None:
            row[3] += (last - waited) / 1e3
            row[4] += (nxt - last) / 1e3
    return {k: [v[0], *(round(x, 1) for x in v[1:])] for k, v in out.items()}


def _ablation(hs, cmf, g, geo, pos: int, rng, reps: int) -> dict:
    """{class: device ms of the one-row step recorded without it} for each ABLATE class (two steps
    each: one records the graph, one replays it); the graphs are recorded again after."""
    real = hs.ctx
    ms = {}
    try:
        for name, members in ABLATE.items():
            real.sync()
            hs.drop_graphs(lambda k: True)
            hs.ctx = _Skipping(real, members)
            _steps(hs, cmf, g, geo, pos, 2, rng)
            pos += 2
            ms[name], _ = _device_ms(hs, cmf, g, reps)
    finally:
        hs.ctx = real
        real.sync()
        hs.drop_graphs(lambda k: True)
    return ms


def _kernel_us(ctx, kept, reps: int = 10) -> dict:
    """Per kernel name: [launches in the step, microseconds they take], each launch timed as `reps`
    copies of it in a graph of its own (states move: run it last)."""
    from cortiq_drv.cu import Event, capture

    out: dict = {}
    e0, e1 = Event(ctx), Event(ctx)
    for how, a in kept:
        graph = capture(ctx, lambda: [getattr(ctx, how)(*a) for _ in range(reps)])
        graph.launch()
        e0.record()
        for _ in range(3):
            graph.launch()
        e1.record()
        us = e0.elapsed_ms(e1) * 1e3 / (3 * reps)
        graph.close()
        k, t = out.get(a[0].name, (0, 0.0))
        out[a[0].name] = (k + 1, t + us)
    e0.close()
    e1.close()
    return {name: [k, round(t, 1)] for name, (k, t) in sorted(out.items(), key=lambda x: -x[1][1])}


def _host_profile(hs, cmf, g, geo, pos: int, rng, steps: int = 32) -> dict:
    """cProfile over `steps` decode steps: the 16 costliest functions by own time, microseconds a
    step."""
    import cProfile
    import pstats

    pr = cProfile.Profile()
    pr.enable()
    _steps(hs, cmf, g, geo, pos, steps, rng)
    pr.disable()
    st = pstats.Stats(pr).stats
    top = sorted(st.items(), key=lambda x: -x[1][2])[:16]
    return {f"{Path(f).name}:{ln}:{fn}": [v[1] // steps, round(v[2] * 1e6 / steps, 1)] for (f, ln, fn), v in top}


def _host_sections(hs, cmf, g, geo, pos: int, rng, steps: int = 32) -> dict:
    """Microseconds a step in each of the token path's parts (each timed by a wrapper, no
    profiler), and `token` the whole step."""
    from cortiq_drv.cu import driver
    from cortiq_drv.hybrid import api, graphs

    # (a staged step copies its row in and out inside the graph: no memcpy call to time)
    spots = [(api, "plan_for"), (api, "admit"), (graphs, "book"), (api, "_stage_rows"),
             (driver, "graph_launch"), (driver, "stream_sync"), (api, "token")]
    ns = {name: 0 for _, name in spots}
    kept = [(m, name, getattr(m, name)) for m, name in spots]

    def timed(name, fn):
        def go(*a, **k):
            t0 = time.perf_counter_ns()
            try:
                return fn(*a, **k)
            finally:
                ns[name] += time.perf_counter_ns() - t0
        return go

    for m, name, fn in kept:
        setattr(m, name, timed(name, fn))
    try:
        _steps(hs, cmf, g, geo, pos, steps, rng)
    finally:
        for m, name, fn in kept:
            setattr(m, name, fn)
    return {name: round(t / steps / 1e3, 1) for name, t in ns.items()}


def bench_shape(label: str, a, bw: float, emit, tmp: Path) -> None:
    from bench_prefill import card_geo
    from cortiq_drv.graph import build
    from cortiq_drv.hybrid import spec
    from cortiq_drv.hybrid import state as hstate

    cmf, made_s = _model(label, a.source, tmp)
    g = build(cmf)
    hs = hstate.current()
    geo = card_geo(g)
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    hs.kv_hint = (a.prompt + a.warmup + a.tokens + 2 + (64 if a.breakdown else 0)
                  + (2 * len(ABLATE) if a.ablate else 0) + sum(a.windows) * (a.reps + 1 + int(a.breakdown)))
    _prompt(hs, cmf, g, geo, a.prompt, rng)
    plan_s = time.perf_counter() - t0
    rec0 = hs.counters.graph_rec
    pos = a.prompt
    _steps(hs, cmf, g, geo, pos, a.warmup, rng)
    pos += a.warmup
    api_us: list = []
    times = _steps(hs, cmf, g, geo, pos, a.tokens, rng, api_us)
    pos += a.tokens
    # what the timed steps read (the K/V rows grow with the position)
    parts = step_bytes(g, pos - 1)
    ms = statistics.median(times) * 1e3
    dev, launch_us = _device_ms(hs, cmf, g, max(a.tokens, 16))
    wins = _windows(hs, cmf, g, geo, pos, a.windows, a.reps, rng)
    pos += sum(a.windows) * (a.reps + 1)
    counted = _counted(hs, lambda: _steps(hs, cmf, g, geo, pos, 1, rng))
    pos += 1
    total = sum(parts.values())
    floor_ms = total / (bw * 1e12) * 1e3
    emit(dict(bench="decode", shape=label, source=a.source, model_s=round(made_s, 1),
              plan_and_prompt_s=round(plan_s, 1), prompt=a.prompt, tokens=a.tokens, ms_per_token=round(ms, 4),
              mean_ms_per_token=round(statistics.mean(times) * 1e3, 4),
              device_ms_per_token=None if dev is None else round(dev, 4),
              host_us_per_token=None if dev is None else round((ms - dev) * 1e3, 1),
              host_us_api=round(statistics.median(api_us), 1),
              bytes_per_token=total, bytes_parts=parts, read_tbps=round(bw, 3), floor_ms=round(floor_ms, 4),
              ratio=round(floor_ms / ms, 3), device_ratio=None if dev is None else round(floor_ms / dev, 3),
              target_ratio=0.6 if label == "9b" else None, graph_nodes=counted.launches,
              graph_launch_us=None if launch_us is None else round(launch_us, 1),
              graphs_recorded_in_steps=hs.counters.graph_rec - rec0, tok_s=round(1e3 / ms, 1)))
    for n, wt in wins:
        wdev, _ = _device_ms(hs, cmf, g, max(a.tokens, 16), n)
        emit(dict(bench="verify_window", shape=label, n=n, ms=round(statistics.median(wt) * 1e3, 4),
                  device_ms=None if wdev is None else round(wdev, 4),
                  step_device_ms=None if dev is None else round(dev, 4),
                  ratio=None if wdev is None or dev is None else round(wdev / dev, 3),
                  target_ratio=1.3 if n == 8 else None))
    if a.timeline and dev is not None:
        # every kernel of a step records in pdl_begin but hy_copy16 (RowIO's copies)
        names = [args[0].name for _, args in counted.kept if args[0].name != "hy_copy16"]
        classes = timeline_classes(_timeline_records(hs, cmf, g), names)
        emit(dict(bench="decode_timeline", shape=label, device_ms=round(dev, 4),
                  fields=["launches", "seg_us", "lead_us", "body_us", "drain_us"], kernels=classes))
    if a.ablate and dev is not None:
        without = _ablation(hs, cmf, g, geo, pos, rng, max(a.tokens, 16))
        pos += 2 * len(ABLATE)
        # each class's launches a step, from the direct step counted above
        launches = {k: sum(in_class(args[0].name, m) for _, args in counted.kept) for k, m in ABLATE.items()}
        emit(dict(bench="decode_ablation", shape=label, device_ms=round(dev, 4),
                  without={k: round(v, 4) for k, v in without.items()}, launches=launches,
                  cost_us={k: round((dev - v) * 1e3, 1) for k, v in without.items()}))
    if a.breakdown:
        emit(dict(bench="decode_host", shape=label, sections=_host_sections(hs, cmf, g, geo, pos, rng),
                  profile=_host_profile(hs, cmf, g, geo, pos + 32, rng)))
        pos += 64
        # the windows' launches counted before any kernel is replayed on its own (states move)
        wk = []
        for n in a.windows:
            wk.append((n, _counted(hs, lambda n=n, p=pos: _windows(hs, cmf, g, geo, p, [n], 0, rng))))
            pos += n
        for name, n, c in [("decode_kernels", 1, counted)] + [("verify_window_kernels", n, c) for n, c in wk]:
            ks = _kernel_us(hs.ctx, c.kept)
            emit(dict(bench=name, shape=label, n=n, launches=c.launches,
                      total_us=round(sum(t for _, t in ks.values()), 1), kernels=ks))
    spec.reset(hs, KV_ID)


def bench_matvecs(label: str, a, bw: float, emit) -> None:
    """Each matvec of the shape at a.rows rows (bench_kernels, the rule's variant, no cuBLAS)."""
    import bench_kernels as bk

    from cortiq_drv.default_model import SHAPES
    from cortiq_drv.hybrid import state as hstate

    s = SHAPES[label]
    m = dict(hidden=s.hidden, nh=s.heads, nkv=s.kv_heads, hd=s.head_dim, ffn=s.ffn, gk=s.gdn_k_heads,
             gv=s.gdn_v_heads, gd=s.gdn_head_dim, vocab=s.vocab)
    # the shape's own hyb.cu module, which its decode steps just loaded
    hs = hstate.current()
    ctx, fx = hs.ctx, hs.hfuncs(s.heads // s.kv_heads, s.head_dim)
    opts = SimpleNamespace(rows=a.rows, variants="rule", reps=a.reps, no_cublas=True)
    tflops = bk.mma_rate(ctx, a.reps)
    emit(bk.mma_rate_line(tflops))
    for name, rows, cols, pair in bk.matrices(m):
        bk.bench_matrix(ctx, fx, label, name, rows, cols, pair, opts, bw, tflops, emit)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="9b,27b")
    ap.add_argument("--tokens", type=int, default=64, help="timed decode steps")
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=512, help="rows before the first timed step")
    ap.add_argument("--rows", default="1,4,8,16", help="row counts of the matvec lines")
    ap.add_argument("--windows", default="2,4,8,16", help="rows of the verify-window lines ('': none)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--source", choices=("file", "mem"), default="file")
    ap.add_argument("--dir", default=None, help="where model files go (default: a temporary directory)")
    ap.add_argument("--skip-matvec", action="store_true")
    ap.add_argument("--breakdown", action="store_true", help="kernel times and a host profile of a step")
    ap.add_argument("--ablate", action="store_true", help="each kernel class's cost in the step's graph")
    ap.add_argument("--timeline", action="store_true", help="the step's kernels timed in its graph (instrumented)")
    ap.add_argument("--force", default="", help="KEY=VARIANT,...: q4tp sets run on these variants")
    ap.add_argument("--out", default=None, help="also append the JSON lines to this file")
    a = ap.parse_args(argv)
    try:
        force = parse_force(a.force)
    except ValueError as e:
        ap.error(str(e))
    a.rows = [int(v) for v in a.rows.split(",")]
    a.windows = [int(v) for v in a.windows.split(",") if v]
    if any(not 2 <= n <= 16 for n in a.windows):
        ap.error("--windows: row counts from 2 to 16 (the small path's verify windows)")
    if a.prompt < 1:
        ap.error("--prompt: at least 1 row")
    from cortiq_drv.cu.ctx import device_available

    ok, why = device_available()
    if not ok:
        print(f"bench_decode: no CUDA device: {why}", file=sys.stderr)
        return 1
    import bench_kernels as bk

    from cortiq_drv.cu import Ctx

    out = open(a.out, "a") if a.out else None

    def emit(line) -> None:
        text = json.dumps(line)
        print(text, flush=True)
        if out:
            out.write(text + "\n")
            out.flush()

    ctx = Ctx.current()
    if a.timeline:
        from cortiq_drv.hybrid import state as hstate

        hstate.current().card.defines["HY_TIMELINE"] = TIMELINE_RECORDS
    bw = bk.read_bandwidth(ctx, a.reps)
    emit(bk.read_bw_line(ctx, bw))
    tmp = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="bench_decode_"))
    matched: set = set()
    try:
        for label in a.shapes.split(","):
            with Choices(force) as ch:
                bench_shape(label, a, bw, emit, tmp)
            emit(dict(bench="decode_choices", shape=label, sets=ch.seen, forced=sorted(ch.matched)))
            matched |= ch.matched
            if a.source == "file":
                os.unlink(tmp / f"{label}.cmf")
            if not a.skip_matvec:
                bench_matvecs(label, a, bw, emit)
    finally:
        if not a.dir:
            shutil.rmtree(tmp, ignore_errors=True)
        if out:
            out.close()
    if set(force) - matched:
        print(f"bench_decode: --force keys that matched no set: {', '.join(sorted(set(force) - matched))}",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
