"""The hybrid arm's per-process state (ports cuda_hybrid.rs `HState`, `GdnState` and the f16
`KvMirror` this arm keeps) and `Card`, the one seam between the arm's host-side logic and the
device.

Everything the arm keeps between calls lives in one `HState`: the kernels by attention geometry,
the plans, the K/V mirrors and GDN states by (sequence, layer), the recorded small-path graphs,
the named scratch, the restore tables, and the debug / profile counters. Plan building, admission,
booking and graph keying only reach the device through `Card` (allocations, graph capture,
kernels, repacked matrices, job tables), `Buf` methods and `ctx.launch`, so the CPU tests drive
them with fake buffers.
"""

from __future__ import annotations

import hashlib
import sys
import threading
from dataclasses import dataclass, field

import numpy as np

from cortiq_drv import knobs
from cortiq_drv.cmf.layout import round_up
from cortiq_drv.cu import Buf, Event, Pinned, capture
from cortiq_drv.cu.args import kargs
from cortiq_drv.cu.nvrtc import compile_cubin, load
from cortiq_drv.hybrid import mma
from cortiq_drv.hybrid.mats import MatStore
from cortiq_drv.kernels import source

NMAX = mma.NMAX
# Blocks of hy_argmax a row (`RowIO.apart`).
ARGMAX_BLOCKS = 64
# K/V mirror capacity grows in steps of this many rows (at least doubling).
MIRROR_STEP = 1024


class Card:
    """The device operations of the arm besides `Buf` methods and `ctx.launch`."""

    def __init__(self, ctx):
        self.ctx = ctx
        self._store: MatStore | None = None
        # defines hyb.cu compiles with besides HPK and HD (tools/bench_decode.py --timeline sets
        # HY_TIMELINE before the first plan)
        self.defines: dict = {}

    def new(self, nbytes: int) -> Buf:
        return Buf.new(self.ctx, nbytes)

    def upload(self, arr: np.ndarray) -> Buf:
        return Buf.from_array(self.ctx, arr)

    def capture(self, fn):
        return capture(self.ctx, fn)

    def pinned(self, nbytes: int) -> Pinned:
        return Pinned(nbytes)

    def event(self) -> Event:
        return Event(self.ctx)

    def funcs(self, hpk: int, hd: int):
        """hyb.cu compiled for (heads per KV head, head width) and loaded (the reference's
        `load_funcs`): the weight side's kernels and the arm's (`HFuncs`)."""
        # launch imports plan, which imports this module: HFuncs comes in here
        from cortiq_drv.hybrid.launch import HFuncs

        cubin = compile_cubin(source("hyb.cu"), {"HPK": hpk, "HD": hd, **self.defines}, self.ctx.arch)
        return HFuncs(self.ctx, load(self.ctx, cubin))

    def store(self, fx) -> MatStore:
        """The repacked matrices (made with the first kernels loaded, as the reference's
        `st.hyb.funcs.values().next()`)."""
        if self._store is None:
            self._store = MatStore(self.ctx, fx)
        return self._store

    def mmaset(self, jobs):
        return mma.mmaset(self.ctx, jobs)

    def mmaset_pair(self, m, p0, p1, pstride: int):
        return mma.mmaset_pair(self.ctx, m, p0, p1, pstride)


