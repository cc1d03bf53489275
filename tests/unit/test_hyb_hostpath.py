"""The decode step's host path on a fake card: 50 consecutive tokens compute no stack signature,
build no plan, record no graph and run no per-layer admission pass after the first; the caches
give way when a descriptor, the final norm's content, a mirror's room or the sequence changes."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import _fakecard
from cortiq_drv.hybrid import admit as admit_mod
from cortiq_drv.hybrid import api, plan as plan_mod, spec
from cortiq_drv.hybrid.launch import rope_rows
from cortiq_drv.hybrid.state import ARGMAX_BLOCKS


@pytest.fixture
def counted(monkeypatch):
    """Calls of the expensive host operations: hsig, build, the per-layer admission passes."""
    n = {"hsig": 0, "build": 0, "gdn": 0, "mirror": 0}

    def wrap(mod, name, key):
        real = getattr(mod, name)

        def f(*a, **k):
            n[key] += 1
            return real(*a, **k)

        monkeypatch.setattr(mod, name, f)

    wrap(plan_mod, "hsig", "hsig")
    wrap(plan_mod, "build", "build")
    wrap(admit_mod, "_gdn", "gdn")
    wrap(admit_mod, "_mirror", "mirror")
    return n


def _step(hs, cmf, g, pos, layers=None, final_norm=None, kv_id=1):
    h = np.full(g.hidden, 0.5, np.float32)
    logits = np.zeros(g.lm_rows, np.float32)
    out = api.token(hs, cmf, kv_id, layers or g.layers, g.invf, h, position=pos, lm_head=(g.lm, g.lm_rows),
                    final_norm=g.final_norm if final_norm is None else final_norm, logits=logits,
                    hidden_too=True, nh=g.nh, nkv=g.nkv, hd=g.hd, attn_scale=g.scale, rd=g.rd, hidden=g.hidden,
                    cap=4096, gemma=g.gemma, eps=g.eps)
    assert out.ok, out.reason
    return h, logits


def test_fifty_tokens_without_expensive_host_work(hyb_tiny, counted):
    cmf, g = hyb_tiny
    hs, ctx, card = _fakecard.fake_state()
    _step(hs, cmf, g, 0)
    first = dict(counted)
    assert first == {"hsig": 1, "build": 1, "gdn": 3, "mirror": 1}
    p = next(iter(hs.plans.values()))
    c = hs.counters
    rec0, syncs0 = c.graph_rec, ctx.syncs
    for pos in range(1, 51):
        h, logits = _step(hs, cmf, g, pos, final_norm=g.final_norm.copy())
    assert counted == first
    assert next(iter(hs.plans.values())) is p and c.graph_rec == rec0 == 1 and card.captures == 1
    assert c.graph_run == 51
    # one sync a token (the logits and the row back), nothing else waits on the card
    assert ctx.syncs - syncs0 == 50
    # the cursors moved as the full pass moves them
    assert all(gs.next_pos == 51 and gs.tape is None for gs in hs.gdn.values())
    assert [m.stored for m in hs.kv.values()] == [51]
    # the last token's row, RoPE row and records wait in the host twin; each step's graph starts by
    # bringing them onto the card and ends by taking the row back, with no copy call
    io = p.rows.io
    assert (io.h_h[0] == 0.5).all() and io.ci_h[:8].tolist() == [50, 50, 64, 4096, 64, 0, 0, 0]
    assert io.tab_h[0].tobytes() == rope_rows(p.invf, (50,)).tobytes()
    # (the fake card runs hy_copy16): the call record and the rows on the card
    assert p.ci.read(np.int32, 8).tolist() == [50, 50, 64, 4096, 64, 0, 0, 0]
    assert p.rows.tab.read(np.float32, 2 * p.half).tobytes() == io.tab_h[0].tobytes()
    assert (p.rows.h.read(np.float32, g.hidden) == 0.5).all()
    graph = next(iter(hs.graphs.values())).graph.nodes
    first, last = ([_i(x) for x in n.args] for n in (graph[0], graph[-1]))
    assert graph[0].name == graph[-1].name == "hy_copy16"
    assert first == [io.host.ptr, io.dev.ptr, io.row_end(1) // 16]
    assert last == [io.dev.ptr + io.h_off, io.host.ptr + io.h_off, g.hidden // 4]
    # the row and logits came back into the caller's arrays (the fake card runs no kernels)
    assert (h == 0.5).all() and logits.dtype == np.float32


def test_caches_give_way(hyb_tiny, counted):
    cmf, g = hyb_tiny
    hs, _, card = _fakecard.fake_state()
    _step(hs, cmf, g, 0)
    _step(hs, cmf, g, 1)
    assert (counted["hsig"], counted["gdn"]) == (1, 3)
    # a fresh descriptor object with the same content: the signature is computed, the plan kept
    layers = [replace(g.layers[0]), *g.layers[1:]]
    _step(hs, cmf, g, 2, layers=layers)
    assert (counted["hsig"], counted["build"], counted["gdn"]) == (2, 1, 6)
    # the final norm's content moved: a new plan, its graph recorded
    moved = g.final_norm.copy()
    moved[0] += 1
    _step(hs, cmf, g, 3, layers=layers, final_norm=moved)
    assert counted["build"] == 2 and card.captures == 2
    # a state moved behind the cache (a rewind the full pass refuses): Failed, not a stale replay
    gs = hs.gdn[(1, 0)]
    gs.next_pos = 1
    h = np.ones(g.hidden, np.float32)
    out = api.token(hs, cmf, 1, layers, g.invf, h, position=4, lm_head=(g.lm, g.lm_rows), final_norm=moved,
                    logits=np.zeros(g.lm_rows, np.float32), nh=g.nh, nkv=g.nkv, hd=g.hd, attn_scale=g.scale,
                    rd=g.rd, hidden=g.hidden, cap=4096, gemma=g.gemma, eps=g.eps)
    assert out.status == "failed" and "at row 1" in out.reason
    # a reset sequence starts again with a full pass
    spec.reset(hs, 1)
    assert not hs.held
    before = counted["gdn"]
    _step(hs, cmf, g, 0, layers=layers, final_norm=moved)
    assert counted["gdn"] == before + 3


def test_mirror_growth_rerecords_through_the_full_pass(hyb_tiny, counted):
    cmf, g = hyb_tiny
    hs, _, _ = _fakecard.fake_state()
    _step(hs, cmf, g, 0)
    m = hs.kv[(1, 3)]
    cap = m.cap
    for pos in range(1, cap + 1):
        _step(hs, cmf, g, pos)
    # the step past the room: one full mirror pass grows it, the graph is recorded again
    assert m.cap > cap and counted["mirror"] == 2 and hs.counters.graph_rec == 2


def _pick_step(hs, cmf, g, pos, rows, logits=None):
    h = np.full(g.hidden, 0.25, np.float32)
    pick = np.full(1, -1, np.int32)
    out = api.token(hs, cmf, 1, g.layers, g.invf, h, position=pos, lm_head=(g.lm, rows), final_norm=g.final_norm,
                    logits=logits, pick=pick, hidden_too=True, nh=g.nh, nkv=g.nkv, hd=g.hd, attn_scale=g.scale,
                    rd=g.rd, hidden=g.hidden, cap=4096, gemma=g.gemma, eps=g.eps)
    assert out.ok, out.reason
    return h, pick


def _i(b: bytes) -> int:
    return int.from_bytes(b, "little", signed=True)


def test_greedy_pick_on_the_card(hyb_tiny):
    """A greedy step: hy_argmax over the sampleable rows inside the recorded graph, its id straight
    into the plan's pinned host twin, the residual row back by the graph's last kernel: no copy
    call at all."""
    cmf, g = hyb_tiny
    hs, ctx, card = _fakecard.fake_state()
    rows = g.lm_rows - 7  # sampleable ids: the padding rows past them are never searched
    _step(hs, cmf, g, 0)
    caps, rec = card.captures, hs.counters.graph_rec
    # the head's row count moved: the plan is built again, its picking graph recorded
    _pick_step(hs, cmf, g, 1, rows)
    p = next(iter(hs.plans.values()))
    io = p.rows.io
    # the fake card runs no kernels: the id the host twin holds is what comes back
    io.pick_h[0] = rows - 1
    ctx.launches.clear()
    ctx.host_copies.clear()
    for pos in range(2, 22):
        h, pick = _pick_step(hs, cmf, g, pos, rows)
        assert pick[0] == rows - 1 and (h == 0.25).all()
    assert ctx.host_copies == []
    # one graph for the picking head (the first step's head graph had none), replayed since
    assert card.captures == caps + 1 and hs.counters.graph_rec == rec + 1
    argmax = [l for l in ctx.launches if l.name == "hy_argmax"]
    assert len(argmax) == 20 and argmax[0].grid == (ARGMAX_BLOCKS, 1)
    a = [_i(x) for x in argmax[0].args]
    assert a == [p.rows.logits.ptr, rows, rows, io.host.ptr + io.pick_off, 0, io.apart.ptr, io.acnt.ptr]
    # the argmax follows the head's matvec, the row's copy back closes each step's graph
    step = len(ctx.launches) // 20
    assert all(ctx.launches[k * step + step - 2].name == "hy_argmax" for k in range(20))
    assert all(ctx.launches[k * step + step - 1].name == "hy_copy16" for k in range(20))


def test_pick_with_logits_and_declines(hyb_tiny):
    cmf, g = hyb_tiny
    hs, ctx, card = _fakecard.fake_state()
    # a pick with a logits row asked too: both come back
    logits = np.full(g.lm_rows, np.nan, np.float32)
    _pick_step(hs, cmf, g, 0, g.lm_rows, logits)
    assert not np.isnan(logits).any()
    kw = dict(nh=g.nh, nkv=g.nkv, hd=g.hd, attn_scale=g.scale, rd=g.rd, hidden=g.hidden, cap=4096,
              gemma=g.gemma, eps=g.eps)
    h = np.ones(g.hidden, np.float32)
    for lm, pick in (((g.lm, g.lm_rows), np.zeros(1, np.int64)), (None, np.zeros(1, np.int32))):
        out = api.token(hs, cmf, 1, g.layers, g.invf, h, position=1, lm_head=lm, final_norm=g.final_norm,
                        pick=pick, **kw)
        assert out.status == "declined" and "pick" in out.reason
    # neither a logits row nor a pick: declined as before
    out = api.token(hs, cmf, 1, g.layers, g.invf, h, position=1, lm_head=(g.lm, g.lm_rows),
                    final_norm=g.final_norm, **kw)
    assert out.status == "declined" and "logits" in out.reason


def test_token_rope_row_is_the_positions_own():
    """`token` takes its RoPE row from the plan's block of positions: the bytes `rope_rows` gives
    that position alone (and a window's rows), across block edges and far positions."""
    from types import SimpleNamespace

    invf = (1.0 / 1e7 ** (np.arange(0, 64, 2, dtype=np.float32) / 64)).astype(np.float32)
    plan = SimpleNamespace(invf=invf, rope=None)
    for pos in [0, 1, 255, 256, 257, 511, 3, 70000, 262143, 262144, 1 << 20]:
        row = api._rope_row(plan, pos)
        assert row.tobytes() == rope_rows(invf, (pos,)).tobytes(), pos
        assert row.tobytes() == rope_rows(invf, range(pos, pos + 5))[0].tobytes(), pos
        assert plan.rope[0] <= pos < plan.rope[0] + api.ROPE_BLOCK


def test_greedy_verify_window_picks_in_the_graph(hyb_tiny):
    """A greedy verify window stages as a token does: its rows, RoPE rows and records in the
    plan's pinned host twin, brought onto the card by the graph's first kernel (hy_copy16 of
    row_end(n)), each row's argmax straight into the twin, the rows back by the graph's last
    kernel: no copy call at all. A deferred batch still uploads its rows and waits for nothing."""
    from cortiq_drv.graph import SpecTail

    cmf, g = hyb_tiny
    hs, ctx, card = _fakecard.fake_state()
    _step(hs, cmf, g, 0)
    n = 4
    kw = dict(nh=g.nh, nkv=g.nkv, hd=g.hd, rd=g.rd, hidden=g.hidden, cap=4096, gemma=g.gemma, eps=g.eps,
              attn_scale=g.scale)
    rows = np.arange(n * g.hidden, dtype=np.float32).reshape(n, g.hidden) / 7
    p = next(iter(hs.plans.values()))
    io = p.rows.io
    io.pick_h[:n] = [5, 6, 7, 8]
    ctx.launches.clear()
    ctx.host_copies.clear()
    syncs = ctx.syncs
    h, ids = rows.copy(), np.full(n, -1, np.int32)
    out = api.batch(hs, cmf, 1, 0, g.layers, g.invf, h, positions=range(1, 1 + n),
                    spec=SpecTail(g.lm, g.lm_rows, g.final_norm), argmax_out=ids, **kw)
    assert out.ok, out.reason
    assert ctx.host_copies == [] and ctx.syncs == syncs + 1
    # the fake card runs no kernels: the ids and rows the twin holds are what come back
    assert ids.tolist() == [5, 6, 7, 8] and h.tobytes() == rows.tobytes()
    assert io.h_h[:n].tobytes() == rows.tobytes()
    assert io.tab_h[:n].tobytes() == rope_rows(p.invf, range(1, 1 + n)).tobytes()
    assert (p.rows.h.read(np.float32, n * g.hidden) == rows.reshape(-1)).all()
    first, last = ctx.launches[0], ctx.launches[-1]
    assert first.name == last.name == "hy_copy16"
    assert [_i(x) for x in first.args] == [io.host.ptr, io.dev.ptr, io.row_end(n) // 16]
    assert [_i(x) for x in last.args] == [io.dev.ptr + io.h_off, io.host.ptr + io.h_off, n * g.hidden // 4]
    argmax = [l for l in ctx.launches if l.name == "hy_argmax"]
    assert len(argmax) == 1 and argmax[0].grid == (ARGMAX_BLOCKS, n)
    assert _i(argmax[0].args[3]) == io.host.ptr + io.pick_off
    # recorded once with the copies and the argmax inside, replayed for the next window
    caps = card.captures
    out = api.batch(hs, cmf, 1, 0, g.layers, g.invf, rows.copy(), positions=range(1 + n, 1 + 2 * n),
                    spec=SpecTail(g.lm, g.lm_rows, g.final_norm), argmax_out=ids, **kw)
    assert out.ok and card.captures == caps and ctx.host_copies == []
    nodes = hs.graphs[max(hs.graphs, key=lambda k: k[3])].graph.nodes
    assert [x.name for x in nodes[-2:]] == ["hy_argmax", "hy_copy16"] and nodes[0].name == "hy_copy16"
    # a deferred batch (no head) queues its rows' uploads and brings nothing back
    ctx.host_copies.clear()
    ctx.launches.clear()
    h2 = np.ones((2, g.hidden), np.float32)
    assert api.batch(hs, cmf, 1, 0, g.layers, g.invf, h2, positions=range(1 + 2 * n, 3 + 2 * n), defer=True,
                     **kw).ok
    assert "up" in [d for d, _ in ctx.host_copies] and "down" not in [d for d, _ in ctx.host_copies]
    assert "hy_copy16" not in [l.name for l in ctx.launches]
