"""The generation engine: open a CMF, pick an arm, prefill in chunks, decode, speculate with the
MTP block's drafts, seal attention layers into far fields past a prompt length.

`Engine.open(path, device="auto"|"cpu"|"cuda")`; `logits(ids)`; `generate(prompt or ids, ...)`
streams `Token`s; `chat(messages, ...)` renders a chat and generates. Two arms run a generation
through one sequence protocol (`prefill`, `step`, `verify`, `accept`, `draft`, `pos`): the host
arm (`HostModel`, `_HostSeq` here) and the card (`engine_cuda.CardSeq`, the CUDA hybrid arm).
"cuda" raises `NoDevice` without a usable device and `Declined` when the card cannot take the
model; "auto" takes the card when it can, else the host arm, and falls back to the host arm when
the card declines a prompt (`device_reason` says why). Past the prompt a decline surfaces.

Speculation (the reference's speculative rounds): after each emitted token the MTP block drafts
k tokens; the tip and its drafts go through one verify window; row i's token is chosen exactly as
a plain decode step would choose it (same sampler, same history, one draw each) and the drafts are
kept up to the first that differs. So the output is the same with and without drafts, greedy or
seeded, up to the float32 rounding a window's rows share with a one-row step.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Iterator, Sequence as Seq

import numpy as np

from cortiq_drv import knobs
from cortiq_drv.chat import ChatTemplate, stop_ids as header_stop_ids
from cortiq_drv.errors import CortiqError, CudaError, Declined, NoDevice
from cortiq_drv.graph import GraphAttn
from cortiq_drv.host import HostModel, Sequence
from cortiq_drv.nystrom import FarLayer
from cortiq_drv.sampling import GREEDY, Sampler, Sampling
from cortiq_drv.vocab import QWEN35_REAL, QWEN35_VOCAB

# Prompt rows one host call takes.
PROMPT_CHUNK = 256
# The longest verify window (the reference's NMAX): the tip and 15 drafts.
MAX_WINDOW = 16


@dataclass(frozen=True)
class FarSettings:
    """When and how the engine seals attention layers into far fields (the O1 settings):
    `seal_at` prompt rows (None: never), the layer indices (None: every attention layer),
    landmarks m, window w, sinks, rectified far weights."""

    seal_at: int | None = None
    layers: tuple[int, ...] | None = None
    m: int = 32
    w: int = 128
    sink: int = 4
    rect_fm: bool = False

    @classmethod
    def from_knobs(cls) -> FarSettings:
        k = knobs.get()
        return cls(k.o1_seal_at, k.o1_layers, k.o1_m, k.o1_w, k.o1_sink, k.o1_rect)


@dataclass
class Counters:
    """Work done by the engine's last `generate` call."""

    prompt_tokens: int = 0
    prompt_s: float = 0.0
    decode_tokens: int = 0
    decode_s: float = 0.0
    drafts_proposed: int = 0
    drafts_accepted: int = 0
    verify_rounds: int = 0
    sealed_layers: tuple = ()
    # the card's small-path graphs recorded and replayed, and its declines, during the call
    graphs_recorded: int = 0
    graph_replays: int = 0
    card_declines: int = 0

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.prompt_s if self.prompt_s > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0


@dataclass(frozen=True)
class Token:
    """One generated token: its id and the text it completes (empty while a UTF-8 character is
    still open, or when the engine generates ids without text)."""

    id: int
    text: str = ""


@dataclass
class _Run:
    """One generation's moving parts: the sequence (`_HostSeq` or `CardSeq`), the sampler, the
    ids so far, the last row's logits and residual (the MTP block's input)."""

    seq: object
    sampler: Sampler
    history: list
    logits: np.ndarray
    hidden: np.ndarray