class KvMirror:
    """One attention layer's K/V rows of one sequence on the card as f16: k, v [cap][row] with
    row = nkv * hd values; rows [0, stored) are valid."""

    def __init__(self, row: int):
        self.row = row
        self.stored = 0
        self.cap = 0
        self.k: Buf | None = None
        self.v: Buf | None = None

    @property
    def bytes(self) -> int:
        return 2 * self.cap * self.row * 2

    def reserve(self, hs: "HState", n: int, hint: int) -> None:
        """Room for `n` rows after the stored ones (at least `hint` rows in all). Growing moves
        the rows to a new allocation: graphs recorded over the old one are recorded again."""
        need = self.stored + n
        if need <= self.cap:
            return
        # doubling keeps the copies of a growing mirror's rows rare; an empty one has none to
        # copy, and is sized as a fresh one would be
        cap = round_up(max(need, hint, 2 * self.cap if self.stored else 0), MIRROR_STEP)
        k, v = hs.card.new(cap * self.row * 2), hs.card.new(cap * self.row * 2)
        if self.stored:
            k.copy_from(self.k.view(0, self.stored * self.row * 2))
            v.copy_from(self.v.view(0, self.stored * self.row * 2))
        old = self.bytes
        self.close(hs)
        self.k, self.v, self.cap = k, v, cap
        hs.ctx.kv_bytes += self.bytes - old

    def close(self, hs: "HState") -> None:
        if self.k is not None:
            # pending work may still read them
            hs.ctx.sync()
            self.k.close()
            self.v.close()
            self.k = self.v = None


@dataclass
class GdnState:
    """One GDN layer's recurrent state on the card and what a verify window needs to step back:
    seven views of one allocation (`_all`): s [nv][dk][dv], ring [kk-1][cdim], the window's tape
    (t_qkv raw rows `t_stride` floats apart, t_cq conv rows, t_gb gates; NMAX rows each), and
    the state the window started from (s_save, ring_save)."""

    dims: tuple  # (nv, nk, dk, dv, kk)
    all: Buf
    s: Buf
    ring: Buf
    t_qkv: Buf
    t_cq: Buf
    t_gb: Buf
    s_save: Buf
    ring_save: Buf
    t_stride: int
    next_pos: int
    # (first position, rows) of the last window that kept a tape
    tape: tuple | None = None
    # (position, s copy, ring copy) of `gdn_snapshot`
    snap: tuple | None = None

    @property
    def ring_n(self) -> int:
        nv, nk, dk, dv, kk = self.dims
        return (kk - 1) * (2 * nk * dk + nv * dv)

    @property
    def s_n(self) -> int:
        nv, _, dk, dv, _ = self.dims
        return nv * dk * dv

    @property
    def counted(self) -> int:
        """Bytes this state counts in `ctx.kv_bytes` (the reference's accounting)."""
        nv, nk, dk, dv, kk = self.dims
        cdim = 2 * nk * dk + nv * dv
        return (self.s_n * 2 + self.ring_n * 2 + NMAX * (2 * cdim + 2 * nv)) * 4

    def views(self) -> tuple:
        """The seven buffers in `book`'s order."""
        return (self.s, self.ring, self.t_qkv, self.t_cq, self.t_gb, self.s_save, self.ring_save)

    def drop_snapshot(self, hs, synced: bool = False) -> None:
        """Free the `gdn_snapshot` copy (its bytes off the K/V count) once the stream's pending
        copies into it are done (`synced`: the caller synchronised the stream after them)."""
        if self.snap is not None:
            if not synced:
                hs.ctx.sync()
            hs.ctx.kv_bytes -= self.snap[1].bytes + self.snap[2].bytes
            self.snap[1].close()
            self.snap[2].close()
            self.snap = None

    def fresh(self, hs, synced: bool = False) -> None:
        """Row 0 of a new sequence: s and ring zeroed (on the stream), no tape, no snapshot
        (`drop_snapshot`'s `synced`)."""
        self.s.memset(0)
        self.ring.memset(0)
        self.next_pos, self.tape = 0, None
        self.drop_snapshot(hs, synced)

    def close(self, hs, synced: bool = False) -> None:
        """Free the state and its snapshot (`drop_snapshot`'s `synced`)."""
        self.drop_snapshot(hs, synced)
        self.all.close()


@dataclass(frozen=True)
class HostAt:
    """An address in pinned host memory, which a kernel reaches at that address (unified
    addressing); `ptr` as a Buf's, for argument lists and graph signatures."""

    ptr: int


