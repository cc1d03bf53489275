"""The tensor-core matvec of the small path: job tables (`HyJob`), `MmaSet` (`mmaset`,
`mmaset_pair`; the reference's `mmaset_kind` is its constructor), `Planes`, `split`,
`MmaSet.run`, `rows_matvec` (ports of cuda_hybrid.rs; `RowsMatvec` keeps its buffers between
calls), and `MmaFuncs`, the kernels of hyb.cu they launch. The measured rules a set's launches
are chosen by live in mma_rules.

Arithmetic contract (kernels/hyb_mma.cuh): a row's outputs are the same bits whatever number of
rows the call carries and whichever of the TB variants runs; only KS (warps splitting a tile's
groups) changes them, and it depends on the matrices alone (`ks16`), never on n.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from cortiq_drv.cu import Buf
from cortiq_drv.cu.args import dev_ptr, kargs
from cortiq_drv.errors import CortiqError
from cortiq_drv.hybrid.mma_rules import evens_tiles, fewer_waves, four_tiles, one_wave, set_rules, stages_b

# Rows of the small path (the reference's NMAX).
NMAX = 16
# Weight kinds: q4tp (FORMAT.md "Graph weight kinds"), and the flag of a gate/up pair.
KIND_Q4TP = 6
KIND_PAIR = 0x100

# `struct HyJob` of kernels/hyb_mma.cuh (56 bytes, natural alignment).
HYJOB = np.dtype([("w", "<u8"), ("aux0", "<u8"), ("aux1", "<u8"), ("y", "<u8"), ("res", "<u8"),
                  ("rows", "<i4"), ("kind", "<i4"), ("blk0", "<i4"), ("ystride", "<i4")])
# Jobs a launch carries at most (HY_MAXJ: the table travels by value in the kernel parameters).
MAXJ = 8


# The dynamic shared memory of hy_mmp and hy_mmr: each warp's ring of HY_RUN_STAGES stages of
# HY_STAGE bytes (four 256-byte weight units and their 16 code bytes; kernels/hyb_mmp_core.cuh; the
# kernels trap when launched with less).
RUN_STAGES = 4
STAGE_BYTES = 1088
# hy_mmv's ring (HY_MV_STAGES; a sweep compiling another value gives `MmaFuncs` its own).
MV_STAGES = 4
# Registers and threads an SM holds (sm_80, sm_90).
_SM_REGS = 65536
_SM_THREADS = 2048


def ring_bytes(ks: int, stages: int) -> int:
    """Dynamic shared memory of an hy_mmp / hy_mmv launch with `ks` warps and rings of `stages`."""
    return ks * stages * STAGE_BYTES


def staged_b_bytes(cols: int, n: int) -> int:
    """hy_mmv's staged B (kernels/hyb_mmp_core.cuh, hy_mmp_run with SB) after the rings: the
    call's 3 n plane columns, hy_sb_stride(cols / 32) bytes apart."""
    gpr = cols // 32
    return 3 * n * (gpr * 64 + ((64 - gpr * 64) & 127))


