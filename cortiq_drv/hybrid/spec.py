"""Stepping a sequence's state on the card back and reading it (ports cuda_hybrid.rs
`spec_restore`, `gdn_snapshot`, `gdn_snapshot_restore`, `gdn_state_read`, `state_resident`,
`reset`).

Attention layers need nothing here: their mirrors rewind themselves when the next call starts at
an earlier row (`admit`). GDN layers go back to a verify window's start and replay its accepted
rows from the tape (`spec_restore`), or to a snapshot taken at a prompt position.
"""

from __future__ import annotations

import sys

import numpy as np

from cortiq_drv.cu.args import kargs
from cortiq_drv.errors import CortiqError


def _keys(hs, kv_id: int) -> list:
    return sorted(k for k in hs.gdn if k[0] == kv_id)


def _restore_table(hs, kv_id: int, live: list):
    """The layers' state pointers, 7 a layer (`hy_gdn_restore_*`'s table), made again when the
    layers change."""
    held = hs.rtabs.get(kv_id)
    if held is not None and held[1] == live:
        return held[0]
    t = np.array([b.ptr for k in live for b in _restore_row(hs.gdn[k])], dtype=np.uint64)
    if held is not None:
        hs.ctx.sync()
        held[0].close()
    buf = hs.card.upload(t)
    hs.rtabs[kv_id] = (buf, list(live))
    return buf


def _restore_row(gs) -> tuple:
    return (gs.s_save, gs.s, gs.t_cq, gs.t_gb, gs.ring_save, gs.ring, gs.t_qkv)


