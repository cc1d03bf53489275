"""The far field of a sealed attention layer (Nystrom "O1" attention, docs/MODEL.md "The far field").

Ports the reference's `crate::nystrom` as `cuda_hybrid.rs` uses it: `NystromState` is one KV
group's state (`new_group` / seal, `advance`, output, `device_view`), `FarLayer` holds the groups
of one attention layer, `O1DeviceView` / `O1HeadView` are what the CUDA arm's `o1_ensure` uploads.

A sealed group keeps `sink` exact keys (the first rows), a ring of the last `w` keys, and for the
keys that left the ring per query head and landmark a running maximum `m_max`, a mass `z` and a
numerator `t`, kept at scale exp(-m_max). Landmarks are segment means of the first `prefill` rows;
M = (A^T A + lam I)^-1 A^T is the ridge pseudo-inverse of A = exp(q~ k~^T * scale), in float64.
Everything else is float32, as on the card.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cortiq_drv.errors import CortiqError, Declined

# Defaults of the reference's O1 settings.
M_DEFAULT = 32
W_DEFAULT = 128
SINK_DEFAULT = 4
# The fewest landmarks a seal takes (m_eff = clamp(prefill // 8, MIN_LANDMARKS, m)).
MIN_LANDMARKS = 4


def landmark_count(prefill: int, m: int) -> int:
    """m_eff = clamp(prefill // 8, 4, m): the landmarks a seal over `prefill` rows takes."""
    return min(max(prefill // 8, MIN_LANDMARKS), m)


def landmarks(x: np.ndarray, m_eff: int) -> np.ndarray:
    """Segment means of rows x [t, ...]: landmark i is the mean of rows [i*t/m_eff, (i+1)*t/m_eff)."""
    t = x.shape[0]
    out = np.empty((m_eff,) + x.shape[1:], np.float32)
    for i in range(m_eff):
        out[i] = x[i * t // m_eff:(i + 1) * t // m_eff].astype(np.float64).mean(axis=0)
    return out


def ridge_pinv(a: np.ndarray) -> np.ndarray:
    """M = (A^T A + lam I)^-1 A^T with lam = 1e-6 * mean(diag(A^T A)), float64, for A [m, m]."""
    a = np.asarray(a, np.float64)
    ata = a.T @ a
    lam = 1e-6 * float(np.mean(np.diag(ata)))
    return np.linalg.solve(ata + lam * np.eye(a.shape[1]), a.T)


@dataclass(frozen=True)
class O1HeadView:
    """One query head's skeleton and far sums, as the card takes them (f32, row-major)."""

    q_tilde: np.ndarray  # [m, d]
    mu: np.ndarray  # [m, m] the ridge pseudo-inverse M, row a column b: u = Fh @ mu
    m_max: np.ndarray  # [m]
    z_hat: np.ndarray  # [m]
    t_hat: np.ndarray  # [m, dv]
    rect_fm: bool


@dataclass(frozen=True)
class O1DeviceView:
    """One KV group's far field for `o1_ensure`: near rows (sinks, then the ring in slot order),
    landmarks, the heads' skeletons and the counters. Arrays are copies."""

    d: int
    dv: int
    m_eff: int
    sink_len: int
    w: int
    win_len: int
    win_head: int
    far_len: int
    scale: float
    sink_k: np.ndarray  # [sink_len, d]
    sink_v: np.ndarray  # [sink_len, dv]
    win_k: np.ndarray  # [win_len, d] ring slots 0..win_len
    win_v: np.ndarray  # [win_len, dv]
    k_tilde: np.ndarray  # [m, d]
    heads: tuple  # hpk x O1HeadView


@dataclass(frozen=True)
class NystromSnap:
    """What a verify window may move: ring, sinks, far sums and counters (copies)."""

    arrays: tuple
    counters: tuple


class NystromState:
    """One KV group's far field (`crate::nystrom::NystromState`); build it with `seal`."""

    def __init__(self, m: int, w: int, sink: int, hpk: int, d: int, dv: int,
                 scale: float | None = None, rect_fm: bool = False):
        """`new_group`: an empty group of `hpk` query heads; landmarks come with `seal`."""
        if m < MIN_LANDMARKS or w < 1 or sink < 0 or hpk < 1:
            raise CortiqError(f"far field: m={m} (>= {MIN_LANDMARKS}), w={w} (>= 1), sink={sink}, "
                              f"hpk={hpk}: out of range")
        self.m, self.w, self.sink, self.hpk, self.d, self.dv = m, w, sink, hpk, d, dv
        self.scale = float(1.0 / np.sqrt(d) if scale is None else scale)
        self.rect_fm = rect_fm
        self.m_eff = 0
        self.sink_k = np.zeros((sink, d), np.float32)  # [sink, d]
        self.sink_v = np.zeros((sink, dv), np.float32)  # [sink, dv]
        self.ring_k = np.zeros((w, d), np.float32)  # [w, d]
        self.ring_v = np.zeros((w, dv), np.float32)  # [w, dv]
        self.sink_len = self.win_len = self.win_head = self.far_len = 0

    def seal(self, k: np.ndarray, v: np.ndarray, q: np.ndarray, prefill: int) -> None:
        """Landmarks from rows [0, prefill) of k [t, d], q [>= prefill, hpk, d]; then every row of
        k, v [t, dv] in order (sinks, ring, far sums), as `advance` would put them."""
        if v.shape != (k.shape[0], self.dv):
            raise CortiqError(f"far field seal: values {v.shape} for keys {k.shape}")
        self.skeleton(k, q, prefill)
        self._load_rows(np.asarray(k, np.float32), np.asarray(v, np.float32))

    def skeleton(self, k: np.ndarray, q: np.ndarray, prefill: int) -> None:
        """The seal's landmarks and M from rows [0, prefill) of k [>= prefill, d] and
        q [>= prefill, hpk, d], with empty sinks, ring and far sums."""
        if self.m_eff:
            raise CortiqError("far field: this group is sealed already")
        if prefill < MIN_LANDMARKS or prefill > min(k.shape[0], q.shape[0]):
            raise Declined("far field seal", f"{prefill} prefill rows of {k.shape[0]} keys and "
                           f"{q.shape[0]} queries (needs at least {MIN_LANDMARKS}, at most the rows)")
        if q.shape[1:] != (self.hpk, self.d) or k.shape[1:] != (self.d,):
            raise CortiqError(f"far field seal: q {q.shape}, k {k.shape} for {self.hpk} heads "
                              f"of width {self.d}")
        self.m_eff = landmark_count(prefill, self.m)
        self.k_tilde = landmarks(k[:prefill], self.m_eff)  # [m, d]
        self.q_tilde = np.ascontiguousarray(landmarks(q[:prefill], self.m_eff).transpose(1, 0, 2))  # [hpk, m, d]
        a = np.exp(np.einsum("hid,ad->hia", self.q_tilde.astype(np.float64),
                             self.k_tilde.astype(np.float64)) * self.scale)  # [hpk, m, m]
        self.mu = np.stack([ridge_pinv(a[h]) for h in range(self.hpk)]).astype(np.float32)  # [hpk, m, m]
        self.m_max = np.full((self.hpk, self.m_eff), -np.inf, np.float32)  # [hpk, m]
        self.z = np.zeros((self.hpk, self.m_eff), np.float32)  # [hpk, m]
        self.t = np.zeros((self.hpk, self.m_eff, self.dv), np.float32)  # [hpk, m, dv]

    def _load_rows(self, k: np.ndarray, v: np.ndarray) -> None:
        """The seal's rows in bulk: sinks, the far rows' sums in one merge, then the ring."""
        t = k.shape[0]
        ns = min(t, self.sink)
        self.sink_k[:ns], self.sink_v[:ns], self.sink_len = k[:ns], v[:ns], ns
        rest = t - ns
        far = max(rest - self.w, 0)
        if far:
            self._far_insert(k[ns:ns + far], v[ns:ns + far])
        self.far_len = far
        # ring slot of row r is (r - sink) % w, the slot `advance` would have written
        for r in range(ns + far, t):
            slot = (r - ns) % self.w
            self.ring_k[slot], self.ring_v[slot] = k[r], v[r]
        self.win_len = min(rest, self.w)
        self.win_head = (rest % self.w) if rest >= self.w else 0

    def _far_insert(self, k: np.ndarray, v: np.ndarray) -> None:
        """Keys k [n, d] with values v [n, dv] into every head's far sums. One row is MODEL.md's rule
        (rescale by exp(m_max - l) when l is a new maximum); n rows merge at their common maximum."""
        logit = np.einsum("hmd,nd->nhm", self.q_tilde, k) * np.float32(self.scale)  # [n, hpk, m]
        top = np.maximum(self.m_max, logit.max(axis=0))  # [hpk, m]
        rescale = np.exp(self.m_max - top)  # [hpk, m]
        e = np.exp(logit - top)  # [n, hpk, m]
        self.z = self.z * rescale + e.sum(axis=0)
        self.t = self.t * rescale[..., None] + np.einsum("nhm,nd->hmd", e, v)
        self.m_max = top

    def advance(self, k: np.ndarray, v: np.ndarray) -> None:
        """One row's key k [d] and value v [dv] in (`nystrom.rs` advance): a sink while there is
        room, else the ring; a full ring first sends its oldest row into the far sums."""
        if not self.m_eff:
            raise CortiqError("far field: advance before the seal")
        if self.sink_len < self.sink:
            self.sink_k[self.sink_len], self.sink_v[self.sink_len] = k, v
            self.sink_len += 1
        elif self.win_len < self.w:
            self.ring_k[self.win_len], self.ring_v[self.win_len] = k, v
            self.win_len += 1
        else:
            h = self.win_head
            self._far_insert(self.ring_k[h:h + 1], self.ring_v[h:h + 1])
            self.ring_k[h], self.ring_v[h] = k, v
            self.win_head = (h + 1) % self.w
            self.far_len += 1

    def output(self, q: np.ndarray) -> np.ndarray:
        """Attention of the group's query heads q [hpk, d] over sinks, ring and far sums -> [hpk, dv]."""
        scale = np.float32(self.scale)
        near_k = np.concatenate([self.sink_k[:self.sink_len], self.ring_k[:self.win_len]])  # [n, d]
        near_v = np.concatenate([self.sink_v[:self.sink_len], self.ring_v[:self.win_len]])  # [n, dv]
        s = (q @ near_k.T) * scale  # [hpk, n]
        c = s.max(axis=1)  # [hpk]
        far_num = np.zeros((self.hpk, self.dv), np.float32)
        far_den = np.zeros(self.hpk, np.float32)
        if self.far_len:
            fl = np.einsum("hd,ad->ha", q, self.k_tilde) * scale  # [hpk, m]
            f = fl.max(axis=1)  # [hpk]
            u = np.einsum("ha,hab->hb", np.exp(fl - f[:, None]), self.mu)  # [hpk, m]
            if self.rect_fm:
                u = np.maximum(u, 0)
            c = np.maximum(c, (f[:, None] + self.m_max).max(axis=1))
            gain = u * np.exp(f[:, None] + self.m_max - c[:, None])  # [hpk, m]
            far_den = (gain * self.z).sum(axis=1)
            far_num = np.einsum("hm,hmd->hd", gain, self.t)
            # a negative far mass (u can be negative without rect_fm) drops the far part
            keep = far_den >= 0
            far_den = np.where(keep, far_den, 0)
            far_num = np.where(keep[:, None], far_num, 0)
        p = np.exp(s - c[:, None])  # [hpk, n]
        den = np.maximum(far_den + p.sum(axis=1), np.float32(1e-30))
        return ((far_num + p @ near_v) / den[:, None]).astype(np.float32)

    def snapshot(self) -> NystromSnap:
        """Copies of everything `advance` moves (before a verify window)."""
        arrays = (self.sink_k, self.sink_v, self.ring_k, self.ring_v, self.m_max, self.z, self.t)
        return NystromSnap(tuple(a.copy() for a in arrays),
                           (self.sink_len, self.win_len, self.win_head, self.far_len))

    def restore(self, snap: NystromSnap) -> None:
        """Back to a snapshot's state (its arrays are copied again, so it can be restored twice)."""
        (self.sink_k, self.sink_v, self.ring_k, self.ring_v, self.m_max, self.z,
         self.t) = (a.copy() for a in snap.arrays)
        self.sink_len, self.win_len, self.win_head, self.far_len = snap.counters

    def device_view(self) -> O1DeviceView:
        """The group as `o1_ensure` uploads it (copies; the ring in slot order)."""
        if not self.m_eff:
            raise CortiqError("far field: a device view before the seal")
        heads = tuple(O1HeadView(self.q_tilde[h].copy(), self.mu[h].copy(), self.m_max[h].copy(),
                                 self.z[h].copy(), self.t[h].copy(), self.rect_fm)
                      for h in range(self.hpk))
        return O1DeviceView(self.d, self.dv, self.m_eff, self.sink_len, self.w, self.win_len,
                            self.win_head, self.far_len, self.scale,
                            self.sink_k[:self.sink_len].copy(), self.sink_v[:self.sink_len].copy(),
                            self.ring_k[:self.win_len].copy(), self.ring_v[:self.win_len].copy(),
                            self.k_tilde.copy(), heads)


class FarLayer:
    """The far fields of one sealed attention layer: one `NystromState` per KV group; query head
    j reads group j // hpk, as in the exact attention. It stands in for the host's `KvRows` (the
    store protocol of `host.attention.attention_mixer`: `n`, `attend`, `truncate`, `cpu_rows`);
    each `attend` keeps a tape (the state before it and its rows) so `truncate` can drop the
    rejected rows of a verify window (`spec_commit`: restore, then advance the kept rows)."""

    def __init__(self, groups: list[NystromState]):
        self.groups = groups
        self._tape: tuple | None = None

    @classmethod
    def seal(cls, k: np.ndarray, v: np.ndarray, q: np.ndarray, *, prefill: int, m: int = M_DEFAULT,
             w: int = W_DEFAULT, sink: int = SINK_DEFAULT, scale: float | None = None,
             rect_fm: bool = False) -> FarLayer:
        """Seal a layer from its rows k [t, nkv, d], v [t, nkv, dv] and queries q [>= prefill, nh, d]."""
        t, nkv, d = k.shape
        nh = q.shape[1]
        if nh % nkv:
            raise CortiqError(f"far field: {nh} query heads over {nkv} KV heads")
        hpk = nh // nkv
        groups = []
        for g in range(nkv):
            st = NystromState(m, w, sink, hpk, d, v.shape[2], scale, rect_fm)
            st.seal(k[:, g], v[:, g], q[:, g * hpk:(g + 1) * hpk], prefill)
            groups.append(st)
        return cls(groups)

    @property
    def n(self) -> int:
        """Rows the layer has taken (sinks + ring + far)."""
        g = self.groups[0]
        return g.sink_len + g.win_len + g.far_len

    def attend(self, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Rows in order: each row's keys k [n, nkv, d], values v [n, nkv, dv] go in, then its
        queries q [n, nh, d] read the layer -> [n, nh, dv]."""
        self._tape = (self.n, self.snapshot(), np.array(k, np.float32), np.array(v, np.float32))
        hpk = self.groups[0].hpk
        out = np.empty((q.shape[0], q.shape[1], v.shape[2]), np.float32)
        for r in range(q.shape[0]):
            for g, st in enumerate(self.groups):
                st.advance(k[r, g], v[r, g])
                out[r, g * hpk:(g + 1) * hpk] = st.output(q[r, g * hpk:(g + 1) * hpk])
        return out

    def advance(self, k: np.ndarray, v: np.ndarray) -> None:
        """Rows k [n, nkv, d], v [n, nkv, dv] in without outputs."""
        for r in range(k.shape[0]):
            for g, st in enumerate(self.groups):
                st.advance(k[r, g], v[r, g])

    def truncate(self, n: int) -> None:
        """Keep rows [0, n): back to the last `attend`'s start and its first rows again. Rows
        before that call cannot be dropped (their keys are in the far sums)."""
        if n >= self.n:
            return
        if self._tape is None or n < self._tape[0]:
            raise CortiqError(f"far field: cannot go back to row {n}: the sealed layer holds "
                              f"{self.n} rows and keeps only its last call's")
        pos0, snaps, k, v = self._tape
        self.restore(snaps)
        self.advance(k[:n - pos0], v[:n - pos0])
        self._tape = None

    def cpu_rows(self) -> tuple[list[np.ndarray], list[np.ndarray], int]:
        """No exact host rows: cpu_base = n, empty rows per group (the card takes `device_views`)."""
        empty = [np.zeros(0, np.float32) for _ in self.groups]
        return empty, list(empty), self.n

    def snapshot(self) -> list[NystromSnap]:
        return [g.snapshot() for g in self.groups]

    def restore(self, snaps: list[NystromSnap]) -> None:
        for g, s in zip(self.groups, snaps):
            g.restore(s)

    def device_views(self) -> list[O1DeviceView]:
        """One view per KV group, in group order (what `o1_ensure` takes for a layer)."""
        return [g.device_view() for g in self.groups]


def stream_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, m: int = M_DEFAULT,
                     w: int = W_DEFAULT, sink: int = SINK_DEFAULT, prefill: int,
                     rect_fm: bool = False) -> np.ndarray:
    """One head's far-field attention outputs [T, dv] for q, k [T, d], v [T, dv]: landmarks from
    rows [0, prefill), then every row in order (its key in, then its query out), scale 1/sqrt(d)."""
    q, k, v = (np.asarray(x, np.float32) for x in (q, k, v))
    st = NystromState(m, w, sink, 1, k.shape[1], v.shape[1], None, rect_fm)
    st.skeleton(k, q[:, None], prefill)
    out = np.empty((q.shape[0], v.shape[1]), np.float32)  # [T, dv]
    for r in range(q.shape[0]):
        st.advance(k[r], v[r])
        out[r] = st.output(q[r, None])[0]
    return out
