"""One small-path call's launch inputs (ports cuda_hybrid.rs `Book`, `attn_rb`, `ATTN_NBLK`,
`book`, without the far field).

`book` lays out, for a call of n rows at pos0, every layer's state pointers and every attention
layer's call record, sizes the attention scratch, and moves the host-side cursors (mirror rows,
GDN positions and tapes) past the call: it runs before the launches are queued or replayed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cortiq_drv.errors import CortiqError
from cortiq_drv.cmf.layout import round_up
from cortiq_drv.hybrid.state import NMAX

# Key blocks the attention grid covers: every count `attn_rb` allows (keys / rb <= 128).
ATTN_NBLK = 129
# Blocks an SM a call's attention grid holds at least (`attn_grid`).
ATTN_FILL = 4
# Key blocks of the scratch each block of a one-row attention grid walks (`attn_grid`).
ATTN_WALK = 2
# The attention scratch grows by this many keys a head at a time.
KEY_STEP = 4096


def attn_rb(keys: int) -> int:
    """Keys a block of the decode attention takes for `keys` keys: 64 up to 8192 keys, so a
    window's rows split their keys as their one-row steps do there."""
    return 64 * max(-(-keys // 8192), 1)


def attn_grid(nkv: int, n: int, sms: int, nbc: int) -> int:
    """Blocks along the keys of a call's hy_scores / hy_values grid (nkv, n the others; the kernels
    walk key blocks x, x + grid, ...: any grid gives the same sums): a block for every ATTN_WALK
    of the `nbc` key blocks the attention scratch holds (every record a graph over that scratch
    replays has no more), at most ATTN_NBLK, and no more than ATTN_FILL blocks an SM of the card's
    `sms`, fewer from there, so a window's rows do not multiply the blocks past their keys (each
    of which the card starts and retires). H200, 9B shape, device ms (`bench_decode --source mem
    --skip-matvec --tokens 16`, session 16): with ATTN_FILL alone (one run each) the best one-row
    grid followed the scratch, 33 of 33 / 66 / 129 blocks at 512 keys (64 key blocks: 2.2214 /
    2.2374 / 2.2481), 66 at 8000 keys (128 blocks: 2.5169 / 2.4144 / 2.4413), while the 8-row
    window there wants ATTN_FILL 4 (5.313 / 4.831 / 4.689 at 5 / 9 / 17 blocks); this rule against
    a one-row grid of ATTN_NBLK (two runs each): 2.2241 / 2.2251 against 2.2439 / 2.2421 at 512
    keys, 2.4275 / 2.4240 against 2.4535 / 2.4505 at 8000. At 512 keys, windows against a grid of
    ATTN_NBLK (`--breakdown`, session 15), us for the 8 layers: 8-row scores 87.7 / values 64.5
    against 176.1 / 213.8, 16-row 138.7 / 127.7 against 341.3 / 416.9."""
    return max(1, min(ATTN_NBLK, -(-nbc // ATTN_WALK), -(-ATTN_FILL * sms // (nkv * n))))


@dataclass
class Book:
    """Per layer: the GDN state's seven buffers (`GdnState.views`) or the mirror's (K, V).
    `ci`: the attention layers' call records, 8 int32 words each: n0 (mirror rows before the
    call), the mirror row of the call's first row, rb, ncap, nbcap, then three far-field words
    (0 here). `scratch`: the attention scratch (S, Mx, P, E)."""

    layers: list
    ci: np.ndarray
    scratch: tuple
    # the layers' part of `sig`, as `admit` held it (the held states' buffers stay put)
    lsig: tuple

    def sig(self) -> tuple:
        """The pointers a graph recorded over this call holds (`run_small`'s signature)."""
        return self.lsig + tuple(b.ptr for b in self.scratch)


def record(n0: int, n: int) -> list:
    """The call record of an attention layer holding n0 rows for a call of n rows."""
    keys = n0 + n
    rb = attn_rb(keys)
    ncap = round_up(keys, KEY_STEP)
    return [n0, n0, rb, ncap, -(-ncap // rb), 0, 0, 0]


def records(stored: list, n: int) -> tuple:
    """The call records of attention layers holding `stored` rows each, for a call of n rows, as
    one int32 array (8 words a layer, in layer order), and the largest key count and key-block
    count among them (0, 0 without layers). The layers of a stack hold the same rows (one record,
    repeated: the path a decode step takes); otherwise one record per distinct row count."""
    if not stored:
        return np.zeros(0, dtype=np.int32), 0, 0
    recs = {s: record(s, n) for s in set(stored)}
    if len(recs) == 1:
        ci = np.full((len(stored), 8), recs[stored[0]], dtype=np.int32).reshape(-1)
    else:
        ci = np.array([recs[s] for s in stored], dtype=np.int32).reshape(-1)
    return ci, max(recs) + n, max(r[4] for r in recs.values())


def scratch_sizes(nh: int, hd: int, keys_max: int, nbcap_max: int, kcap: int | None) -> dict:
    """Bytes of the attention scratch for records up to `keys_max` keys and `nbcap_max` blocks;
    `kcap` (CMF_HYB_KCAP=1: the context cap) sizes the scores for it from the start."""
    kc = max(round_up(max(keys_max, kcap or 0), KEY_STEP), KEY_STEP)
    nbc = min(max(nbcap_max, 1), ATTN_NBLK + 64)
    return {"hy_S": NMAX * nh * kc * 4, "hy_Mx": NMAX * nh * nbc * 4,
            "hy_P": NMAX * nbc * nh * hd * 4, "hy_E": NMAX * nbc * nh * 4}


def scratch_nblk(scratch: tuple, nh: int) -> int:
    """Key blocks the attention scratch (S, Mx, P, E) holds: its Mx as `scratch_sizes` sized it
    (or larger: the scratch only grows)."""
    return scratch[1].bytes // (NMAX * nh * 4)


def _scratch(hs, plan, keys_max: int, nbcap_max: int, kcap: int) -> tuple:
    """The attention scratch for records up to `keys_max` keys and `nbcap_max` blocks, grown on
    demand."""
    sizes = scratch_sizes(plan.nh, plan.hd, keys_max, nbcap_max, kcap if hs.kcap else None)
    return tuple(hs.scr(name, nbytes) for name, nbytes in sizes.items())


def book(hs, plan, kv_id: int, layer_base: int, pos0: int, n: int, tape: bool, kcap: int) -> Book:
    """Lay out a call of `n` rows at `pos0` and move the cursors past it. It takes the states as
    the `admit` just before it resolved and held them (`hs.admitted`: its GdnStates and KvMirrors
    in layer order, every layer's buffers and their pointers); a call it did not admit is an
    error."""
    adm, hs.admitted = hs.admitted, None
    if adm is None or adm[:3] != ((plan.id, kv_id, layer_base), pos0, n):
        raise CortiqError(f"book: a call of {n} rows at {pos0} that admit did not resolve")
    _, _, gdn, _, kv, views, lsig = adm[3]
    end, tp = pos0 + n, ((pos0, n) if tape else None)
    for gs in gdn:
        gs.next_pos = end
        gs.tape = tp
    ci, keys_max, nbcap_max = records([m.stored for m in kv], n)
    for m in kv:
        m.stored += n
    return Book(views, ci, _scratch(hs, plan, keys_max, nbcap_max, kcap), lsig)
