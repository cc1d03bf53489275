"""The prompt path's budget (hybrid/bigfit.py) on a fake card: `need` is exactly the scratch
`big` takes (no allocation once `prepare` ran, every size as sized), `fit` keeps the knobs'
configuration when it fits and otherwise shrinks band, score sizing, passes, then rows, frees
oversized scratch only when it must, and declines naming the bytes; through `api.batch` a chunk
that does not fit is Declined with every state where it was, and one that fits only in pieces
runs in pieces to the same state.
"""

import numpy as np
import pytest

import _fakecard
from cortiq_drv.errors import Declined
from cortiq_drv.hybrid import api, bigfit
from cortiq_drv.hybrid.admit import admit
from cortiq_drv.hybrid.big import run_chunk
from cortiq_drv.hybrid.plan import plan_for
from cortiq_drv.hybrid.state import HState

MiB = 1 << 20


class GemmCtx(_fakecard.FakeCtx):
    """A fake context that records the rows of each cuBLAS weight GEMM."""

    def __init__(self):
        super().__init__()
        self.gemm_n = []

    def gemm(self, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, mode):
        self.gemm_n.append(n)

    def gemm_strided_batched_f16(self, *a, **kw):
        pass


def _card(hyb_tiny):
    cmf, g = hyb_tiny
    ctx = GemmCtx()
    heap = _fakecard.Heap(256 << 20)
    hs = HState(ctx, _fakecard.FakeCard(ctx, heap))
    p = plan_for(hs, cmf, g.layers, 0, None, None, g.nh, g.nkv, g.hd, g.rd, g.hidden, g.gemma, g.eps, g.scale,
                 g.invf, 0)
    return hs, ctx, heap, p


@pytest.mark.parametrize("chunks,att,wd,flash", [([40, 300], 128, 64, True), ([40, 300], 128, 64, False),
                                                 ([300, 100], 16, 1, False)])
def test_need_is_what_big_takes(hyb_tiny, env, chunks, att, wd, flash):
    env(CMF_HYB_ATT_ROWS=att, CMF_HYB_WD_MB=wd, CORTIQ_DRV_FLASH=int(flash))
    hs, ctx, heap, p = _card(hyb_tiny)
    g = hyb_tiny[1]
    pos = 0
    for n in chunks:
        assert admit(hs, p, g.layers, 1, 0, pos, n, 0) is None
        f = bigfit.prepare(hs, p, n, pos)
        before = heap.allocs
        run_chunk(hs, p, 1, 0, range(pos, pos + n), np.ones((n, g.hidden), np.float32), False, f)
        # every buffer big asked for was there, none grew
        assert heap.allocs == before
        pos += n
    # the scratch is the largest need of the chunks, name by name
    want: dict = {}
    for i, n in enumerate(chunks):
        for k, v in bigfit.chunk_need(p, n, sum(chunks[:i]), bigfit.configured(n, 0)).items():
            want[k] = max(want.get(k, 0), v)
    assert {k: b.bytes for k, b in hs.scratch.items()} == want


def test_score_bytes_cover_every_pass():
    # 1M keys: two passes of 64 rows (halved toward PASS_CAP) and S sized by the later one
    s, p = bigfit.score_bytes(1 << 20, 128, 0, 4, 4, 128, 0)
    assert s == 4 * ((1 << 20) + 128) * 64 * 4 * 4 and p == s // 2
    # a hint sizes the whole chunk's pass up front
    assert bigfit.score_bytes(0, 100, 0, 2, 2, 128, 4096)[0] == 4096 * 100 * 4 * 4


def test_fit_keeps_the_configuration_when_it_fits(hyb_tiny):
    _, _, _, p = _card(hyb_tiny)
    cfg = bigfit.BigCfg(300, 64 * MiB, 128, 0)
    f = bigfit.fit(p, 300, 0, cfg, {}, 100 * MiB, 200 * MiB)
    assert f.cfg == cfg and f.release == () and f.sizes == bigfit.chunk_need(p, 300, 0, cfg)


@pytest.mark.parametrize("flash", [False, True])
def test_fit_shrinks_in_order_then_declines(hyb_tiny, flash):
    _, _, _, p = _card(hyb_tiny)
    cfg = bigfit.BigCfg(300, 64 * MiB, 128, 4096, flash)
    assert bigfit.flash(p, cfg) == flash
    steps = list(bigfit._candidates(p, 300, cfg))
    assert steps[0] == cfg and steps[1].wd_bytes == 16 * bigfit.wmax(p)[1] * 2
    if flash:
        # no scores in memory: nothing to shrink in attention
        assert [c.rows for c in steps[1:]] == [300, 192, 128, 64]
    else:
        assert steps[2].hint == 0 and [c.att_rows for c in steps[2:6]] == [128, 64, 32, 16]
        assert [c.rows for c in steps[5:]] == [300, 192, 128, 64]
    totals = [sum(bigfit.chunk_need(p, 300, 0, c).values()) for c in steps]
    assert all(a > b for a, b in zip(totals, totals[1:]))
    fixed = 50 * MiB
    for i, c in enumerate(steps):
        # a budget just at this step's total: this step, not an earlier one
        f = bigfit.fit(p, 300, 0, cfg, {}, fixed, fixed + totals[i])
        assert f.cfg == c and fixed + sum(f.sizes.values()) <= fixed + totals[i]
    with pytest.raises(Declined) as e:
        bigfit.fit(p, 300, 0, cfg, {}, fixed, fixed + totals[-1] - 1)
    r = e.value.reason
    assert "300 rows" in r and "pieces of 64 rows" in r and "budget" in r
    assert f"{(fixed + totals[-1]) / MiB:.0f} MiB" in r and f"{(fixed + totals[-1] - 1) / MiB:.0f} MiB" in r


