"""Choosing the next token from a row of logits: greedy or sampled, with penalties.

Order (llama.cpp's / vLLM's): padding ids masked, repetition penalty, presence penalty, then greedy
argmax (temperature 0) or temperature, top-k, top-p, min-p and one uniform draw from the seeded
generator. Every sampled token takes exactly one draw, so a run with speculative drafts (which
samples each verify row in order and stops at the first mismatch) draws the same numbers in the
same order as a run without, and gives the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cortiq_drv.errors import CortiqError


@dataclass(frozen=True)
class Sampling:
    """Sampling settings; the defaults are greedy. `temperature` 0 is greedy; `top_k` 0 and `top_p`
    1 and `min_p` 0 are off; `repetition_penalty` 1 and `presence_penalty` 0 are off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    seed: int | None = None

    def __post_init__(self):
        bad = []
        if not self.temperature >= 0:
            bad.append(f"temperature {self.temperature} (>= 0)")
        if self.top_k < 0:
            bad.append(f"top_k {self.top_k} (>= 0)")
        if not 0 < self.top_p <= 1:
            bad.append(f"top_p {self.top_p} (in (0, 1])")
        if not 0 <= self.min_p <= 1:
            bad.append(f"min_p {self.min_p} (in [0, 1])")
        if not self.repetition_penalty > 0:
            bad.append(f"repetition_penalty {self.repetition_penalty} (> 0)")
        if bad:
            raise CortiqError("sampling: " + ", ".join(bad))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def needs_logits(self) -> bool:
        """Does a pick need the row of logits on the host? Not a greedy one without penalties: that
        is the row's argmax over the sampleable ids, which the card takes itself (`hy_argmax`)."""
        return not (self.greedy and self.repetition_penalty == 1 and not self.presence_penalty)


GREEDY = Sampling()


class Sampler:
    """Picks tokens under `sampling` among ids [0, valid) (ids from `valid` on are padding)."""

    def __init__(self, sampling: Sampling, valid: int):
        self.sampling = sampling
        self.valid = valid
        self.rng = np.random.default_rng(sampling.seed)

    def penalised(self, logits: np.ndarray, history) -> np.ndarray:
        """Logits [vocab] as float64 with padding at -inf and the penalties on ids in `history`."""
        x = np.array(logits[:self.valid], np.float64)  # [valid], one copy
        s = self.sampling
        if s.repetition_penalty == 1 and not s.presence_penalty:
            return x
        seen = np.unique(np.fromiter(history, np.int64))
        seen = seen[(seen >= 0) & (seen < self.valid)]
        if s.repetition_penalty != 1:
            v = x[seen]
            x[seen] = np.where(v > 0, v / s.repetition_penalty, v * s.repetition_penalty)
        if s.presence_penalty:
            x[seen] -= s.presence_penalty
        return x

    def probs(self, logits: np.ndarray, history=()) -> np.ndarray:
        """The distribution a sampled token is drawn from, over ids [0, valid) (float64)."""
        s = self.sampling
        x = self.penalised(logits, history) / s.temperature
        if 0 < s.top_k < x.size:
            kth = np.partition(x, -s.top_k)[-s.top_k]
            x = np.where(x >= kth, x, -np.inf)
        p = np.exp(x - x.max())
        p /= p.sum()
        if s.top_p < 1:
            # the ids still in, in the order a stable sort of all of them gives (zeros sort last:
            # the head's running sums are the same, and zeroing a zero changes nothing)
            nz = np.flatnonzero(p)
            order = nz[np.argsort(-p[nz], kind="stable")]
            before = np.cumsum(p[order]) - p[order]
            # keep the smallest head of the sorted ids whose mass reaches top_p
            p[order[before >= s.top_p]] = 0
        if s.min_p > 0:
            p = np.where(p >= s.min_p * p.max(), p, 0)
        return p / p.sum()

    def __call__(self, logits: np.ndarray, history=()) -> int:
        """One token for a row of logits [vocab]; `history` the ids seen so far (prompt and output)."""
        if not self.sampling.needs_logits:
            # float32 -> float64 is exact and monotone: the argmax of the row itself, no copy
            return int(np.argmax(logits[:self.valid]))
        if self.sampling.greedy:
            return int(np.argmax(self.penalised(logits, history)))
        p = self.probs(logits, history)
        u = self.rng.random()
        return int(min(np.searchsorted(np.cumsum(p), u, side="right"), np.flatnonzero(p)[-1]))
