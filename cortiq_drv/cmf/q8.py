"""q8_2f (dtype 9): int8 weights times a per-row f16 scale times a per-column f16 field.

Layout and encoding as docs/FORMAT.md ("q8_2f"); ports the converter's `encode_q8_2f`.
Payload: int8 body [rows, cols], f16 row scale [rows], f16 column field [cols];
w[o, i] = q[o, i] * row[o] * col[i].
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from cortiq_drv.cmf import f16
from cortiq_drv.errors import CmfError

# Rows per block of the column sums: a fixed block makes the float64 sums' order fixed.
_SUM_BLOCK = 256
# Elements per encode / decode chunk (~8 MiB of float32).
_CHUNK_ELEMS = 1 << 21


def sections(rows: int, cols: int) -> tuple[int, int]:
    """(row_off, col_off): where the row scales and the column field start."""
    return rows * cols, rows * cols + 2 * rows


def nbytes(rows: int, cols: int) -> int:
    """Total payload bytes of a rows x cols matrix."""
    return rows * cols + 2 * rows + 2 * cols


def column_field(w) -> np.ndarray:
    """col[i] = max(f16(sqrt(mean over rows of w^2)), 2^-14), float32 [cols].

    Squares are summed in float64, each fixed block of 256 rows first, the blocks in order."""
    rows, cols = (int(d) for d in w.shape)
    acc = np.zeros(cols, dtype=np.float64)
    for r0 in range(0, rows, _SUM_BLOCK):
        x = np.asarray(w[r0:r0 + _SUM_BLOCK], dtype=np.float32).astype(np.float64)
        acc += np.add.reduce(x * x, axis=0)
    rms = np.sqrt(acc / max(rows, 1)).astype(np.float32)
    return f16.f16_scale(rms)


def _encode_rows(w: np.ndarray, col: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows float32 [R, cols] -> (int8 body [R, cols], f16 row-scale bits [R])."""
    wn = w / col  # [R, cols]
    scale = f16.f16_scale(np.abs(wn).max(axis=1) / np.float32(127))  # [R]
    q = np.clip(np.rint(wn / scale[:, None]), -127, 127).astype(np.int8)
    return q, f16.to_f16(scale)


def encode_iter(w, chunk_rows: int | None = None) -> Iterator[memoryview]:
    """The q8_2f payload of the 2-D `w` in pieces: body chunks, row scales, column field.

    Two passes over `w` (column statistics, then rows), each reading row slices only."""
    rows, cols = (int(d) for d in w.shape)
    if rows <= 0 or cols <= 0:
        raise CmfError(f"q8_2f needs a non-empty 2-D matrix, got {rows}x{cols}")
    col = column_field(w)
    if not np.isfinite(col).all():
        raise CmfError("q8_2f encode: the matrix holds inf or NaN, or its column RMS overflows f16")
    step = chunk_rows or max(1, _CHUNK_ELEMS // cols)
    scales = []
    for r0 in range(0, rows, step):
        q, s = _encode_rows(np.asarray(w[r0:r0 + step], dtype=np.float32), col)
        scales.append(s)
        yield memoryview(q).cast("B")
    yield memoryview(np.concatenate(scales).astype("<u2")).cast("B")
    yield memoryview(f16.to_f16(col).astype("<u2")).cast("B")


def encode(w, chunk_rows: int | None = None) -> bytes:
    """The q8_2f payload (bytes) of the float matrix `w` [rows, cols]."""
    return b"".join(encode_iter(w, chunk_rows))


def decode(b, rows: int, cols: int) -> np.ndarray:
    """float32 [rows, cols] of a q8_2f payload: (q * row) * col."""
    buf = np.frombuffer(b, dtype=np.uint8)
    if len(buf) != nbytes(rows, cols):
        raise CmfError(f"q8_2f payload of {len(buf)} bytes, a {rows}x{cols} matrix needs "
                       f"{nbytes(rows, cols)}")
    row_off, col_off = sections(rows, cols)
    q = buf[:row_off].view(np.int8).reshape(rows, cols)
    row = f16.from_f16(buf[row_off:col_off].view("<u2"))  # [rows]
    col = f16.from_f16(buf[col_off:].view("<u2"))  # [cols]
    out = np.empty((rows, cols), dtype=np.float32)
    step = max(1, _CHUNK_ELEMS // cols)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        np.multiply(q[r0:r1].astype(np.float32) * row[r0:r1, None], col, out=out[r0:r1])
    return out
