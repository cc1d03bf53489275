"""q4tp: layout, code packing, ladders, hand-made payloads and an independent slow encoder."""

import math
import struct

import numpy as np
import pytest

from cortiq_drv.cmf import q4tp
from cortiq_drv.errors import CmfError

F32 = np.float32


def h_bits(x) -> int:
    """f16 bits of a float, round half to even, overflow to inf (Python's struct packing)."""
    try:
        return struct.unpack("<H", struct.pack("<e", float(x)))[0]
    except OverflowError:
        return 0x7C00 if x > 0 else 0xFC00


def h_val(bits: int) -> F32:
    return F32(struct.unpack("<e", struct.pack("<H", bits))[0])


def halving_sum(vals):
    """Pairwise halving: element i += element i + n/2 until one is left (FORMAT's fixed order)."""
    while len(vals) > 1:
        h = len(vals) // 2
        vals = [F32(vals[i] + vals[i + h]) for i in range(h)]
    return vals[0]


def ref_encode(w: np.ndarray) -> bytes:
    """docs/FORMAT.md's q4tp encoder, one row, one group, one element at a time."""
    rows, cols = w.shape
    gpr = cols // 32
    stride = (gpr * 5 + 7) // 8
    nib, params, codes = bytearray(), bytearray(), bytearray()
    for r in range(rows):
        tiles = [[F32(v) for v in w[r, 32 * g:32 * g + 32]] for g in range(gpr)]
        absmax = [max(abs(v) for v in t) for t in tiles]
        dead = [a == 0 for a in absmax]
        lg = [F32(math.log2(max(h_val(h_bits(a / F32(7))), 2.0 ** -14))) for a in absmax]
        live = [x for x, d in zip(lg, dead) if not d]
        lo, hi = (min(live), max(live)) if live else (lg[0], lg[0])
        lo_h = h_bits(lo)
        lo_r = h_val(lo_h)
        st_h = h_bits(max(F32(hi - lo_r), F32(0)) / F32(31))
        for _ in range(64):
            st = h_val(st_h)
            if st > 0 and lo_r + F32(31) * st >= hi:
                break
            st_h += 1
        st = h_val(st_h)
        rung = [F32(2.0 ** float(lo_r + F32(c) * st)) for c in range(32)]
        row_code = 0
        for g, t in enumerate(tiles):
            c = 0
            if not dead[g]:
                nominal = min(max(round(float((lg[g] - lo_r) / st)), 0), 31)
                best_err = None
                for cand in range(max(nominal - 2, 0), min(nominal + 1, 31) + 1):
                    s = rung[cand]
                    err = halving_sum([F32(v - F32(min(max(round(float(v / s)), -8), 7)) * s) ** 2
                                       for v in t])
                    if best_err is None or err < best_err:
                        c, best_err = cand, err
            q = [min(max(round(float(v / rung[c])), -8), 7) + 8 for v in t]
            nib += bytes(q[2 * k] | q[2 * k + 1] << 4 for k in range(16))
            row_code |= c << (5 * g)
        params += struct.pack("<HH", lo_h, st_h)
        codes += row_code.to_bytes(stride, "little")
    return bytes(nib + params + codes)


def test_sections():
    # 3 rows x 96 cols: 3 groups a row, 15 code bits -> 2 bytes.
    assert q4tp.sections(3, 96) == (3 * 3 * 16, 3 * 3 * 16 + 12, 2)
    assert q4tp.sections(17408, 5120) == (17408 * 160 * 16, 17408 * 160 * 16 + 17408 * 4, 100)
    assert q4tp.nbytes(1, 32) == 16 + 4 + 1


