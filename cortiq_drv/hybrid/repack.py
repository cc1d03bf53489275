"""q4tp into the tensor-core layout of `hy_mmp` (ports cuda_hybrid.rs `repack_q4tp`,
`repack_rows`, `repack_on_card`, `repack_rows_on_card`, `planes_bytes`, `mat_planes`).

The layout (kernels/hyb_mma.cuh spells it out beside the kernels): for `rows` logical rows,
ntile = ceil(rows / 16), gpr = cols / 32,
  nibbles  u32 [ntile][gpr][32 lanes][2]: word s of lane (gid, tig) holds the mma.sync m16n8k16
           A registers a_0..a_3 of k-step s, a_m = row gid + 8 (m & 1), columns
           16 s + 2 tig + 8 (m >> 1) and the next; low nibbles at bits 4m, high ones at 4m + 16;
  codes    u8 [ntile][gpr][16]: the rung code of each (row, group);
  ladders  f32 [rows][2]: each row's (lo, step), rung c = exp2(lo + c * step).
Rows past `rows` are zero weights (nibble 8, code 0). A gate/up pair of `inter` rows each
becomes 2 * inter rows whose tile t holds gate rows 8t..8t+7 then the same up rows (`pair_map`).

The host functions here are the reference the card's `hy_repack` is tested against, byte for
byte; the `*_on_card` ones are what plan builds use.
"""

from __future__ import annotations

import numpy as np

from cortiq_drv.cmf import f16, q4tp
from cortiq_drv.cmf.layout import round_up
from cortiq_drv.cu import Buf
from cortiq_drv.cu.args import kargs
from cortiq_drv.errors import CortiqError

GROUP = 32
TILE = 16
# Tiles the host repack turns around at once (bounds its temporaries).
_TILE_CHUNK = 256
# For lane l, k-step s, register m: the tile row (gid + 8 (m & 1)) and the group word
# (2 s + (m >> 1)) it draws its byte from, and that byte's shift (8 tig).
_LANE = np.arange(32)
_ROW = (_LANE[:, None, None] >> 2) + 8 * (np.arange(4)[None, None, :] & 1) + 0 * np.arange(2)[None, :, None]
_WORD = 2 * np.arange(2)[None, :, None] + (np.arange(4)[None, None, :] >> 1) + 0 * _LANE[:, None, None]
_SHIFT = (8 * (_LANE & 3)).astype(np.uint32)[:, None, None]
_M4 = (4 * np.arange(4)).astype(np.uint32)