def blocks_per_sm(smem_optin: int, f, threads: int, dyn_smem: int) -> int:
    """Blocks of `f` an SM holds at once (registers, shared memory: `smem_optin` a block at most,
    threads)."""
    warps = threads // 32
    regs_warp = -(-f.attr("NUM_REGS") * 32 // 256) * 256
    by_regs = _SM_REGS // (regs_warp * warps)
    by_smem = (smem_optin + 1024) // (f.attr("SHARED_SIZE_BYTES") + dyn_smem + 1024)
    return max(1, min(by_regs, by_smem, _SM_THREADS // threads))


def mmp_name(nt: int, tb: int, ks: int) -> str:
    """The matvec entry of (NT, TB, KS); NT 0 is hy_mmv's."""
    return f"hy_mmv_{tb}_{ks}" if nt == 0 else f"hy_mmp_{nt}_{tb}_{ks}"


# Tiles a block of a launch (TB) may take, and the (NT, TB, KS) entries hyb_mmp.cuh compiles: every
# (TB, KS) of 1, 2 and 8, 16, and TB 4 for 11..16 rows at KS 8 (hy_mmp_2_4_8, `four_tiles`).
TBS = (1, 2, 4)
MMP_VARIANTS = (*((nt, tb, ks) for nt in (0, 1, 2) for tb in (1, 2) for ks in (8, 16)), (2, 4, 8))


def mmvs_name(tb: int, ks: int) -> str:
    """hy_mmv_{TB}_{KS} with its columns staged in shared memory."""
    return f"hy_mmvs_{tb}_{ks}"


def mmr_name(ntc: int, tb: int) -> str:
    """hy_mmp_1_{TB}_8's run path alone for calls filling NTC n-tiles."""
    return f"hy_mmr_{ntc}_{tb}_8"


def mmr_ntc(n: int) -> int:
    """The n-tiles of 8 columns that `n` rows' three planes fill (hy_ntc; hy_mmr's NTC)."""
    return (3 * n + 7) // 8


def mmr_fits(nt: int, tb: int, ks: int, n: int) -> bool:
    """Whether hy_mmr can run a call of variant (nt, tb, ks) with `n` rows: 3..8 rows at KS 8, one
    or two tiles a block."""
    return nt == 1 and tb <= 2 and ks == 8 and n >= 3


# The weight-side kernels that start with pdl_begin() (kernels/common.cuh), launched as
# programmatic dependents.
PDL_KERNELS = (*(mmp_name(*v) for v in MMP_VARIANTS),
               *(mmvs_name(tb, ks) for tb in (1, 2) for ks in (8, 16)),
               *(mmr_name(ntc, tb) for ntc in (2, 3) for tb in (1, 2)), "hy_split", "hy_rmsnorm2")


class MmaFuncs:
    """The weight-side kernels of one loaded hyb.cu module: `mmp[(NT, TB, KS)]` for each of
    MMP_VARIANTS (NT 0: `hy_mmv_{TB}_{KS}`, the one- and two-row entries; 1, 2:
    `hy_mmp_{NT}_{TB}_{KS}`), `split`, `rmsnorm2`, `repack` (the matching fields of the reference's
    `HFuncs`), `mmp_smem[NT][KS == 16]`, each variant's dynamic shared memory (hy_mmv's rings
    `mv_stages` deep, hy_mmp's and hy_mmr's `run_stages`: the module's HY_MV_STAGES and
    HY_RUN_STAGES), and `grid_cap[(NT, TB, KS)]`, the blocks each variant keeps resident on the whole
    card (its grid walks the work items, so a launch never needs more), and `mmvs[TB - 1][KS == 16]`,
    `hy_mmvs_{TB}_{KS}` (hy_mmv with its columns staged: its shared memory and blocks by
    `staged_shape`), and `mmr[NTC - 2][TB - 1]`, `hy_mmr_{NTC}_{TB}_8` (`mmr_smem`, `mmr_cap`).
    PDL_KERNELS are marked `pdl`."""

    def __init__(self, ctx, module, mv_stages: int = MV_STAGES, run_stages: int = RUN_STAGES):
        # the card's limits, kept here: launches may go through a wrapper of the context (KtCtx)
        self.smem_optin, self.sm_count = ctx.smem_optin, ctx.sm_count
        self.module = module
        self.mmp = {v: module.func(mmp_name(*v)) for v in MMP_VARIANTS}
        self.mmp_smem = [[ring_bytes(ks, mv_stages if nt == 0 else run_stages) for ks in (8, 16)] for nt in (0, 1, 2)]
        self.grid_cap = {}
        # (the driver picks each launch's shared-memory carveout: a PREFERRED_SHARED_MEMORY_CARVEOUT
        # of the fewest percent for these blocks slows the staged 9B head, 177.5 -> 214.1 us, and
        # the decode step, 2.227 -> 2.261 ms; of 100, 8-row calls, 9B gate/up 33.2 -> 36.6 us:
        # H200, session 17)
        # Every block an SM holds: hy_mmv's caps one block an SM short, so that each SM keeps a
        # block's registers for the next launch's blocks to become resident and fetch their first
        # stages while it runs, lose (H200, session 30 call 5, `bench_decode --shapes 9b --source
        # mem --skip-matvec --tokens 32 --windows 2 --prompt 64`, device ms, two runs each: step
        # 2.0977 / 2.0952 against 1.9805 / 1.9819, 2-row window 2.3552 / 2.3602 against 2.1445 /
        # 2.1467; the rules' choices made from those caps).
        for (nt, tb, ks), f in self.mmp.items():
            smem = self.mmp_smem[nt][int(ks == 16)]
            f.allow_smem(smem)
            self.grid_cap[nt, tb, ks] = blocks_per_sm(self.smem_optin, f, 32 * ks, smem) * self.sm_count
        # hy_mmvs: all the card allows (its staged columns come on top of hy_mmv's ring)
        self.mmvs = [[module.func(mmvs_name(tb, ks)) for ks in (8, 16)] for tb in (1, 2)]
        self.mmvs_shape: dict = {}
        for f in (f for row in self.mmvs for f in row):
            f.allow_smem(self.smem_optin - f.attr("SHARED_SIZE_BYTES"))
        self.mmr = [[module.func(mmr_name(ntc, tb)) for tb in (1, 2)] for ntc in (2, 3)]
        self.mmr_smem = ring_bytes(8, run_stages)
        for f in (f for row in self.mmr for f in row):
            f.allow_smem(self.mmr_smem)
        self.mmr_cap = [[blocks_per_sm(self.smem_optin, f, 256, self.mmr_smem) * self.sm_count for f in row]
                        for row in self.mmr]
        self.split = module.func("hy_split")
        self.rmsnorm2 = module.func("hy_rmsnorm2")
        self.repack = module.func("hy_repack")
        for name in PDL_KERNELS:
            module.func(name).pdl = True

    def staged_shape(self, tb: int, ks: int, cols: int, n: int) -> tuple[int, int] | None:
        """(dynamic shared memory, most blocks worth launching) of hy_mmvs_{tb}_{ks} for n rows
        `cols` wide; None when the staged columns do not fit beside its rings."""
        key = (tb, ks, cols, n)
        got = self.mmvs_shape.get(key, False)
        if got is False:
            f = self.mmvs[tb - 1][int(ks == 16)]
            smem = self.mmp_smem[0][int(ks == 16)] + staged_b_bytes(cols, n)
            fits = smem + f.attr("SHARED_SIZE_BYTES") <= self.smem_optin
            cap = blocks_per_sm(self.smem_optin, f, 32 * ks, smem) * self.sm_count
            got = self.mmvs_shape[key] = (smem, cap) if fits else None
        return got


def weight_side_source() -> str:
    """The weight-side kernels alone, as hyb.cu compiles them: its includes up to hyb_mmp.cuh (the
    pieces MmaFuncs' kernels live in), a third of its compile time, for the matvec's own tests
    and speed runs (hyb.cu's HPK / HD do not reach these pieces)."""
    from cortiq_drv.kernels import includes, source

    pieces = includes("hyb.cu")
    return "\n".join(source(name) for name in pieces[:pieces.index("hyb_mmp.cuh") + 1])


@dataclass(frozen=True)
class Planes:
    """The row planes a tensor-core launch reads: three bf16 parts of each f32 (`put3`), `stride`
    elements a row, each row's columns in fragment order (kernels/hyb_mma.cuh, `plane_cols`). A
    gate/up pair's output is read as `Planes(hi, lo, lo, stride)`."""

    p0: int
    p1: int
    p2: int
    stride: int


@dataclass(frozen=True)
class JobSpec:
    """One matrix of a launch: `mat` (a repacked DevMat), output `y`, residual `res` (0: none),
    the output's row stride and the rows to compute (the reference's JobSpec tuple)."""

    mat: object
    y: int
    res: int
    ystride: int
    rows: int


def job_table(list_, kind: int, tb: int) -> tuple[np.ndarray, int]:
    """The HyJob records of `list_` for `tb` tiles a block, and the blocks they take."""
    jobs = np.zeros(len(list_), dtype=HYJOB)
    blk = 0
    for i, s in enumerate(list_):
        m = s.mat
        jobs[i] = (dev_ptr(m.w), dev_ptr(m.aux0), dev_ptr(m.aux1), dev_ptr(s.y), dev_ptr(s.res), s.rows, kind,
                   blk, s.ystride)
        ntile = -(-s.rows // 16)
        blk += -(-ntile // tb)
    return jobs, blk


def variant(n: int, ks16: bool, tb1: bool) -> tuple[int, int, int]:
    """(NT, TB, KS) of a call with `n` rows: NT 0 (hy_mmv) up to 2 rows, 1 up to 8, 2 up to 16."""
    if not 1 <= n <= NMAX:
        raise CortiqError(f"hy_mmp: {n} rows, the small path takes 1..{NMAX}")
    return (n + 7) // 8 if n > 2 else 0, 1 if tb1 else 2, 16 if ks16 else 8


def rows_cap(nt: int) -> int:
    """Rows a call of variant NT carries at most (hy_mmv: 2)."""
    return 8 * nt if nt else 2


def jobs_block(jobs: np.ndarray):
    """The `HyJobs` block a launch takes by value: `jobs`, then zeroed records up to MAXJ (ctypes
    bytes; made once a set and shared by its launches' JobArgs)."""
    table = np.zeros(MAXJ, dtype=HYJOB)
    table[:len(jobs)] = jobs
    return ctypes.create_string_buffer(table.tobytes(), table.nbytes)


class JobArgs:
    """An hy_mmp / hy_mmv launch's parameters: the job table by value (`block`, a `jobs_block` of
    nj records), then nj, p0, p1, p2, xs, n, cols packed by KArgs (its checks, its 8-byte slots);
    `addr` is the `void**` a launch takes (the driver copies the values at launch, a graph capture
    records them)."""

    __slots__ = ("addr", "_block", "_rest", "_ptrs")

    def __init__(self, block, nj: int, p: Planes, n: int, cols: int):
        self._block = block
        self._rest = kargs("iQQQiii", nj, p.p0, p.p1, p.p2, p.stride, n, cols)
        slots = (ctypes.c_void_p * len(self._rest)).from_address(self._rest.addr)
        self._ptrs = (ctypes.c_void_p * (1 + len(self._rest)))(ctypes.addressof(block), *slots)
        self.addr = ctypes.addressof(self._ptrs)


def check_planes(p: Planes, n: int, cols: int, what: str) -> None:
    """The planes a launch reads or writes `cols` columns of, in `n` rows: 16-byte aligned, whole
    groups of 32 columns (their fragment order), past one row a stride of a multiple of 8
    elements (every lane's B fragments are one 16-byte load) that holds the columns."""
    if (p.p0 | p.p1 | p.p2) % 16 or cols % 32 or (n > 1 and (p.stride % 8 or cols > p.stride)):
        raise CortiqError(f"{what}: planes at {p.p0:#x}, {p.p1:#x}, {p.p2:#x}, stride {p.stride}, for {n} rows of "
                          f"{cols} columns: 16-byte aligned planes, columns in whole groups of 32, and past one row a "
                          f"stride of a multiple of 8 that holds them")


class MmaSet:
    """One launch's q4tp matrices: job tables for one, two and four tiles a block (`jobs`, `blocks`:
    by TB), the choices the reference's `MmaSet` makes (`mmaset_kind`, `variant`) and the ones
    measured here on top of them (`choice`)."""

    def __init__(self, ctx, list_, kind: int):
        if not list_:
            raise CortiqError("mmaset: no matrices")
        if len(list_) > MAXJ:
            raise CortiqError(f"mmaset: {len(list_)} matrices, a launch carries at most {MAXJ}")
        for s in list_:
            m = s.mat
            if m.kind != KIND_Q4TP or m.cols % 32:
                raise CortiqError("a tensor-core job over a matrix that is not repacked q4tp")
            if not 0 < s.rows <= m.rows:
                raise CortiqError(f"mmaset: {s.rows} rows of a {m.rows}-row matrix")
        if len({s.mat.cols for s in list_}) != 1:
            raise CortiqError("mmaset: matrices of one launch must share their width")
        self.cols = list_[0].mat.cols
        tables = {tb: job_table(list_, kind, tb) for tb in TBS}
        self.jobs = {tb: t for tb, (t, _) in tables.items()}
        self.blocks = {tb: b for tb, (_, b) in tables.items()}
        self._hyjobs = {tb: jobs_block(t) for tb, t in self.jobs.items()}
        self.ks16, self.tb1 = set_rules([s.rows for s in list_])
        self._calls = {}  # (fx, nt, tb, ks, staged, lean, planes, n): ctx.launch's arguments
        self._choices = {}  # (fx, n): `choice`

    def variant(self, n: int) -> tuple[int, int, int]:
        """(NT, TB, KS) of a call with `n` rows (`MmaSet::run`'s choice)."""
        return variant(n, self.ks16, self.tb1)

    def choice(self, fx, n: int) -> tuple[int, int, int, bool, bool]:
        """(NT, TB, KS, staged, lean) of `run`'s call: `variant`; at one or two rows TB 1 where
        `evens_tiles` says, then at one row hy_mmvs where `stages` says, else hy_mmp_1 instead of
        hy_mmv where `fewer_waves` does; at 3..8 rows and KS 8, hy_mmr (lean) where `one_wave`
        says; at 11..16 rows TB 4 where `four_tiles` says (the rules: mma_rules)."""
        nt, tb, ks = self.variant(n)
        if four_tiles(nt, tb, ks, n):
            return nt, 4, ks, False, False
        if mmr_fits(nt, tb, ks, n):
            lean = one_wave(self.blocks[tb], fx.grid_cap[nt, tb, ks], fx.mmr_cap[mmr_ntc(n) - 2][tb - 1])
            return nt, tb, ks, False, lean
        if nt:
            return nt, tb, ks, False, False
        if tb == 2 and evens_tiles(self.blocks[2], self.blocks[1], fx.sm_count, fx.grid_cap[0, 1, ks]):
            tb = 1
        if self.stages(fx, n, tb, ks):
            return nt, tb, ks, True, False
        if fewer_waves(self.blocks[tb], fx.grid_cap[0, tb, ks], fx.grid_cap[1, tb, ks]):
            nt = 1
        return nt, tb, ks, False, False

    def stages(self, fx, n: int, tb: int, ks: int) -> bool:
        """Whether a call of `n` rows at (tb, ks) stages its columns (hy_mmvs) by the rules: room
        for the columns (hy_mmvs takes one or two rows) and `stages_b`."""
        shape = fx.staged_shape(tb, ks, self.cols, n) if n <= 2 else None
        return shape is not None and stages_b(self.blocks[tb], self.cols // 32, fx.grid_cap[0, tb, ks],
                                              shape[1], fx.grid_cap[1, tb, ks], n)

    def run(self, ctx, fx, p: Planes, cols: int, n: int) -> None:
        """The call's `n` rows of x (as planes) through every matrix (`MmaSet::run`, choosing as
        `choice` does)."""
        if cols != self.cols:
            raise CortiqError(f"hy_mmp: planes {cols} wide for matrices {self.cols} wide")
        key = (fx, n)
        how = self._choices.get(key)
        if how is None:
            how = self._choices[key] = self.choice(fx, n)
        self.launch(ctx, fx, p, n, *how)

    def launch(self, ctx, fx, p: Planes, n: int, nt: int, tb: int, ks: int, staged: bool | None = None,
               lean: bool = False) -> None:
        """Launch variant (nt, tb, ks) over the set (`hy_mmv_{tb}_{ks}` when nt is 0, or
        `hy_mmvs_{tb}_{ks}` when `staged`, by default as `stages` rules; `hy_mmr_{NTC}_{tb}_8`
        when `lean`; tests and benchmarks pick variants; the arithmetic depends on `ks` alone)."""
        key = (fx, nt, tb, ks, staged, lean, p, n)
        call = self._calls.get(key)
        if call is None:
            f, smem, cap = self.pick(fx, p, n, nt, tb, ks, staged, lean)
            args = JobArgs(self._hyjobs[tb], len(self.jobs[tb]), p, n, self.cols)
            call = self._calls[key] = (f, (min(self.blocks[tb], cap), 1), 32 * ks, smem, args)
        ctx.launch(*call)

    def pick(self, fx, p: Planes, n: int, nt: int, tb: int, ks: int, staged: bool | None = None,
             lean: bool = False):
        """(kernel, dynamic shared memory, most blocks worth launching) of `launch`'s call."""
        check_planes(p, n, self.cols, "hy_mmp")
        if (nt, tb, ks) not in fx.mmp:
            raise CortiqError(f"hy_mmp variant {nt}_{tb}_{ks}: no such kernel (TB 4 is hy_mmp_2 at KS 8 alone)")
        if n > rows_cap(nt):
            raise CortiqError(f"hy_mmp variant {nt}_{tb}_{ks}: at most {rows_cap(nt)} rows, got {n}")
        if staged and nt:
            raise CortiqError(f"hy_mmp variant {nt}_{tb}_{ks}: only hy_mmv (NT 0) stages its columns")
        if lean:
            if not mmr_fits(nt, tb, ks, n):
                raise CortiqError(f"hy_mmr: calls of 3..8 rows at KS 8 (NT 1, TB 1 or 2), not {n} rows of "
                                  f"{nt}_{tb}_{ks}")
            c = mmr_ntc(n)
            return fx.mmr[c - 2][tb - 1], fx.mmr_smem, fx.mmr_cap[c - 2][tb - 1]
        ki = int(ks == 16)
        f, smem, cap = fx.mmp[nt, tb, ks], fx.mmp_smem[nt][ki], fx.grid_cap[nt, tb, ks]
        if nt == 0 and (self.stages(fx, n, tb, ks) if staged is None else staged):
            shape = fx.staged_shape(tb, ks, self.cols, n)
            if shape is None:
                raise CortiqError(f"hy_mmvs_{tb}_{ks}: {n} rows {self.cols} wide need room for their columns "
                                  f"beside the rings")
            f, (smem, cap) = fx.mmvs[tb - 1][ki], shape
        return f, smem, cap


def mmaset(ctx, list_) -> MmaSet:
    """Plain / residual jobs (`mmaset`): `list_` of JobSpec."""
    return MmaSet(ctx, list_, KIND_Q4TP)


def mmaset_pair(ctx, m, p0, p1, pstride: int) -> MmaSet:
    """One gate/up pair (see `hmat_pair`) whose output silu(gate) * up is written as the bf16
    planes p0 (hi) and p1 (half the rest), `pstride` a row (`mmaset_pair`)."""
    return MmaSet(ctx, [JobSpec(m, dev_ptr(p0), dev_ptr(p1), pstride, m.rows)], KIND_Q4TP | KIND_PAIR)


def split(ctx, fx, p: Planes, x, xstride: int, cols: int, n: int) -> None:
    """x [n][xstride] f32, its first `cols` columns, into the planes (`split`)."""
    check_planes(p, n, cols, "split")
    args = kargs("QiiQQQii", x, xstride, cols, p.p0, p.p1, p.p2, p.stride, n)
    ctx.launch(fx.split, (-(-(n * cols) // 256), 1), 256, 0, args)


def rmsnorm2(ctx, fx, x, w, xf, hidden: int, eps: float, gemma: bool, p: Planes, n: int) -> None:
    """Rows x [n][hidden] f32 RMS-normalised by w [hidden] (`1 + w` when `gemma`) into the planes
    and, when `xf` is given, into xf [n][hidden] f32 (`hy_rmsnorm2`: whole groups of 32 columns).
    At n <= HY_EARLY_ROWS (kernels/common.cuh) it lets the next launch go before its own wait, so
    what follows it on the stream must read no kernel's output before its wait (a matvec does not)."""
    check_planes(p, n, hidden, "rmsnorm2")
    args = kargs("QQQifiQQQi", x, w, xf, hidden, eps, int(gemma), p.p0, p.p1, p.p2, p.stride)
    ctx.launch(fx.rmsnorm2, (-(-hidden // 1024), n), 256, 0, args)


class RowsMatvec:
    """y [n][rows] = W x [n][cols] on the card for a repacked q4tp DevMat, `chunk` (<= NMAX) rows
    a launch, every row as in a one-row call (`rows_matvec`), with its staging rows, planes and
    job table made once (sized for `chunk` rows) for any number of calls. `new(nbytes)` and
    `sets(jobs)` make the buffers and the job table (default: plain buffers and `mmaset`; the arm
    passes its Card's); `what` names it in errors."""

    def __init__(self, ctx, fx, m, new=None, sets=None, what: str = "rows_matvec", chunk: int = NMAX):
        if not 1 <= chunk <= NMAX:
            raise CortiqError(f"{what}: {chunk} rows a launch, the matvec takes 1..{NMAX}")
        new = new or (lambda nbytes: Buf.new(ctx, nbytes))
        self.ctx, self.fx, self.m, self.what, self.chunk = ctx, fx, m, what, chunk
        self.bufs = []
        try:
            for nbytes in (chunk * m.cols * 4, chunk * m.rows * 4, *[chunk * m.cols * 2] * 3):
                self.bufs.append(new(nbytes))
            _, y, p0, p1, p2 = self.bufs
            self.planes = Planes(p0.ptr, p1.ptr, p2.ptr, m.cols)
            self.ms = (sets or (lambda jobs: mmaset(ctx, jobs)))([JobSpec(m, y.ptr, 0, m.rows, m.rows)])
        except BaseException:
            self.close()
            raise

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """y [n][rows] of x [n][cols] (float32), after one sync."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        cols = self.m.cols
        if x.ndim != 2 or x.shape[1] != cols:
            raise CortiqError(f"{self.what}: rows of width {cols}, got shape {x.shape}")
        ctx, fx, (xin, yout) = self.ctx, self.fx, self.bufs[:2]
        y = np.empty((x.shape[0], self.m.rows), dtype=np.float32)
        # stream order keeps a chunk's upload after the last one's launches and its download
        for r0 in range(0, x.shape[0], self.chunk):
            k = min(self.chunk, x.shape[0] - r0)
            xin.upload_async(x[r0:r0 + k])
            split(ctx, fx, self.planes, xin, cols, cols, k)
            self.ms.run(ctx, fx, self.planes, cols, k)
            yout.download_async(y[r0:r0 + k])
        ctx.sync()
        return y

    def close(self) -> None:
        for b in self.bufs:
            b.close()
        self.bufs = []


def rows_matvec(ctx, fx, m, x: np.ndarray) -> np.ndarray:
    """y [n][rows] = W x [n][cols] on the card for a repacked q4tp DevMat, NMAX rows a launch
    (`rows_matvec`): every row as in a one-row call; buffers for this call alone."""
    mv = RowsMatvec(ctx, fx, m)
    try:
        return mv(x)
    finally:
        mv.close()
