"""The prompt path under `CMF_GPU_VRAM_MB` (hybrid/bigfit.py) on the mid-size model.

A prompt of 1500 rows in one chunk (past the 128-row attention passes, every weight in 1 MiB
expansion bands): unconstrained, then with a budget where the weights fit but the chunk's scratch
only in pieces of 768 rows with one-band expansion (and 16-row passes where attention keeps its
scores in memory, not hy_flash_h): it runs so, within the
budget, and the last row's logits (the host head over the card's last residual row) are within
relative RMS 2e-3 of the unconstrained run's with the same argmax (the GEMMs see other shapes,
so bits may differ). Under a budget below the smallest step it is Declined naming the bytes and
the budget, every state of the sequence still at row 0; the same call without the budget then
gives the unconstrained run's residual rows bit for bit (nothing was half-written). A model
whose weights do not fit: the engine on "cuda" raises Declined, on "auto" runs on the host arm.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import _dev
from cortiq_drv.default_model import build_model
from cortiq_drv.engine import Engine
from cortiq_drv.errors import Declined
from cortiq_drv.hybrid import api, bigfit, spec

pytestmark = pytest.mark.gpu

N = 1500
MiB = 1 << 20
TOL = 2e-3


@pytest.fixture(scope="module")
def arm(tmp_path_factory):
    return _dev.Arm(_dev.write_model(_dev.MID, tmp_path_factory.mktemp("m") / "mid.cmf"))


def _run(arm, kv, ids):
    """The prompt as one api.batch chunk: (outcome, residual rows [n, hidden])."""
    g = arm.g
    h = np.array(arm.hm.embed(ids), dtype=np.float32)
    out = api.batch(arm.hs, arm.cmf, kv, 0, g.layers, g.invf, h, positions=range(len(ids)), **arm.geo)
    return out, h


def _states(hs, kv):
    return ({gs.next_pos for k, gs in hs.gdn.items() if k[0] == kv}, {m.stored for k, m in hs.kv.items() if k[0] == kv})


def test_tight_budget_works_in_pieces_or_declines(arm, env, monkeypatch):
    hs, ctx = arm.hs, arm.hs.ctx
    rng = np.random.default_rng(7)
    ids = [int(t) for t in rng.integers(0, arm.g.lm_rows, N)]
    fits = []
    prepare = bigfit.prepare
    monkeypatch.setattr(bigfit, "prepare", lambda *a: fits.append((a[1], prepare(*a))) or fits[-1][1])
    hs.kv_hint = 0
    env(CMF_HYB_WD_MB=1, CMF_GPU_VRAM_MB=None)
    kv0 = ctx.kv_bytes
    out, h1 = _run(arm, 101, ids)
    assert out.ok, out.reason
    plan, f1 = fits[-1]
    assert f1.cfg == bigfit.BigCfg(N, MiB, 128, 0)
    want = arm.hm.head(h1[-1:])[0]
    kv_seq = ctx.kv_bytes - kv0
    spec.reset(hs, 101)
    other = sum(b.bytes for k, b in hs.scratch.items() if not k.startswith("hb_"))
    fixed = ctx.resident + ctx.kv_bytes + kv_seq + other
    # passes shrink only where attention keeps its scores in memory (not hy_flash_h)
    att = 128 if bigfit.flash(plan, f1.cfg) else 16
    small = bigfit.BigCfg(768, 16 * bigfit.wmax(plan)[1] * 2, att, 0)
    budget = -(-(fixed + sum(bigfit.chunk_need(plan, N, 0, small).values())) // MiB)
    env(CMF_GPU_VRAM_MB=budget)
    out, h2 = _run(arm, 102, ids)
    assert out.ok, out.reason
    assert fits[-1][1].cfg == small
    assert ctx.resident + ctx.kv_bytes + sum(b.bytes for b in hs.scratch.values()) <= budget * MiB
    got = arm.hm.head(h2[-1:])[0]
    err = _dev.rel_rms(got, want)
    print(f"pieces of 768 rows, 1-band expansion, {att}-row passes: logits relative RMS {err:.2e} "
          f"against the unconstrained run (budget {budget} MiB, weights {ctx.resident / MiB:.0f} MiB)")
    assert err <= TOL and int(np.argmax(got)) == int(np.argmax(want)), err
    spec.reset(hs, 102)
    least = sum(bigfit.chunk_need(plan, N, 0, bigfit.BigCfg(64, small.wd_bytes, att, 0)).values())
    low = (fixed + least) // MiB - 1
    env(CMF_GPU_VRAM_MB=low)
    out, _ = _run(arm, 103, ids)
    assert out.status == "declined", out.status
    assert f"budget {low} MiB" in out.reason and "pieces of 64 rows" in out.reason, out.reason
    print(f"declined: {out.reason}")
    assert _states(hs, 103) == ({0}, {0})
    env(CMF_GPU_VRAM_MB=None)
    out, h3 = _run(arm, 103, ids)
    assert out.ok, out.reason
    assert h3.tobytes() == h1.tobytes()
    spec.reset(hs, 103)


def test_weights_past_the_budget_decline_and_the_engine_falls_back(arm, env, tmp_path):
    path = build_model(replace(_dev.MID, seed=4), tmp_path / "mid4.cmf", "mid4")
    # the mid model's weights already fill the budget: the new model's cannot come in
    env(CMF_GPU_VRAM_MB=-(-arm.hs.ctx.resident // MiB))
    prompt = list(range(40))
    e = Engine.open(path, device="cuda")
    with pytest.raises(Declined, match="weights do not fit"):
        list(e.generate(prompt, max_tokens=2, stop_ids=()))
    a = Engine.open(path, device="auto")
    toks = [t.id for t in a.generate(prompt, max_tokens=2, stop_ids=())]
    assert len(toks) == 2 and a.device == "cpu" and "weights do not fit" in a.device_reason, a.device_reason
