"""f16 / bf16 conversions against scalar references built from the IEEE definitions."""

import math
import struct

import numpy as np
import pytest

from cortiq_drv.cmf import f16

EDGES_F32 = [0.0, -0.0, 1.0, -1.0, 65504.0, 65519.996, 65520.0, -65520.0, 1e9, float("inf"),
             -float("inf"), 6.1035156e-5, 6.0975552e-5, 5.9604645e-8, 2.9802322e-8,
             2.9802326e-8, 8.940697e-8, 1.4901161e-8, 1.0009765625, 1.00048828125,
             1.00146484375, 2049.0, 2051.0, 3.1415927, -7.5e-6, 1e-45]


def ref_f16_value(h: int) -> float:
    s, e, m = h >> 15, (h >> 10) & 31, h & 1023
    if e == 31:
        v = math.inf if m == 0 else math.nan
    elif e == 0:
        v = m * 2.0 ** -24
    else:
        v = (1024 + m) * 2.0 ** (e - 25)
    return -v if s else v


def ref_to_f16(x: float) -> int:
    """Python's struct half-float packing rounds half to even; it raises where f16 overflows."""
    try:
        return struct.unpack("<H", struct.pack("<e", x))[0]
    except OverflowError:
        return 0xFC00 if x < 0 else 0x7C00


def test_from_f16_exhaustive():
    bits = np.arange(1 << 16).astype(np.uint16)
    got = f16.from_f16(bits)
    assert got.dtype == np.float32
    want = np.array([ref_f16_value(int(h)) for h in bits], dtype=np.float64)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].astype(np.float64), want[~nan])
    # Signed zero kept.
    assert np.signbit(got[0x8000]) and not np.signbit(got[0])


def test_to_f16_edges_and_random():
    rng = np.random.default_rng(1)
    rand_bits = rng.integers(0, 1 << 32, 20000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    scales = np.exp2(rng.uniform(-26, 16, 20000))
    in_range = (rng.standard_normal(20000) * scales).astype(np.float32)
    xs = np.concatenate([np.array(EDGES_F32, dtype=np.float32), rand_bits, in_range])
    got = f16.to_f16(xs)
    assert got.dtype == np.uint16
    for x, g in zip(xs, got):
        if math.isnan(x):
            assert (int(g) & 0x7C00) == 0x7C00 and (int(g) & 0x3FF), hex(g)
        else:
            assert int(g) == ref_to_f16(float(x)), (float(x), hex(g))


@pytest.mark.parametrize("x, bits", [
    (65519.996, 0x7BFF),  # just below the halfway point to 2^16: stays the largest finite
    (65520.0, 0x7C00),  # halfway: rounds to even, which is inf
    (2.9802322e-8, 0x0000),  # 2^-25 exactly: halfway between 0 and the smallest subnormal, even
    (2.9802326e-8, 0x0001),  # just above halfway
    (8.940697e-8, 0x0002),  # 1.5 * 2^-24 -> 2 * 2^-24 (even)
    (1.00048828125, 0x3C00),  # 1 + 2^-11: halfway, to even (1.0)
    (1.00146484375, 0x3C02),  # 1 + 3 * 2^-11: halfway, to even (1 + 2^-9)
    (-1e9, 0xFC00),
])
def test_to_f16_hand_cases(x, bits):
    assert int(f16.to_f16(np.float32(x))) == bits


def test_round_and_scale():
    x = np.array([0.0, 1e-7, 6.1e-5, 0.1, 70000.0], dtype=np.float32)
    r = f16.round_f16(x)
    assert r.dtype == np.float32
    assert r[2] == np.float32(6.0975552e-5) and r[3] == np.float32(0.099975586) and np.isinf(r[4])
    s = f16.f16_scale(x)
    assert s[0] == s[1] == s[2] == np.float32(2.0 ** -14)
    assert s[3] == r[3]


def test_bf16_both_ways():
    bits = np.arange(1 << 16).astype(np.uint16)
    vals = f16.from_bf16(bits)
    assert np.array_equal(vals.view(np.uint32), bits.astype(np.uint32) << 16)
    # Exact round trip of every non-NaN bf16 value.
    keep = ~np.isnan(vals)
    assert np.array_equal(f16.to_bf16(vals)[keep], bits[keep])
    # Round to nearest even on the dropped half, overflow to inf, NaN stays NaN.
    xs = np.array([0x3F808000, 0x3F818000, 0x3F808001, 0x7F7FFFFF, 0x7FC00001, 0xFF800000,
                   0xFFFFFFFF], dtype=np.uint32).view(np.float32)
    assert f16.to_bf16(xs).tolist() == [0x3F80, 0x3F82, 0x3F81, 0x7F80, 0x7FC0, 0xFF80, 0xFFC0]
