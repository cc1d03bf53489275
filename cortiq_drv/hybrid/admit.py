"""Bringing every layer's state on the card to a call's first position before anything launches
(ports cuda_hybrid.rs `sync_half` and `admit`, without the far field).

K/V mirrors (f16): rewound when the call starts before their end (rows of another continuation),
filled from the host arm's rows where the card lacks them, zero rows where neither has them (a
gap a draft block never saw). GDN states: the seven buffers of a layer in one allocation, fresh
at position 0, seeded from the host's state after a host prefill; a state the card holds at
another row is a hard refusal (the card moved it and the host has no copy to go back to).
"""

from __future__ import annotations

from operator import attrgetter, is_

import numpy as np

from cortiq_drv.errors import CortiqError
from cortiq_drv.graph import GraphAttn
from cortiq_drv.hybrid.plan import GdnL
from cortiq_drv.cmf.layout import round_up
from cortiq_drv.hybrid.state import NMAX, GdnState, KvMirror


def sync_half(hs, m: KvMirror, cpu_k, cpu_v, cpu_base: int, nkv: int, hd: int, upto: int) -> bool:
    """The mirror at `upto` rows: rewound past rows of another continuation, or given the host's
    rows it lacks (as f16). False: the host does not hold them either."""
    if m.stored > upto:
        m.stored = upto
    if m.stored == upto:
        return True
    lo, n = m.stored, upto - m.stored
    have = len(cpu_k[0]) // hd if len(cpu_k) else 0
    if len(cpu_k) != nkv or len(cpu_v) != nkv or lo < cpu_base or upto > cpu_base + have:
        return False
    m.reserve(hs, n, 0)
    a, b = (lo - cpu_base) * hd, (upto - cpu_base) * hd
    # [n][nkv][hd] f16, the mirror's row layout; numpy's float16 rounds to nearest even
    kb = np.stack([np.asarray(cpu_k[g][a:b]).reshape(n, hd) for g in range(nkv)], axis=1).astype(np.float16)
    vb = np.stack([np.asarray(cpu_v[g][a:b]).reshape(n, hd) for g in range(nkv)], axis=1).astype(np.float16)
    m.k.upload_async(kb, lo * m.row * 2)
    m.v.upload_async(vb, lo * m.row * 2)
    # the host arrays go when this returns
    hs.ctx.sync()
    m.stored = upto
    return True


def _mirror(hs, plan, l, key, pos0: int, n: int, hint: int) -> None:
    row = plan.nkv * plan.hd
    m = hs.kv.get(key)
    if m is None or m.row != row:
        if m is not None:
            hs.ctx.kv_bytes -= m.bytes
            m.close(hs)
        m = hs.kv[key] = KvMirror(row)
    a = l.attn
    if sync_half(hs, m, a.cpu_k, a.cpu_v, a.cpu_base, plan.nkv, plan.hd, pos0):
        m.reserve(hs, n, hint)
        return
    # rows neither on the card nor on the host (the plain tokens of a speculation trial a draft
    # block never saw): zero rows, which the attention sees as keys of score 0
    gap = pos0 - m.stored
    m.reserve(hs, gap + n, hint)
    m.k.view(m.stored * row * 2, gap * row * 2).memset(0)
    m.v.view(m.stored * row * 2, gap * row * 2).memset(0)
    if hs.debug:
        hs.log(f"layer {key[1]} of sequence {key[0]}: {gap} K/V rows to {pos0} filled with zeros")
    m.stored = pos0


def _new_gdn(hs, plan, g: GdnL, cpu_state, pos0: int) -> GdnState:
    """A layer's state: seven views of one zeroed allocation (the card rounds each allocation
    up, and five of the seven are small), seeded from the host's `[ring | S]` past position 0."""
    s_n, ring_n = g.nv * g.dk * g.dv, (g.kk - 1) * g.cdim
    counts = [s_n, ring_n, NMAX * plan.geom.cdmax, NMAX * g.cdim, NMAX * 2 * g.nv, s_n, ring_n]
    sizes = [round_up(max(c, 1) * 4, 256) for c in counts]
    all_ = hs.card.new(sum(sizes))
    all_.memset(0)
    offs = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    v = [all_.view(int(o), s) for o, s in zip(offs, sizes)]
    gs = GdnState((g.nv, g.nk, g.dk, g.dv, g.kk), all_, *v, t_stride=plan.geom.cdmax, next_pos=pos0)
    if pos0 > 0:
        st = np.ascontiguousarray(cpu_state, dtype=np.float32)
        if ring_n:
            gs.ring.upload_async(st[:ring_n])
        gs.s.upload_async(st[ring_n:])
    hs.ctx.kv_bytes += gs.counted
    return gs