def test_code_at_every_bit_offset():
    # Groups 0..7 sit at bit offsets 0, 5, 2, 7, 4, 1, 6, 3: every offset, some straddling bytes.
    codes = [1, 2, 4, 8, 16, 31, 0, 21, 19]
    row = sum(c << 5 * g for g, c in enumerate(codes)).to_bytes(6, "little")
    assert [5 * g % 8 for g in range(8)] == [0, 5, 2, 7, 4, 1, 6, 3]
    assert [q4tp.code(row, g) for g in range(9)] == codes
    assert [q4tp.code(np.frombuffer(row, np.uint8), g) for g in range(9)] == codes
    # By hand: 31 in group 0 and 1 in group 1 -> bits 0..5 set: 0x3F, 0x00.
    assert [q4tp.code(bytes([0x3F, 0x00]), g) for g in (0, 1)] == [31, 1]
    # 31 in group 1 only: bits 5..9 -> 0xE0, 0x03.
    assert [q4tp.code(bytes([0xE0, 0x03]), g) for g in (0, 1)] == [0, 31]


def test_ladder_edges():
    # lo = -3 (f16 0xC200), step = 1/8 (0x3000): rung c = 2^(-3 + c/8).
    params = struct.pack("<HHHH", 0, 0, 0xC200, 0x3000)
    lad = q4tp.ladder(params, 1)
    assert lad.dtype == np.float32 and lad.shape == (32,)
    assert lad[0] == F32(0.125) and lad[8] == F32(0.25) and lad[16] == F32(0.5)
    assert lad[31] == F32(2.0 ** 0.875)
    assert np.all(np.diff(lad) > 0)


def hand_payload() -> bytes:
    """1 x 64: group 0 all nibble 0 at code 0, group 1 byte 0 = 0x9A then 0xFF at code 31."""
    nib = bytes(16) + bytes([0x9A]) + bytes([0xFF] * 15)
    return nib + struct.pack("<HH", 0xC200, 0x3000) + bytes([0xE0, 0x03])


def test_decode_hand_payload():
    d = q4tp.decode(hand_payload(), 1, 64)
    top = F32(2.0 ** 0.875)
    assert d.shape == (1, 64) and d.dtype == np.float32
    assert np.all(d[0, :32] == F32(-1.0))  # (0 - 8) * 0.125
    # Low nibble first: 0x9A -> element 32 = (10 - 8), element 33 = (9 - 8).
    assert d[0, 32] == F32(2) * top and d[0, 33] == top
    assert np.all(d[0, 34:] == F32(7) * top)


def test_hand_ladder_with_ulp_raise():
    # Group scales 1/8 and 1/2: lo = -3, hi = -1, f16(2/31) = 0x2C21 falls short (31 * it < 2),
    # one ulp up, 0x2C22, covers hi.
    w = np.zeros((1, 64), dtype=np.float32)
    w[0, 0] = 7 * 0.125
    w[0, 32] = 7 * 0.5
    b = q4tp.encode(w)
    p_off, c_off, _ = q4tp.sections(1, 64)
    assert h_val(0x2C21) * 31 < 2 <= h_val(0x2C22) * 31
    assert struct.unpack("<HH", b[p_off:c_off]) == (0xC200, 0x2C22)
    assert q4tp.code(b[c_off:], 0) == 0 and q4tp.code(b[c_off:], 1) == 31


def test_dead_groups_and_dead_row():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((2, 96)).astype(np.float32)
    w[0, 32:64] = 0  # one dead group in a live row
    w[1] = 0  # a row with nothing alive
    b = q4tp.encode(w)
    p_off, c_off, stride = q4tp.sections(2, 96)
    assert b[(0 * 3 + 1) * 16:(0 * 3 + 2) * 16] == b"\x88" * 16
    assert q4tp.code(b[c_off:c_off + stride], 1) == 0
    # The dead group stays out of the row's range: lo comes from the live groups.
    lo0 = h_val(struct.unpack("<H", b[p_off:p_off + 2])[0])
    assert lo0 > -14
    # All dead: lo = log2(2^-14) = -14 (0xCB00), step the smallest subnormal (0x0001), codes 0.
    assert struct.unpack("<HH", b[p_off + 4:p_off + 8]) == (0xCB00, 0x0001)
    assert b[3 * 16:6 * 16] == b"\x88" * 48 and b[c_off + stride:] == bytes(stride)
    d = q4tp.decode(b, 2, 96)
    assert np.all(d[1] == 0) and np.all(d[0, 32:64] == 0)


