"""The engine (cortiq_drv.engine) end to end on the tiny CMF of `_tiny.py`.

Host-path comparisons: logits of one call are compared bit for bit; chunked against one call
within relative RMS 1e-5 (float32 reorderings) with argmax equal.
"""

import numpy as np
import pytest

import _tiny
from _ref64 import rel_rms
from _tiny_vocab import write_tiny_vocab
from cortiq_drv.engine import Engine, FarSettings
from cortiq_drv.errors import CortiqError
from cortiq_drv.host import HostModel
from cortiq_drv.nystrom import FarLayer
from cortiq_drv.sampling import Sampling

PROMPT = [5, 17, 300, 2, 99, 411, 23, 8, 150, 77, 3, 42, 250, 9, 64, 128, 33, 7, 200, 61]
EXACT = FarSettings()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return _tiny.write_tiny(tmp_path_factory.mktemp("eng") / "tiny.cmf")


@pytest.fixture(scope="module")
def engine(tiny):
    return Engine.open(tiny, far=EXACT)


def ids(engine, prompt=PROMPT, **kw):
    kw.setdefault("stop_ids", ())
    return [t.id for t in engine.generate(prompt, **kw)]


def oracle(engine, want, prompt_len, wrong_every=3):
    """A drafter that proposes the known continuation `want` (every draft accepted), except that
    in every `wrong_every`-th round its second draft is wrong (partial acceptance)."""
    rounds = []

    def draft(seq, hidden, token, position, k, rows=None):
        j = position - prompt_len
        d = list(want[j + 1:j + 1 + k]) + [0] * k
        d = d[:k]
        if len(rounds) % wrong_every == 1 and k > 1:
            d[1] = (d[1] + 1) % rows
        rounds.append(j)
        return d

    return draft


def test_logits_are_the_host_prefill(engine, tiny):
    got = engine.logits(PROMPT)
    m = HostModel.open(tiny)
    want = m.prefill(m.new_sequence(), PROMPT)
    assert got.dtype == np.float32 and got.shape == (len(PROMPT), 512)
    assert np.array_equal(got, want)
    chunked = Engine.open(tiny, far=EXACT, chunk=7).logits(PROMPT)
    assert rel_rms(chunked, want) < 1e-5
    assert np.array_equal(chunked.argmax(-1), want.argmax(-1))


@pytest.mark.parametrize("k", [1, 3], ids=lambda k: f"k{k}")
def test_mtp_drafts_keep_the_greedy_text(engine, k):
    plain = ids(engine, max_tokens=20)
    assert len(plain) == 20
    assert ids(engine, max_tokens=20, spec_k=k) == plain
    c = engine.counters
    assert c.verify_rounds > 0 and c.drafts_proposed >= c.verify_rounds


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.9, top_k=40, seed=11)],
                         ids=["greedy", "seeded"])
def test_accepted_drafts_give_the_same_tokens(engine, monkeypatch, sampling):
    plain = ids(engine, max_tokens=24, sampling=sampling)
    monkeypatch.setattr(engine.model, "mtp_draft", oracle(engine, plain, len(PROMPT)))
    spec = ids(engine, max_tokens=24, sampling=sampling, spec_k=3)
    c = engine.counters
    assert spec == plain
    assert 0 < c.drafts_accepted < c.drafts_proposed
    # every round emits its accepted drafts and one token of its own
    assert c.verify_rounds + c.drafts_accepted >= 23


def test_seed_reproduces(engine):
    s = Sampling(temperature=1.0, top_p=0.9, seed=5)
    a, b = ids(engine, max_tokens=12, sampling=s), ids(engine, max_tokens=12, sampling=s)
    assert a == b and a != ids(engine, max_tokens=12, sampling=Sampling(temperature=1.0, top_p=0.9, seed=6))


def test_stop_ids_end_generation(engine):
    plain = ids(engine, max_tokens=20)
    stop = plain[6]
    got = ids(engine, max_tokens=20, stop_ids=(stop,), spec_k=2)
    assert got == plain[:plain.index(stop) + 1]
    assert len(ids(engine, max_tokens=5)) == 5


