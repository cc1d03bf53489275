"""The prompt path (`big`, through `api.batch`) against the host arm's prefill.

A prompt of 17..4096 rows goes to the card in chunks (chunk boundaries inside the prompt, a tail
of at most 16 rows on the small path); the last row's logits (the host head over the card's last
residual row) must be within relative RMS 2e-2 of the host prefill's (f16 GEMMs) with the same
argmax. The states it leaves (K/V mirror rows, GDN state at the prompt's end) then continue into
card decode steps (`api.token`) that agree with the host's decode within the same tolerance: after
an f16 prefill the small path's 1e-3 cannot hold, the card's state being the f16 prefill's.
Also with a 1 MiB expansion band (every weight in bands) and 16-row attention passes (the score
GEMMs in place of hy_flash_h).
"""

from __future__ import annotations

import numpy as np
import pytest


pytestmark = pytest.mark.gpu

TOL = 2e-2
DECODE_STEPS = 4


def rel_rms(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all()
    return float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b ** 2)))


_KV = iter(range(1000, 2000))


def _check(arm, n, chunk, seed):
    rng = np.random.default_rng(seed)
    ids = [int(t) for t in rng.integers(0, min(arm.g.lm_rows, 200_000), n)]
    kv = next(_KV)
    seq = arm.hm.new_sequence()
    want = arm.hm.run(seq, ids, head="last").logits[-1]
    h = arm.prefill(kv, ids, chunk)
    got = arm.hm.head(h[-1:])[0]
    err = rel_rms(got, want)
    print(f"n {n} chunk {chunk}: last-row logits relative RMS {err:.2e}")
    assert err <= TOL and int(np.argmax(got)) == int(np.argmax(want)), (err, np.sort(want)[-2:])
    tok = int(np.argmax(want))
    for step in range(DECODE_STEPS):
        w = arm.hm.decode(seq, tok)
        c = arm.token(kv, tok, n + step)
        e = rel_rms(c, w)
        assert e <= TOL and int(np.argmax(c)) == int(np.argmax(w)), (step, e)
        tok = int(np.argmax(w))


@pytest.mark.parametrize("n,chunk", [(17, 17), (100, 40), (300, 128), (1000, 492), (4096, 1024), (4096, 4096)])
def test_default_prompt_matches_host(default_arm, n, chunk):
    _check(default_arm, n, chunk, n + chunk)


@pytest.mark.parametrize("n,chunk", [(600, 256), (4096, 2048)])
def test_mid_prompt_matches_host(mid_arm, n, chunk):
    _check(mid_arm, n, chunk, n + chunk)


def test_bands_and_short_passes(mid_arm, env):
    """Every weight expanded in 1 MiB bands (the stacked GEMMs then one each), attention as the
    score GEMM passes (not hy_flash_h) of 16 rows."""
    env(CORTIQ_DRV_FLASH=0, CMF_HYB_WD_MB=1, CMF_HYB_ATT_ROWS=16)
    _check(mid_arm, 200, 90, 5)
