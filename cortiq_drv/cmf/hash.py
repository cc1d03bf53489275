"""hash64: cortiq's payload hash (docs/FORMAT.md), vectorised over 8-byte words in chunks."""

from __future__ import annotations

import numpy as np

_MASK = (1 << 64) - 1
_M1 = 0xFF51AFD7ED558CCD
_M2 = 0xC4CEB9FE1A85EC53
_GOLD = 0x9E3779B97F4A7C15
# Words hashed per numpy pass: 8 MiB of input keeps the temporaries small on GB payloads.
_CHUNK_WORDS = 1 << 20


def _fmix_int(x: int) -> int:
    x ^= x >> 33
    x = (x * _M1) & _MASK
    x ^= x >> 33
    x = (x * _M2) & _MASK
    return x ^ (x >> 33)


def _fmix_words(x: np.ndarray) -> np.ndarray:
    """fmix64 of every element of a uint64 array (uint64 array arithmetic wraps)."""
    x = x ^ (x >> np.uint64(33))
    x *= np.uint64(_M1)
    x ^= x >> np.uint64(33)
    x *= np.uint64(_M2)
    x ^= x >> np.uint64(33)
    return x


def _as_u8(data) -> np.ndarray:
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    return np.frombuffer(data, dtype=np.uint8)


class Hash64:
    """Streaming hash64: `update` with pieces of any length, `digest` the result."""

    def __init__(self):
        self._acc = 0
        self._words = 0  # full 8-byte words folded in so far
        self._tail = b""  # the bytes after the last full word (< 8)

    def update(self, data) -> "Hash64":
        u8 = _as_u8(data)
        if self._tail:
            need = 8 - len(self._tail)
            self._tail += u8[:need].tobytes()
            u8 = u8[need:]
            if len(self._tail) < 8:
                return self
            self._fold(np.frombuffer(self._tail, "<u8"))
            self._tail = b""
        n = len(u8) // 8
        for w0 in range(0, n, _CHUNK_WORDS):
            w1 = min(n, w0 + _CHUNK_WORDS)
            self._fold(u8[w0 * 8:w1 * 8].view("<u8"))
        self._tail = u8[n * 8:].tobytes()
        return self

    def _fold(self, words: np.ndarray) -> None:
        # acc ^= fmix64(word_i) ^ (i * GOLD) for the next len(words) word indices.
        idx = np.arange(self._words, self._words + len(words), dtype=np.uint64)
        idx *= np.uint64(_GOLD)
        mixed = _fmix_words(words) ^ idx
        self._acc ^= int(np.bitwise_xor.reduce(mixed))
        self._words += len(words)

    def digest(self) -> int:
        acc, nbytes = self._acc, self._words * 8 + len(self._tail)
        if self._tail:
            # The partial last word, zero padded, is word number `full_words`.
            word = int.from_bytes(self._tail.ljust(8, b"\0"), "little")
            acc ^= _fmix_int(word) ^ ((self._words * _GOLD) & _MASK)
        return _fmix_int(acc ^ nbytes)


def hash64(data) -> int:
    """hash64 of a bytes-like object or a contiguous numpy array's bytes."""
    return Hash64().update(data).digest()
