"""The engine's card arm: a model's sequences driven through the CUDA hybrid arm
(`cortiq_drv.hybrid.api`), with the host model for what stays on the host (embedding rows, the
MTP block's eh projection, sampling).

A prompt goes through `api.batch(defer=True)` in chunks (more than NMAX rows: the prompt path
`big`; a tail of at most NMAX rows: the small path), nothing copied back, then its last token
through `api.token` with the head. Decode is `api.token` with the head over the sampled ids
`[0, rows)` (the padding ids past the tokenizer never reach a greedy pick); a greedy step without
penalties (`Sampling.needs_logits` false) and each MTP draft take the pick on the card, only the
id coming back. A speculative round is one verify window through `api.batch` with a `SpecTail`
(the head over every row, each row's argmax on the card when the pick is greedy), then
`spec.spec_restore` when only part of the window is kept. The MTP block drafts on the card too
(its normed input halves on the host, the eh projection by `CardEh`, its layer through `api.token`
under its own layer base) and on the host arm once the card declines it.

Outcomes: a Declined one raises `Declined` naming the step (the engine falls back to the host arm
when the prompt is declined under device="auto", else surfaces it); a Failed one raises
`CortiqError` (the card's state moved: the generation stops, the next starts afresh at row 0).
"""

from __future__ import annotations

import itertools
import sys

import numpy as np

from cortiq_drv.errors import CortiqError, CudaError, Declined, NoDevice
from cortiq_drv.graph import KIND_F32, KIND_Q4TP, GraphAttn, SpecTail
from cortiq_drv.host import Sequence
from cortiq_drv.host.attention import KvRows
from cortiq_drv.host.mtp import block_halves

WHAT = "cuda engine"
# Rows one prompt-path call takes (the engine's chunking on the card).
CARD_CHUNK = 4096
# The context cap handed to the arm when the file names none.
DEFAULT_CAP = 262_144
# Sequence ids on the card: one per engine, far from the ones tests pick by hand.
_KV_IDS = itertools.count(1 << 20)


def card_misfit(g) -> str | None:
    """Why the hybrid arm cannot take this model (None: it can), decided before any device work:
    the stack (`api.wants`), the kernels' geometry (`plan.geometry`) and the weight codecs."""
    from cortiq_drv.hybrid import api, plan

    if not api.wants(g.layers, g.nh, g.nkv, g.hd):
        return "no layer of this model is one the hybrid arm takes (GDN or gated attention)"
    try:
        plan.geometry(g.layers, (g.lm, g.lm_rows), g.nh, g.nkv, g.hd, g.rd, g.hidden, g.invf)
    except Declined as e:
        return e.reason
    for i, l in enumerate(g.layers):
        a = l.attn
        mats = (a.qkv, a.z, a.out) if isinstance(a, GraphAttn.Gdn) else (a.wq, a.wk, a.wv, a.wo)
        mats += (l.ffn.gate, l.ffn.up, l.ffn.down)
        bad = [w.name for w in mats if w.kind != KIND_Q4TP]
        if isinstance(a, GraphAttn.Gdn):
            bad += [w.name for w in (a.a, a.b) if w.kind != KIND_F32]
        if bad:
            return f"layer {i}: {bad[0]} is not in a codec the hybrid kernels read"
    if g.lm.kind != KIND_Q4TP:
        return f"the LM head {g.lm.name} is not q4tp"
    return None


def prompt_chunks(n: int, chunk: int) -> list[tuple[int, int]]:
    """Rows [0, n) as (start, end) pieces of at most `chunk` rows (the last may be short)."""
    if chunk < 1:
        raise CortiqError(f"prompt chunk {chunk}: at least 1 row")
    return [(a, min(a + chunk, n)) for a in range(0, n, chunk)]


def _raise(out, what: str) -> None:
    """A Declined outcome as `Declined`, a Failed one as `CortiqError`; Completed passes."""
    if out.ok:
        return
    if out.status == "declined":
        raise Declined(WHAT, f"{what}: {out.reason}")
    raise CortiqError(f"{WHAT}: {what} failed on the card ({out.reason}); the generation stops")


