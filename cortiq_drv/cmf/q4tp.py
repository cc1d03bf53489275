"""q4tp (dtype 15): 4-bit weights, a per-group scale picked from a per-row 32-rung ladder.

Layout and encoding exactly as docs/FORMAT.md ("q4tp"); ports cortiq_core::quant's
`q4tp_sections`, `q4tp_code`, `q4tp_ladder` and the converter's `encode_q4tp` (plus FORMAT.md's
search of rungs code-2 .. code+1 for the least squared error). Everything is
vectorised over rows and processed in row chunks; rows are independent and every reduction has a
fixed order, so the bytes do not depend on the chunk size.

One payload, three planes:
  nibbles  rows * gpr * 16 bytes, group (r, g) at (r * gpr + g) * 16, low nibble first
  params   rows * 4 bytes at params_off: per row f16 lo, f16 step
  codes    rows * stride bytes at codes_off: per row 5-bit rung codes, LSB first
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from itertools import islice
from typing import Iterator

import numpy as np

from cortiq_drv.cmf import f16
from cortiq_drv.errors import CmfError

GROUP = 32
RUNGS = 32
LMAX = RUNGS - 1
# Elements per encode / decode chunk (~8 MiB of float32): bounds the temporaries.
_CHUNK_ELEMS = 1 << 21
_RUNG_IDX = np.arange(RUNGS, dtype=np.float32)
_BIT_WEIGHTS = (1 << np.arange(5, dtype=np.uint8)).astype(np.uint8)


def sections(rows: int, cols: int) -> tuple[int, int, int]:
    """(params_off, codes_off, stride) of a rows x cols payload (`q4tp_sections`)."""
    gpr = cols // GROUP
    params_off = rows * gpr * 16
    codes_off = params_off + rows * 4
    return params_off, codes_off, (gpr * 5 + 7) // 8


def nbytes(rows: int, cols: int) -> int:
    """Total payload bytes of a rows x cols matrix."""
    _, codes_off, stride = sections(rows, cols)
    return codes_off + rows * stride


def code(code_row, g: int) -> int:
    """The 5-bit rung code of group `g` in one row's code bytes (`q4tp_code`)."""
    b, s = 5 * g // 8, 5 * g % 8
    v = int(code_row[b])
    if s > 3:
        v |= int(code_row[b + 1]) << 8
    return (v >> s) & 31


