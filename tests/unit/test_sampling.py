"""Token choice (cortiq_drv.sampling): greedy, the filters, penalties, seeds and padding."""

import numpy as np
import pytest

from cortiq_drv.errors import CortiqError
from cortiq_drv.sampling import GREEDY, Sampler, Sampling


def _softmax(x):
    e = np.exp(np.asarray(x, np.float64) - np.max(x))
    return e / e.sum()


LOGITS = np.array([1.0, 3.0, 2.5, -1.0, 0.5, 2.9], np.float32)


def test_greedy_is_argmax_and_draws_nothing():
    s = Sampler(GREEDY, 6)
    state = s.rng.bit_generator.state
    assert s(LOGITS) == 1
    assert s.rng.bit_generator.state == state


def test_padding_is_never_chosen():
    x = np.array([0.0, 1.0, 0.5, 50.0, 60.0], np.float32)  # ids 3, 4 are padding
    assert Sampler(GREEDY, 3)(x) == 1
    hot = Sampler(Sampling(temperature=5.0, seed=0), 3)
    assert {hot(x) for _ in range(300)} <= {0, 1, 2}


def test_seed_reproduces_and_differs():
    a = Sampler(Sampling(temperature=1.0, seed=7), 6)
    b = Sampler(Sampling(temperature=1.0, seed=7), 6)
    c = Sampler(Sampling(temperature=1.0, seed=8), 6)
    ra, rb, rc = ([s(LOGITS) for _ in range(50)] for s in (a, b, c))
    assert ra == rb and ra != rc


def test_temperature_draws_follow_softmax():
    s = Sampler(Sampling(temperature=0.7, seed=1), 6)
    n = 20000
    counts = np.bincount([s(LOGITS) for _ in range(n)], minlength=6) / n
    # binomial standard error at n = 20000 is below 0.0036; 0.015 is > 4 of them
    assert np.max(np.abs(counts - _softmax(LOGITS / 0.7))) < 0.015


def test_top_k_top_p_min_p_supports():
    s = Sampler(Sampling(temperature=1.0, top_k=2), 6)
    p = s.probs(LOGITS)
    assert set(np.flatnonzero(p)) == {1, 5}
    np.testing.assert_allclose(p[[1, 5]], _softmax(LOGITS[[1, 5]]), rtol=1e-12)
    full = _softmax(LOGITS)
    order = np.argsort(-full)
    cut = np.searchsorted(np.cumsum(full[order]), 0.8) + 1
    p = Sampler(Sampling(temperature=1.0, top_p=0.8), 6).probs(LOGITS)
    assert set(np.flatnonzero(p)) == set(order[:cut])
    np.testing.assert_allclose(p.sum(), 1.0, rtol=1e-12)
    p = Sampler(Sampling(temperature=1.0, min_p=0.5), 6).probs(LOGITS)
    assert set(np.flatnonzero(p)) == {i for i in range(6) if full[i] >= 0.5 * full.max()}
    assert Sampler(Sampling(temperature=1.0, top_k=1, seed=2), 6)(LOGITS) == 1


def test_penalties():
    rep = Sampler(Sampling(repetition_penalty=2.0), 6)
    x = rep.penalised(LOGITS, [1, 3, 3, 99])
    np.testing.assert_allclose(x, [1.0, 1.5, 2.5, -2.0, 0.5, 2.9])
    assert rep(LOGITS, [1]) == 5
    pres = Sampler(Sampling(presence_penalty=0.5), 6)
    np.testing.assert_allclose(pres.penalised(LOGITS, [5, 5, 2]), [1.0, 3.0, 2.0, -1.0, 0.5, 2.4])
    assert pres(LOGITS, [1]) == 5


@pytest.mark.parametrize("kw", [dict(temperature=-1), dict(top_k=-1), dict(top_p=0), dict(min_p=2),
                                dict(repetition_penalty=0)], ids=lambda kw: next(iter(kw)))
def test_bad_settings_raise(kw):
    with pytest.raises(CortiqError, match=next(iter(kw))):
        Sampling(**kw)