class CardArm:
    """A host model's graph on the card: the arm's process state, the call geometry, one sequence
    id for the engine (each generation starts it again at row 0)."""

    def __init__(self, hm, hs):
        self.hm = hm
        self.hs = hs
        self.g = g = hm.graph
        self.kv_id = next(_KV_IDS)
        self.chunk = CARD_CHUNK
        self.geo = dict(nh=g.nh, nkv=g.nkv, hd=g.hd, rd=g.rd, hidden=g.hidden,
                        cap=g.max_positions or DEFAULT_CAP, gemma=g.gemma, eps=g.eps, attn_scale=g.scale)
        self.n_gdn = sum(isinstance(l.attn, GraphAttn.Gdn) for l in g.layers)
        # why the MTP block drafts on the host (None: on the card)
        self.mtp_on_host: str | None = None
        self._eh: CardEh | None = None

    @classmethod
    def open(cls, hm, far=None) -> "CardArm":
        """The card arm for host model `hm`: NoDevice without a usable device, Declined when the
        arm cannot take the model (or the far field `far` asks for a seal, not on the card yet)."""
        from cortiq_drv.hybrid import state

        try:
            hs = state.current()
        except (NoDevice, CudaError) as e:
            raise NoDevice(f"no usable CUDA device: {e}") from e
        if far is not None and far.seal_at is not None:
            raise Declined(WHAT, "far-field seals (CMF_O1_SEAL_AT) are not on the card yet")
        why = card_misfit(hm.graph)
        if why is not None:
            raise Declined(WHAT, why)
        return cls(hm, hs)

    def embed(self, ids) -> np.ndarray:
        """Embedding rows [n, hidden] of `ids` from the host model, float32 C-order (a new array)."""
        return np.ascontiguousarray(self.hm.embed(ids), dtype=np.float32)

    def block_input(self, h: np.ndarray, t: int) -> np.ndarray:
        """The MTP block's input row [hidden] for token t after residual row h [1, hidden]
        (`host.mtp.block_input`): the normed halves on the host, eh_proj on the card."""
        if self._eh is None:
            self._eh = CardEh(self.hs, self.hm.cmf, self.g)
        return self._eh(block_halves(self.hm, h, t)[0])

    def counters(self) -> tuple[int, int, int]:
        """(graphs recorded, graph replays, declines) of the arm so far (process-wide)."""
        c = self.hs.counters
        return c.graph_rec, c.graph_run, len(c.declines)

    def sequence(self, rows: int, kv_hint: int = 0) -> "CardSeq":
        """A fresh sequence (the engine's id, from row 0) whose head gives logits [rows];
        `kv_hint`: the rows it expects to hold (the K/V reservation, also of mirrors the last
        generation left smaller). The last generation's rows and states are cleared in place (the
        MTP block's mirror would keep its rows otherwise), so its graphs replay."""
        from cortiq_drv.hybrid import spec

        spec.rewind(self.hs, self.kv_id, kv_hint)
        self.hs.kv_hint = kv_hint
        return CardSeq(self, rows)

    def logits(self, ids) -> np.ndarray:
        """float32 [len(ids), lm_rows]: every row's logits from a fresh sequence, as verify
        windows of NMAX rows (the small path's head over every row)."""
        from cortiq_drv.hybrid import api
        from cortiq_drv.hybrid.state import NMAX

        g = self.g
        out = np.empty((len(ids), g.lm_rows), dtype=np.float32)
        for a, b in prompt_chunks(len(ids), NMAX):
            h = self.embed(ids[a:b])
            sp = SpecTail(g.lm, g.lm_rows, g.final_norm)
            r = api.batch(self.hs, self.hm.cmf, self.kv_id, 0, g.layers, g.invf, h, positions=range(a, b),
                          spec=sp, **self.geo)
            _raise(r, f"logits of rows {a}..{b}")
            out[a:b] = sp.logits_out
        return out

    def report(self) -> None:
        """CMF_CUDA_DEBUG: graph counters; CMF_CUDA_PROF: small-path and prompt-path stage times
        (stderr)."""
        from cortiq_drv.hybrid import big, graphs

        graphs.report(self.hs)
        if self.hs.prof:
            for line in big.PROF.report():
                print(line, file=sys.stderr)

    def release(self) -> None:
        """Free the engine's sequence on the card (mirrors, states, graphs over them) and the
        eh projection's rows."""
        from cortiq_drv.hybrid import spec

        spec.reset(self.hs, self.kv_id)
        if self._eh is not None:
            self._eh.close()
            self._eh = None


