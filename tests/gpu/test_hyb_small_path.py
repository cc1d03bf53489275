"""The hybrid arm's small path on the card against the host arm and against itself.

- `token` logits against the host arm's decode (the default model's shape and a mid-size model of
  8 layers, hidden 1024, head widths 256 / 128): relative RMS <= 1e-3, the same argmax every
  step, over 64 steps; a host prefill followed by card decode likewise;
- a verify window's row i equals the one-row step at that position, byte for byte (n = 2..16),
  the window entered through `gdn_snapshot_restore`; the card's greedy pick equals the argmax;
- a one-row step's greedy pick on the card equals the host argmax of its downloaded logits over
  the sampleable rows, 40 steps, and an id-only step (the engine's) gives the same bytes;
- graph replay equals direct launches byte for byte across 4096 keys, where the scratch and the
  mirror grow and the graph is recorded again;
- `spec_restore` after a partial acceptance, then decoding, equals plain decoding byte for byte;
- programmatic dependent launches in the graph equal plain direct launches byte for byte;
- a position past the cap, a geometry outside the kernels, a model over the budget: Declined.
"""

from __future__ import annotations

import numpy as np
import pytest

from cortiq_drv import knobs
from cortiq_drv.hybrid import api, spec
from cortiq_drv.hybrid import state as hstate

pytestmark = pytest.mark.gpu

TOL = 1e-3


def rel_rms(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b ** 2)))


def _greedy(arm, kv_id, t0, steps):
    """Card and host decoding the host's greedy continuation of t0: the worst relative RMS."""
    seq = arm.hm.new_sequence()
    tok, worst = t0, 0.0
    for pos in range(steps):
        want = arm.hm.decode(seq, tok)
        got = arm.token(kv_id, tok, pos)
        err = rel_rms(got, want)
        assert np.isfinite(got).all() and err <= TOL, (pos, err)
        assert int(np.argmax(got)) == int(np.argmax(want)), (pos, np.sort(want)[-2:])
        worst = max(worst, err)
        tok = int(np.argmax(want))
    return worst


@pytest.mark.parametrize("which", ["default", "mid"])
def test_token_matches_host(which, request):
    arm = request.getfixturevalue(f"{which}_arm")
    worst = _greedy(arm, {"default": 100, "mid": 101}[which], 1000, 64)
    print(f"{which}: worst relative RMS over 64 steps {worst:.2e}")


def test_host_prefill_then_card_decode(default_arm):
    arm, kv = default_arm, 200
    seq = arm.hm.new_sequence()
    prompt = list(range(3000, 3019))
    tok = int(np.argmax(arm.hm.prefill(seq, prompt)[-1]))
    layers = arm.g.bind(seq)
    for pos in range(len(prompt), len(prompt) + 16):
        got = arm.token(kv, tok, pos, layers if pos == len(prompt) else None)
        want = arm.hm.decode(seq, tok)
        assert rel_rms(got, want) <= TOL and int(np.argmax(got)) == int(np.argmax(want)), pos
        tok = int(np.argmax(want))


def _pick_token(arm, kv_id, tok, pos, rows, with_logits):
    """A greedy step as the engine takes it: the pick on the card over the head's `rows`
    (and the logits too when `with_logits`): (id, logits or None, residual row)."""
    g = arm.g
    h = np.array(arm.hm.embed([tok])[0], dtype=np.float32)
    logits = np.empty(rows, np.float32) if with_logits else None
    pick = np.full(1, -1, np.int32)
    out = api.token(arm.hs, arm.cmf, kv_id, g.layers, g.invf, h, position=pos, lm_head=(g.lm, rows),
                    final_norm=g.final_norm, logits=logits, pick=pick, hidden_too=True, **arm.geo)
    assert out.ok, out.reason
    return int(pick[0]), logits, h