def test_subnormal_scales():
    # absmax / 7 below 2^-14 (and below the f16 subnormal range): the scale floors at 2^-14.
    w = np.full((1, 32), 1e-6, dtype=np.float32)
    b = q4tp.encode(w)
    assert struct.unpack("<HH", b[16:20]) == (0xCB00, 0x0001)
    assert b[:16] == b"\x88" * 16  # 1e-6 / 2^-14 rounds to 0
    # Two groups an f16 ulp apart in scale: span / 31 is an f16 subnormal step.
    w = np.zeros((1, 64), dtype=np.float32)
    w[0, 0] = 7 * 0.125
    w[0, 32] = 7 * 0.125 * (1 + 2 ** -10)
    b = q4tp.encode(w)
    lo_h, st_h = struct.unpack("<HH", b[32:36])
    assert lo_h == 0xC200 and 0 < st_h < 0x0400
    assert b == ref_encode(w)
    lad = q4tp.ladder(b[32:36], 0)
    assert lad[31] >= F32(0.125 * (1 + 2 ** -10)) * F32(1 - 1e-6)


def make_matrix() -> np.ndarray:
    """8 x 352 (11 groups: the last code ends inside a byte), rows with distinct character."""
    rng = np.random.default_rng(11)
    w = rng.standard_normal((8, 352)).astype(np.float32)
    w[1] *= np.repeat(np.exp2(rng.uniform(-10, 4, 11)), 32).astype(np.float32)
    w[2, 64:160] = 0
    w[3] = 0
    w[4] *= F32(1e-7)
    w[5] = 0
    w[5, ::32] = rng.uniform(-3, 3, 11).astype(np.float32)
    w[6] *= F32(1000)
    w[7, :176] *= F32(1e-6)
    return w


def test_encode_matches_slow_reference():
    w = make_matrix()
    assert q4tp.encode(w) == ref_encode(w)


def test_bytes_do_not_depend_on_chunking():
    w = np.random.default_rng(5).standard_normal((37, 160)).astype(np.float32)
    b = q4tp.encode(w)
    for chunk in (1, 7, 36):
        assert q4tp.encode(w, chunk_rows=chunk) == b
    assert q4tp.encode(w, chunk_rows=4, threads=3) == b
    # A lazy source: only row slices are ever taken.
    class Rows:
        shape = w.shape

        def __getitem__(self, sl):
            assert isinstance(sl, slice)
            return w[sl].astype(np.float64)
    assert q4tp.encode(Rows(), chunk_rows=5) == b


@pytest.mark.parametrize("rows, gpr", [(1, 1), (15, 31), (16, 32), (17, 33)])
def test_round_trip_error(rows, gpr):
    w = np.random.default_rng(rows).standard_normal((rows, gpr * 32)).astype(np.float32)
    d = q4tp.decode(q4tp.encode(w), rows, gpr * 32)
    # 4-bit with absmax / 7 scales on Gaussian data: relative RMS about 0.09 (bound 0.13).
    rel = np.sqrt(np.mean((d - w) ** 2) / np.mean(w ** 2))
    assert rel < 0.13
    # Per element within its group's |w|max / 7 (about one rung): not a law of the codec (a lower
    # rung may clip), a guard on these seeded matrices.
    amax = np.abs(w.reshape(rows, gpr, 32)).max(axis=2, keepdims=True)
    assert np.all(np.abs((d - w).reshape(rows, gpr, 32)) <= amax / 7 * 1.01 + 1e-30)


def test_errors():
    with pytest.raises(CmfError, match="multiple of 32"):
        q4tp.encode(np.zeros((2, 40), np.float32))
    with pytest.raises(CmfError, match="inf or NaN"):
        q4tp.encode(np.full((1, 32), np.nan, np.float32))
    with pytest.raises(CmfError, match="overflows f16"):
        q4tp.encode(np.full((1, 32), 1e6, np.float32))
    with pytest.raises(CmfError, match="needs 71"):
        q4tp.decode(bytes(70), 1, 128)
