"""The engine's device choice and its card driver without a GPU.

- device="cuda" without a usable device raises NoDevice naming why; "auto" takes the host arm and
  says why; a model the card cannot take is Declined at open ("cuda") or runs on the host ("auto");
- the card driver (`engine_cuda.CardSeq`) against a stand-in of `hybrid.api` that computes with
  the host arm: the calls it makes (prompt chunks with `defer`, big above NMAX rows and the
  small-path tail, the last row through `token` with the head over the sampled ids, verify windows
  with the pick on the card when greedy, `spec_restore` after a partial acceptance) and the tokens
  it gives (equal to the host arm's, greedy, seeded and speculative); Declined outcomes fall back
  under "auto" and surface under "cuda"; a Failed one stops the generation.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from cortiq_drv import engine_cuda
from cortiq_drv.cli import main
from cortiq_drv.default_model import Shape, build_model
from cortiq_drv.engine import Engine, FarSettings
from cortiq_drv.errors import CortiqError, Declined, NoDevice
from cortiq_drv.graph import BatchGraphOutcome, TokenGraphOutcome
from cortiq_drv.host import HostModel
from cortiq_drv.host.attention import KvRows
from cortiq_drv.hybrid import api, spec
from cortiq_drv.hybrid import state as hstate
from cortiq_drv.sampling import Sampling

# GDN head width 128 and attention width 32: a geometry the hybrid kernels take, small enough for
# the host arm to run in milliseconds.
FIT = Shape(hidden=64, layers=4, full_every=2, heads=2, kv_heads=1, head_dim=32, gdn_k_heads=1,
            gdn_v_heads=1, gdn_head_dim=128, ffn=64, vocab=512, max_positions=4096, seed=4)
# GDN head width 32: outside the kernels.
MISFIT = Shape(hidden=64, layers=4, heads=2, kv_heads=1, head_dim=64, gdn_k_heads=1, gdn_v_heads=2,
               gdn_head_dim=32, ffn=128, vocab=512)
PROMPT = [5, 17, 200, 9, 33, 41, 7, 300, 2, 11, 64, 99, 3, 150, 8, 21, 77, 400, 12, 6]
EXACT = FarSettings()


@pytest.fixture(scope="module")
def fit(tmp_path_factory):
    return build_model(FIT, tmp_path_factory.mktemp("dev") / "fit.cmf")


@pytest.fixture(scope="module")
def misfit(tmp_path_factory):
    return build_model(MISFIT, tmp_path_factory.mktemp("dev") / "misfit.cmf")


@pytest.fixture
def no_device(monkeypatch):
    def raise_(*a):
        raise NoDevice("no CUDA driver: test stand-in")

    monkeypatch.setattr(hstate, "current", raise_)


class HostCard:
    """`api.token`, `api.batch`, `spec.spec_restore`, `spec.reset` / `rewind` computed by the host
    arm over residual rows, recording each call; `decline` / `fail`: (call index, outcome) to
    return."""

    def __init__(self, path):
        self.hm = HostModel.open(path)
        self.calls: list[tuple] = []
        self.seqs: dict = {}
        self.decline_at: int | None = None
        self.fail_at: int | None = None
        self.mtp_declines = False
        c = SimpleNamespace(graph_rec=0, graph_run=0, declines=[], calls_n=[0] * 17)
        self.hs = SimpleNamespace(counters=c, kv_hint=0, ctx=SimpleNamespace(arch="sm_fake"), prof=False,
                                  debug=False)

    def _outcome(self, cls):
        n = len(self.calls) - 1
        if n == self.decline_at:
            return cls.declined("a stand-in decline")
        if n == self.fail_at:
            return cls.failed("a stand-in failure")
        return None

    def _rows(self, kv_id, h, pos0, window):
        """HostModel.run from residual rows: every trunk layer at pos0 (row 0 starts afresh)."""
        hm = self.hm
        if pos0 == 0:
            self.seqs[kv_id] = hm.new_sequence()
        seq = self.seqs[kv_id]
        seq.commit()
        assert seq.pos == pos0, (seq.pos, pos0)
        cos, sin = hm.rope(pos0, len(h))
        tapes = {}
        for i, l in enumerate(hm.graph.layers):
            gdn = hm._gdn.get(i)
            h, rec = hm.layer(h, l, seq.gdn[i] if gdn else seq.kv[i], pos0, cos, sin, window, gdn)
            if rec is not None:
                tapes[i] = rec
        seq.pos = pos0 + len(h)
        if window:
            from cortiq_drv.host.sequence import Window

            seq.window = Window(pos0, len(h), tapes)
        return h

    def token(self, hs, cmf, kv_id, layers, invf, h, *, position, lm_head=None, final_norm=None, logits=None,
              layer_base=0, hidden_too=False, pick=None, **geo):
        self.calls.append(("token", layer_base, position, lm_head[1], pick is not None))
        if layer_base and self.mtp_declines:
            return TokenGraphOutcome.declined("no MTP on this stand-in")
        bad = self._outcome(TokenGraphOutcome)
        if bad is not None:
            return bad
        hm = self.hm
        x = h.reshape(1, -1)
        if layer_base:
            g = hm.graph
            kv = self.seqs.setdefault((kv_id, layer_base), KvRows(g.nkv, g.hd, g.scale))
            kv.truncate(position)
            kv.fill_zero(position)
            cos, sin = hm.rope(position, 1)
            y, _ = hm.layer(x, layers[0], kv, position, cos, sin)
        else:
            y = self._rows(kv_id, x, position, False)
        row = hm.head(y, final_norm)[0, :lm_head[1]]
        if pick is not None:
            # the card's pick: the lowest id among equals, over the head's rows only
            pick[0] = np.argmax(row)
        if logits is not None:
            logits[:lm_head[1]] = row
        if hidden_too:
            h[:] = y[0]
        return TokenGraphOutcome.completed()

    def batch(self, hs, cmf, kv_id, layer_base, layers, invf, h, *, positions, spec=None, argmax_out=None,
              defer=False, **geo):
        positions = list(positions)
        self.calls.append(("batch", len(positions), positions[0], defer, spec is not None,
                           argmax_out is not None))
        bad = self._outcome(BatchGraphOutcome)
        if bad is not None:
            return bad
        y = self._rows(kv_id, h.reshape(len(positions), -1), positions[0], spec is not None)
        if spec is not None:
            logits = self.hm.head(y, spec.final_norm)[:, :spec.lm_rows]
            if argmax_out is not None:
                argmax_out[:] = np.argmax(logits, axis=1)
            else:
                spec.logits_out = logits
        if not defer:
            h.reshape(-1)[:] = y.reshape(-1)
        return BatchGraphOutcome.completed()

    def spec_restore(self, hs, kv_id, slot, base_pos, expected):
        self.calls.append(("restore", slot, base_pos, expected))
        seq = self.seqs[kv_id]
        assert seq.window.pos0 == base_pos
        seq.accept(slot + 1)
        return True


class HostEh:
    """`engine_cuda.CardEh` computed by the host arm: eh_proj over the normed halves, each call
    recorded."""

    def __init__(self, hc: HostCard):
        self.hc = hc

    def __call__(self, halves: np.ndarray) -> np.ndarray:
        self.hc.calls.append(("eh", halves.shape))
        hm = self.hc.hm
        return hm.mm(hm.graph.mtp.eh, halves[None])[0]

    def close(self) -> None:
        pass


@pytest.fixture
def card(fit, monkeypatch):
    hc = HostCard(fit)
    monkeypatch.setattr(engine_cuda, "CardEh", lambda hs, cmf, g: HostEh(hc))
    monkeypatch.setattr(hstate, "current", lambda: hc.hs)
    monkeypatch.setattr(api, "token", hc.token)
    monkeypatch.setattr(api, "batch", hc.batch)
    monkeypatch.setattr(spec, "spec_restore", hc.spec_restore)
    monkeypatch.setattr(spec, "reset", lambda hs, kv_id: None)
    monkeypatch.setattr(spec, "rewind", lambda hs, kv_id, hint=0: None)
    return hc


def toks(engine, **kw):
    kw = {"max_tokens": 24, "stop_ids": (), **kw}
    return [t.id for t in engine.generate(PROMPT, **kw)]


def test_cuda_without_a_device_says_why(fit, no_device, tmp_path, capsys):
    with pytest.raises(NoDevice, match="no usable CUDA device: no CUDA driver: test stand-in"):
        Engine.open(fit, device="cuda")
    e = Engine.open(fit, device="auto")
    assert e.device == "cpu" and e.card is None
    assert "no usable CUDA device" in e.device_reason and "running on the host arm" in e.device_reason
    assert main(["logits", str(fit), "--ids", "1,2", "--out", str(tmp_path / "x.npy"), "--device", "cuda"]) == 1
    assert "no usable CUDA device" in capsys.readouterr().err


def test_a_model_the_card_cannot_take(misfit, fit, card):
    with pytest.raises(Declined, match="GDN geometry"):
        Engine.open(misfit, device="cuda")
    e = Engine.open(misfit, device="auto")
    assert e.device == "cpu" and "GDN geometry" in e.device_reason
    with pytest.raises(Declined, match="far-field seals"):
        Engine.open(fit, device="cuda", far=FarSettings(seal_at=8))
    assert engine_cuda.card_misfit(HostModel.open(fit).graph) is None


def test_prompt_chunks():
    assert engine_cuda.prompt_chunks(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert engine_cuda.prompt_chunks(0, 4) == []
    with pytest.raises(CortiqError, match="at least 1 row"):
        engine_cuda.prompt_chunks(3, 0)


def test_prompt_and_decode_calls(fit, card):
    e = Engine.open(fit, device="cuda", far=EXACT)
    assert e.device == "cuda" and "sm_fake" in e.device_reason
    e.card.chunk = 8
    got = toks(e, max_tokens=4)
    assert got == toks(Engine.open(fit, device="cpu", far=EXACT), max_tokens=4)
    # rows 0..18 in chunks of 8 with nothing back (big past NMAX rows, the small path below), then
    # the last row through token with the head over the 512 sampled ids (its logits back), then
    # one step a token, greedy: the pick on the card, only the id back
    assert card.calls == [("batch", 8, 0, True, False, False), ("batch", 8, 8, True, False, False),
                          ("batch", 3, 16, True, False, False), ("token", 0, 19, 512, False),
                          ("token", 0, 20, 512, True), ("token", 0, 21, 512, True), ("token", 0, 22, 512, True)]
    assert card.hs.kv_hint == len(PROMPT) + 4


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.9, top_k=40, seed=3),
                                      Sampling(repetition_penalty=1.3, presence_penalty=0.5)],
                         ids=["greedy", "seeded", "greedy-penalised"])
def test_card_tokens_equal_the_host_arm(fit, card, sampling):
    host = Engine.open(fit, device="cpu", far=EXACT)
    e = Engine.open(fit, device="cuda", far=EXACT)
    plain = toks(host, sampling=sampling)
    assert toks(e, sampling=sampling) == plain
    # the decode steps pick on the card exactly when the pick needs no logits
    steps = [x for x in card.calls if x[0] == "token"][1:]
    assert len(steps) == 23 and all(x[4] == (not sampling.needs_logits) for x in steps)
    card.calls.clear()
    assert toks(e, sampling=sampling, spec_k=3) == plain
    c = e.counters
    assert c.verify_rounds > 0 and e.card.mtp_on_host is None
    windows = [x for x in card.calls if x[0] == "batch" and x[4]]
    assert windows and all(x[5] == (not sampling.needs_logits) for x in windows)
    drafts = [x for x in card.calls if x[0] == "token" and x[1] == FIT.layers]
    assert len(drafts) == c.drafts_proposed and all(x[4] for x in drafts)
    # each draft's eh projection on the card, over both normed halves
    assert card.calls.count(("eh", (2 * FIT.hidden,))) == len(drafts)
    # every round either kept its whole window or restored every GDN layer to its start
    restores = [x for x in card.calls if x[0] == "restore"]
    assert all(x[3] == e.card.n_gdn == 2 for x in restores)
    assert 0 < len(restores) == c.verify_rounds - _full_rounds(card.calls)


def _full_rounds(calls) -> int:
    """Verify windows not followed by a restore (every draft kept)."""
    n = 0
    for i, x in enumerate(calls):
        if x[0] == "batch" and x[4]:
            nxt = next((y for y in calls[i + 1:] if y[0] in ("restore", "batch")), None)
            n += nxt is None or nxt[0] != "restore"
    return n


def test_mtp_declined_drafts_on_the_host(fit, card):
    card.mtp_declines = True
    e = Engine.open(fit, device="cuda", far=EXACT)
    plain = toks(Engine.open(fit, device="cpu", far=EXACT))
    assert toks(e, spec_k=2) == plain
    assert "no MTP on this stand-in" in e.card.mtp_on_host


def test_declined_prompt_falls_back_under_auto(fit, card):
    plain = toks(Engine.open(fit, device="cpu", far=EXACT))
    card.decline_at = 0
    e = Engine.open(fit, device="cuda", far=EXACT)
    with pytest.raises(Declined, match="prompt rows 0..19: a stand-in decline"):
        toks(e)
    card.calls.clear()
    e = Engine.open(fit, device="auto", far=EXACT)
    assert e.device == "cuda"
    assert toks(e) == plain
    assert e.device == "cpu" and "a stand-in decline" in e.device_reason
    card.calls.clear()
    assert e.logits(PROMPT[:3]).shape == (3, 512) and card.calls == []


def test_decode_outcomes_surface(fit, card):
    card.decline_at = 3
    e = Engine.open(fit, device="auto", far=EXACT)
    with pytest.raises(Declined, match="decode at row 21: a stand-in decline"):
        toks(e)
    card.calls.clear()
    card.decline_at, card.fail_at = None, 2
    with pytest.raises(CortiqError, match="decode at row 20 failed on the card .a stand-in failure"):
        toks(e)


def test_logits_on_the_card(fit, card):
    e = Engine.open(fit, device="cuda", far=EXACT)
    ids = PROMPT + PROMPT[:5]
    got = e.logits(ids)
    want = Engine.open(fit, device="cpu", far=EXACT).logits(ids)
    assert got.shape == want.shape == (25, 512)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # windows of NMAX rows with the head over every row
    assert [c[:5] for c in card.calls] == [("batch", 16, 0, False, True), ("batch", 9, 16, False, True)]


def test_card_eh_on_a_fake_card(hyb_tiny):
    """CardEh: the eh matrix repacked once into the arm's store, then per call the halves
    uploaded, one hy_split and one matvec launch over planes 2 hidden wide, the row back; the
    same buffers every call."""
    import _fakecard
    from cortiq_drv.hybrid.plan import plan_for

    cmf, g = hyb_tiny
    hs, ctx, card = _fakecard.fake_state()
    plan_for(hs, cmf, g.layers, 0, None, None, g.nh, g.nkv, g.hd, g.rd, g.hidden, g.gemma, g.eps, g.scale,
             g.invf, 0)
    eh = engine_cuda.CardEh(hs, cmf, g)
    assert (cmf.uid, g.mtp.eh.idx) in hs.store().mats
    ptrs = [b.ptr for b in eh.mv.bufs]
    # one row a call: staging row, output row and the three planes of one row
    assert [b.bytes for b in eh.mv.bufs] == [2 * g.hidden * 4, g.hidden * 4, *[2 * g.hidden * 2] * 3]
    for _ in range(2):
        ctx.launches.clear()
        assert eh(np.ones(2 * g.hidden, np.float32)).shape == (g.hidden,)
        names = [l.name for l in ctx.launches]
        assert names == ["hy_split", "hy_mmp"]
        assert ctx.launches[0].grid[0] == -(-2 * g.hidden // 256)
    assert [b.ptr for b in eh.mv.bufs] == ptrs
    with pytest.raises(CortiqError, match="eh projection: rows of width"):
        eh(np.ones(g.hidden, np.float32))
    from cortiq_drv.hybrid import mma

    with pytest.raises(CortiqError, match=r"17 rows a launch, the matvec takes 1\.\.16"):
        mma.RowsMatvec(ctx, None, eh.mv.m, chunk=17)
    eh.close()