@pytest.mark.parametrize("pad", [0, 333])
def test_card_pick_equals_host_argmax(default_arm, pad):
    """40 greedy steps picked on the card equal the host argmax of the same step's downloaded
    logits over the sampleable rows (lm rows - pad: the padding rows never searched); a sequence
    that takes only the id (the engine's path) gives the same ids and rows, byte for byte."""
    arm = default_arm
    rows = arm.g.lm_rows - pad
    kv = 500 + 2 * pad
    tok = 1000
    for pos in range(40):
        got, logits, h = _pick_token(arm, kv, tok, pos, rows, True)
        assert np.isfinite(logits).all()
        assert got == int(np.argmax(logits)) and 0 <= got < rows, pos
        only, none, h2 = _pick_token(arm, kv + 1, tok, pos, rows, False)
        assert none is None and only == got and h2.tobytes() == h.tobytes(), pos
        tok = got
    spec.reset(arm.hs, kv)
    spec.reset(arm.hs, kv + 1)


def _one_row_run(arm, kv, toks):
    return [arm.token(kv, t, p) for p, t in enumerate(toks)]


@pytest.mark.parametrize("which", ["default", "mid"])
def test_verify_rows_equal_one_row_steps(which, request):
    arm = request.getfixturevalue(f"{which}_arm")
    rng = np.random.default_rng(5)
    toks = [int(t) for t in rng.integers(0, arm.g.embed.rows, 40)]
    p0, kv = 20, {"default": 300, "mid": 310}[which]
    ref = _one_row_run(arm, kv, toks)
    # another sequence to p0, snapshot there, then every window length from it
    _one_row_run(arm, kv + 1, toks[:p0])
    assert spec.gdn_snapshot(arm.hs, kv + 1, p0)
    for n in range(2, 17):
        assert spec.gdn_snapshot_restore(arm.hs, kv + 1, p0)
        got = arm.window(kv + 1, toks[p0:p0 + n], p0)
        for i in range(n):
            assert got[i].tobytes() == ref[p0 + i].tobytes(), (n, i)
    assert spec.gdn_snapshot_restore(arm.hs, kv + 1, p0)
    ids = arm.window(kv + 1, toks[p0:p0 + 7], p0, argmax=True)
    assert ids.tolist() == [int(np.argmax(ref[p0 + i])) for i in range(7)]


@pytest.mark.parametrize("which", ["default", "mid"])
def test_spec_restore_then_decode_equals_plain(which, request):
    arm = request.getfixturevalue(f"{which}_arm")
    rng = np.random.default_rng(6)
    toks = [int(t) for t in rng.integers(0, arm.g.embed.rows, 30)]
    p0, keep, kv = 12, 3, {"default": 400, "mid": 410}[which]
    ref = _one_row_run(arm, kv, toks)
    _one_row_run(arm, kv + 1, toks[:p0])
    drafts = toks[p0:p0 + keep] + [7, 8, 9]
    got = arm.window(kv + 1, drafts, p0)
    assert all(got[i].tobytes() == ref[p0 + i].tobytes() for i in range(keep))
    assert spec.spec_restore(arm.hs, kv + 1, keep - 1, p0, arm.gdn_layers())
    for pos in range(p0 + keep, len(toks)):
        assert arm.token(kv + 1, toks[pos], pos).tobytes() == ref[pos].tobytes(), pos


def test_small_prompt_chunk_then_decode(default_arm):
    arm, g = default_arm, default_arm.g
    prompt = list(range(5000, 5012))
    seq = arm.hm.new_sequence()
    want = arm.hm.run(seq, prompt, head=None).hidden
    h = np.array(arm.hm.embed(prompt), dtype=np.float32)
    out = api.batch(arm.hs, arm.cmf, 700, 0, g.layers, g.invf, h, positions=range(len(prompt)), **arm.geo)
    assert out.ok, out.reason
    assert rel_rms(h, want) <= TOL
    tok = int(np.argmax(arm.hm.head(want[-1:])[0]))
    for pos in range(len(prompt), len(prompt) + 8):
        got = arm.token(700, tok, pos)
        ref = arm.hm.decode(seq, tok)
        assert rel_rms(got, ref) <= TOL and int(np.argmax(got)) == int(np.argmax(ref)), pos
        tok = int(np.argmax(ref))


