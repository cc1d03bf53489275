"""q8_2f: hand-made payloads, an independent slow encoder, round trips, chunk independence."""

import math
import struct

import numpy as np
import pytest

from cortiq_drv.cmf import q8
from cortiq_drv.errors import CmfError

F32 = np.float32
TINY = 2.0 ** -14


def h_round(x) -> F32:
    """f16(x) as a float32, round half to even, inf on overflow."""
    try:
        return F32(struct.unpack("<e", struct.pack("<e", float(x)))[0])
    except OverflowError:
        return F32(math.copysign(math.inf, x))


def ref_encode(w: np.ndarray) -> bytes:
    """docs/FORMAT.md's q8_2f encoder element by element."""
    rows, cols = w.shape
    col = []
    for i in range(cols):
        acc = 0.0
        for b0 in range(0, rows, 256):
            block = 0.0
            for o in range(b0, min(rows, b0 + 256)):
                block += float(w[o, i]) ** 2
            acc += block
        col.append(F32(max(h_round(F32(math.sqrt(acc / rows))), TINY)))
    body, scales = bytearray(), bytearray()
    for o in range(rows):
        wn = [F32(w[o, i]) / col[i] for i in range(cols)]
        s = F32(max(h_round(max(abs(v) for v in wn) / F32(127)), TINY))
        body += bytes((min(max(round(float(v / s)), -127), 127)) & 0xFF for v in wn)
        scales += struct.pack("<e", s)
    return bytes(body + scales + b"".join(struct.pack("<e", c) for c in col))


def test_decode_hand_payload():
    # q = [127, -127], row scale 0.5, column field [2, 0.25].
    b = bytes([127, 0x81]) + struct.pack("<HHH", 0x3800, 0x4000, 0x3400)
    assert q8.decode(b, 1, 2).tolist() == [[127.0, -15.875]]


def test_zero_row_and_column_floor():
    w = np.zeros((3, 4), dtype=np.float32)
    w[1, 1] = 2.0
    b = q8.encode(w)
    row_off, col_off = q8.sections(3, 4)
    col = np.frombuffer(b[col_off:], "<f2").astype(np.float32)
    rows = np.frombuffer(b[row_off:col_off], "<f2").astype(np.float32)
    # Column 1: sqrt(4 / 3) in f16; the others floor at 2^-14, as do the empty rows' scales.
    assert col.tolist() == [TINY, float(h_round(math.sqrt(4 / 3))), TINY, TINY]
    assert rows[0] == rows[2] == F32(TINY)
    assert np.frombuffer(b[:row_off], np.int8).tolist() == [0] * 5 + [127] + [0] * 6
    assert q8.decode(b, 3, 4)[1, 1] == pytest.approx(2.0, rel=2e-3)


def test_encode_matches_slow_reference():
    rng = np.random.default_rng(2)
    # 300 rows: a full 256-row block and a partial one; columns of very different scale.
    w = (rng.standard_normal((300, 24)) * np.exp2(rng.uniform(-12, 6, 24))).astype(np.float32)
    w[7] = 0
    assert q8.encode(w) == ref_encode(w)


def test_round_trip_and_chunking():
    w = np.random.default_rng(4).standard_normal((33, 160)).astype(np.float32)
    b = q8.encode(w)
    assert len(b) == q8.nbytes(33, 160) == 33 * 160 + 66 + 320
    for chunk in (1, 5, 32):
        assert q8.encode(w, chunk_rows=chunk) == b
    d = q8.decode(b, 33, 160)
    # int8 at |w / col|max / 127 per row: relative RMS well under 1% on Gaussian data.
    assert np.sqrt(np.mean((d - w) ** 2) / np.mean(w ** 2)) < 0.01


def test_errors():
    with pytest.raises(CmfError, match="inf or NaN"):
        q8.encode(np.full((2, 2), np.inf, np.float32))
    with pytest.raises(CmfError, match="needs 12"):
        q8.decode(bytes(11), 2, 2)
