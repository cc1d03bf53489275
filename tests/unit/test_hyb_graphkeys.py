"""Small-path graph keying on a fake card: graphs keyed by (plan, sequence, first layer, rows,
tape, head, taps), replayed while the pointers hold, recorded again when a mirror or the
attention scratch moved; direct launches without graphs; the launch sequence and every launch's
argument list against the kernels' signatures in kernels/*.cuh."""

from __future__ import annotations

import numpy as np

import _fakecard
from cortiq_drv.graph import TokenGraphOutcome
from cortiq_drv.hybrid import api, launch
from cortiq_drv.hybrid.admit import admit
from cortiq_drv.hybrid.graphs import run_small
from cortiq_drv.hybrid.plan import plan_for
from cortiq_drv.hybrid.state import ARGMAX_BLOCKS
from test_pdl import EARLY_LETGO, EARLY_READERS


def _plan(hs, cmf, g, head=True):
    lm = (g.lm, g.lm_rows) if head else None
    return plan_for(hs, cmf, g.layers, 0, lm, g.final_norm, g.nh, g.nkv, g.hd, g.rd, g.hidden, g.gemma, g.eps,
                    g.scale, g.invf, 0)


def _call(hs, p, g, kv_id, pos0, n, tape=False, head=True):
    assert admit(hs, p, g.layers, kv_id, 0, pos0, n, 0) is None
    return run_small(hs, p, kv_id, 0, pos0, n, tape, head, 4096)


def test_replay_while_pointers_hold(hyb_tiny):
    cmf, g = hyb_tiny
    hs, ctx, card = _fakecard.fake_state()
    p = _plan(hs, cmf, g)
    ctx.launches.clear()
    assert _call(hs, p, g, 1, 0, 1) == g.lm_rows
    c = hs.counters
    assert (c.graph_rec, c.graph_run, card.captures) == (1, 1, 1)
    one_step = list(ctx.launches)
    ctx.launches.clear()
    _call(hs, p, g, 1, 1, 1)
    assert (c.graph_rec, c.graph_run) == (1, 2)
    # a replay queues the recorded nodes as they were
    assert ctx.launches == one_step
    # another row count, tape, head or sequence: another graph
    _call(hs, p, g, 1, 2, 4, tape=True)
    _call(hs, p, g, 2, 0, 1)
    assert c.graph_rec == 3 and len(hs.graphs) == 3
    assert {k[1:6] for k in hs.graphs} == {(1, 0, 1, False, True), (1, 0, 4, True, True), (2, 0, 1, False, True)}


def test_rerecorded_when_the_mirror_grows(hyb_tiny):
    cmf, g = hyb_tiny
    hs, _, _ = _fakecard.fake_state()
    p = _plan(hs, cmf, g)
    _call(hs, p, g, 1, 0, 1)
    m = hs.kv[(1, 3)]
    cap, key = m.cap, next(iter(hs.graphs))
    old = hs.graphs[key]
    for pos in range(1, cap + 1):
        _call(hs, p, g, 1, pos, 1)
    assert m.cap > cap and hs.counters.graph_rec == 2 and hs.graphs[key] is not old
    assert old.graph.closed


def test_rerecorded_when_the_scratch_grows(hyb_tiny):
    cmf, g = hyb_tiny
    hs, _, _ = _fakecard.fake_state()
    hs.debug = True
    p = _plan(hs, cmf, g)
    _call(hs, p, g, 1, 0, 1)
    for i in range(3):
        hs.gdn[(1, i)].next_pos = 4096
    m = hs.kv[(1, 3)]
    m.reserve(hs, 4096, 0)
    m.stored = 4096
    _call(hs, p, g, 1, 4096, 1)
    assert hs.counters.graph_rec == 2
    # within the new scratch: replayed
    _call(hs, p, g, 1, 4097, 1)
    assert hs.counters.graph_rec == 2 and hs.counters.graph_run == 3


def test_direct_launches_match_the_recorded_graph(hyb_tiny):
    cmf, g = hyb_tiny
    recorded = {}
    for graphs in (True, False):
        hs, ctx, card = _fakecard.fake_state()
        hs.use_graphs = graphs
        p = _plan(hs, cmf, g)
        ctx.launches.clear()
        _call(hs, p, g, 1, 0, 3, tape=True)
        recorded[graphs] = [(l.name, l.grid, l.block, l.fmt) for l in ctx.launches]
        assert card.captures == int(graphs) and hs.counters.graph_run == int(graphs)
    assert recorded[True] == recorded[False]