def _gdn(hs, plan, g: GdnL, l, key, li: int, pos0: int):
    """None, or (hard, reason) when the layer's state cannot be brought to pos0."""
    dims = (g.nv, g.nk, g.dk, g.dv, g.kk)
    gs = hs.gdn.get(key)
    if gs is not None:
        if gs.dims == dims and gs.next_pos == pos0:
            return None
        if gs.dims == dims and pos0 == 0:
            # a new sequence on the same id: no history (as spec.rewind makes it)
            gs.fresh(hs)
            return None
        return True, f"GDN state of layer {li} is at row {gs.next_pos}, the call at {pos0}"
    ring_n, s_n = (g.kk - 1) * g.cdim, g.nv * g.dk * g.dv
    if pos0 > 0 and len(l.attn.cpu_state) != ring_n + s_n:
        return False, "GDN host seed missing for a nonzero position"
    hs.gdn[key] = _new_gdn(hs, plan, g, l.attn.cpu_state, pos0)
    return None


_NEXT_POS, _STORED, _CAP = attrgetter("next_pos"), attrgetter("stored"), attrgetter("cap")


def _still_held(hs, held, layers, pos0: int, n: int) -> bool:
    """`admit`'s cheap path: the descriptors and every layer's state object are the ones the last
    full admission of this (plan, sequence, first layer) resolved, each already at pos0 with room
    for n rows, so the full pass would change nothing (the loops run in C: map, set, min)."""
    descs, gkeys, gdn, kkeys, kv = held[:5]
    # (a caller passing its stack's own tuple again, as decode steps do, is held as it is)
    if descs is not layers and (len(descs) != len(layers) or not all(map(is_, descs, layers))):
        return False
    if not all(map(is_, map(hs.gdn.get, gkeys), gdn)) or not set(map(_NEXT_POS, gdn)) <= {pos0}:
        return False
    if not all(map(is_, map(hs.kv.get, kkeys), kv)) or not set(map(_STORED, kv)) <= {pos0}:
        return False
    return min(map(_CAP, kv), default=pos0 + n) >= pos0 + n


def _hold(hs, plan, layers, kv_id: int, layer_base: int) -> tuple:
    """What a full admission resolved: (descriptors, GDN keys, their GdnStates, attention keys,
    their KvMirrors, every layer's buffers in `book`'s order, their pointers). A state's buffers
    never move while it is held (a grown mirror fails `_still_held` first: the grown room is set
    up by a full pass)."""
    gkeys, gdn, kkeys, kv, views = [], [], [], [], []
    for li, pl in enumerate(plan.layers):
        k = (kv_id, layer_base + li)
        if isinstance(pl.mix, GdnL):
            gkeys.append(k)
            gdn.append(hs.gdn[k])
            views.append(gdn[-1].views())
        else:
            kkeys.append(k)
            kv.append(hs.kv[k])
            views.append((kv[-1].k, kv[-1].v))
    return (tuple(layers), tuple(gkeys), tuple(gdn), tuple(kkeys), tuple(kv), views,
            tuple(b.ptr for bufs in views for b in bufs))


def admit(hs, plan, layers, kv_id: int, layer_base: int, pos0: int, n: int, hint: int):
    """Every layer's state at `pos0` with room for `n` rows: None, or (hard, reason). hard: the
    card holds state this call cannot use (a Failed outcome); otherwise nothing the caller relies
    on moved (Declined). A decode step whose states are where the last call left them skips the
    per-layer pass; either way `hs.admitted` tells `book` which states this call resolved."""
    hkey = (plan.id, kv_id, layer_base)
    held = hs.held.get(hkey)
    if held is not None and _still_held(hs, held, layers, pos0, n):
        hs.admitted = (hkey, pos0, n, held)
        return None
    hs.admitted = None
    try:
        for li, (pl, l) in enumerate(zip(plan.layers, layers)):
            key = (kv_id, layer_base + li)
            if isinstance(pl.mix, GdnL) and isinstance(l.attn, GraphAttn.Gdn):
                bad = _gdn(hs, plan, pl.mix, l, key, li, pos0)
                if bad is not None:
                    return bad
            elif not isinstance(pl.mix, GdnL) and isinstance(l.attn, GraphAttn.Full):
                _mirror(hs, plan, l, key, pos0, n, hint)
            else:
                return False, f"layer {li}: descriptors changed under the plan"
    except CortiqError as e:
        return False, str(e)
    # plan_for keys a plan by its layer count, so `layers` is exactly the plan's stack here
    hs.held[hkey] = held = _hold(hs, plan, layers, kv_id, layer_base)
    hs.admitted = (hkey, pos0, n, held)
    return None