class RowIO:
    """A plan's call inputs and outputs in one device allocation `dev` with a pinned host twin
    `host` of the same layout (the graph reads and writes both at fixed addresses):

        ci [n_attn][8] i32 | tab [NMAX][half][2] f32 | pick [NMAX] i32 | h [NMAX][hidden] f32 |
        acnt [NMAX] i32 | apart [NMAX][ARGMAX_BLOCKS][2] words

    The last two (zeroed once, never copied) are hy_argmax's per-row arrival counts, which each
    launch leaves at zero, and its block parts.
    A call of n rows that waits for its results (a decode step, a verify window, a batch not
    deferred) makes no copy call for its inputs, its picks or its residual rows (a call that
    returns logits still downloads them): the host writes its records, RoPE rows and residual rows
    into `host` (rows 0 .. n - 1 of each); the call's graph starts with `launch_in(n)` (hy_copy16
    of bytes 0 .. `row_end(n)`: the rest of tab and pick ride along, the call rewrites what it
    reads), its greedy picks go straight to `pick_host`, and it ends with `launch_out(n)` (h's rows
    back). The host writes `host` only once the stream synchronised past the last call that read
    it (each such call syncs before it returns)."""

    def __init__(self, card, n_attn: int, half: int, hidden: int):
        ci_n, tab_n = max(n_attn, 1) * 8 * 4, NMAX * half * 2 * 4
        self.hidden = hidden
        self.tab_off = round_up(ci_n, 16)
        self.pick_off = round_up(self.tab_off + max(tab_n, 1), 16)
        # 256-byte aligned rows for the matvecs' residual reads and writes
        self.h_off = round_up(self.pick_off + NMAX * 4, 256)
        work_off = self.h_off + NMAX * hidden * 4
        work = (NMAX + NMAX * ARGMAX_BLOCKS * 2) * 4
        nbytes = work_off + work
        self.dev = card.new(nbytes)
        self.host = card.pinned(nbytes)
        d, raw = self.dev, self.host.array(np.uint8)
        self.ci, self.tab = d.view(0, ci_n), d.view(self.tab_off, tab_n)
        self.h = d.view(self.h_off, NMAX * hidden * 4)
        self.acnt = d.view(work_off, NMAX * 4)
        self.apart = d.view(work_off + NMAX * 4, NMAX * ARGMAX_BLOCKS * 8)
        d.view(work_off, work).memset(0)
        self.pick_host = HostAt(self.host.ptr + self.pick_off)
        # host views: the records, and the RoPE rows, ids and residual rows row by row
        self.ci_h = raw[:ci_n].view(np.int32)
        self.tab_h = raw[self.tab_off:self.tab_off + tab_n].view(np.float32).reshape(NMAX, half * 2)
        self.pick_h = raw[self.pick_off:self.pick_off + NMAX * 4].view(np.int32)
        self.h_h = raw[self.h_off:work_off].view(np.float32).reshape(NMAX, hidden)

    def row_end(self, n: int) -> int:
        """Where h's row n starts: the end of what a call of n rows brings onto the card (hidden %
        32 == 0, plan.geometry: whole 16-byte words)."""
        return self.h_off + n * self.hidden * 4

    def launch_in(self, ctx, fx, n: int) -> None:
        """Queue hy_copy16 of the staged records, RoPE rows and n residual rows onto the card."""
        n16 = self.row_end(n) // 16
        ctx.launch(fx.copy16, (-(-n16 // 256), 1), 256, 0, kargs("QQi", self.host.ptr, self.dev, n16))

    def launch_out(self, ctx, fx, n: int) -> None:
        """Queue hy_copy16 of h's first n rows back into the host twin."""
        n16 = (self.row_end(n) - self.h_off) // 16
        ctx.launch(fx.copy16, (-(-n16 // 256), 1), 256, 0,
                   kargs("QQi", self.dev.ptr + self.h_off, self.host.ptr + self.h_off, n16))

    def close(self) -> None:
        self.dev.close()
        self.host.close()


@dataclass
class Counters:
    """Debug and profile counters of the small path (`GRAPH_REC`, `GRAPH_RUN`, `HSTAGE_NS`,
    `HCALLS_N`, declines)."""

    graph_rec: int = 0
    graph_run: int = 0
    calls_n: list = field(default_factory=lambda: [0] * (NMAX + 1))
    # [rows][stage] nanoseconds (CMF_CUDA_PROF)
    stage_ns: np.ndarray = field(default_factory=lambda: np.zeros((NMAX + 1, 12), dtype=np.int64))
    tokens_seen: int = 0
    declines: list = field(default_factory=list)
    # perf_counter_ns when the last small-path call's graph launch (or direct launches) returned
    launched_ns: int = 0


class HState:
    """The arm's state on one context (`st.hyb` with the parts of `State` it uses)."""

    def __init__(self, ctx, card: Card | None = None):
        self.ctx = ctx
        self.card = card if card is not None else Card(ctx)
        self.lock = threading.RLock()
        k = knobs.get()
        # CMF_CUDA_GRAPH, CMF_CUDA_PROF, CMF_CUDA_DEBUG, CMF_CUDA_MEM, CMF_HYB_KCAP, CMF_HYB_KT
        self.use_graphs = k.cuda_graph
        self.prof = k.cuda_prof
        self.debug = k.cuda_debug
        self.mem = k.cuda_mem
        self.kcap = k.hyb_kcap
        self.kt = k.hyb_kt
        self.funcs: dict = {}
        self.plans: dict = {}
        self.kv: dict = {}
        self.gdn: dict = {}
        self.graphs: dict = {}
        self.rtabs: dict = {}
        self.scratch: dict = {}
        self._f32: dict = {}
        # pinned host staging by name: (Pinned, the event `pin_done` records, or None) (`pin`)
        self._pins: dict = {}
        # (plan id, sequence, first layer) -> the states a full admission resolved (`admit`), and
        # the last admission's (key, first position, rows, held) for `book`
        self.held: dict = {}
        self.admitted: tuple | None = None
        # (file, its uid) of the last call: a CmfFile hashes its header for `uid` on every read
        self._uid: tuple = (None, "")
        # the K/V capacity a caller expects (rows), for the first reservation
        self.kv_hint = 0
        # layers whose residual rows a drafter taps (`taps_wanted`); the last call's tap rows
        self.taps_wanted: tuple = ()
        self.taps_out: np.ndarray | None = None
        # host microseconds of each token (CMF_CUDA_DEBUG)
        self.token_us: list = []
        self.counters = Counters()

    def log(self, msg: str) -> None:
        print(f"cuda hybrid: {msg}", file=sys.stderr)

    def mem_report(self, what: str) -> None:
        """`CMF_CUDA_MEM=1`: what the card holds, on stderr, after `what` (`mem_report`)."""
        if not self.mem:
            return
        mb = lambda b: b / (1 << 20)
        free, total = self.ctx.mem_get_info()
        gdn = sum(g.all.bytes + (g.snap[1].bytes + g.snap[2].bytes if g.snap else 0)
                  for g in self.gdn.values())
        scratch = sorted(((b.bytes, k) for k, b in self.scratch.items()), reverse=True)
        mcap = max((m.cap for m in self.kv.values()), default=0)
        big = ", ".join(f"{k} {mb(b):.0f}" for b, k in scratch[:6])
        self.log(f"mem after {what}: used {mb(total - free):.0f} of {mb(total):.0f} MiB; weights "
                 f"{mb(self.ctx.resident):.0f}, K/V {mb(self.ctx.kv_bytes):.0f} ({len(self.kv)} mirrors "
                 f"of up to {mcap} rows), GDN states {mb(gdn):.0f} in {len(self.gdn)}, scratch "
                 f"{mb(sum(b for b, _ in scratch)):.0f} (largest {big}), graphs {len(self.graphs)}")

    def uid(self, cmf) -> str:
        """`cmf.uid`, read once per file object (a file's content does not change under it)."""
        if self._uid[0] is not cmf:
            self._uid = (cmf, cmf.uid)
        return self._uid[1]

    def hfuncs(self, hpk: int, hd: int):
        f = self.funcs.get((hpk, hd))
        if f is None:
            f = self.funcs[(hpk, hd)] = self.card.funcs(hpk, hd)
        return f

    def store(self) -> MatStore:
        return self.card.store(next(iter(self.funcs.values())))

    def scr(self, name: str, nbytes: int) -> Buf:
        """Named scratch of at least `nbytes`, grown (never shrunk) on demand: a grown one has a
        new address."""
        b = self.scratch.get(name)
        if b is not None and b.bytes >= nbytes:
            return b
        if b is not None:
            self.ctx.sync()
            b.close()
        b = self.scratch[name] = self.card.new(round_up(max(nbytes, 1), 256))
        return b

    def scr_release(self, names) -> None:
        """Free the named scratch (after a sync: pending work may still use it); the next `scr`
        of a name allocates afresh."""
        if names:
            self.ctx.sync()
        for name in names:
            self.scratch.pop(name).close()

    def drop_graphs(self, match) -> None:
        """Close and forget the recorded small-path graphs whose key (`graphs.graph_key`: plan id,
        sequence, ...) `match` accepts; a later call records its graph again."""
        for k in [k for k in self.graphs if match(k)]:
            self.graphs.pop(k).close()

    def pin(self, name: str, dtype, n: int) -> np.ndarray:
        """Pinned host staging `name` as n values of `dtype` at a fixed address, free to write: the
        card has copied out of it whatever was queued before its last `pin_done` (waited for
        here). The card copies from and into it without the driver's pageable bounce, and truly
        asynchronously: a caller queues its copies, then `pin_done`. Grown (after a sync), never
        shrunk."""
        nbytes = n * np.dtype(dtype).itemsize
        p, done = self._pins.get(name, (None, None))
        if done is not None:
            done.sync()
        if p is None or p.bytes < nbytes:
            if p is not None:
                self.ctx.sync()
                p.close()
            p = self.card.pinned(round_up(max(nbytes, 1), 4096))
            self._pins[name] = (p, done)
        return p.array(dtype)[:n]

    def pin_done(self, name: str) -> None:
        """The copies queued so far out of staging `name` are its last readers: its next `pin`
        waits for them (an event recorded on the stream)."""
        p, done = self._pins[name]
        if done is None:
            done = self.card.event()
            self._pins[name] = (p, done)
        done.record()

    def f32_buf(self, arr: np.ndarray) -> Buf:
        """A float32 vector on the card, one upload per distinct content (`st.f32_buf`)."""
        a = np.ascontiguousarray(arr, dtype=np.float32)
        key = (a.nbytes, fp_f32(a))
        b = self._f32.get(key)
        if b is None:
            b = self._f32[key] = self.card.upload(a)
        return b


def fp_f32(a: np.ndarray) -> int:
    """A fingerprint of a float32 vector's content (`crate::gpu::fp_f32`)."""
    h = hashlib.blake2b(np.ascontiguousarray(a, dtype=np.float32).tobytes(), digest_size=8)
    return int.from_bytes(h.digest(), "little")


_CURRENT: HState | None = None


def current() -> HState:
    """The process-wide arm state on `Ctx.current()` (NoDevice without a GPU)."""
    global _CURRENT
    from cortiq_drv.cu import Ctx

    ctx = Ctx.current()
    if _CURRENT is None or _CURRENT.ctx is not ctx:
        _CURRENT = HState(ctx)
    return _CURRENT
