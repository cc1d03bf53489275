"""hash64 against a scalar transcription of docs/FORMAT.md and hand-derivable values."""

import numpy as np
import pytest

from cortiq_drv.cmf import Hash64, hash64
from cortiq_drv.cmf import hash as hash_mod

MASK = (1 << 64) - 1


def fmix64(x):
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & MASK
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & MASK
    return x ^ (x >> 33)


def ref_hash64(data: bytes) -> int:
    """The spec word by word, in plain Python integers."""
    acc = 0
    for i in range(0, len(data), 8):
        word = int.from_bytes(data[i:i + 8].ljust(8, b"\0"), "little")
        acc ^= fmix64(word) ^ ((i // 8 * 0x9E3779B97F4A7C15) & MASK)
    return fmix64(acc ^ len(data))


def test_fmix64_hand_values():
    assert fmix64(0) == 0
    # x = 1: the first xor-shift keeps 1, the first multiply gives M1.
    x = 0xFF51AFD7ED558CCD
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & MASK
    assert fmix64(1) == x ^ (x >> 33)


def test_empty_and_zero_word_by_hand():
    # No words: acc = 0 ^ len 0, fmix64(0) = 0.
    assert hash64(b"") == 0
    # One zero word: fmix64(0) ^ 0 * GOLD = 0, then acc ^= 8.
    assert hash64(bytes(8)) == fmix64(8)
    # One zero byte: the padded word is zero too, only the length differs.
    assert hash64(bytes(1)) == fmix64(1)
    # Two zero words: word 1 contributes its index constant.
    assert hash64(bytes(16)) == fmix64(0x9E3779B97F4A7C15 ^ 16)


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 16])
def test_lengths_against_spec(n):
    data = bytes(range(1, n + 1))
    assert hash64(data) == ref_hash64(data)


def test_pinned_values():
    # Bytes 1..n; pinned so that a change of both implementations at once still shows.
    pinned = {1: 0xD522B5D820B5E72F, 7: 0x8AB02661B5AD6935, 8: 0x216FF52AC63A931C,
              9: 0xAF71FE816B401A83, 16: 0xCA7F3529AC9E6568}
    assert {n: hash64(bytes(range(1, n + 1))) for n in pinned} == pinned
    # Length 8 by hand: one word 0x0807060504030201 at index 0.
    assert pinned[8] == fmix64(fmix64(0x0807060504030201) ^ 8)


def test_streaming_pieces_and_chunks(monkeypatch):
    # Small numpy chunks so the chunk loop and word indices across chunks are exercised.
    monkeypatch.setattr(hash_mod, "_CHUNK_WORDS", 5)
    data = np.random.default_rng(7).integers(0, 256, 1003, dtype=np.uint8).tobytes()
    want = ref_hash64(data)
    assert hash64(data) == want
    h = Hash64()
    for a, b in [(0, 3), (3, 3), (3, 12), (12, 517), (517, 1003)]:
        h.update(data[a:b])
    assert h.digest() == want


def test_numpy_and_memoryview_inputs():
    arr = np.arange(37, dtype=np.float32)
    assert hash64(arr) == ref_hash64(arr.tobytes())
    assert hash64(memoryview(arr.tobytes())[5:]) == ref_hash64(arr.tobytes()[5:])
