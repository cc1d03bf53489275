"""A fake device for the hybrid arm's host-side tests (import as `import _fakecard`).

`FakeBuf` has the `Buf` methods the arm uses over a numpy byte heap, so copies, memsets and
uploads really move bytes (each host copy logged in `FakeCtx.host_copies` as (direction, host
array), so tests see what crossed and from where); `FakePinned` is pinned host memory
(`Pinned`) over a numpy array; `FakeCtx` records kernel launches (name, grid, block, packed argument
formats and bytes) instead of running them (but for hy_copy16's bytes); `FakeCard` implements
`hybrid.state.Card` with those: graph capture records the launches a body queues and replays them into the launch log,
matrices and job tables are plain records of what was asked.
"""

from __future__ import annotations

import ctypes
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cortiq_drv.hybrid.launch import HFuncs
from cortiq_drv.hybrid.mma import KIND_Q4TP
from cortiq_drv.hybrid.state import HState

BASE = 0x7F0000000000


class Heap:
    """Device memory: one zeroed numpy byte array with bump allocation (256-byte aligned)."""

    def __init__(self, nbytes: int = 96 << 20):
        self.mem = np.zeros(nbytes, dtype=np.uint8)
        self.used = 0
        self.allocs = 0

    def alloc(self, nbytes: int) -> int:
        at = self.used
        self.used = (at + max(nbytes, 1) + 255) // 256 * 256
        if self.used > len(self.mem):
            raise MemoryError("fake heap exhausted")
        self.allocs += 1
        return BASE + at


class FakeBuf:
    __slots__ = ("heap", "ptr", "bytes", "owned", "ctx")

    def __init__(self, heap: Heap, ptr: int, nbytes: int, owned: bool, ctx):
        self.heap, self.ptr, self.bytes, self.owned, self.ctx = heap, ptr, nbytes, owned, ctx

    def _at(self, off: int, n: int) -> np.ndarray:
        assert 0 <= off and off + n <= self.bytes, (off, n, self.bytes)
        a = self.ptr - BASE + off
        return self.heap.mem[a:a + n]

    def view(self, off: int, nbytes: int) -> "FakeBuf":
        assert off + nbytes <= self.bytes
        return FakeBuf(self.heap, self.ptr + off, nbytes, False, self.ctx)

    def upload_async(self, host: np.ndarray, off: int = 0) -> None:
        assert host.flags.c_contiguous
        self.ctx.host_copies.append(("up", host))
        self._at(off, host.nbytes)[:] = host.view(np.uint8).reshape(-1)

    def download_async(self, host: np.ndarray, off: int = 0) -> None:
        self.ctx.host_copies.append(("down", host))
        host.reshape(-1).view(np.uint8)[:] = self._at(off, host.nbytes)

    def copy_from(self, src: "FakeBuf", off: int = 0) -> None:
        self._at(off, src.bytes)[:] = src._at(0, src.bytes)

    def memset(self, byte: int = 0) -> None:
        self._at(0, self.bytes)[:] = byte

    def read(self, dtype, count: int, off: int = 0) -> np.ndarray:
        return self._at(off, count * np.dtype(dtype).itemsize).copy().view(dtype)

    def close(self) -> None:
        self.ptr = 0 if self.owned else self.ptr


@dataclass
class Launch:
    name: str
    grid: tuple
    block: object
    fmt: str
    args: tuple  # packed bytes of every argument


class FakeCtx:
    def __init__(self):
        self.stream = None
        self.sm_count = 132
        self.smem_optin = 232448
        self.resident = 0
        self.kv_bytes = 0
        self.launches: list[Launch] = []
        self.recording: list | None = None
        self.syncs = 0
        self.host_copies: list = []
        # the card's memory (its FakeCard sets it), which hy_copy16 reads and writes
        self.heap: Heap | None = None

    def _log(self, f, grid, block, args) -> None:
        rec = Launch(f.name, tuple(grid), block, args.fmt, tuple(args.slot(i) for i in range(len(args))))
        (self.recording if self.recording is not None else self.launches).append(rec)
        # a capture runs it too, as device copies (`FakeBuf.copy_from`) run when queued
        if rec.name == "hy_copy16":
            self.copy16(rec)

    def copy16(self, rec: Launch) -> None:
        """hy_copy16 (a token's rows in and out of pinned host memory), the one kernel the fake
        card runs: its bytes moved."""
        src, dst, n = (int.from_bytes(a, "little") for a in rec.args)
        ctypes.memmove(self._host_addr(dst), self._host_addr(src), n * 16)

    def _host_addr(self, ptr: int) -> int:
        """The host address of a fake device pointer (the heap's bytes) or of pinned host memory."""
        on_heap = BASE <= ptr < BASE + len(self.heap.mem)
        return self.heap.mem.ctypes.data + ptr - BASE if on_heap else ptr

    def launch(self, f, grid, block, smem, args) -> None:
        self._log(f, grid, block, args)

    def launch_3d(self, f, grid, block, smem, args) -> None:
        self._log(f, grid, block, args)

    def sync(self) -> None:
        self.syncs += 1

    def mem_get_info(self):
        return (1 << 30, 2 << 30)


