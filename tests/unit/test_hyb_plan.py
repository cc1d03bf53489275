"""The hybrid arm's plans on a fake card: building from a tiny model's graph descriptors, the job
tables' pointers, `hsig` change detection, rebuilds, declines, `wants`, `rope_rows`."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import _fakecard
import _tiny
from cortiq_drv.cmf import CmfFile
from cortiq_drv.errors import Declined
from cortiq_drv.graph import GraphAttn, build as graph_build
from cortiq_drv.host.ops import rope_tables
from cortiq_drv.hybrid.api import wants
from cortiq_drv.hybrid.launch import rope_rows
from cortiq_drv.hybrid.plan import GdnL, hsig, plan_for


def _plan(hs, cmf, g, layers=None, first_pos=0, final_norm=None, head=True, eps=None):
    layers = g.layers if layers is None else layers
    lm = (g.lm, g.lm_rows) if head else None
    return plan_for(hs, cmf, layers, 0, lm, g.final_norm if final_norm is None else final_norm, g.nh, g.nkv, g.hd,
                    g.rd, g.hidden, g.gemma, g.eps if eps is None else eps, g.scale, g.invf, first_pos)


def test_build_geometry_and_buffers(hyb_tiny):
    cmf, g = hyb_tiny
    hs, ctx, card = _fakecard.fake_state()
    p = _plan(hs, cmf, g)
    cdim = 2 * 2 * 128 + 4 * 128
    assert card.funcs_loaded == [(2, 32)]
    assert (p.geom.hpk, p.geom.half, p.geom.qrow) == (2, 4, 2 * 4 * 32)
    assert (p.geom.cdmax, p.geom.vdmax, p.geom.nvmax, p.geom.intermax) == (cdim, 512, 4, 128)
    assert p.geom.pstride == 512
    r = p.rows
    assert r.h.bytes == 16 * 64 * 4 and r.qkv.bytes == 16 * cdim * 4 and r.pp0.bytes == 16 * 512 * 2
    assert r.logits.bytes == 16 * g.lm_rows * 4 and r.tab.bytes == 16 * 4 * 2 * 4
    assert p.ci.bytes == 1 * 8 * 4
    assert [isinstance(l.mix, GdnL) for l in p.layers] == [True, True, True, False]
    # 3 x (qkv, z, out) + (q, k, v, o) + 4 x down + head, and 4 gate/up pairs
    store = card._store
    assert len(store.mats) == 3 * 3 + 4 + 4 + 1 and len(store.pairs) == 4
    assert store.arena_needs and store.arena_needs[0] > 0


def test_job_tables_point_at_the_row_buffers(hyb_tiny):
    cmf, g = hyb_tiny
    hs, _, _ = _fakecard.fake_state()
    p = _plan(hs, cmf, g)
    r, geo = p.rows, p.geom
    gd = p.layers[0].mix
    q, z = gd.ms_in.jobs
    assert (q.y, q.res, q.ystride, q.rows) == (r.qkv.ptr, 0, geo.cdmax, geo.cdmax)
    assert (z.y, z.ystride, z.rows) == (r.z.ptr, geo.vdmax, 512)
    (o,) = gd.ms_out.jobs
    assert (o.y, o.res, o.ystride, o.mat.cols) == (r.h.ptr, r.h.ptr, 64, 512)
    at = p.layers[3].mix
    jq, jk, jv = at.ms_in.jobs
    assert (jq.y, jq.ystride, jq.rows) == (r.q.ptr, geo.qrow, 2 * 4 * 32)
    assert (jk.y, jk.rows, jv.y, jv.rows) == (r.k.ptr, 64, r.v.ptr, 64)
    (pair,) = p.layers[1].ms_gu.jobs
    assert (pair.y, pair.res, pair.ystride, pair.rows) == (r.qq0.ptr, r.qq1.ptr, geo.pstride, 256)
    (dn,) = p.layers[1].ms_dn.jobs
    assert (dn.y, dn.res, dn.mat.cols) == (r.h.ptr, r.h.ptr, 128)
    (hd,) = p.lm[2].jobs
    assert (hd.y, hd.ystride, hd.rows) == (r.logits.ptr, g.lm_rows, g.lm_rows)
    # the gate projections as f32 on the card, their f16 copies made by hy_to_half
    assert gd.a.read(np.float32, 4 * 64).tolist() == g.layers[0].attn.a.data.reshape(-1).tolist()


def test_plan_reused_until_the_signature_moves(hyb_tiny):
    cmf, g = hyb_tiny
    hs, _, _ = _fakecard.fake_state()
    p = _plan(hs, cmf, g)
    # a fresh copy of the final norm with the same content: the same plan
    assert _plan(hs, cmf, g, final_norm=g.final_norm.copy()) is p
    moved = g.final_norm.copy()
    moved[3] += 1
    p2 = _plan(hs, cmf, g, final_norm=moved)
    assert p2 is not p and p2.id > p.id
    # eps, or a weight by identity
    assert _plan(hs, cmf, g, final_norm=moved, eps=1e-5) is not p2
    l0 = g.layers[0]
    other = [replace(l0, input_norm=l0.input_norm.copy()), *g.layers[1:]]
    assert hsig(cmf.uid, other, (g.lm, g.lm_rows), g.final_norm, g.nh, g.nkv, g.hd, g.rd, g.hidden, g.gemma,
                g.invf) != hsig(cmf.uid, g.layers, (g.lm, g.lm_rows), g.final_norm, g.nh, g.nkv, g.hd, g.rd,
                                g.hidden, g.gemma, g.invf)


def test_constants_rechecked_by_content_at_a_sequence_start(hyb_tiny):
    cmf, g = hyb_tiny
    hs, _, _ = _fakecard.fake_state()
    a = g.layers[0].attn
    taps = a.conv1d.copy()
    layers = [replace(g.layers[0], attn=replace(a, conv1d=taps)), *g.layers[1:]]
    p = _plan(hs, cmf, g, layers)
    taps[0] += 0.5
    # the same address: kept mid-sequence, rebuilt at position 0
    assert _plan(hs, cmf, g, layers, first_pos=7) is p
    p2 = _plan(hs, cmf, g, layers, first_pos=0)
    assert p2 is not p
    assert p2.layers[0].mix.taps.read(np.float32, 1)[0] == taps[0]


def test_plans_by_stack_and_head(hyb_tiny):
    cmf, g = hyb_tiny
    hs, _, _ = _fakecard.fake_state()
    p = _plan(hs, cmf, g)
    trunk = _plan(hs, cmf, g, head=False)
    assert trunk is not p and trunk.lm is None and len(hs.plans) == 2
    # matrices are shared between plans: the head plan repacked them already
    assert hs.store().arena_needs[-1] == 0


@pytest.mark.parametrize("over, why", [
    (dict(linear_key_head_dim=16, linear_value_head_dim=16), "GDN geometry"),
    (dict(head_dim=512), "outside the kernels"),
    (dict(num_attention_heads=34, num_kv_heads=2), "outside the kernels"),
])
def test_geometries_outside_the_kernels_are_declined(tmp_path, over, why):
    base = dict(linear_key_head_dim=128, linear_value_head_dim=128)
    cmf = CmfFile.open(_tiny.write_tiny(tmp_path / "m.cmf", **{**base, **over}))
    g = graph_build(cmf)
    hs, _, _ = _fakecard.fake_state()
    with pytest.raises(Declined, match=why):
        _plan(hs, cmf, g)
    assert not hs.plans
    cmf.close()


def test_f32_weights_are_declined(tmp_path):
    cmf = CmfFile.open(_tiny.write_tiny(tmp_path / "f.cmf", quant="f32", linear_key_head_dim=128,
                                        linear_value_head_dim=128))
    g = graph_build(cmf)
    hs, _, _ = _fakecard.fake_state()
    with pytest.raises(Declined, match="f32 FFN"):
        _plan(hs, cmf, g)
    cmf.close()


def test_wants(hyb_tiny):
    _, g = hyb_tiny
    assert wants(g.layers, g.nh, g.nkv, g.hd)
    full = [l for l in g.layers if isinstance(l.attn, GraphAttn.Full)]
    plain = [replace(l, attn=replace(l.attn, q_norm=None, k_norm=None, output_gate=False)) for l in full]
    assert wants(full, g.nh, g.nkv, g.hd) and not wants(plain, g.nh, g.nkv, g.hd)
    # an empty stack: by whether the dense arm's attention takes the geometry
    assert wants([], 16, 2, 256) and not wants([], 2, 1, 128)


def test_rope_rows_match_the_host_tables(hyb_tiny):
    _, g = hyb_tiny
    pos = [0, 1, 17, 4095, 100_000]
    tab = rope_rows(g.invf, pos)
    cos, sin = rope_tables(g.invf, np.array(pos))
    assert tab.shape == (5, g.rd // 2, 2) and tab.dtype == np.float32
    np.testing.assert_array_equal(tab[..., 0], sin)
    np.testing.assert_array_equal(tab[..., 1], cos)
