"""The prompt path (`big`, through `api.batch`) against the host arm's prefill.

A prompt of 17..4096 rows goes to the card in chunks (chunk boundaries inside the prompt, a tail
of at most 16 rows on the small path); the last row's logits (the host head over the card's last
residual row) must be within relative RMS 2e-2 of the host prefill's (f16 GEMMs) with the same
argmax. The states it leaves (K/V mirror rows, GDN state at the prompt's end) then continue into
card decode steps (`api.token`) that agree with the host's decode within the same tolerance: after
an f16 prefill the small path's 1e-3 cannot hold, the card's state being the f16 prefill's.
Also with a 1 MiB expansion band (every weight in bands) and 16-row attention passes.
"""

from __future__ import annotations

import numpy as np
import pytest

from cortiq_drv import knobs
from cortiq_drv.cmf import CmfFile, CmfWriter
from cortiq_drv.default_model import SHAPES, Shape, header, tensor_payloads
from cortiq_drv.host.model import HostModel
from cortiq_drv.hybrid import api
from cortiq_drv.hybrid import state as hstate

pytestmark = pytest.mark.gpu

MID = Shape(hidden=1024, layers=8, heads=8, kv_heads=2, head_dim=256, gdn_k_heads=4, gdn_v_heads=8,
            gdn_head_dim=128, ffn=3072, vocab=16384, seed=3)
CAP = 262_144
TOL = 2e-2
DECODE_STEPS = 4


def _write(shape: Shape, path):
    with CmfWriter(path) as w:
        for name, dtype, tshape, payload in tensor_payloads(shape):
            w.add(name, dtype, tshape, payload)
        w.set_header(header(shape, "test"))
    return path


def rel_rms(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.isfinite(a).all()
    return float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b ** 2)))


class Arm:
    """A model on both arms: the host model for reference, the card through `api`."""

    def __init__(self, path):
        self.cmf = CmfFile.open(path)
        self.hm = HostModel(self.cmf)
        self.g = g = self.hm.graph
        self.hs = hstate.current()
        self.geo = dict(nh=g.nh, nkv=g.nkv, hd=g.hd, rd=g.rd, hidden=g.hidden, cap=CAP, gemma=g.gemma,
                        eps=g.eps, attn_scale=g.scale)

    def prefill(self, kv_id, ids, chunk):
        """The prompt on the card in chunks; the residual rows of the last chunk."""
        g, pos = self.g, 0
        for c0 in range(0, len(ids), chunk):
            part = ids[c0:c0 + chunk]
            h = np.array(self.hm.embed(part), dtype=np.float32)
            last = c0 + len(part) == len(ids)
            out = api.batch(self.hs, self.cmf, kv_id, 0, g.layers, g.invf, h,
                            positions=range(pos, pos + len(part)), defer=not last, **self.geo)
            assert out.ok, out.reason
            pos += len(part)
        return h

    def token(self, kv_id, tok, pos):
        g = self.g
        h = np.array(self.hm.embed([tok])[0], dtype=np.float32)
        logits = np.empty(g.lm_rows, np.float32)
        out = api.token(self.hs, self.cmf, kv_id, g.layers, g.invf, h, position=pos,
                        lm_head=(g.lm, g.lm_rows), final_norm=g.final_norm, logits=logits, **self.geo)
        assert out.ok, out.reason
        return logits


@pytest.fixture(scope="module")
def default_arm(tmp_path_factory):
    return Arm(_write(SHAPES["default"], tmp_path_factory.mktemp("m") / "default.cmf"))


@pytest.fixture(scope="module")
def mid_arm(tmp_path_factory):
    return Arm(_write(MID, tmp_path_factory.mktemp("m") / "mid.cmf"))


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


def test_bands_and_short_passes(mid_arm, monkeypatch):
    """Every weight expanded in 1 MiB bands, attention in 16-row passes."""
    monkeypatch.setenv("CMF_HYB_WD_MB", "1")
    monkeypatch.setenv("CMF_HYB_ATT_ROWS", "16")
    knobs.reset()
    try:
        _check(mid_arm, 200, 90, 5)
    finally:
        monkeypatch.undo()
        knobs.reset()
