"""CMF v2 byte layout: envelope, feature bits, directory records, dtype ids (docs/FORMAT.md)."""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np

from cortiq_drv.cmf import q4tp, q8
from cortiq_drv.errors import CmfError

MAGIC = b"CMF\x01"
VERSION = 2
ENVELOPE_SIZE = 128
# magic, version, flags, required_features, then 7 (off, len) pairs ... as 14 u64, then 2 hashes.
ENVELOPE = struct.Struct("<4sIII" + "Q" * 14)
SECTIONS = ("header", "dir", "data", "masks", "vocab", "index")
DATA_ALIGN = 4096
# Tensors of BIG_TENSOR bytes or more start on a 4096-byte boundary, smaller ones on 64.
BIG_TENSOR = 16 << 10
SMALL_ALIGN = 64
MAX_NDIM = 6

# required_features bits.
TENSOR_DIR = 1 << 0
BINARY_MASKS = 1 << 1
QUANT_2F = 1 << 2
DELTA_MASKS = 1 << 3
HOT_PACKS = 1 << 4
LOOP_MASKS = 1 << 5
SKILL_FILE = 1 << 6
FEATURE_NAMES = {TENSOR_DIR: "TENSOR_DIR", BINARY_MASKS: "BINARY_MASKS", QUANT_2F: "QUANT_2F",
                 DELTA_MASKS: "DELTA_MASKS", HOT_PACKS: "HOT_PACKS", LOOP_MASKS: "LOOP_MASKS",
                 SKILL_FILE: "SKILL_FILE"}
KNOWN_FEATURES = sum(FEATURE_NAMES)

# dtype ids (u8, never reused) and their names.
DTYPE_NAMES = {0: "f32", 1: "f16", 2: "bf16", 3: "q8_row", 4: "q4_block", 5: "mix8_4", 6: "u8",
               7: "q4_col", 8: "vbit", 9: "q8_2f", 10: "vbit_ro", 11: "q4_tiled", 12: "q1",
               13: "q1s", 14: "q1t", 15: "q4tp", 16: "q2tp"}
DTYPE_IDS = {v: k for k, v in DTYPE_NAMES.items()}
F32, F16, BF16, U8, Q8_2F, Q4TP = 0, 1, 2, 6, 9, 15
# Dtypes whose payload is a whole number of bytes per element.
ELEMENT_SIZE = {F32: 4, F16: 2, BF16: 2, U8: 1}

DIR_HEAD = struct.Struct("<QQ")
DIR_RECORD = np.dtype([("name_off", "<u4"), ("name_len", "<u2"), ("dtype", "u1"), ("ndim", "u1"),
                       ("shape", "<u4", (MAX_NDIM,)), ("off", "<u8"), ("nbytes", "<u8"),
                       ("hash", "<u8")])
assert DIR_RECORD.itemsize == 56


def dtype_id(dtype: int | str) -> int:
    """The u8 id of `dtype` given as an id or a name; CmfError for anything unknown."""
    if isinstance(dtype, str):
        if dtype not in DTYPE_IDS:
            raise CmfError(f"unknown dtype {dtype!r}")
        return DTYPE_IDS[dtype]
    if int(dtype) not in DTYPE_NAMES:
        raise CmfError(f"unknown dtype id {dtype}")
    return int(dtype)


def payload_nbytes(dtype: int, shape: tuple[int, ...]) -> int | None:
    """Bytes a payload of `dtype` and `shape` must hold; None for dtypes sized by their content.

    CmfError when the shape cannot carry the dtype (q4tp / q8_2f are 2-D, q4tp cols % 32 == 0)."""
    n = 1
    for d in shape:
        n *= int(d)
    if dtype in ELEMENT_SIZE:
        return n * ELEMENT_SIZE[dtype]
    if dtype not in (Q8_2F, Q4TP):
        return None
    if len(shape) != 2:
        raise CmfError(f"{DTYPE_NAMES[dtype]} needs a 2-D shape, got {tuple(shape)}")
    rows, cols = (int(d) for d in shape)
    if dtype == Q8_2F:
        return q8.nbytes(rows, cols)
    if cols % q4tp.GROUP:
        raise CmfError(f"q4tp needs cols % 32 == 0, got shape {tuple(shape)}")
    return q4tp.nbytes(rows, cols)


def align_of(nbytes: int) -> int:
    """Alignment of a tensor's offset in the blob (writer rule)."""
    return DATA_ALIGN if nbytes >= BIG_TENSOR else SMALL_ALIGN


def round_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


class TensorInfo(NamedTuple):
    """One directory entry. `offset` is absolute in the file (the directory stores it relative
    to data_off); `dtype` is the dtype's name ("q4tp"); `hash` the stored hash64 of the payload."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    hash: int