class CardEh:
    """The MTP block's eh projection on the card, the matvec of the host's `block_input` (eh_proj
    is [hidden, 2 hidden]: 34M weights on the 9B): the matrix repacked into the arm's store once,
    then each call one row through `mma.RowsMatvec`. Declined when the matrix is not q4tp or does
    not fit the budget."""

    def __init__(self, hs, cmf, g):
        from cortiq_drv.hybrid import mma, plan

        self.hs = hs
        with hs.lock:
            fx = hs.hfuncs(g.nh // g.nkv, g.hd)
            m = plan.weight(hs, cmf, g.mtp.eh, g.hidden, 2 * g.hidden)
            # one row a call: buffers for one row
            self.mv = mma.RowsMatvec(hs.ctx, fx, m, hs.card.new, hs.card.mmaset, "eh projection", chunk=1)

    def __call__(self, halves: np.ndarray) -> np.ndarray:
        """The block's input row [hidden] = eh_proj halves [2 hidden] (float32)."""
        with self.hs.lock:
            return self.mv(np.reshape(halves, (1, -1)))[0]

    def close(self) -> None:
        self.mv.close()


class CardSeq:
    """One generation's sequence on the card: the position, the pending verify window, the
    host-side MTP rows once drafting falls back to the host."""

    def __init__(self, arm: CardArm, rows: int):
        self.arm = arm
        self.rows = rows
        self.pos = 0
        self.window: tuple[int, int] | None = None
        self._host_mtp: Sequence | None = None

    def _token(self, h: np.ndarray, pos: int, layers, layer_base: int, final_norm, what: str,
               pick: bool = False):
        """One row h [hidden] at `pos` through `layers` with the head: logits [rows], or with
        `pick` the greedy pick (the argmax over the head's rows, taken on the card: only the id
        comes back); h becomes the residual row after the last layer."""
        from cortiq_drv.hybrid import api

        a, g = self.arm, self.arm.g
        logits = None if pick else np.empty(self.rows, dtype=np.float32)
        tid = np.empty(1, dtype=np.int32) if pick else None
        out = api.token(a.hs, a.hm.cmf, a.kv_id, layers, g.invf, h, position=pos, lm_head=(g.lm, self.rows),
                        final_norm=final_norm, logits=logits, layer_base=layer_base, hidden_too=True,
                        pick=tid, **a.geo)
        _raise(out, what)
        return int(tid[0]) if pick else logits

    def prefill(self, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """The prompt from row 0: rows but the last in chunks, nothing back, then the last row
        with the head. Returns (logits [rows], residual row [hidden]) of the last row."""
        from cortiq_drv.hybrid import api

        a, g = self.arm, self.arm.g
        h = self.arm.embed(ids)
        n = len(ids)
        for s, e in prompt_chunks(n - 1, a.chunk):
            r = api.batch(a.hs, a.hm.cmf, a.kv_id, 0, g.layers, g.invf, np.ascontiguousarray(h[s:e]),
                          positions=range(s, e), defer=True, **a.geo)
            _raise(r, f"prompt rows {s}..{e}")
        last = h[n - 1].copy()
        logits = self._token(last, n - 1, g.layers, 0, g.final_norm, f"the prompt's last row {n - 1}")
        self.pos = n
        return logits, last

    def step(self, tok: int, pick: bool) -> tuple:
        """One decode step of `tok` at the position: (logits [rows], residual row [hidden], None),
        or with `pick` (None, residual row, the greedy pick taken on the card)."""
        g = self.arm.g
        h = self.arm.embed([tok])[0]  # a fresh row: the step writes the residual into it
        got = self._token(h, self.pos, g.layers, 0, g.final_norm, f"decode at row {self.pos}", pick)
        self.pos += 1
        self.window = None
        return (None, h, got) if pick else (got, h, None)

    def verify(self, toks: list[int], pick: bool):
        """A verify window of `toks` at the position: (logits [n, rows] or None, the card's
        argmax ids [n] when `pick` else None, residual rows [n, hidden]). Follow with `accept`."""
        from cortiq_drv.hybrid import api

        a, g = self.arm, self.arm.g
        n = len(toks)
        h = self.arm.embed(toks)
        sp = SpecTail(g.lm, self.rows, g.final_norm)
        ids = np.empty(n, dtype=np.int32) if pick else None
        out = api.batch(a.hs, a.hm.cmf, a.kv_id, 0, g.layers, g.invf, h,
                        positions=range(self.pos, self.pos + n), spec=sp, argmax_out=ids, **a.geo)
        _raise(out, f"a verify window of {n} rows at {self.pos}")
        self.window = (self.pos, n)
        self.pos += n
        return sp.logits_out, ids, h.reshape(n, g.hidden)

    def accept(self, keep: int) -> None:
        """Keep the first `keep` rows of the pending window: GDN layers go back to its start and
        replay the kept rows (`spec_restore`); attention mirrors rewind at the next call."""
        from cortiq_drv.hybrid import spec

        if self.window is None:
            raise CortiqError("accept: no verify window is pending on this sequence")
        pos0, n = self.window
        if not 1 <= keep <= n:
            raise CortiqError(f"accept: {keep} rows of a window of {n}")
        self.window = None
        if keep < n and not spec.spec_restore(self.arm.hs, self.arm.kv_id, keep - 1, pos0, self.arm.n_gdn):
            raise CortiqError(f"{WHAT}: spec_restore of {keep} rows of the window at {pos0} failed on "
                              f"the card; the generation stops")
        self.pos = pos0 + keep

    def draft(self, hidden: np.ndarray, tip: int, k: int, valid: int) -> list[int]:
        """k greedy MTP drafts after `tip` (at the position), from the trunk's residual row
        `hidden`: on the card, on the host once the card declines the block (the reason kept in
        `arm.mtp_on_host`)."""
        a = self.arm
        if a.mtp_on_host is None:
            try:
                return self._draft_card(hidden, tip, k, valid)
            except Declined as e:
                a.mtp_on_host = e.reason
        if self._host_mtp is None:
            g = a.g
            self._host_mtp = Sequence({}, {}, KvRows(g.nkv, g.hd, g.scale))
        return a.hm.mtp_draft(self._host_mtp, hidden, tip, self.pos, k, rows=valid)

    def _draft_card(self, hidden: np.ndarray, tip: int, k: int, valid: int) -> list[int]:
        """The host draft's steps (`host.mtp.draft`) with the eh projection (`CardEh`), the block's
        layer and the head on the card, the layer under layer base len(layers); its K/V mirror
        rewinds to the position itself."""
        a, g = self.arm, self.arm.g
        m = g.mtp
        h = np.asarray(hidden, dtype=np.float32).reshape(1, g.hidden)
        t, out = int(tip), []
        # the head's rows are the sampleable ids: the card's pick is the host's argmax
        pick = valid == self.rows
        for j in range(k):
            x = a.block_input(h, t)  # [hidden]
            got = self._token(x, self.pos + j, [m.layer], len(g.layers), m.final_norm,
                              f"an MTP draft at row {self.pos + j}", pick)
            t = got if pick else int(np.argmax(got[:valid]))
            out.append(t)
            h = x.reshape(1, g.hidden)
        return out