class FakePinned:
    """`Pinned` over a numpy array: `ptr` its address, `array` views of it."""

    def __init__(self, nbytes: int):
        self.bytes = int(nbytes)
        self.mem = np.zeros(max(self.bytes, 1), dtype=np.uint8)
        self.ptr = self.mem.ctypes.data

    def array(self, dtype=np.uint8, shape=None) -> np.ndarray:
        a = self.mem[:self.bytes].view(dtype)
        return a if shape is None else a.reshape(shape)

    def close(self) -> None:
        self.ptr = 0


class FakeEvent:
    """`Event`: records and waits count (the fake stream is always done)."""

    def __init__(self):
        self.records = self.syncs = 0

    def record(self) -> None:
        self.records += 1

    def sync(self) -> None:
        self.syncs += 1


class FakeFunc:
    """A kernel: its name, the registers a thread ptxas gives it on sm_90 under its launch bounds
    (`REGS`; 64 for the kernels not listed) and its static shared memory (`SMEM`, the weight-side
    kernels'; 0 for the others), both of which test_kernels_compile holds to ptxas' own, so the
    grid caps are the card's."""

    REGS = {"hy_mmp_2_4_8": 255, "hy_mmp_": 128, "hy_mmr_": 80, "hy_mmv_1_8": 80, "hy_mmv_2_8": 80,
            "hy_mmvs_1_8": 80, "hy_mmvs_2_8": 80, "hy_mmvs_1_16": 88, "hy_mmvs_2_16": 128}
    # HySmem<NC, TB, KS>: the rung tables, the warps' sums, the outputs, the mbarriers
    SMEM = {"hy_mmp_1_1_8": 7808, "hy_mmp_1_1_16": 12032, "hy_mmp_1_2_8": 15488, "hy_mmp_1_2_16": 23808,
            "hy_mmp_2_1_8": 9344, "hy_mmp_2_1_16": 13568, "hy_mmp_2_2_8": 18560, "hy_mmp_2_2_16": 26880,
            "hy_mmp_2_4_8": 36992,
            "hy_mmr_2_1_8": 7808, "hy_mmr_2_2_8": 15488, "hy_mmr_3_1_8": 7808, "hy_mmr_3_2_8": 15488,
            "hy_mmv_1_8": 7808, "hy_mmv_1_16": 12032, "hy_mmv_2_8": 15488, "hy_mmv_2_16": 23808,
            "hy_mmvs_1_8": 7808, "hy_mmvs_1_16": 12032, "hy_mmvs_2_8": 15488, "hy_mmvs_2_16": 23808}

    def __init__(self, name: str):
        self.name = name

    def allow_smem(self, nbytes: int) -> None:
        pass

    def attr(self, name: str) -> int:
        regs = next((r for k, r in self.REGS.items() if self.name.startswith(k)), 64)
        return {"NUM_REGS": regs, "SHARED_SIZE_BYTES": self.SMEM.get(self.name, 0)}.get(name, 0)


class FakeModule:
    def func(self, name: str) -> FakeFunc:
        return FakeFunc(name)


@dataclass
class FakeMat:
    kind: int
    rows: int
    cols: int
    w: FakeBuf
    aux0: FakeBuf
    aux1: FakeBuf
    key: object


class FakeStore:
    """`MatStore`'s interface: matrices as records with a small buffer each."""

    def __init__(self, card):
        self.card = card
        self.mats, self.pairs = {}, {}
        self.arena_needs: list[int] = []

    @contextmanager
    def plan_arena(self, need: int):
        self.arena_needs.append(need)
        yield None

    def _mat(self, key, rows, cols):
        b = self.card.new(64)
        return FakeMat(KIND_Q4TP, rows, cols, b, b.view(0, 16), b.view(16, 16), key)

    def hmat(self, key, payload, rows, cols):
        m = self.mats.get(key)
        if m is None or (m.rows, m.cols) != (rows, cols):
            m = self.mats[key] = self._mat(key, rows, cols)
        return m

    def hmat_pair(self, key, gate, up, inter, cols):
        if key not in self.pairs:
            self.pairs[key] = self._mat(key, 2 * inter, cols)
        return self.pairs[key]