class _HostSeq:
    """A host `Sequence` behind the engine's sequence protocol (what `CardSeq` does on the card)."""

    def __init__(self, engine: "Engine", seq: Sequence):
        self.engine = engine
        self.seq = seq

    @property
    def pos(self) -> int:
        return self.seq.pos

    def prefill(self, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        rows = self.engine.prefill(self.seq, ids)
        return rows.logits[-1], rows.hidden[-1]

    def step(self, tok: int, pick: bool) -> tuple[np.ndarray, np.ndarray, None]:
        rows = self.engine.model.run(self.seq, [tok], head="all")
        return rows.logits[0], rows.hidden[0], None

    def verify(self, toks: list[int], pick: bool):
        rows = self.engine.model.run(self.seq, toks, head="all", window=True)
        return rows.logits, None, rows.hidden

    def accept(self, keep: int) -> None:
        self.seq.accept(keep)

    def draft(self, hidden: np.ndarray, tip: int, k: int, valid: int) -> list[int]:
        return self.engine.model.mtp_draft(self.seq, hidden, tip, self.seq.pos, k, rows=valid)


class Engine:
    """A model opened for generation on one arm: the host arm, or the card (`card`, a
    `engine_cuda.CardArm`) with the host model beside it for embeddings and sampling."""

    def __init__(self, model: HostModel, *, device: str, device_reason: str,
                 far: FarSettings | None = None, chunk: int = PROMPT_CHUNK, card=None,
                 fallback: bool = False):
        self.model = model
        self.device = device
        self.device_reason = device_reason
        self.card = card
        # "auto": a prompt the card declines runs on the host arm instead
        self.fallback = fallback
        self.far = far if far is not None else FarSettings.from_knobs()
        self.chunk = chunk
        self.counters = Counters()
        header = model.cmf.header
        self.tokenizer_config = header.get("tokenizer_config") or {}
        self.stop_ids = header_stop_ids(self.tokenizer_config)
        self._tokenizer = None

    @classmethod
    def open(cls, path, device: str = "auto", **kw) -> Engine:
        """Open the CMF at `path` on `device`: "cpu" (the host arm), "cuda" (the card: NoDevice
        without one, Declined when it cannot take the model), "auto" (the card when it can take
        the model, else the host arm; `device_reason` says why)."""
        path = Path(path)
        if not path.is_file():
            raise CortiqError(f"{path}: no such model file")
        if device not in ("auto", "cpu", "cuda"):
            raise CortiqError(f"device {device!r}: expected 'auto', 'cpu' or 'cuda'")
        model = HostModel.open(path)
        if device == "cpu":
            return cls(model, device="cpu", device_reason="asked for the host arm", **kw)
        from cortiq_drv.engine_cuda import CardArm

        far = kw.get("far") if kw.get("far") is not None else FarSettings.from_knobs()
        try:
            card = CardArm.open(model, far)
        except (NoDevice, CudaError, Declined) as e:
            if device == "cuda":
                raise
            return cls(model, device="cpu", device_reason=f"{e}: running on the host arm", **kw)
        reason = "asked for the card" if device == "cuda" else "a CUDA device takes the model"
        return cls(model, device="cuda", device_reason=f"{reason} ({card.hs.ctx.arch})", card=card,
                   fallback=device == "auto", **kw)

    def _to_host(self, e: Declined) -> None:
        """Under "auto": the card declined a prompt, the host arm runs from now on."""
        if not self.fallback:
            raise e
        self.card.release()
        self.card, self.device = None, "cpu"
        self.device_reason = f"the card declined ({e}): running on the host arm"

    # -- vocabulary -----------------------------------------------------------------------------

    @property
    def vocab(self) -> int:
        """Rows of the LM head (logits per row)."""
        return self.model.vocab

    @property
    def context(self) -> int:
        """The context limit in positions (0: none)."""
        return self.model.graph.max_positions

    @property
    def tokenizer(self):
        """The file's tokenizer.json, else the Qwen3.5 tokenizer (loaded on first use)."""
        if self._tokenizer is None:
            from cortiq_drv.tokenizer import Tokenizer

            data = self.model.cmf.vocab
            self._tokenizer = Tokenizer.from_json(data, "the model's vocab section") if data \
                else Tokenizer.qwen35()
        return self._tokenizer

    @cached_property
    def valid(self) -> int:
        """Ids [0, valid) can be sampled; the rest are padding rows of the head. Kept: it reads
        the file's vocab section (a copy of its bytes), and every speculative round asks."""
        if self.model.cmf.vocab:
            return min(self.vocab, self.tokenizer.vocab_size)
        return QWEN35_REAL if self.vocab == QWEN35_VOCAB else self.vocab

    def encode(self, prompt: str | Seq[int]) -> list[int]:
        """Token ids of a prompt (text through the tokenizer), checked against the vocabulary."""
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(i) for i in prompt]
        if not ids:
            raise CortiqError("empty prompt: nothing to generate from")
        bad = [i for i in ids if not 0 <= i < self.vocab]
        if bad:
            raise CortiqError(f"token id {bad[0]} is not in the vocabulary [0, {self.vocab})")
        if self.context and len(ids) > self.context:
            raise CortiqError(f"the prompt has {len(ids)} tokens, past the context limit of "
                              f"{self.context}")
        return ids

    # -- prompt ---------------------------------------------------------------------------------

    def new_sequence(self) -> Sequence:
        """An empty sequence; its attention layers keep their queries when a seal may come."""
        return self.model.new_sequence(keep_queries=self.far.seal_at is not None)

    def _seal_layers(self) -> list[int]:
        layers = [i for i, l in enumerate(self.model.graph.layers) if isinstance(l.attn, GraphAttn.Full)]
        if self.far.layers is None:
            return layers
        bad = [i for i in self.far.layers if i not in layers]
        if bad:
            raise CortiqError(f"far field: layer {bad[0]} is not an attention layer (those are {layers})")
        return list(self.far.layers)

    def _seal(self, seq: Sequence) -> tuple:
        """Seal the chosen attention layers from the rows so far (their queries included)."""
        f = self.far
        sealed = self._seal_layers()
        for i in sealed:
            k, v, q = seq.kv[i].rows()
            seq.kv[i] = FarLayer.seal(k, v, q, prefill=seq.pos, m=f.m, w=f.w, sink=f.sink,
                                      scale=self.model.graph.scale, rect_fm=f.rect_fm)
        return tuple(sealed)

    def prefill(self, seq: Sequence, ids: list[int], head: str = "last"):
        """The prompt rows in chunks (one cut at `far.seal_at`, where the layers are sealed);
        returns the last chunk's `HostRows`."""
        cuts = set(range(self.chunk, len(ids), self.chunk))
        seal_at = self.far.seal_at
        if seal_at is not None and seq.pos < seal_at <= seq.pos + len(ids):
            cuts.add(seal_at - seq.pos)
        bounds = [0] + sorted(c for c in cuts if 0 < c < len(ids)) + [len(ids)]
        out = []
        for a, b in zip(bounds, bounds[1:]):
            out.append(self.model.run(seq, ids[a:b], head=head))
            if seal_at is not None and seq.pos == seal_at:
                self.counters.sealed_layers = self._seal(seq)
        if head == "all":
            out[-1].logits = np.concatenate([r.logits for r in out])
        return out[-1]

    def logits(self, ids: Seq[int]) -> np.ndarray:
        """float32 [len(ids), vocab]: the logits at every position of `ids` from a fresh sequence."""
        ids = self.encode(list(ids))
        self.counters = Counters()
        if self.card is not None:
            try:
                return self.card.logits(ids)
            except Declined as e:
                self._to_host(e)
        return np.ascontiguousarray(self.prefill(self.new_sequence(), ids, "all").logits,
                                    dtype=np.float32)

    # -- generation -----------------------------------------------------------------------------

    def generate(self, prompt: str | Seq[int], max_tokens: int = 128, sampling: Sampling = GREEDY,
                 stop_ids: Seq[int] | None = None, spec_k: int = 0,
                 text: bool | None = None) -> Iterator[Token]:
        """Stream up to `max_tokens` tokens after `prompt` (text or ids). Generation ends at a stop
        id (emitted; default the file's `eos_token_ids`), at max_tokens, or at the context limit.
        `spec_k` > 0 drafts that many tokens a round with the MTP block. `text`: decode tokens to
        text (default: when the prompt is text). The arguments are checked here, the work starts
        at the first token asked for."""
        if spec_k and self.model.graph.mtp is None:
            raise CortiqError("speculative decoding needs an MTP block; this model has none")
        if not 0 <= spec_k < MAX_WINDOW:
            raise CortiqError(f"spec_k {spec_k}: 0 to {MAX_WINDOW - 1} drafts a round")
        if max_tokens < 1:
            raise CortiqError(f"max_tokens {max_tokens}: at least 1")
        ids = self.encode(prompt)
        stops = set(self.stop_ids if stop_ids is None else stop_ids)
        stream = self.tokenizer.stream() if (isinstance(prompt, str) if text is None else text) else None
        return self._stream(ids, max_tokens, Sampler(sampling, self.valid), stops, spec_k, stream)

    def _prompt(self, ids: list[int], max_tokens: int):
        """A fresh sequence on the engine's arm with the prompt in: (sequence, last row's logits,
        residual row). A prompt the card declines runs on the host arm under "auto"."""
        if self.card is not None:
            seq = self.card.sequence(self.valid, len(ids) + max_tokens)
            try:
                return (seq, *seq.prefill(ids))
            except Declined as e:
                self._to_host(e)
        seq = _HostSeq(self, self.new_sequence())
        return (seq, *seq.prefill(ids))

    def _stream(self, ids, max_tokens, sampler, stops, spec_k, stream) -> Iterator[Token]:
        """`generate`'s work: the prompt, then the tokens with their text, timed."""
        self.counters = c = Counters()
        before = self.card.counters() if self.card is not None else None
        t0 = time.perf_counter()
        seq, logits, hidden = self._prompt(ids, max_tokens)
        c.prompt_tokens, c.prompt_s = len(ids), time.perf_counter() - t0
        run = _Run(seq, sampler, list(ids), logits, hidden)
        t0 = time.perf_counter()
        for n, tok in enumerate(self._tokens(run, max_tokens, stops, spec_k)):
            # the first token comes from the prompt's last row: decode speed counts the rest
            c.decode_tokens, c.decode_s = n, time.perf_counter() - t0
            if self.card is not None:
                c.graphs_recorded, c.graph_replays, c.card_declines = (
                    a - b for a, b in zip(self.card.counters(), before))
            yield Token(tok, (stream.step(tok) or "") if stream is not None else "")

    def _tokens(self, run: _Run, max_tokens: int, stops: set, spec_k: int) -> Iterator[int]:
        """Token ids: the first from the prompt's last row, then one decode step or one speculative
        round after each, until a stop id, max_tokens or the context limit."""
        tip = run.sampler(run.logits, run.history)
        pending = [tip]
        n = 0
        while True:
            for tok in pending:
                run.history.append(tok)
                n += 1
                yield tok
                if tok in stops or n >= max_tokens:
                    return
            if self.context and run.seq.pos >= self.context:
                return
            k = min(spec_k, max_tokens - n)
            if self.context:
                k = min(k, self.context - run.seq.pos - 1)
            if k > 0:
                pending = self._round(run, tip, k)
            else:
                logits, run.hidden, tid = run.seq.step(tip, not run.sampler.sampling.needs_logits)
                pending = [run.sampler(logits, run.history) if tid is None else tid]
            tip = pending[-1]

    def _round(self, run: _Run, tip: int, k: int) -> list[int]:
        """One speculative round after `tip`: k drafts, one verify window, greedy acceptance.
        Returns the accepted drafts and then the next tip (the token the first rejected row, or
        the last row, chooses); the sequence keeps the tip's row and the accepted drafts' rows."""
        seq, c, s = run.seq, self.counters, run.sampler.sampling
        drafts = seq.draft(run.hidden, tip, k, self.valid)
        # a greedy pick without penalties is each row's argmax: taken on the card when there
        pick = not s.needs_logits
        logits, ids, hidden = seq.verify([tip] + drafts, pick)
        # row i follows the history and the drafts before it (all kept when row i is reached);
        # chained, not copied: only a penalty reads it
        choose = (lambda i: int(ids[i])) if ids is not None else \
            lambda i: run.sampler(logits[i], itertools.chain(run.history, drafts[:i]))
        c.drafts_proposed += k
        c.verify_rounds += 1
        out = []
        for i, d in enumerate(drafts):
            out.append(choose(i))
            if out[-1] != d:
                break
            c.drafts_accepted += 1
        else:
            out.append(choose(k))
        seq.accept(len(out))
        run.hidden = hidden[len(out) - 1]
        return out

    def chat(self, messages: list[dict], *, enable_thinking: bool = True, tools=None,
             **gen) -> Iterator[Token]:
        """Render `messages` with the file's chat template (or the built-in Qwen3.5 one) and
        generate the assistant's turn; keyword arguments go to `generate`."""
        tpl = ChatTemplate.from_config(self.tokenizer_config, self.tokenizer)
        prompt = tpl.render(messages, enable_thinking=enable_thinking, tools=tools)
        return self.generate(prompt, **gen)
