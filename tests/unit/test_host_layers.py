"""The host arm's layer kinds against the independent float64 reference of tests/unit/_ref64.py.

Tolerance: relative RMS error below 2e-5 (float32 math against float64 on O(1) values), NaN fails.
"""

import numpy as np
import pytest

from cortiq_drv.host.attention import AttnConsts, AttnGeom, KvRows, attention_mixer
from cortiq_drv.host.gdn import GdnConsts, GdnDims, GdnState, gdn_layer, gdn_mixer
from cortiq_drv.host.model import dense_ffn
from cortiq_drv.graph import rope_inv_freq
from cortiq_drv.host.ops import rms_norm, rope_tables

import _ref64 as ref
from _ref64 import rel_rms

TOL = 2e-5


def gdn_weights(rng, hidden, nk, nv, dk, dv, kk):
    cdim = 2 * nk * dk + nv * dv
    f = lambda *s, sc=1.0: (rng.standard_normal(s) * sc).astype(np.float32)
    return {
        "in_proj_qkv": f(cdim, hidden, sc=hidden ** -0.5),
        "in_proj_z": f(nv * dv, hidden, sc=hidden ** -0.5),
        "in_proj_a": f(nv, hidden, sc=hidden ** -0.5),
        "in_proj_b": f(nv, hidden, sc=hidden ** -0.5),
        "A_log": f(nv, sc=0.5),
        "dt_bias": f(nv, sc=0.5),
        "conv1d": f(cdim, 1, kk, sc=0.5),
        "norm": (1 + f(dv, sc=0.1)),
        "out_proj": f(hidden, nv * dv, sc=(nv * dv) ** -0.5),
    }


@pytest.mark.parametrize("nk,nv,kk,t", [(2, 2, 4, 1), (2, 4, 4, 17), (1, 3, 1, 5), (2, 4, 2, 16)],
                         ids=["one-row", "gqa-17", "kk1", "kk2-16"])
def test_gdn_layer_matches_float64(nk, nv, kk, t):
    rng = np.random.default_rng(7)
    hidden, dk, dv = 48, 16, 8
    w = gdn_weights(rng, hidden, nk, nv, dk, dv, kk)
    x = rng.standard_normal((t, hidden)).astype(np.float32)
    got = gdn_layer(x, w, nk=nk, nv=nv, dk=dk, dv=dv, kk=kk, eps=1e-6)
    want, _ = ref.gdn(x, w, nk, nv, dk, dv, kk, 1e-6)
    assert got.shape == (t, hidden) and got.dtype == np.float32
    assert rel_rms(got, want) < TOL


def test_gdn_flat_conv_and_state_layout():
    """conv1d given flat gives the same rows; the state is [ring (kk-1)*cdim | S nv*dk*dv] with the
    ring the last kk-1 raw rows oldest first and S the reference's S per value head."""
    rng = np.random.default_rng(3)
    hidden, nk, nv, dk, dv, kk, t = 32, 1, 2, 8, 8, 4, 6
    w = gdn_weights(rng, hidden, nk, nv, dk, dv, kk)
    x = rng.standard_normal((t, hidden)).astype(np.float32)
    flat = dict(w, conv1d=w["conv1d"].reshape(-1))
    a = gdn_layer(x, w, nk=nk, nv=nv, dk=dk, dv=dv, kk=kk, eps=1e-6)
    b = gdn_layer(x, flat, nk=nk, nv=nv, dk=dk, dv=dv, kk=kk, eps=1e-6)
    assert np.array_equal(a, b)
    dims = GdnDims(nk, nv, dk, dv, kk)
    c = GdnConsts(w["conv1d"].reshape(dims.cdim, kk), w["A_log"], w["dt_bias"], w["norm"])
    st = GdnState(dims)
    mm = lambda key, v: v @ {"qkv": w["in_proj_qkv"], "z": w["in_proj_z"], "a": w["in_proj_a"],
                             "b": w["in_proj_b"], "out": w["out_proj"]}[key].T
    gdn_mixer(x, mm, c, st, 1e-6)
    _, (hist, S) = ref.gdn(x, w, nk, nv, dk, dv, kk, 1e-6)
    ring = st.buf[:dims.ring_n].reshape(kk - 1, dims.cdim)
    assert rel_rms(ring, np.array(hist)) < TOL
    assert rel_rms(st.buf[dims.ring_n:].reshape(nv, dk, dv), S) < TOL