class FakeSet:
    """A job table: the JobSpecs asked, `run` logs an `hy_mmp` launch with JobArgs' arguments
    after the table (nj, p0, p1, p2, xs, n, cols; the table itself travels by value), then each
    job's output and residual (y, res), which stand for the table."""

    def __init__(self, jobs, kind):
        self.jobs, self.kind = list(jobs), kind
        self.cols = self.jobs[0].mat.cols

    def run(self, ctx, fx, p, cols, n):
        from cortiq_drv.cu.args import kargs

        assert cols == self.cols and 1 <= n <= 16
        outs = [a for j in self.jobs for a in (j.y, j.res)]
        ctx.launch(FakeFunc("hy_mmp"), (1, 1), 256, 0, kargs("iQQQiii" + "Q" * len(outs), len(self.jobs), p.p0,
                                                             p.p1, p.p2, p.stride, n, cols, *outs))


class FakeGraph:
    def __init__(self, ctx, nodes):
        self.ctx, self.nodes, self.closed = ctx, nodes, False
        self.copies = [n for n in nodes if n.name == "hy_copy16"]

    def launch(self):
        assert not self.closed
        self.ctx.launches.extend(self.nodes)
        for rec in self.copies:
            self.ctx.copy16(rec)

    def close(self):
        self.closed = True


class FakeCard:
    def __init__(self, ctx: FakeCtx, heap: Heap):
        self.ctx, self.heap = ctx, heap
        # the card's memory, which the context's hy_copy16 reads and writes
        ctx.heap = heap
        self._store = None
        self.captures = 0
        self.funcs_loaded: list = []
        self.pins: list[FakePinned] = []

    def new(self, nbytes):
        return FakeBuf(self.heap, self.heap.alloc(nbytes), int(nbytes), True, self.ctx)

    def upload(self, arr):
        a = np.ascontiguousarray(arr)
        b = self.new(a.nbytes)
        b.upload_async(a)
        return b

    def pinned(self, nbytes):
        self.pins.append(FakePinned(nbytes))
        return self.pins[-1]

    def event(self):
        return FakeEvent()

    def is_pinned(self, host: np.ndarray) -> bool:
        """Do the bytes of the host array lie in live pinned memory?"""
        at, n = host.ctypes.data, host.nbytes
        return any(p.ptr and p.ptr <= at and at + n <= p.ptr + p.bytes for p in self.pins)

    def capture(self, fn):
        self.captures += 1
        self.ctx.recording = []
        try:
            fn()
            return FakeGraph(self.ctx, self.ctx.recording)
        finally:
            self.ctx.recording = None

    def funcs(self, hpk, hd):
        self.funcs_loaded.append((hpk, hd))
        return HFuncs(self.ctx, FakeModule())

    def store(self, fx):
        if self._store is None:
            self._store = FakeStore(self)
        return self._store

    def mmaset(self, jobs):
        return FakeSet(jobs, KIND_Q4TP)

    def mmaset_pair(self, m, p0, p1, pstride):
        from cortiq_drv.hybrid.mma import KIND_PAIR, JobSpec

        return FakeSet([JobSpec(m, p0, p1, pstride, m.rows)], KIND_Q4TP | KIND_PAIR)


def fake_state() -> tuple[HState, FakeCtx, FakeCard]:
    ctx = FakeCtx()
    card = FakeCard(ctx, Heap())
    return HState(ctx, card), ctx, card


_KERNELS = Path(__file__).resolve().parents[2] / "cortiq_drv" / "kernels"
_SIG = re.compile(r'extern "C" __global__ void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\(([^)]*)\)', re.S)
# the hy_mmp_* entry points come out of a macro: the matvec's own tests check them
_MACRO = "__launch_bounds__"


def kernel_params() -> dict[str, list[str]]:
    """Each `extern "C"` kernel of the hybrid sources: its parameters as written (type and name;
    hy_mmp_* take their macro's parameter list)."""
    out = {}
    for name in ("hyb_gdn.cuh", "hyb_attn.cuh", "hyb_mma.cuh", "hyb_mmp.cuh"):
        for fn, params in _SIG.findall((_KERNELS / name).read_text()):
            if fn != _MACRO:
                out[fn] = [p.strip() for p in params.split(",") if p.strip()]
    return out


def kernel_formats() -> dict[str, str]:
    """Each kernel of `kernel_params` as a kargs format: pointers and u64 'Q', int 'i', float 'f'."""
    out = {}
    for fn, params in kernel_params().items():
        codes = ""
        for p in params:
            if "*" in p or p.split()[0] in ("u64",):
                codes += "Q"
            elif p.split()[-2] in ("int",):
                codes += "i"
            elif p.split()[-2] == "float":
                codes += "f"
            else:
                raise AssertionError(f"{fn}: parameter {p!r}")
        out[fn] = codes
    return out