def _restore(hs, kv_id: int, slot: int, base_pos: int) -> int:
    keys = _keys(hs, kv_id)
    if not hs.funcs:
        return 0
    fx = next(iter(hs.funcs.values()))
    # every layer with this window's tape, of one geometry
    live, dims = [], None
    for k in keys:
        gs = hs.gdn[k]
        if gs.tape is None or gs.tape[0] != base_pos or slot >= gs.tape[1]:
            continue
        if dims is not None and dims != (gs.dims, gs.t_stride):
            raise CortiqError("GDN layers of different geometry in one restore")
        dims = (gs.dims, gs.t_stride)
        live.append(k)
    if not live:
        return 0
    (nv, nk, dk, dv, kk), tstride = dims
    cdim = 2 * nk * dk + nv * dv
    keep, nl = slot + 1, len(live)
    tab = _restore_table(hs, kv_id, live)
    if dk == 128 and dv % 32 == 0:
        hs.ctx.launch_3d(fx.rs_scan4, (nv * dv // 32, nl, 1), 128, 0,
                         kargs("Qiiiii", tab, keep, cdim, nv, nk, dv))
    else:
        hs.ctx.launch_3d(fx.rs_scan, (-(-nv * dv // 8), nl, 1), 256, 0,
                         kargs("Qiiiiii", tab, keep, cdim, nv, nk, dk, dv))
    if kk > 1:
        hs.ctx.launch_3d(fx.rs_ring, (-(-cdim // 256), nl, 1), 256, 0,
                         kargs("Qiiii", tab, keep, tstride, cdim, kk))
    for k in live:
        gs = hs.gdn[k]
        gs.next_pos, gs.tape = base_pos + keep, None
    return nl


def spec_restore(hs, kv_id: int, slot: int, base_pos: int, expected: int) -> bool:
    """After a verify window from `base_pos` accepted rows 0..slot: every GDN layer of the
    sequence back to the window's start with the accepted rows replayed. True when `expected`
    layers were restored."""
    with hs.lock:
        try:
            return _restore(hs, kv_id, slot, base_pos) == expected
        except CortiqError as e:
            print(f"cuda GDN restore failed: {e}", file=sys.stderr)
            return False


def gdn_snapshot(hs, kv_id: int, pos: int) -> bool:
    """Copy every GDN state of the sequence, all at position `pos`, to its snapshot (a device
    copy on the stream). False when a layer is elsewhere or none is resident."""
    with hs.lock:
        keys = _keys(hs, kv_id)
        if not keys or any(hs.gdn[k].next_pos != pos for k in keys):
            return False
        try:
            for k in keys:
                gs = hs.gdn[k]
                if gs.snap is None:
                    snap_s, snap_r = hs.card.new(gs.s.bytes), hs.card.new(gs.ring.bytes)
                    hs.ctx.kv_bytes += snap_s.bytes + snap_r.bytes
                else:
                    _, snap_s, snap_r = gs.snap
                snap_s.copy_from(gs.s)
                snap_r.copy_from(gs.ring)
                gs.snap = (pos, snap_s, snap_r)
        except CortiqError as e:
            print(f"cuda GDN snapshot failed: {e}", file=sys.stderr)
            return False
        return True


def gdn_snapshot_restore(hs, kv_id: int, pos: int) -> bool:
    """Every GDN state of the sequence back to its snapshot at `pos`. False (nothing changed)
    unless every layer holds a snapshot at `pos`."""
    with hs.lock:
        keys = _keys(hs, kv_id)
        if not keys or any(hs.gdn[k].snap is None or hs.gdn[k].snap[0] != pos for k in keys):
            return False
        try:
            for k in keys:
                gs = hs.gdn[k]
                gs.s.copy_from(gs.snap[1])
                gs.ring.copy_from(gs.snap[2])
                gs.next_pos, gs.tape = pos, None
        except CortiqError as e:
            print(f"cuda GDN snapshot restore failed: {e}", file=sys.stderr)
            return False
        return True


def state_resident(hs, kv_id: int, layer: int) -> bool:
    """A recurrent state of this sequence and layer lives on the card."""
    return (kv_id, layer) in hs.gdn


def gdn_state_read(hs, kv_id: int, layer: int) -> np.ndarray | None:
    """A GDN layer's state back to the host, `[ring | S]` as the host keeps it (synchronises)."""
    with hs.lock:
        gs = hs.gdn.get((kv_id, layer))
        if gs is None:
            return None
        out = np.empty(gs.ring_n + gs.s_n, dtype=np.float32)
        if gs.ring_n:
            gs.ring.download_async(out[:gs.ring_n])
        gs.s.download_async(out[gs.ring_n:])
        hs.ctx.sync()
        return out


def rewind(hs, kv_id: int, hint: int = 0) -> None:
    """A new sequence on `kv_id` in place of the old one: every K/V mirror back to no rows, every
    GDN state zeroed at row 0 (its window tape and snapshot gone), as fresh ones would be. The
    allocations, the restore table and the graphs recorded over them stay with their pointers,
    so the next generation replays those graphs instead of recording them again (`reset` frees
    it all). A mirror with room for fewer than `hint` rows (the new sequence's expected length)
    is reallocated now, empty, as a fresh one would be sized, rather than grown mid-decode."""
    with hs.lock:
        states = [gs for k, gs in hs.gdn.items() if k[0] == kv_id]
        # one wait for the stream's copies into any snapshot, not one a layer
        if any(gs.snap is not None for gs in states):
            hs.ctx.sync()
        for gs in states:
            gs.fresh(hs, synced=True)
        for k, m in hs.kv.items():
            if k[0] == kv_id:
                m.stored = 0
                if m.cap < hint:
                    m.reserve(hs, hint, hint)
        hs.admitted = None


def reset(hs, kv_id: int) -> None:
    """Drop a sequence's state on the card: GDN states, K/V mirrors, restore table and the
    graphs recorded over them."""
    with hs.lock:
        hs.ctx.sync()
        held = hs.rtabs.pop(kv_id, None)
        if held is not None:
            held[0].close()
        for k in [k for k in hs.gdn if k[0] == kv_id]:
            gs = hs.gdn.pop(k)
            hs.ctx.kv_bytes -= gs.counted
            gs.close(hs, synced=True)
        for k in [k for k in hs.kv if k[0] == kv_id]:
            m = hs.kv.pop(k)
            hs.ctx.kv_bytes -= m.bytes
            m.close(hs)
        hs.drop_graphs(lambda k: k[1] == kv_id)
        for k in [k for k in hs.held if k[1] == kv_id]:
            del hs.held[k]
        hs.admitted = None