def test_padding_is_never_sampled(tiny):
    class Padded(Engine):
        valid = 100

    e = Padded.open(tiny, far=EXACT)
    full = ids(Engine.open(tiny, far=EXACT), max_tokens=16)
    assert max(full) >= 100  # the unmasked head does pick the ids masked below
    for kw in (dict(), dict(spec_k=2), dict(sampling=Sampling(temperature=2.0, seed=1))):
        assert max(ids(e, max_tokens=16, **kw)) < 100


def test_text_generation_and_padding_from_the_tokenizer(tmp_path):
    e = Engine.open(write_tiny_vocab(tmp_path / "v.cmf", words=300), far=EXACT)
    assert e.valid == 301
    toks = list(e.generate("w5 w17 w200 w9 w33", max_tokens=12, stop_ids=()))
    assert len(toks) == 12 and max(t.id for t in toks) <= 300
    assert "".join(t.text for t in toks).strip() == e.tokenizer.decode([t.id for t in toks])
    chat = list(e.chat([{"role": "user", "content": "w3 w4"}], max_tokens=3, stop_ids=()))
    assert len(chat) == 3


def test_errors(tiny, tmp_path, engine):
    with pytest.raises(CortiqError, match="no such model file"):
        Engine.open(tmp_path / "missing.cmf")
    with pytest.raises(CortiqError, match="'tpu'"):
        Engine.open(tiny, device="tpu")
    assert "running on the host arm" in Engine.open(tiny).device_reason
    with pytest.raises(CortiqError, match="token id 512 is not in the vocabulary"):
        engine.logits([1, 512])
    with pytest.raises(CortiqError, match="empty prompt"):
        ids(engine, prompt=[])
    with pytest.raises(CortiqError, match="spec_k 16"):
        engine.generate(PROMPT, spec_k=16)
    with pytest.raises(CortiqError, match="max_tokens 0"):
        engine.generate(PROMPT, max_tokens=0)


def test_context_limit(tmp_path):
    e = Engine.open(_tiny.write_tiny(tmp_path / "c.cmf", max_position_embeddings=24), far=EXACT)
    with pytest.raises(CortiqError, match="25 tokens, past the context limit of 24"):
        e.logits(list(range(25)))
    # 20 prompt rows: tokens are chosen from rows 19 .. 23, the last row the context has
    assert len(ids(e, max_tokens=50)) == 5
    assert len(ids(e, max_tokens=50, spec_k=3)) == 5


def test_sealed_layer_with_the_whole_ring_is_exact(tiny, engine):
    far = FarSettings(seal_at=8, w=64, sink=2, m=8)
    e = Engine.open(tiny, far=far, chunk=5)
    got = e.logits(PROMPT)
    assert e.counters.sealed_layers == (3,)
    want = engine.logits(PROMPT)
    assert rel_rms(got, want) < 1e-5 and np.array_equal(got.argmax(-1), want.argmax(-1))


def test_sealed_layer_generates_with_drafts(tiny, monkeypatch):
    e = Engine.open(tiny, far=FarSettings(seal_at=12, w=6, sink=2, m=8, layers=(3,)), chunk=5)
    plain = ids(e, max_tokens=16)
    seq = e.new_sequence()
    e.prefill(seq, PROMPT)
    assert isinstance(seq.kv[3], FarLayer) and seq.kv[3].groups[0].far_len == len(PROMPT) - 2 - 6
    assert ids(e, max_tokens=16, spec_k=2) == plain
    monkeypatch.setattr(e.model, "mtp_draft", oracle(e, plain, len(PROMPT)))
    assert ids(e, max_tokens=16, spec_k=3) == plain
    assert e.counters.drafts_accepted > 0
    with pytest.raises(CortiqError, match="layer 1 is not an attention layer"):
        Engine.open(tiny, far=FarSettings(seal_at=4, layers=(1,))).logits(PROMPT)


def test_drafts_need_an_mtp_block(tmp_path):
    path = _tiny.write_tiny(tmp_path / "n.cmf", mtp={"num_layers": 0, "share_lm_head": True,
                                                      "share_embed": True})
    e = Engine.open(path, far=EXACT)
    assert len(ids(e, max_tokens=3)) == 3
    with pytest.raises(CortiqError, match="needs an MTP block"):
        e.generate(PROMPT, spec_k=2)