def identity_map(r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Logical row r is row r of payload 0."""
    return np.zeros_like(r), r


def pair_map(r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A gate/up pair: row r of tile r >> 4 is gate (payload 0) or up (payload 1) row
    (r >> 4) * 8 + (r & 7), gate for the tile's first 8 rows."""
    return ((r & 15) >= 8).astype(np.int64), (r >> 4) * 8 + (r & 7)


def _split(payload, srows: int, cols: int):
    """A q4tp payload's planes: nibbles u8 [srows, gpr, 16], params u16 [srows, 2], codes u8
    [srows, stride + 1] (a zero byte appended so every 5-bit code reads two bytes)."""
    params_off, codes_off, stride = q4tp.sections(srows, cols)
    b = np.frombuffer(payload, dtype=np.uint8)
    if len(b) < codes_off + srows * stride:
        raise CortiqError(f"repack: a {srows}x{cols} q4tp payload needs {codes_off + srows * stride} "
                          f"bytes, got {len(b)}")
    nib = b[:params_off].reshape(srows, cols // GROUP, 16)
    params = b[params_off:codes_off].view("<u2").reshape(srows, 2)
    codes = np.zeros((srows, stride + 1), dtype=np.uint8)
    codes[:, :stride] = b[codes_off:codes_off + srows * stride].reshape(srows, stride)
    return nib, params, codes


def row_codes(codes: np.ndarray, gpr: int) -> np.ndarray:
    """5-bit codes [R, gpr] of code rows [R, >= ceil(5 gpr / 8) + 1] (FORMAT.md's rule)."""
    g = np.arange(gpr)
    b, s = (5 * g) >> 3, ((5 * g) & 7).astype(np.uint16)
    v = codes[:, b].astype(np.uint16) | (codes[:, b + 1].astype(np.uint16) << 8)
    return ((v >> s) & 31).astype(np.uint8)


def _ladders(planes, src: np.ndarray, srow: np.ndarray) -> np.ndarray:
    """f32 [rows * 2]: each logical row's (lo, step) from its payload's f16 params."""
    lad = np.empty((len(src), 2), dtype=np.float32)
    for i, (_, params, _) in enumerate(planes):
        sel = src == i
        lad[sel] = f16.from_f16(params[srow[sel]])
    return lad.reshape(-1)


def _check_rows(srcs, rows: int, cols: int, rowmap):
    if cols <= 0 or cols % GROUP:
        raise CortiqError(f"repack: q4tp width {cols} is not a positive multiple of 32")
    src, srow = rowmap(np.arange(rows, dtype=np.int64))
    for i, (_, srows) in enumerate(srcs):
        if (srow[src == i] >= srows).any():
            raise CortiqError(f"repack: a logical row maps past payload {i}'s {srows} rows")
    if ((src < 0) | (src >= len(srcs))).any():
        raise CortiqError("repack: a logical row maps to a payload that is not there")
    return src, srow


def _tile_words(words: np.ndarray) -> np.ndarray:
    """Group words u32 [T, 16 rows, gpr, 4] of T tiles -> the lane layout u32 [T, gpr, 32, 2]."""
    w = words.transpose(0, 2, 1, 3)  # [T, gpr, 16, 4]
    byte = (w[:, :, _ROW, _WORD] >> _SHIFT) & np.uint32(0xFF)  # [T, gpr, 32, 2, 4]
    x = ((byte & np.uint32(0xF)) << _M4) | ((byte >> np.uint32(4)) << (_M4 + np.uint32(16)))
    return np.bitwise_or.reduce(x, axis=-1)


def repack_rows(srcs, rows: int, cols: int, rowmap=identity_map):
    """`repack_q4tp` over rows drawn from several q4tp payloads of one width (`repack_rows`).

    `srcs` is a list of (payload, its rows); `rowmap(r)` maps logical rows (an int64 array) to
    (payload index, row in it) arrays. Returns (nibbles u32 [ntile*gpr*64], codes u8
    [ntile*gpr*16], ladders f32 [rows*2])."""
    src, srow = _check_rows(srcs, rows, cols, rowmap)
    planes = [_split(p, n, cols) for p, n in srcs]
    gpr, ntile = cols // GROUP, -(-rows // TILE)
    nib = np.empty((ntile, gpr, 32, 2), dtype=np.uint32)
    codes = np.zeros((ntile * TILE, gpr), dtype=np.uint8)
    for t0 in range(0, ntile, _TILE_CHUNK):
        t1 = min(ntile, t0 + _TILE_CHUNK)
        r0, r1 = t0 * TILE, min(rows, t1 * TILE)
        rows_nib = np.full(((t1 - t0) * TILE, gpr, 16), 0x88, dtype=np.uint8)
        for i, (pn, _, pc) in enumerate(planes):
            sel = np.nonzero(src[r0:r1] == i)[0]
            rows_nib[sel] = pn[srow[r0 + sel]]
            codes[r0 + sel] = row_codes(pc[srow[r0 + sel]], gpr)
        words = rows_nib.view("<u4").reshape(t1 - t0, TILE, gpr, 4)
        nib[t0:t1] = _tile_words(words)
    codes_t = codes.reshape(ntile, TILE, gpr).transpose(0, 2, 1)  # [ntile, gpr, 16]
    return nib.reshape(-1), np.ascontiguousarray(codes_t).reshape(-1), _ladders(planes, src, srow)


def repack_q4tp(payload, rows: int, cols: int):
    """One q4tp payload in the tensor-core layout, on the host (`repack_q4tp`)."""
    return repack_rows([(payload, rows)], rows, cols)


def random_q4tp(rows: int, cols: int, rng: np.random.Generator) -> bytes:
    """A q4tp payload of random nibbles and codes with finite row params (lo in [-12, -4], step
    in [0, 0.25]), like the reference's test `payload`: for tests and speed runs."""
    params_off, codes_off, stride = q4tp.sections(rows, cols)
    b = np.frombuffer(rng.bytes(codes_off + rows * stride), dtype=np.uint8).copy()
    lo = f16.to_f16(rng.uniform(-12, -4, rows).astype(np.float32))
    st = f16.to_f16(rng.uniform(0, 0.25, rows).astype(np.float32))
    b[params_off:codes_off] = np.stack([lo, st], axis=1).astype("<u2").view(np.uint8).reshape(-1)
    return b.tobytes()


def _plane_offsets(t_bytes: int, cc_bytes: int) -> tuple[int, int]:
    """Where the codes and the ladders start in a matrix's allocation (tiles first)."""
    cc_at = round_up(t_bytes, 256)
    return cc_at, round_up(cc_at + cc_bytes, 256)


def planes_bytes(rows: int, cols: int) -> int:
    """The bytes `mat_planes` takes for a rows x cols matrix (`planes_bytes`)."""
    ntile, gpr = -(-rows // TILE), cols // GROUP
    _, lad_at = _plane_offsets(ntile * gpr * 256, ntile * gpr * 16)
    return round_up(lad_at + rows * 8 + 64, 256)


def mat_planes(ctx, t_bytes: int, cc_bytes: int, lad: np.ndarray, arena=None):
    """A repacked matrix's planes (tiles, codes, ladders) in one allocation, from `arena` when it
    has room (`mat_planes`): (all, codes view, ladders view); the ladders are uploaded here."""
    cc_at, lad_at = _plane_offsets(t_bytes, cc_bytes)
    lad_bytes = lad.nbytes + 64
    total = lad_at + lad_bytes
    if arena is not None and arena.fits(total):
        whole = arena.take(total)
    else:
        whole = Buf.new(ctx, total)
    ld = whole.view(lad_at, lad_bytes)
    ld.upload(np.ascontiguousarray(lad, dtype=np.float32))
    return whole, whole.view(cc_at, cc_bytes), ld


def _launch_repack(ctx, fx, na, ca, nb, cb, stride: int, pair: bool, rows: int, cols: int, lad, arena):
    """The planes, then `hy_repack` into them; waits for it (the sources are freed after)."""
    ntile, gpr = -(-rows // TILE), cols // GROUP
    t, cc, ld = mat_planes(ctx, ntile * gpr * 256, ntile * gpr * 16, lad, arena)
    threads = ntile * gpr * 32
    args = kargs("QQQQiiQQii", na, ca, nb, cb, stride, int(pair), t, cc, rows, cols)
    ctx.launch(fx.repack, (-(-threads // 256), 1), 256, 0, args)
    ctx.sync()
    return t, cc, ld


def repack_on_card(ctx, fx, srcs, src_rows: int, rows: int, cols: int, arena=None):
    """One q4tp payload (or a gate/up pair of two, `pair_map`) uploaded as stored and repacked on
    the card by `hy_repack` (`repack_on_card`): (tiles, codes, ladders) Bufs; the tiles own the
    allocation (or are an arena view)."""
    if cols <= 0 or cols % GROUP or not 1 <= len(srcs) <= 2:
        raise CortiqError("repack: one q4tp payload (or a pair), 32 columns wide")
    pair = len(srcs) == 2
    if pair and rows != 2 * src_rows:
        raise CortiqError(f"repack: a pair of {src_rows}-row payloads makes {2 * src_rows} rows, not {rows}")
    if pair and src_rows % 8:
        raise CortiqError(f"repack: a gate/up pair needs rows a multiple of 8, got {src_rows}")
    rowmap = pair_map if pair else identity_map
    src_list = [(p, src_rows) for p in srcs]
    src, srow = _check_rows(src_list, rows, cols, rowmap)
    planes = [_split(p, src_rows, cols) for p in srcs]
    lad = _ladders(planes, src, srow)
    params_off, codes_off, stride = q4tp.sections(src_rows, cols)
    up = []
    try:
        for p in srcs:
            b = np.frombuffer(p, dtype=np.uint8)
            up.append((Buf.from_array(ctx, b[:params_off]),
                       Buf.from_array(ctx, b[codes_off:codes_off + src_rows * stride])))
        (na, ca), (nb, cb) = up[0], up[-1]
        return _launch_repack(ctx, fx, na, ca, nb, cb, stride, pair, rows, cols, lad, arena)
    finally:
        for n, c in up:
            n.close()
            c.close()


def repack_rows_on_card(ctx, fx, nib, params, codes, stride: int, rows: int, cols: int, arena=None):
    """`repack_on_card` for the leading `rows` rows of one payload whose three sections come
    apart (nibbles, params, codes of those rows), straight from a file's pages
    (`repack_rows_on_card`)."""
    gpr = cols // GROUP
    nib, params, codes = (np.frombuffer(x, dtype=np.uint8) for x in (nib, params, codes))
    if cols <= 0 or cols % GROUP or len(nib) < rows * gpr * 16 or len(params) < rows * 4 \
            or len(codes) < rows * stride:
        raise CortiqError("repack: q4tp sections shorter than their rows")
    lad = f16.from_f16(params[:rows * 4].view("<u2")).astype(np.float32)
    na = Buf.from_array(ctx, nib[:rows * gpr * 16])
    try:
        ca = Buf.from_array(ctx, codes[:rows * stride])
        try:
            return _launch_repack(ctx, fx, na, ca, na, ca, stride, False, rows, cols, lad, arena)
        finally:
            ca.close()
    finally:
        na.close()