def test_timed_and_profiled_tokens_equal_the_graph(default_arm, capfd):
    arm, hs = default_arm, default_arm.hs
    toks = [11, 22, 33, 44]
    ref = _one_row_run(arm, 800, toks)
    try:
        # CMF_HYB_KT: the kernels of the next token launched one by one and timed
        hs.kt = hs.counters.tokens_seen + 2
        hs.prof = False
        got = _one_row_run(arm, 801, toks[:3])
        assert "kernel times" in capfd.readouterr().err
        # CMF_CUDA_PROF: stage syncs, direct launches
        hs.prof = True
        got.append(arm.token(801, toks[3], 3))
    finally:
        hs.kt, hs.prof = knobs.get().hyb_kt, knobs.get().cuda_prof
    assert all(a.tobytes() == b.tobytes() for a, b in zip(got, ref))
    assert hs.counters.stage_ns[1].sum() > 0


def test_graph_replay_equals_direct_past_4096_keys(default_arm):
    arm, hs = default_arm, default_arm.hs
    rng = np.random.default_rng(7)
    n0 = 4090
    seq = arm.hm.new_sequence()
    arm.hm.run(seq, rng.integers(0, 248000, n0), head=None)
    layers = arm.g.bind(seq)
    toks = [int(t) for t in rng.integers(0, 248000, 10)]
    recs = []
    try:
        for i, t in enumerate(toks):
            pos = n0 + i
            hs.use_graphs = True
            before = hs.counters.graph_rec
            a = arm.token(500, t, pos, layers if i == 0 else None)
            recs.append(hs.counters.graph_rec - before)
            hs.use_graphs = False
            b = arm.token(501, t, pos, layers if i == 0 else None)
            assert a.tobytes() == b.tobytes(), pos
            want = arm.hm.decode(seq, t)
            assert rel_rms(a, want) <= TOL and int(np.argmax(a)) == int(np.argmax(want)), pos
    finally:
        hs.use_graphs = knobs.get().cuda_graph
    # recorded at the first step, replayed, recorded again where 4097 keys moved the scratch
    # (position 4096, step 6: 4097 keys)
    assert recs[0] == 1 and recs[6] == 1 and sum(recs) == 2, recs


def test_programmatic_launches_equal_plain_ones(default_arm, monkeypatch):
    """The step's kernels launched as programmatic dependents (the default, recorded into the
    graph) give the bytes of plain direct launches (CORTIQ_DRV_PDL=0), 12 steps."""
    arm, hs = default_arm, default_arm.hs
    assert hs.ctx.pdl_ok, hs.ctx.arch
    toks = [int(t) for t in np.random.default_rng(11).integers(0, 248000, 12)]
    try:
        for pos, t in enumerate(toks):
            monkeypatch.delenv("CORTIQ_DRV_PDL", raising=False)
            knobs.reset()
            hs.use_graphs = True
            a = arm.token(510, t, pos)
            monkeypatch.setenv("CORTIQ_DRV_PDL", "0")
            knobs.reset()
            hs.use_graphs = False
            b = arm.token(511, t, pos)
            assert a.tobytes() == b.tobytes(), pos
    finally:
        monkeypatch.delenv("CORTIQ_DRV_PDL", raising=False)
        knobs.reset()
        hs.use_graphs = knobs.get().cuda_graph


def test_declines(default_arm, monkeypatch):
    arm, g = default_arm, default_arm.g
    h = np.zeros(g.hidden, np.float32)
    logits = np.empty(g.lm_rows, np.float32)
    kw = dict(arm.geo, cap=10)
    out = api.token(arm.hs, arm.cmf, 600, g.layers, g.invf, h, position=10, lm_head=(g.lm, g.lm_rows),
                    final_norm=g.final_norm, logits=logits, **kw)
    assert out.status == "declined" and "cap" in out.reason
    bad = dict(arm.geo, nh=34, nkv=2)
    out = api.token(arm.hs, arm.cmf, 600, g.layers, g.invf, h, position=0, lm_head=(g.lm, g.lm_rows),
                    final_norm=g.final_norm, logits=logits, **bad)
    assert out.status == "declined" and "outside the kernels" in out.reason
    monkeypatch.setenv("CMF_GPU_VRAM_MB", "1")
    knobs.reset()
    try:
        fresh = hstate.HState(arm.hs.ctx)
        out = api.token(fresh, arm.cmf, 600, g.layers, g.invf, h, position=0, lm_head=(g.lm, g.lm_rows),
                        final_norm=g.final_norm, logits=logits, **arm.geo)
        assert out.status == "declined" and "do not fit" in out.reason
    finally:
        monkeypatch.delenv("CMF_GPU_VRAM_MB")
        knobs.reset()