def ladders(lo: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Rungs exp2(lo + c * step), c = 0..31, for rows with float32 `lo`, `step` [n] -> [n, 32].

    The exponent is formed in float32 as the card does (c * step, then + lo); exp2 runs in float64
    and is rounded to float32, which gives the correctly rounded rung in practice and the same
    bits on every machine (float32 np.exp2 may take a SIMD path that differs by an ulp)."""
    lo = np.asarray(lo, dtype=np.float32)[..., None]
    step = np.asarray(step, dtype=np.float32)[..., None]
    x = lo + _RUNG_IDX * step  # [n, 32]
    return np.exp2(x.astype(np.float64)).astype(np.float32)


def ladder(params, r: int) -> np.ndarray:
    """Row `r`'s 32 rungs (float32) from the params plane (`q4tp_ladder`)."""
    p = np.frombuffer(params, dtype="<u2", count=2, offset=4 * r)
    lo, step = f16.from_f16(p)
    return ladders(lo, step)


@lru_cache(maxsize=1)
def _log2_table() -> np.ndarray:
    """log2 of every non-negative f16 up to inf as float32 (correctly rounded via float64),
    indexed by f16 bits; NaN above (scales are never negative or NaN)."""
    table = np.full(1 << 16, np.nan, dtype=np.float32)
    vals = f16.from_f16(np.arange(0x7C01).astype(np.uint16)).astype(np.float64)
    with np.errstate(divide="ignore"):
        table[:0x7C01] = np.log2(vals)
    return table


def _scale_logs(absmax: np.ndarray) -> np.ndarray:
    """lg = log2(f16_scale(absmax / 7)) per group, float32 [R, gpr]."""
    scale_bits = f16.to_f16(f16.f16_scale(absmax / np.float32(7)))
    return _log2_table()[scale_bits]


def _row_params(lg: np.ndarray, dead: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """f16 bits of each row's (lo, step) from its live groups' logs [R, gpr] -> ([R], [R])."""
    lo = np.where(dead, np.float32(np.inf), lg).min(axis=1)
    hi = np.where(dead, np.float32(-np.inf), lg).max(axis=1)
    # An all-dead row keeps a ladder at its first group's (floor) scale.
    none = dead.all(axis=1)
    lo[none] = lg[none, 0]
    hi[none] = lo[none]
    lo_h = f16.to_f16(lo)
    lo_r = f16.from_f16(lo_h)
    span = np.maximum(hi - lo_r, np.float32(0))
    st_h = f16.to_f16(span / np.float32(LMAX))
    # Rounding `step` to f16 can land short of hi: raise it one ulp at a time (at most 64).
    for _ in range(64):
        st = f16.from_f16(st_h)
        short = ~((st > 0) & (lo_r + np.float32(LMAX) * st >= hi))
        if not short.any():
            break
        st_h = st_h + short.astype(np.uint16)
    return lo_h, st_h


def _sq_err(t: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Squared error of groups t [R, gpr, 32] quantised at scales s [R, gpr], float32 [R, gpr].

    Summed by halving (32 -> 16 -> ... -> 1), a fixed order whatever the chunk shape."""
    s3 = s[..., None]
    d = t - np.clip(np.rint(t / s3), -8, 7) * s3
    d *= d
    while d.shape[-1] > 1:
        h = d.shape[-1] // 2
        d = d[..., :h] + d[..., h:]
    return d[..., 0]


def _pick_codes(t, lg, dead, lad, lo_r, st) -> np.ndarray:
    """Each group's rung code [R, gpr]: the nominal rung, then the best of code-2 .. code+1."""
    nominal = np.clip(np.rint((lg - lo_r[:, None]) / st[:, None]), 0, LMAX).astype(np.int64)
    nominal[dead] = 0
    best = nominal.copy()
    best_err = np.full(nominal.shape, np.inf, dtype=np.float32)
    for k in (-2, -1, 0, 1):
        cand = np.clip(nominal + k, 0, LMAX)
        err = _sq_err(t, np.take_along_axis(lad, cand, axis=1))
        # Strictly less: on a tie the lower code, tried first, stays.
        better = (err < best_err) & ~dead
        best[better] = cand[better]
        best_err[better] = err[better]
    return best


def _pack_codes(codes: np.ndarray) -> np.ndarray:
    """5-bit codes [R, gpr] -> code bytes [R, stride], code g at bit 5g, LSB first."""
    bits = (codes[..., None].astype(np.uint8) >> np.arange(5, dtype=np.uint8)) & 1  # [R, gpr, 5]
    return np.packbits(bits.reshape(len(codes), -1), axis=1, bitorder="little")


def _unpack_codes(plane: np.ndarray, gpr: int) -> np.ndarray:
    """Code bytes [R, stride] -> codes [R, gpr] (uint8)."""
    bits = np.unpackbits(plane, axis=1, bitorder="little")[:, :gpr * 5]
    return (bits.reshape(len(plane), gpr, 5) * _BIT_WEIGHTS).sum(axis=2, dtype=np.uint8)


def _encode_rows(w: np.ndarray):
    """Rows float32 [R, cols] -> (nibbles [R, gpr*16], params [R, 4], codes [R, stride]) (u8)."""
    rows, cols = w.shape
    t = w.reshape(rows, cols // GROUP, GROUP)  # [R, gpr, 32]
    absmax = np.abs(t).max(axis=2)  # [R, gpr]
    if not np.isfinite(absmax).all():
        raise CmfError("q4tp encode: the matrix holds inf or NaN")
    lg = _scale_logs(absmax)
    if not np.isfinite(lg).all():
        raise CmfError("q4tp encode: a group's scale overflows f16 (|w| > 458528)")
    dead = absmax == 0
    lo_h, st_h = _row_params(lg, dead)
    lo_r, st = f16.from_f16(lo_h), f16.from_f16(st_h)
    lad = ladders(lo_r, st)  # [R, 32]
    codes = _pick_codes(t, lg, dead, lad, lo_r, st)
    s = np.take_along_axis(lad, codes, axis=1)[..., None]  # [R, gpr, 1]
    q = (np.clip(np.rint(t / s), -8, 7) + 8).astype(np.uint8)  # [R, gpr, 32]
    nib = q[..., 0::2] | (q[..., 1::2] << 4)  # [R, gpr, 16]
    params = np.stack([lo_h, st_h], axis=1).astype("<u2").view(np.uint8)  # [R, 4]
    return nib.reshape(rows, -1), params, _pack_codes(codes)


def _check_shape(rows: int, cols: int) -> None:
    if cols <= 0 or cols % GROUP:
        raise CmfError(f"q4tp needs cols a positive multiple of {GROUP}, got {cols}")


def encode_iter(w, chunk_rows: int | None = None, threads: int = 1) -> Iterator[memoryview]:
    """The q4tp payload of the 2-D `w` in pieces: nibble chunks, then params, then codes.

    `w` is anything 2-D whose row slices convert to float32 (an ndarray, a memory map, a lazy
    view), read `chunk_rows` rows at a time, so the source need never be in memory whole.
    `threads` > 1 encodes chunks in parallel (numpy releases the GIL); the bytes are the same."""
    rows, cols = (int(d) for d in w.shape)
    _check_shape(rows, cols)
    step = chunk_rows or max(1, _CHUNK_ELEMS // cols)

    def one(r0: int):
        return _encode_rows(np.ascontiguousarray(w[r0:r0 + step], dtype=np.float32))

    params, codes = [], []
    # At most `threads` chunks in flight: Executor.map would submit every chunk at once and
    # buffer the whole nibble plane whenever the consumer (a disk write) is the slower side.
    width, starts = max(1, threads), iter(range(0, rows, step))
    with ThreadPoolExecutor(width) as pool:
        pending = deque(pool.submit(one, r0) for r0 in islice(starts, width))
        while pending:
            nib, p, c = pending.popleft().result()
            r0 = next(starts, None)
            if r0 is not None:
                pending.append(pool.submit(one, r0))
            params.append(p)
            codes.append(c)
            yield memoryview(nib).cast("B")
    for plane in (params, codes):
        if plane:
            yield memoryview(np.concatenate(plane)).cast("B")


def encode(w, chunk_rows: int | None = None, threads: int = 1) -> bytes:
    """The q4tp payload (bytes) of the float matrix `w` [rows, cols], cols % 32 == 0."""
    return b"".join(encode_iter(w, chunk_rows, threads))


def decode(b, rows: int, cols: int) -> np.ndarray:
    """float32 [rows, cols] of a q4tp payload: (nibble - 8) * rung[code]."""
    _check_shape(rows, cols)
    params_off, codes_off, stride = sections(rows, cols)
    buf = np.frombuffer(b, dtype=np.uint8)
    if len(buf) != codes_off + rows * stride:
        raise CmfError(f"q4tp payload of {len(buf)} bytes, a {rows}x{cols} matrix needs "
                       f"{codes_off + rows * stride}")
    gpr = cols // GROUP
    nib = buf[:params_off].reshape(rows, gpr, 16)
    p = buf[params_off:codes_off].view("<u2").reshape(rows, 2)
    cplane = buf[codes_off:].reshape(rows, stride)
    out = np.empty((rows, gpr, GROUP), dtype=np.float32)
    step = max(1, _CHUNK_ELEMS // cols)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        lad = ladders(f16.from_f16(p[r0:r1, 0]), f16.from_f16(p[r0:r1, 1]))  # [R, 32]
        s = np.take_along_axis(lad, _unpack_codes(cplane[r0:r1], gpr).astype(np.int64), axis=1)
        q = np.empty((r1 - r0, gpr, GROUP), dtype=np.float32)
        q[..., 0::2] = nib[r0:r1] & 15
        q[..., 1::2] = nib[r0:r1] >> 4
        q -= 8
        np.multiply(q, s[..., None], out=out[r0:r1])
    return out.reshape(rows, cols)