def _direct_call(hyb_tiny, n, tape):
    """A fresh fake card's plan and one call of n rows launched directly: (hs, plan, ctx, g),
    the call's launches in ctx.launches."""
    cmf, g = hyb_tiny
    hs, ctx, _ = _fakecard.fake_state()
    hs.use_graphs = False
    p = _plan(hs, cmf, g)
    ctx.launches.clear()
    _call(hs, p, g, 1, 0, n, tape=tape)
    return hs, p, ctx, g


def test_launch_sequence_and_argument_lists(hyb_tiny):
    hs, p, ctx, g = _direct_call(hyb_tiny, 2, True)
    names = [l.name for l in ctx.launches]
    gdn = ["hy_rmsnorm2", "hy_mmp", "hy_gdn_front", "hy_gdn_scan4_out32", "hy_mmp"]
    attn = ["hy_rmsnorm2", "hy_mmp", "hy_qk", "hy_scores", "hy_values", "hy_finish", "hy_mmp"]
    ffn = ["hy_rmsnorm2", "hy_mmp", "hy_mmp"]
    assert names == (gdn + ffn) * 3 + attn + ffn + ["hy_rmsnorm2", "hy_mmp"]
    formats = _fakecard.kernel_formats()
    for l in ctx.launches:
        if l.name != "hy_mmp":
            assert l.fmt == formats[l.name], l.name
    by = {l.name: l for l in ctx.launches}
    cdim = 2 * 2 * 128 + 4 * 128
    assert by["hy_gdn_front"].grid == (cdim // 128 + 8, 2) and by["hy_gdn_front"].block == 128
    # the column scan and the gated norm in one launch: a block (4 * dv threads) a value head
    assert by["hy_gdn_scan4_out32"].grid == (4 + cdim // 512, 1) and by["hy_gdn_scan4_out32"].block == 512
    assert by["hy_qk"].grid == (g.nh + g.nkv, 2) and by["hy_qk"].block == g.hd
    # the first scratch holds 4096 keys, 64 blocks of 64: a block for every two
    assert by["hy_scores"].grid == (32, g.nkv, 2) and by["hy_finish"].grid == (g.nh, 2)
    # the tape's state copy is the column scan's own (its 14th argument), not a device copy, and
    # its raw rows and ring the front's (its last two), every GDN layer's own
    assert int.from_bytes(by["hy_gdn_scan4_out32"].args[13], "little") == hs.gdn[(1, 2)].s_save.ptr
    fronts = [l for l in ctx.launches if l.name == "hy_gdn_front"]
    saves = [(int.from_bytes(l.args[-2], "little"), int.from_bytes(l.args[-1], "little")) for l in fronts]
    assert saves == [(hs.gdn[(1, li)].t_qkv.ptr, hs.gdn[(1, li)].ring_save.ptr) for li in (0, 1, 2)]
    # the call record address: plan.ci, the first (only) attention layer
    assert int.from_bytes(by["hy_scores"].args[-1], "little") == p.ci.ptr
    assert p.ci.read(np.int32, 8).tolist() == [0, 0, 64, 4096, 64, 0, 0, 0]


def test_early_reads_skip_the_launch_before(hyb_tiny):
    """What a kernel loads before its wait was written at least two launches back: the nearest
    launch before it that holds a buffer of test_pdl.EARLY_READERS among its arguments (a
    matvec's jobs' outputs included) is two or more back, in the fused and the two-launch form,
    with a tape or none; the xn and z writers (the norm, the qkv matvec) are found so."""
    params = _fakecard.kernel_params()
    at = {(k, v): [p.split()[-1].lstrip("*") for p in params[k]].index(v) for k, vs in EARLY_READERS.items()
          for v in vs}
    back = {}
    for n, tape in ((1, False), (2, True), (launch.FUSED_SCAN_ROWS + 1, True)):
        _, _, ctx, _ = _direct_call(hyb_tiny, n, tape)
        ls = ctx.launches
        blobs = [b"".join(l.args) for l in ls]
        for k, l in enumerate(ls):
            for v in EARLY_READERS.get(l.name, ()):
                ptr = l.args[at[(l.name, v)]]
                assert int.from_bytes(ptr, "little") != 0, (l.name, v)
                holders = [k - j for j in range(k) if ptr in blobs[j]]
                assert not holders or min(holders) >= 2, (n, l.name, v, min(holders))
                back.setdefault((l.name, v), set()).add(min(holders) if holders else None)
    assert set(back) == set(at)
    assert back[("hy_gdn_front", "xn")] == {2} and back[("hy_gdn_scan4_out32", "z")] == {2}
    assert back[("hy_gdn_out32", "z")] == {3}


def test_a_matvec_follows_each_early_letgo(hyb_tiny):
    """The kernels that may let the next launch go before their wait (test_pdl.EARLY_LETGO) are
    each followed by a matvec, which reads nothing a kernel writes before its own wait: in every
    form of a call, with the head, tape or none."""
    seen = set()
    for n, tape in ((1, False), (2, True), (launch.FUSED_SCAN_ROWS, True), (launch.FUSED_SCAN_ROWS + 1, False)):
        _, _, ctx, _ = _direct_call(hyb_tiny, n, tape)
        names = [l.name for l in ctx.launches]
        for k, name in enumerate(names):
            if name in EARLY_LETGO:
                assert k + 1 < len(names) and names[k + 1] == "hy_mmp", (n, tape, k, names[k:k + 2])
                seen.add(name)
    assert seen == set(EARLY_LETGO)


def test_longer_calls_scan_and_norm_in_two_launches(hyb_tiny):
    """Past FUSED_SCAN_ROWS rows a GDN layer's column scan (a block for 32 value columns, keeping
    the tape's state copy) and its gated norm (a block a row and value head) are two launches."""
    n = launch.FUSED_SCAN_ROWS + 1
    hs, _, ctx, g = _direct_call(hyb_tiny, n, True)
    names = [l.name for l in ctx.launches]
    assert "hy_gdn_scan4_out32" not in names
    gdn = ["hy_rmsnorm2", "hy_mmp", "hy_gdn_front", "hy_gdn_scan4", "hy_gdn_out32", "hy_mmp"]
    assert names[:len(gdn)] == gdn and names.count("hy_gdn_scan4") == names.count("hy_gdn_out32") == 3
    formats = _fakecard.kernel_formats()
    by = {l.name: l for l in ctx.launches}
    for name in ("hy_gdn_scan4", "hy_gdn_out32"):
        assert by[name].fmt == formats[name], name
    cdim = 2 * 2 * 128 + 4 * 128
    assert by["hy_gdn_scan4"].grid == (4 * 128 // 32 + cdim // 128, 1) and by["hy_gdn_scan4"].block == 128
    assert by["hy_gdn_out32"].grid == (n * 4, 1) and by["hy_gdn_out32"].block == 128
    assert int.from_bytes(by["hy_gdn_scan4"].args[13], "little") == hs.gdn[(1, 2)].s_save.ptr


def test_a_call_without_tape_saves_nothing(hyb_tiny):
    _, _, ctx, _ = _direct_call(hyb_tiny, 1, False)
    fronts = [l for l in ctx.launches if l.name == "hy_gdn_front"]
    assert len(fronts) == 3 and all(l.args[-2:] == (bytes(8), bytes(8)) for l in fronts)


def test_token_outcomes_on_the_fake_card(hyb_tiny):
    cmf, g = hyb_tiny
    hs, _, _ = _fakecard.fake_state()
    kw = dict(nh=g.nh, nkv=g.nkv, hd=g.hd, attn_scale=g.scale, rd=g.rd, hidden=g.hidden, cap=64, gemma=g.gemma,
              eps=g.eps, lm_head=(g.lm, g.lm_rows), final_norm=g.final_norm)
    h = np.ones(g.hidden, np.float32)
    logits = np.zeros(g.lm_rows, np.float32)
    out = api.token(hs, cmf, 1, g.layers, g.invf, h, position=0, logits=logits, **kw)
    assert out == TokenGraphOutcome.completed()
    assert api.token(hs, cmf, 1, g.layers, g.invf, h, position=64, logits=logits, **kw).status == "declined"
    assert api.token(hs, cmf, 1, g.layers, g.invf, h, position=1, logits=None, **kw).status == "declined"
    # the card's GDN state is at row 1: a call at 5 fails (the sequence must be rebuilt)
    out = api.token(hs, cmf, 1, g.layers, g.invf, h, position=5, logits=logits, **kw)
    assert out.status == "failed" and "at row 1" in out.reason
    assert [w for w, _ in hs.counters.declines] == ["hybrid token"] * 3


def _kw(g, cap=64):
    return dict(nh=g.nh, nkv=g.nkv, hd=g.hd, attn_scale=g.scale, rd=g.rd, hidden=g.hidden, cap=cap, gemma=g.gemma,
                eps=g.eps)


def test_taps_keep_the_rows_after_asked_layers(hyb_tiny):
    cmf, g = hyb_tiny
    hs, _, _ = _fakecard.fake_state()
    hs.taps_wanted = (1, 3)
    h = np.arange(g.hidden, dtype=np.float32)
    out = api.token(hs, cmf, 1, g.layers, g.invf, h.copy(), position=0, **_kw(g))
    assert out.ok
    # the fake card runs no kernels: the residual rows are the uploaded row
    assert hs.taps_out.shape == (2, 1, g.hidden) and (hs.taps_out == h).all()
    assert next(iter(hs.graphs))[6] == (1, 3)
    # a call that does not reach every asked layer keeps none
    hs.taps_wanted = (9,)
    hs.taps_out = None
    assert api.token(hs, cmf, 1, g.layers, g.invf, h.copy(), position=1, **_kw(g)).ok
    assert hs.taps_out is None


def test_profile_stages_launch_directly(hyb_tiny, capsys):
    cmf, g = hyb_tiny
    hs, ctx, card = _fakecard.fake_state()
    hs.prof = True
    hs.debug = True
    h = np.ones(g.hidden, np.float32)
    logits = np.zeros(g.lm_rows, np.float32)
    kw = dict(_kw(g), lm_head=(g.lm, g.lm_rows), final_norm=g.final_norm, logits=logits)
    assert api.token(hs, cmf, 1, g.layers, g.invf, h, position=0, **kw).ok
    assert card.captures == 0 and hs.counters.calls_n[1] == 1
    timed = hs.counters.stage_ns[1]
    # every stage but "silu" (made in the gate/up epilogue) was marked
    assert (timed[[0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11]] > 0).all() and timed[8] == 0
    from cortiq_drv.hybrid.graphs import report

    report(hs)
    err = capsys.readouterr().err
    assert "0 recorded, 0 replays" in err and " 1 rows, 1 calls" in err and "gdn core" in err
    hs.mem = True
    hs.mem_report("a test")
    assert "mem after a test" in capsys.readouterr().err


def test_batch_outcomes(hyb_tiny):
    from cortiq_drv.graph import SpecTail

    cmf, g = hyb_tiny
    hs, ctx, _ = _fakecard.fake_state()
    kw = _kw(g)
    h = np.ones((4, g.hidden), np.float32)
    run = lambda pos, **x: api.batch(hs, cmf, 1, 0, g.layers, g.invf, h[:len(pos)], positions=pos, **kw, **x)
    assert run([]).status == "declined"
    assert run([0, 2]).status == "declined"
    assert run([62, 63, 64]).status == "declined"
    sp = SpecTail(g.lm, g.lm_rows, g.final_norm, pick=object())
    assert run([0, 1], spec=sp).status == "declined"
    assert not hs.gdn and not hs.kv
    # a small prompt chunk, then a verify window with the head, then its greedy pick on the card
    assert run([0, 1, 2]).ok and hs.gdn[(1, 0)].tape is None and hs.gdn[(1, 0)].next_pos == 3
    sp = SpecTail(g.lm, g.lm_rows, g.final_norm)
    assert run([3, 4, 5, 6], spec=sp).ok and sp.logits_out.shape == (4, g.lm_rows)
    assert hs.gdn[(1, 0)].tape == (3, 4)
    ctx.launches.clear()
    ids = np.full(4, -1, np.int32)
    assert run([7, 8, 9, 10], spec=SpecTail(g.lm, g.lm_rows, g.final_norm), argmax_out=ids).ok
    pick = [l for l in ctx.launches if l.name == "hy_argmax"]
    assert len(pick) == 1 and pick[0].grid == (ARGMAX_BLOCKS, 4) and (ids == 0).all()


def test_rewind_keeps_the_graphs_reset_drops_them(hyb_tiny):
    """spec.rewind (the engine's next generation): mirrors back to no rows, GDN states zeroed at
    row 0 without their tape and snapshot, and the same calls again replay the graphs; spec.reset
    frees it all, so they are recorded again."""
    from cortiq_drv.hybrid import spec

    cmf, g = hyb_tiny
    hs, ctx, card = _fakecard.fake_state()
    p = _plan(hs, cmf, g)

    def generation():
        for pos in range(5):
            _call(hs, p, g, 3, pos, 1)
        _call(hs, p, g, 3, 5, 4, tape=True)

    generation()
    c = hs.counters
    rec, held = c.graph_rec, ctx.kv_bytes
    gkeys = [k for k in hs.gdn if k[0] == 3]
    for k in gkeys:
        hs.gdn[k].s.upload_async(np.ones(hs.gdn[k].s_n, np.float32))
    assert spec.gdn_snapshot(hs, 3, 9) and ctx.kv_bytes > held
    bufs = {k: (gs.s.ptr, gs.ring.ptr) for k, gs in hs.gdn.items()}
    syncs = ctx.syncs
    spec.rewind(hs, 3)
    # the snapshots go after the copies queued into them: one wait for all the layers
    assert ctx.syncs == syncs + 1
    assert ctx.kv_bytes == held and all(m.stored == 0 for k, m in hs.kv.items() if k[0] == 3)
    for k in gkeys:
        gs = hs.gdn[k]
        assert (gs.next_pos, gs.tape, gs.snap) == (0, None, None) and (gs.s.ptr, gs.ring.ptr) == bufs[k]
        assert not spec.gdn_state_read(hs, 3, k[1]).any()
    generation()
    assert c.graph_rec == rec
    spec.reset(hs, 3)
    assert not hs.gdn and not hs.kv and not hs.graphs and ctx.kv_bytes == 0
    generation()
    assert c.graph_rec == 2 * rec


def test_rewind_sizes_the_mirrors_for_the_next_sequence(hyb_tiny):
    """spec.rewind with a hint past a mirror's room reallocates it empty at the hint (a fresh
    mirror's size) instead of leaving the growth to the middle of the next decode; mirrors with
    room keep their buffers, and the K/V count follows."""
    from cortiq_drv.hybrid import spec
    from cortiq_drv.hybrid.state import MIRROR_STEP

    cmf, g = hyb_tiny
    hs, ctx, _ = _fakecard.fake_state()
    p = _plan(hs, cmf, g)
    for pos in range(3):
        _call(hs, p, g, 5, pos, 1)
    mirrors = [m for k, m in hs.kv.items() if k[0] == 5]
    assert mirrors and all(m.cap == MIRROR_STEP for m in mirrors)
    ptrs = [m.k.ptr for m in mirrors]
    spec.rewind(hs, 5, MIRROR_STEP)
    assert [m.k.ptr for m in mirrors] == ptrs
    before = ctx.kv_bytes
    spec.rewind(hs, 5, 3 * MIRROR_STEP)
    assert all(m.stored == 0 and m.cap == 3 * MIRROR_STEP for m in mirrors)
    assert all(m.k.ptr != q for m, q in zip(mirrors, ptrs))
    assert ctx.kv_bytes == before + sum(2 * 2 * MIRROR_STEP * m.row * 2 for m in mirrors)
    # the next sequence's calls fit without another reallocation
    ptrs = [m.k.ptr for m in mirrors]
    for pos in range(3):
        _call(hs, p, g, 5, pos, 1)
    assert [m.k.ptr for m in mirrors] == ptrs
    # an empty mirror is sized for the hint alone: no doubling of the room it had (6 steps)
    spec.rewind(hs, 5, 3 * MIRROR_STEP + 1)
    assert all(m.stored == 0 and m.cap == 4 * MIRROR_STEP for m in mirrors)


def test_a_new_sequence_on_the_id_starts_fresh(hyb_tiny):
    """admit at row 0 over states the id holds elsewhere (no rewind): each state zeroed at row 0
    without its tape and snapshot, as spec.rewind leaves it."""
    from cortiq_drv.hybrid import spec

    cmf, g = hyb_tiny
    hs, ctx, _ = _fakecard.fake_state()
    p = _plan(hs, cmf, g)
    for pos in range(3):
        _call(hs, p, g, 4, pos, 1)
    gkeys = [k for k in hs.gdn if k[0] == 4]
    for k in gkeys:
        hs.gdn[k].s.upload_async(np.ones(hs.gdn[k].s_n, np.float32))
    held = ctx.kv_bytes
    assert spec.gdn_snapshot(hs, 4, 3)
    _call(hs, p, g, 4, 0, 1)
    assert ctx.kv_bytes == held
    for k in gkeys:
        gs = hs.gdn[k]
        assert gs.snap is None and gs.tape is None and not spec.gdn_state_read(hs, 4, k[1]).any()