@pytest.mark.parametrize("gemma", [False, True], ids=["qwen", "gemma"])
def test_rms_norm_both_styles(gemma):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    w = (rng.standard_normal(64) * 0.3).astype(np.float32)
    assert rel_rms(rms_norm(x, w, 1e-6, gemma), ref.rms(x, w, 1e-6, gemma)) < TOL


def attn_weights(rng, hidden, nh, nkv, hd, gated):
    f = lambda *s, sc=1.0: (rng.standard_normal(s) * sc).astype(np.float32)
    return {
        "q_proj": f(nh * hd * (2 if gated else 1), hidden, sc=hidden ** -0.5),
        "k_proj": f(nkv * hd, hidden, sc=hidden ** -0.5),
        "v_proj": f(nkv * hd, hidden, sc=hidden ** -0.5),
        "o_proj": f(hidden, nh * hd, sc=(nh * hd) ** -0.5),
        "q_norm": f(hd, sc=0.2),
        "k_norm": f(hd, sc=0.2),
    }


@pytest.mark.parametrize("gated,gemma,norms,chunks", [
    (True, True, True, (9,)), (True, True, True, (4, 1, 5)), (False, False, True, (3, 6)),
    (True, False, False, (1, 1, 2))], ids=["gated-prefill", "gated-chunks", "plain-qwen", "no-qk-norm"])
def test_gated_attention_matches_float64(gated, gemma, norms, chunks):
    """Partial rotary (rd = hd / 4), GQA (4 query heads on 2 KV heads), rows in chunks."""
    rng = np.random.default_rng(11)
    hidden, nh, nkv, hd, theta = 64, 4, 2, 32, 10000.0
    rd = hd // 4
    w = attn_weights(rng, hidden, nh, nkv, hd, gated)
    if not norms:
        del w["q_norm"], w["k_norm"]
    t = sum(chunks)
    x = rng.standard_normal((t, hidden)).astype(np.float32)
    geom = AttnGeom(nh, nkv, hd, rd, hd ** -0.5, 1e-6, gemma)
    c = AttnConsts(w.get("q_norm"), w.get("k_norm"), gated)
    names = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj"}
    mm = lambda key, v: v @ w[names[key]].T
    kv = KvRows(nkv, hd, hd ** -0.5, nh=nh, cap=2)
    invf = rope_inv_freq(theta, rd)
    outs, p = [], 0
    for n in chunks:
        cos, sin = rope_tables(invf, np.arange(p, p + n))
        outs.append(attention_mixer(x[p:p + n], mm, c, geom, kv, p, cos, sin))
        p += n
    got = np.concatenate(outs)
    want = ref.attention(x, w, list(range(t)), ([], []), nh=nh, nkv=nkv, hd=hd, rd=rd,
                         theta=theta, eps=1e-6, gemma=gemma)
    assert kv.n == t
    k, v, q = kv.rows()
    assert k.shape == v.shape == (t, nkv, hd) and q.shape == (t, nh, hd)
    assert rel_rms(got, want) < TOL


def test_dense_ffn_matches_float64():
    rng = np.random.default_rng(4)
    hidden, inter = 64, 96
    w = {"gate_proj": rng.standard_normal((inter, hidden)).astype(np.float32) / 8,
         "up_proj": rng.standard_normal((inter, hidden)).astype(np.float32) / 8,
         "down_proj": rng.standard_normal((hidden, inter)).astype(np.float32) / 10}
    x = rng.standard_normal((7, hidden)).astype(np.float32)
    got = dense_ffn(x, lambda key, v: v @ w[key + "_proj"].T)
    assert rel_rms(got, ref.ffn(x, w)) < TOL