def test_fit_frees_oversized_scratch_only_when_it_must(hyb_tiny):
    _, _, _, p = _card(hyb_tiny)
    cfg = bigfit.BigCfg(40, 64 * MiB, 128, 0)
    sizes = bigfit.chunk_need(p, 40, 0, cfg)
    held = {"hb_gu": 20 * MiB, "hb_old": 5 * MiB}
    total = sum(sizes.values())
    roomy = bigfit.fit(p, 40, 0, cfg, held, 0, total + 30 * MiB)
    assert roomy.cfg == cfg and roomy.release == ()
    tight = bigfit.fit(p, 40, 0, cfg, held, 0, total + MiB)
    assert tight.cfg == cfg and set(tight.release) == {"hb_gu", "hb_old"}


def _states(hs):
    return [s.next_pos for s in hs.gdn.values()], [m.stored for m in hs.kv.values()]


def test_batch_declines_a_chunk_past_the_budget_with_nothing_moved(hyb_tiny, env):
    cmf, g = hyb_tiny
    hs, ctx, heap, p = _card(hyb_tiny)
    kw = dict(nh=g.nh, nkv=g.nkv, hd=g.hd, rd=g.rd, hidden=g.hidden, cap=4096, gemma=g.gemma, eps=g.eps,
              attn_scale=g.scale)
    h = np.ones((40, g.hidden), np.float32)
    assert api.batch(hs, cmf, 1, 0, g.layers, g.invf, h, positions=range(40), **kw).ok
    env(CMF_GPU_VRAM_MB=1)
    before, launches = _states(hs), len(ctx.launches)
    out = api.batch(hs, cmf, 1, 0, g.layers, g.invf, np.ones((300, g.hidden), np.float32),
                    positions=range(40, 340), **kw)
    assert out.status == "declined" and "budget 1 MiB" in out.reason and "needs" in out.reason
    assert _states(hs) == before and len(ctx.launches) == launches
    assert hs.counters.declines[-1][1] == out.reason.split(": ", 1)[1]


def test_batch_runs_a_chunk_in_pieces_under_a_tight_budget(hyb_tiny, env):
    cmf, g = hyb_tiny
    hs, ctx, heap, p = _card(hyb_tiny)
    kw = dict(nh=g.nh, nkv=g.nkv, hd=g.hd, rd=g.rd, hidden=g.hidden, cap=4096, gemma=g.gemma, eps=g.eps,
              attn_scale=g.scale)
    # room for the states and pieces of 128 rows, not 300 at once
    assert admit(hs, p, g.layers, 1, 0, 0, 300, 0) is None
    small = bigfit.BigCfg(128, 16 * bigfit.wmax(p)[1] * 2, 16, 0)
    budget = ctx.resident + ctx.kv_bytes + sum(bigfit.chunk_need(p, 300, 0, small).values())
    env(CMF_GPU_VRAM_MB=-(-budget // MiB))
    out = api.batch(hs, cmf, 1, 0, g.layers, g.invf, np.ones((300, g.hidden), np.float32), positions=range(300),
                    **kw)
    assert out.ok
    assert set(ctx.gemm_n) == {128, 44}
    assert _states(hs) == ([300] * len(hs.gdn), [300] * len(hs.kv))
    assert sum(b.bytes for k, b in hs.scratch.items() if k.startswith("hb_")) <= budget - ctx.kv_bytes


def test_rows_go_to_the_card_through_pinned_staging_in_pieces(hyb_tiny, monkeypatch):
    from cortiq_drv.hybrid import big as bigmod

    monkeypatch.setattr(bigmod, "STAGE_PIECE", 4096)
    hs, ctx, heap, p = _card(hyb_tiny)
    made = []
    event = hs.card.event
    monkeypatch.setattr(hs.card, "event", lambda: made.append(event()) or made[-1])
    g = hyb_tiny[1]
    n = 100
    assert admit(hs, p, g.layers, 1, 0, 0, n, 0) is None
    h = np.random.default_rng(3).standard_normal((n, g.hidden)).astype(np.float32)
    want = h.copy()
    bigmod.big(hs, p, 1, 0, range(n), h)
    ups = [a for d, a in ctx.host_copies if d == "up" and hs.card.is_pinned(a)]
    # 100 rows of 64 floats in pieces of 1024 floats, each from pinned memory
    assert [a.size for a in ups] == [1024] * 6 + [256]
    # the fake card runs no kernel: the residual rows come back as they went
    assert h.tobytes() == want.tobytes()
    (ev,) = made
    assert admit(hs, p, g.layers, 1, 0, n, n, 0) is None
    bigmod.big(hs, p, 1, 0, range(n, 2 * n), h)
    # the second chunk waited for the first one's copies before refilling the staging
    assert ev.records == 2 and ev.syncs == 1
