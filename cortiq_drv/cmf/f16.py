"""16-bit floats as bit patterns (uint16): f16 <-> f32, bf16 <-> f32 (docs/FORMAT.md, "f16").

f16 -> f32 and bf16 -> f32 are exact (subnormals included); f32 -> f16 and f32 -> bf16 round to
nearest even and overflow to inf. Ports cortiq_core::quant's f32_to_f16 / f16_to_f32 and
`f16_scale`.
"""

from __future__ import annotations

import numpy as np

# The smallest normal f16 (2^-14): the floor of every codec scale.
F16_TINY = np.float32(6.1035156e-5)


def to_f16(x) -> np.ndarray:
    """f16 bit patterns (uint16) of `x` taken as float32, round to nearest even, overflow to inf."""
    x = np.asarray(x, dtype=np.float32)
    # numpy's float32 -> float16 cast is IEEE round-to-nearest-even; it warns on overflow to inf.
    with np.errstate(over="ignore"):
        return x.astype(np.float16).view(np.uint16)


def from_f16(bits) -> np.ndarray:
    """float32 values of f16 bit patterns (exact)."""
    with np.errstate(invalid="ignore"):
        return np.asarray(bits, dtype="<u2").view(np.float16).astype(np.float32)


def round_f16(x) -> np.ndarray:
    """`x` rounded to the nearest f16, as float32 (the reference's f16(x))."""
    return from_f16(to_f16(x))


def f16_scale(x) -> np.ndarray:
    """max(f16(x), 2^-14): a codec scale that is a normal f16 and never zero."""
    return np.maximum(round_f16(x), F16_TINY)


def from_bf16(bits) -> np.ndarray:
    """float32 values of bf16 bit patterns (exact: the high half of the f32 bits)."""
    b = np.asarray(bits, dtype="<u2").astype(np.uint32)
    return (b << np.uint32(16)).view(np.float32)


def to_bf16(x) -> np.ndarray:
    """bf16 bit patterns (uint16) of `x` taken as float32, round to nearest even, NaN kept NaN."""
    x = np.asarray(x, dtype=np.float32)
    b = x.view(np.uint32)
    # Adding 0x7FFF plus the lowest kept bit rounds half to even on the top 16 bits (only NaN
    # patterns can wrap, and they are replaced below).
    with np.errstate(over="ignore"):
        r = ((b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
    nan = np.uint16(0x7FC0) | ((b >> np.uint32(16)) & np.uint32(0x8000)).astype(np.uint16)
    return np.where(np.isnan(x), nan, r.astype(np.uint16)).astype(np.uint16)
