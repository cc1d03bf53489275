"""Admission and booking on a fake card whose memory is a numpy heap: K/V mirrors from the host
rows as f16, rewinds, zero gaps; GDN states fresh, seeded, refused; call records, attention
scratch growth, cursors; the restore table, snapshots, state reads, reset."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

import _fakecard
from cortiq_drv.errors import CortiqError
from cortiq_drv.graph import GraphAttn
from cortiq_drv.hybrid import spec
from cortiq_drv.hybrid.admit import admit
from cortiq_drv.hybrid.book import (ATTN_FILL, ATTN_NBLK, ATTN_WALK, attn_grid, attn_rb, book, record,
                                    records, scratch_nblk, scratch_sizes)
from cortiq_drv.hybrid.plan import plan_for

CDIM = 2 * 2 * 128 + 4 * 128
S_N, RING_N = 4 * 128 * 128, 3 * CDIM


def _setup(hyb_tiny):
    cmf, g = hyb_tiny
    hs, ctx, card = _fakecard.fake_state()
    p = plan_for(hs, cmf, g.layers, 0, None, None, g.nh, g.nkv, g.hd, g.rd, g.hidden, g.gemma, g.eps, g.scale,
                 g.invf, 0)
    return hs, ctx, p, g


def _with_host(g, n_rows, seed=0):
    """The layers bound to host rows: K/V rows [n_rows] per group, a GDN state per layer."""
    rng = np.random.default_rng(seed)
    out = []
    for l in g.layers:
        a = l.attn
        if isinstance(a, GraphAttn.Full):
            ks = tuple(rng.standard_normal(n_rows * g.hd).astype(np.float32) for _ in range(g.nkv))
            vs = tuple(rng.standard_normal(n_rows * g.hd).astype(np.float32) for _ in range(g.nkv))
            out.append(replace(l, attn=replace(a, cpu_k=ks, cpu_v=vs, cpu_base=0)))
        else:
            st = rng.standard_normal(RING_N + S_N).astype(np.float32)
            out.append(replace(l, attn=replace(a, cpu_state=st)))
    return out


def test_attn_rb_and_records():
    assert [attn_rb(k) for k in (1, 8192, 8193, 16384, 16385, 262144)] == [64, 64, 128, 128, 192, 2048]
    for keys in (1, 4096, 8192, 8193, 100_000, 262_144):
        assert -(-keys // attn_rb(keys)) <= ATTN_NBLK
    assert record(0, 1) == [0, 0, 64, 4096, 64, 0, 0, 0]
    assert record(4095, 2) == [4095, 4095, 64, 8192, 128, 0, 0, 0]
    assert record(9000, 16) == [9000, 9000, 128, 12288, 96, 0, 0, 0]
    s = scratch_sizes(4, 32, 5, 64, None)
    assert s["hy_S"] == 16 * 4 * 4096 * 4 and s["hy_P"] == 16 * 64 * 4 * 32 * 4
    assert scratch_sizes(4, 32, 5, 64, 20_000)["hy_S"] == 16 * 4 * 20480 * 4


def test_records_are_each_layers_record_in_layer_order():
    # the layers' records one after another, whatever mix of row counts they hold
    for stored, n in (([600] * 8, 1), ([600] * 8, 16), ([5, 9000, 5, 8190], 3), ([0], 1), ([], 1)):
        ci, keys_max, nbcap_max = records(stored, n)
        want = [w for s in stored for w in record(s, n)]
        assert ci.dtype == np.int32 and ci.tolist() == want, (stored, n)
        assert keys_max == max((s + n for s in stored), default=0)
        assert nbcap_max == max((record(s, n)[4] for s in stored), default=0)


def test_attn_grid_fills_the_card_and_no_more():
    """One-row steps (9B / 27B: 4 KV heads, 132 SMs): a block for every ATTN_WALK key blocks the
    scratch holds, at most ATTN_NBLK; windows: no more than ATTN_FILL blocks an SM past that;
    never fewer than one block."""
    assert [attn_grid(4, 1, 132, nbc) for nbc in (1, 64, 128, 193, 400)] == [1, 32, 64, 97, 129]
    assert [attn_grid(4, n, 132, 128) for n in (1, 2, 4, 8, 16)] == [64, 64, 33, 17, 9]
    assert attn_grid(64, 16, 8, 64) == 1
    for nkv, n, sms, nbc in ((4, 8, 132, 64), (2, 3, 108, 128), (8, 16, 132, 193), (1, 1, 132, 7)):
        g = attn_grid(nkv, n, sms, nbc)
        assert 1 <= g <= ATTN_NBLK and (g - 1) * ATTN_WALK < nbc and (g - 1) * nkv * n < ATTN_FILL * sms


def test_scratch_nblk_reads_back_the_blocks_the_scratch_was_sized_for():
    for nh, nbcap in ((16, 64), (24, 128), (4, 193)):
        mx = SimpleNamespace(bytes=scratch_sizes(nh, 256, 5, nbcap, None)["hy_Mx"])
        assert scratch_nblk((None, mx, None, None), nh) == nbcap


def test_fresh_sequence_admit_and_book(hyb_tiny):
    hs, ctx, p, g = _setup(hyb_tiny)
    assert admit(hs, p, g.layers, 7, 0, 0, 3, 0) is None
    gs = hs.gdn[(7, 0)]
    assert gs.next_pos == 0 and gs.dims == (4, 2, 128, 128, 4)
    # seven views of one zeroed allocation, each 256-aligned
    views = gs.views()
    assert all(v.ptr % 256 == 0 and gs.all.ptr <= v.ptr < gs.all.ptr + gs.all.bytes for v in views)
    assert views[2].bytes == 16 * p.geom.cdmax * 4 and views[4].bytes == 16 * 2 * 4 * 4
    assert not gs.all.read(np.uint8, gs.all.bytes).any()
    m = hs.kv[(7, 3)]
    assert m.stored == 0 and m.cap >= 3 and m.row == g.nkv * g.hd
    assert ctx.kv_bytes == 3 * gs.counted + m.bytes
    bk = book(hs, p, 7, 0, 0, 3, True, 4096)
    assert bk.ci.tolist() == record(0, 3) and m.stored == 3
    assert gs.next_pos == 3 and gs.tape == (0, 3)
    assert bk.layers[3] == (m.k, m.v) and bk.layers[0] == views
    assert [b.bytes for b in bk.scratch] == [v for v in scratch_sizes(g.nh, g.hd, 3, 64, None).values()]
    # the next call: admitted at 3 without a move
    assert admit(hs, p, g.layers, 7, 0, 3, 1, 0) is None
    assert book(hs, p, 7, 0, 3, 1, False, 4096).ci.tolist() == record(3, 1) and gs.tape is None
    # a call admit did not resolve (its admission taken, or another position): refused, no move
    assert admit(hs, p, g.layers, 7, 0, 4, 1, 0) is None
    for pos0 in (5, 4):
        with pytest.raises(CortiqError, match="admit did not resolve"):
            book(hs, p, 7, 0, pos0, 1, False, 4096)
    assert gs.next_pos == 4 and m.stored == 4


def test_mirror_rows_from_the_host_as_f16(hyb_tiny):
    hs, _, p, g = _setup(hyb_tiny)
    layers = _with_host(g, 10)
    assert admit(hs, p, layers, 1, 0, 10, 1, 0) is None
    m = hs.kv[(1, 3)]
    assert m.stored == 10
    a = layers[3].attn
    got = m.k.read(np.float16, 10 * m.row).reshape(10, g.nkv, g.hd)
    want = np.stack([k.reshape(10, g.hd) for k in a.cpu_k], axis=1).astype(np.float16)
    np.testing.assert_array_equal(got, want)
    gv = m.v.read(np.float16, 10 * m.row).reshape(10, g.nkv, g.hd)
    np.testing.assert_array_equal(gv, np.stack([v.reshape(10, g.hd) for v in a.cpu_v], axis=1).astype(np.float16))
    # GDN seeded from the host's [ring | S]
    gs = hs.gdn[(1, 0)]
    np.testing.assert_array_equal(gs.ring.read(np.float32, RING_N), layers[0].attn.cpu_state[:RING_N])
    np.testing.assert_array_equal(gs.s.read(np.float32, S_N), layers[0].attn.cpu_state[RING_N:])


def test_mirror_rewinds_grows_and_fills_gaps(hyb_tiny):
    hs, _, p, g = _setup(hyb_tiny)
    assert admit(hs, p, _with_host(g, 0), 2, 0, 0, 16, 0) is None
    book(hs, p, 2, 0, 0, 16, True, 4096)
    m = hs.kv[(2, 3)]
    k_before = m.k.read(np.uint8, 16 * m.row * 2)
    # another continuation from row 5 (GDN states follow through spec_restore / snapshots)
    for gs in (hs.gdn[(2, i)] for i in range(3)):
        gs.next_pos = 5
    assert admit(hs, p, _with_host(g, 0), 2, 0, 5, 1, 0) is None
    assert m.stored == 5
    # past the capacity: a new allocation holding the old rows
    old_ptr, cap = m.k.ptr, m.cap
    for gs in (hs.gdn[(2, i)] for i in range(3)):
        gs.next_pos = cap + 3
    m.stored = 16
    assert admit(hs, p, _with_host(g, 0), 2, 0, cap + 3, 1, 0) is None
    assert m.k.ptr != old_ptr and m.cap > cap and m.stored == cap + 3
    np.testing.assert_array_equal(m.k.read(np.uint8, 16 * m.row * 2), k_before)
    # rows 16 .. cap+3 were on neither side: zeros
    assert not m.k.read(np.uint8, (cap + 3 - 16) * m.row * 2, 16 * m.row * 2).any()


def test_gdn_refusals(hyb_tiny):
    hs, _, p, g = _setup(hyb_tiny)
    assert admit(hs, p, g.layers, 3, 0, 0, 1, 0) is None
    book(hs, p, 3, 0, 0, 1, False, 4096)
    # the card's state is at row 1: a call at 4 is a hard refusal
    hard, why = admit(hs, p, g.layers, 3, 0, 4, 1, 0)
    assert hard and "at row 1, the call at 4" in why
    # a new sequence on the id: zeroed and accepted
    hs.gdn[(3, 0)].s.upload_async(np.ones(4, np.float32))
    assert admit(hs, p, g.layers, 3, 0, 0, 1, 0) is None
    assert not hs.gdn[(3, 0)].s.read(np.float32, S_N).any() and hs.gdn[(3, 0)].next_pos == 0
    # a fresh id past position 0 without a host seed: a soft refusal
    hard, why = admit(hs, p, g.layers, 4, 0, 9, 1, 0)
    assert not hard and "seed missing" in why


def test_scratch_grows_past_4096_keys(hyb_tiny):
    hs, _, p, g = _setup(hyb_tiny)
    layers = _with_host(g, 4094)
    assert admit(hs, p, layers, 5, 0, 4094, 2, 0) is None
    bk = book(hs, p, 5, 0, 4094, 2, False, 262144)
    assert bk.ci.tolist() == record(4094, 2)
    s0 = bk.scratch
    assert admit(hs, p, layers, 5, 0, 4096, 1, 0) is None
    bk2 = book(hs, p, 5, 0, 4096, 1, False, 262144)
    assert bk2.ci.tolist() == [4096, 4096, 64, 8192, 128, 0, 0, 0]
    assert bk2.scratch[0].ptr != s0[0].ptr and bk2.scratch[0].bytes == 16 * g.nh * 8192 * 4
    assert bk2.sig() != bk.sig()
    # sized for the cap from the start (CMF_HYB_KCAP=1)
    hs.kcap = True
    assert admit(hs, p, layers, 5, 0, 4097, 1, 0) is None
    bk3 = book(hs, p, 5, 0, 4097, 1, False, 20000)
    assert bk3.scratch[0].bytes == 16 * g.nh * 20480 * 4


def test_restore_table_snapshot_read_reset(hyb_tiny):
    hs, ctx, p, g = _setup(hyb_tiny)
    layers = _with_host(g, 6)
    assert admit(hs, p, layers, 9, 0, 6, 4, 0) is None
    book(hs, p, 9, 0, 6, 4, True, 4096)
    ctx.launches.clear()
    assert spec.spec_restore(hs, 9, 1, 6, 3)
    tab, keys = hs.rtabs[9]
    assert keys == [(9, 0), (9, 1), (9, 2)]
    ptrs = tab.read(np.uint64, 21).reshape(3, 7)
    gs = hs.gdn[(9, 1)]
    assert ptrs[1].tolist() == [b.ptr for b in (gs.s_save, gs.s, gs.t_cq, gs.t_gb, gs.ring_save, gs.ring, gs.t_qkv)]
    names = [(l.name, l.grid) for l in ctx.launches]
    assert names == [("hy_gdn_restore_scan4", (16, 3, 1)), ("hy_gdn_restore_ring", (-(-CDIM // 256), 3, 1))]
    assert all(hs.gdn[(9, i)].next_pos == 8 and hs.gdn[(9, i)].tape is None for i in range(3))
    # a second restore of the same window finds no tape
    assert not spec.spec_restore(hs, 9, 1, 6, 3)
    # the state read is the seed (the fake card runs no kernels)
    np.testing.assert_array_equal(spec.gdn_state_read(hs, 9, 2), layers[2].attn.cpu_state)
    assert spec.state_resident(hs, 9, 0) and not spec.state_resident(hs, 9, 3)
    assert spec.gdn_snapshot(hs, 9, 8) and not spec.gdn_snapshot(hs, 9, 7)
    hs.gdn[(9, 0)].s.memset(0)
    hs.gdn[(9, 0)].next_pos = 12
    assert not spec.gdn_snapshot_restore(hs, 9, 7)
    assert spec.gdn_snapshot_restore(hs, 9, 8)
    np.testing.assert_array_equal(spec.gdn_state_read(hs, 9, 0), layers[0].attn.cpu_state)
    assert hs.gdn[(9, 0)].next_pos == 8
    spec.reset(hs, 9)
    assert not hs.gdn and not hs.kv and 9 not in hs.rtabs and ctx.kv_bytes == 0
