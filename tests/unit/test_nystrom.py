"""The far field (cortiq_drv.nystrom) against direct float64 matrix computations written here."""

import numpy as np
import pytest

from _ref64 import rel_rms
from cortiq_drv.errors import CortiqError, Declined
from cortiq_drv.nystrom import FarLayer, NystromState, landmark_count, stream_attention


def _causal(q, k, v):
    """Exact causal softmax attention in float64, scale 1/sqrt(d)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    s = q @ k.T / np.sqrt(k.shape[1])
    s = np.where(np.tril(np.ones(s.shape, bool)), s, -np.inf)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p @ v) / p.sum(axis=1, keepdims=True)


def _direct(q, k, v, *, m, w, sink, prefill, rect_fm=False):
    """The far-field operator as matrices, row by row, float64: landmarks, the ridge pseudo-inverse,
    near keys (sinks and the last w others) exact, far keys through F M B."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    T, d = k.shape
    sc = 1 / np.sqrt(d)
    me = min(max(prefill // 8, 4), m)
    seg = [(i * prefill // me, (i + 1) * prefill // me) for i in range(me)]
    kt = np.stack([k[a:b].mean(0) for a, b in seg])
    qt = np.stack([q[a:b].mean(0) for a, b in seg])
    A = np.exp(qt @ kt.T * sc)
    ata = A.T @ A
    M = np.linalg.solve(ata + 1e-6 * np.mean(np.diag(ata)) * np.eye(me), A.T)
    out = np.empty((T, v.shape[1]))
    for r in range(T):
        idx = np.arange(T)
        near = (idx <= r) & ((idx < sink) | (idx > r - w))
        far = (idx <= r) & ~near
        e = np.exp(q[r] @ k[near].T * sc)
        num, den = e @ v[near], e.sum()
        if far.any():
            u = np.exp(q[r] @ kt.T * sc) @ M
            if rect_fm:
                u = np.maximum(u, 0)
            B = np.exp(qt @ k[far].T * sc)  # [m, nfar]
            fden = u @ B.sum(1)
            if fden >= 0:
                num, den = num + u @ B @ v[far], den + fden
        out[r] = num / den
    return out


def _exact_skeleton(rng, T, d, me, seg):
    """Rows whose queries and keys are one of `me` fixed vectors, the first me*seg rows in segments
    of `seg` equal rows: the landmarks are those vectors and the skeleton reproduces exp(q k^T)."""
    basis = np.linalg.qr(rng.standard_normal((d, d)))[0][:me]  # orthonormal rows
    qv, kv = 1.5 * np.sqrt(d) * basis, 1.2 * np.sqrt(d) * basis[::-1]
    which = np.concatenate([np.repeat(np.arange(me), seg), rng.integers(0, me, T - me * seg)])
    return qv[which], kv[which], rng.standard_normal((T, d))


def test_landmark_count_clamps():
    assert [landmark_count(p, 32) for p in (4, 31, 40, 100, 256, 5000)] == [4, 4, 5, 12, 32, 32]
    assert landmark_count(1000, 6) == 6


@pytest.mark.parametrize("rect_fm", [False, True], ids=["plain", "rect"])
def test_exact_skeleton_gives_exact_attention(rect_fm):
    rng = np.random.default_rng(1)
    me, seg, T, d = 8, 8, 150, 16
    q, k, v = _exact_skeleton(rng, T, d, me, seg)
    out = stream_attention(q, k, v, m=me, w=16, sink=4, prefill=me * seg, rect_fm=rect_fm)
    # the ridge (1e-6 of the mean diagonal) is the only approximation left
    assert rel_rms(out, _causal(q, k, v)) < 1e-4


@pytest.mark.parametrize("T,w,sink,prefill,m", [
    (97, 16, 4, 64, 32), (200, 32, 4, 200, 32), (33, 8, 0, 33, 8), (60, 1, 2, 17, 4), (40, 64, 4, 40, 32),
], ids=["T97", "prefill-all", "no-sink", "w1", "ring-only"])
@pytest.mark.parametrize("rect_fm", [False, True], ids=["plain", "rect"])
def test_stream_matches_direct_operator(T, w, sink, prefill, m, rect_fm):
    rng = np.random.default_rng(T + w)
    d, dv = 16, 12
    q, k, v = (rng.standard_normal((T, x)) for x in (d, d, dv))
    out = stream_attention(q, k, v, m=m, w=w, sink=sink, prefill=prefill, rect_fm=rect_fm)
    assert out.shape == (T, dv) and out.dtype == np.float32
    assert rel_rms(out, _direct(q, k, v, m=m, w=w, sink=sink, prefill=prefill, rect_fm=rect_fm)) < 2e-5


def test_ring_only_is_causal_attention():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((50, 8)) for _ in range(3))
    assert rel_rms(stream_attention(q, k, v, m=32, w=64, sink=4, prefill=50), _causal(q, k, v)) < 1e-6


def _rows(rng, T, nkv=2, hpk=2, d=16, dv=16):
    return (rng.standard_normal((T, nkv * hpk, d)).astype(np.float32),
            rng.standard_normal((T, nkv, d)).astype(np.float32),
            rng.standard_normal((T, nkv, dv)).astype(np.float32))


@pytest.mark.parametrize("t", [5, 20, 23, 24, 25, 90], ids=lambda t: f"t{t}")
def test_seal_from_rows_equals_streaming(t):
    """Sealing t rows in bulk leaves the state streaming them leaves; later rows read the same."""
    rng = np.random.default_rng(t)
    T, sink, w, m = t + 12, 4, 20, 8
    q, k, v = _rows(rng, T)
    layer = FarLayer.seal(k[:t], v[:t], q[:t], prefill=t, m=m, w=w, sink=sink)
    assert layer.n == t
    tail = layer.attend(q[t:], k[t:], v[t:])
    for g, st in enumerate(layer.groups):
        ref = NystromState(m, w, sink, 2, 16, 16)
        ref.skeleton(k[:, g], q[:, 2 * g:2 * g + 2], t)
        for r in range(T):
            ref.advance(k[r, g], v[r, g])
        for name in ("sink_len", "win_len", "win_head", "far_len"):
            assert getattr(st, name) == getattr(ref, name), name
        assert np.array_equal(st.ring_k, ref.ring_k) and np.array_equal(st.sink_v, ref.sink_v)
        np.testing.assert_allclose(st.z * np.exp(st.m_max), ref.z * np.exp(ref.m_max), rtol=1e-5)
        for j in range(2):
            h = 2 * g + j
            want = stream_attention(q[:, h], k[:, g], v[:, g], m=m, w=w, sink=sink, prefill=t)[t:]
            # bulk and one-by-one far sums round differently; random data amplifies it
            assert rel_rms(tail[:, h], want) < 1e-4


def test_snapshot_restore_replays_bit_for_bit():
    rng = np.random.default_rng(3)
    q, k, v = _rows(rng, 80)
    layer = FarLayer.seal(k[:60], v[:60], q[:60], prefill=60, m=8, w=16, sink=4)
    snap = layer.snapshot()
    first = layer.attend(q[60:66], k[60:66], v[60:66])
    after = [g.snapshot() for g in layer.groups]
    layer.restore(snap)
    again = layer.attend(q[60:66], k[60:66], v[60:66])
    assert np.array_equal(first, again)
    layer.restore(snap)
    layer.advance(k[60:62], v[60:62])
    assert np.array_equal(layer.attend(q[62:66], k[62:66], v[62:66]), first[2:])
    # truncate: a verify window of 4 rows keeps 1, then the next rows read as without it
    layer.restore(snap)
    layer.attend(q[60:64], k[60:64], v[60:64])
    layer.truncate(61)
    assert layer.n == 61
    assert np.array_equal(layer.attend(q[61:66], k[61:66], v[61:66]), first[1:])
    with pytest.raises(CortiqError, match="cannot go back"):
        layer.truncate(60)
    for g, s in zip(layer.groups, after):
        assert all(np.array_equal(a, b) for a, b in zip(g.snapshot().arrays, s.arrays))
        assert g.snapshot().counters == s.counters


def test_device_view_layout():
    rng = np.random.default_rng(4)
    t, sink, w, m = 70, 4, 16, 32
    q, k, v = _rows(rng, t)
    views = FarLayer.seal(k, v, q, prefill=t, m=m, w=w, sink=sink).device_views()
    assert len(views) == 2
    for g, vw in enumerate(views):
        assert (vw.m_eff, vw.sink_len, vw.w, vw.win_len, vw.far_len) == (8, 4, 16, 16, 50)
        assert vw.win_head == (t - sink) % w and vw.scale == pytest.approx(0.25)
        assert np.array_equal(vw.sink_k, k[:4, g])
        # ring slot s holds the newest row r with (r - sink) % w == s
        for s in range(w):
            r = max(r for r in range(sink, t) if (r - sink) % w == s)
            assert np.array_equal(vw.win_k[s], k[r, g]) and np.array_equal(vw.win_v[s], v[r, g])
        assert vw.k_tilde.shape == (8, 16) and len(vw.heads) == 2
        for h in vw.heads:
            assert h.q_tilde.shape == (8, 16) and h.mu.shape == (8, 8) and h.t_hat.shape == (8, 16)
            assert np.all(np.isfinite(h.m_max)) and np.all(h.z_hat >= 1) and not h.rect_fm


def test_seal_refusals():
    rng = np.random.default_rng(5)
    q, k, v = _rows(rng, 10)
    with pytest.raises(Declined, match="prefill"):
        FarLayer.seal(k[:3], v[:3], q[:3], prefill=3)
    with pytest.raises(Declined, match="prefill"):
        FarLayer.seal(k, v, q, prefill=11)
    with pytest.raises(CortiqError, match="query heads"):
        FarLayer.seal(k, v, q[:, :3], prefill=8)
    layer = FarLayer.seal(k, v, q, prefill=8)
    with pytest.raises(CortiqError, match="sealed already"):
        layer.groups[0].seal(k[:, 0], v[:, 0], q[:, :2], 8)
    with pytest.raises(CortiqError, match="out of range"):
        NystromState(3, 16, 4, 1, 8, 8)
    with pytest.raises(CortiqError, match="before the seal"):
        NystromState(8, 16, 4, 1, 8, 8).advance(k[0, 0], v[0, 0])
