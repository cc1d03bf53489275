"""Repacked q4tp matrices on the card (ports cuda_hybrid.rs `DevMat` as this arm uses it, `hmat`,
`hmat_pair`, the plan arena of `build`, and the VRAM budget they check).

A `MatStore` keeps the arm's matrices by key (the reference's `st.hyb.mats` / `pairs`, keyed
there by model and tensor index) and the arenas plan builds allocated (`st.hyb.arenas`).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from cortiq_drv import knobs
from cortiq_drv.cu import Arena, Buf
from cortiq_drv.errors import CortiqError, Declined
from cortiq_drv.hybrid.mma import KIND_Q4TP
from cortiq_drv.hybrid.repack import planes_bytes, repack_on_card


@dataclass
class DevMat:
    """A weight on the card: kind 6 = repacked q4tp, `w` the tiles (owning the allocation unless
    it is an arena view), `aux0` the rung codes, `aux1` the ladders; `held` the bytes it counts
    against the budget."""

    kind: int
    rows: int
    cols: int
    w: Buf
    aux0: Buf | None
    aux1: Buf | None
    held: int

    def close(self) -> None:
        self.w.close()


def vram_budget(ctx, held_else: int = 0) -> int:
    """Bytes the process may hold on the card: `CMF_GPU_VRAM_MB` when set, else what it holds
    now (the weights, and `held_else` more bytes the caller counts: K/V, states, scratch) plus
    what is free."""
    cap = knobs.get().vram_bytes
    if cap is not None:
        return cap
    return ctx.resident + held_else + ctx.mem_get_info()[0]


def _admit(ctx, what: str, nbytes: int) -> None:
    """Declined when `nbytes` more would take the card past the budget (`hmat`'s check)."""
    budget = vram_budget(ctx)
    if ctx.resident + nbytes > budget:
        raise Declined(what, f"weights do not fit the card ({ctx.resident / 1e9:.2f} GB held + "
                             f"{nbytes / 1e9:.2f} GB, budget {budget / 1e9:.2f} GB)")


class MatStore:
    """The arm's repacked matrices and plan arenas on one context, with kernels `fx`."""

    def __init__(self, ctx, fx):
        self.ctx = ctx
        self.fx = fx
        self.mats: dict = {}
        self.pairs: dict = {}
        self.arenas: list[Arena] = []
        self._arena: Arena | None = None

    @contextmanager
    def plan_arena(self, need: int):
        """While open, matrices come out of one allocation of `need` bytes (the sum of their
        `planes_bytes`) as long as it has room: the card rounds each allocation up (2 MiB), so a
        plan pays that once. `CMF_HYB_ARENA=0` turns it off (yields None)."""
        if need <= 0 or not knobs.get().hyb_arena:
            yield None
            return
        _admit(self.ctx, "plan arena", need)
        arena = Arena(self.ctx, need)
        self.arenas.append(arena)
        self.ctx.resident += need
        self._arena = arena
        try:
            yield arena
        finally:
            self._arena = None

    def _put(self, srcs, src_rows: int, rows: int, cols: int, what: str) -> DevMat:
        nbytes = planes_bytes(rows, cols)
        in_arena = self._arena is not None and self._arena.fits(nbytes)
        if not in_arena:
            _admit(self.ctx, what, nbytes)
        w, aux0, aux1 = repack_on_card(self.ctx, self.fx, srcs, src_rows, rows, cols, self._arena)
        m = DevMat(KIND_Q4TP, rows, cols, w, aux0, aux1, 0 if in_arena else nbytes)
        self.ctx.resident += m.held
        return m

    def hmat(self, key, payload, rows: int, cols: int) -> DevMat:
        """The q4tp matrix `payload` (rows x cols) repacked on the card, cached under `key`
        (`hmat`); Declined when it does not fit the budget."""
        m = self.mats.get(key)
        if m is not None and (m.rows, m.cols) == (rows, cols):
            return m
        m = self._put([payload], rows, rows, cols, f"matrix {key!r} ({rows}x{cols})")
        self.mats[key] = m
        return m

    def hmat_pair(self, key, gate, up, inter: int, cols: int) -> DevMat:
        """A dense FFN's gate and up (each inter x cols q4tp) as one repacked matrix of 2 inter
        rows, its 16-row tiles 8 gate rows then the same 8 up rows, cached under `key`
        (`hmat_pair`): the kernel's epilogue makes silu(gate) * up."""
        if inter % 8 or cols % 32:
            raise CortiqError(f"a gate/up pair of q4tp matrices with rows a multiple of 8, "
                              f"got {inter}x{cols}")
        m = self.pairs.get(key)
        if m is not None:
            return m
        m = self._put([gate, up], inter, 2 * inter, cols, f"pair {key!r} (2x{inter}x{cols})")
        self.pairs[key] = m
        return m

    def close(self) -> None:
        """Free every matrix and arena and give their bytes back to `ctx.resident`."""
        for m in [*self.mats.values(), *self.pairs.values()]:
            self.ctx.resident -= m.held
            m.close()
        self.mats.clear()
        self.pairs.clear()
        for a in self.arenas:
            self.ctx.resident -= a.capacity
            a.close()
        self.arenas.clear()
