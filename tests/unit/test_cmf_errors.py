"""Every hard-error case of docs/FORMAT.md on a deliberately broken file: a clear CmfError."""

import struct

import numpy as np
import pytest

from cortiq_drv.cmf import CmfFile, CmfWriter
from cortiq_drv.errors import CmfError

# Envelope field offsets (FORMAT.md table) and directory record field offsets (56-byte records).
VERSION, FEATURES, HEADER, DIR, DATA, VOCAB = 0x04, 0x0C, 0x10, 0x20, 0x30, 0x50
NAME_OFF, NAME_LEN, DTYPE, NDIM, SHAPE, OFF, NBYTES = 0, 4, 6, 7, 8, 32, 40


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> bytes:
    p = tmp_path_factory.mktemp("cmf") / "good.cmf"
    with CmfWriter(p, {"arch": {"hidden_size": 32}}) as w:
        w.add_array("a.f32", np.arange(6, dtype=np.float32).reshape(2, 3))
        w.add_array("b.q4tp", np.ones((4, 64), dtype=np.float32), "q4tp")
        w.add("c.u8", "u8", (5,), bytes(5))
        w.set_vocab(b"{}")
    return p.read_bytes()


def u64(raw, at):
    return struct.unpack_from("<Q", raw, at)[0]


def put(fmt, at, value):
    def edit(raw):
        struct.pack_into(fmt, raw, at, value)
    return edit


def put_rec(i, fmt, field, value):
    """Edit field `field` of directory record `i`."""
    def edit(raw):
        struct.pack_into(fmt, raw, u64(raw, DIR) + 16 + 56 * i + field, value)
    return edit


def cut(n):
    def edit(raw):
        del raw[n:]
    return edit


def past_blob(raw):
    struct.pack_into("<Q", raw, u64(raw, DIR) + 16 + OFF, u64(raw, DATA + 8))


def bad_name(raw):
    d = u64(raw, DIR)
    pool = d + u64(raw, d + 8)
    raw[pool] = 0xFF


def dup_name(raw):
    d = u64(raw, DIR)
    pool = d + u64(raw, d + 8)
    raw[pool + 5:pool + 10] = raw[pool:pool + 5]  # "a.f32b.q4tp" -> "a.f32a.f32p"
    struct.pack_into("<H", raw, d + 16 + 56 + NAME_LEN, 5)


def data_off_misaligned(raw):
    struct.pack_into("<Q", raw, DATA, u64(raw, DATA) - 64)


def huge_count(raw):
    struct.pack_into("<Q", raw, u64(raw, DIR), 1 << 20)


def bad_json(raw):
    raw[128] = ord("[")


CASES = [
    ("empty file", cut(0), "truncated: 0 bytes"),
    ("truncated envelope", cut(100), "truncated: 100 bytes"),
    ("truncated blob", cut(4096 + 40), "section .* past the end of the file"),
    ("bad magic", put("<4s", 0, b"GGUF"), "bad magic"),
    ("version 1", put("<I", VERSION, 1), "version 1, only version 2"),
    ("version 3", put("<I", VERSION, 3), "version 3, only version 2"),
    ("unknown feature bit", put("<I", FEATURES, 1 | 1 << 7),
     r"unknown required feature bit\(s\) 0x80"),
    ("top feature bit", put("<I", FEATURES, 1 | 1 << 31), "unknown required feature"),
    ("skill file", put("<I", FEATURES, 1 | 1 << 6), "SKILL_FILE"),
    ("no tensor dir bit", put("<I", FEATURES, 0), "TENSOR_DIR is not set"),
    ("vocab past eof", put("<Q", VOCAB, 1 << 40), "vocab section .* past the end"),
    ("header past eof", put("<Q", HEADER + 8, 1 << 32), "header section .* past the end"),
    ("dir past eof", put("<Q", DIR + 8, 1 << 32), "dir section .* past the end"),
    ("data_off not 4096", data_off_misaligned, "data_off .* not a multiple of 4096"),
    ("tensor past blob", past_blob, "tensor 'a.f32' at .* past the blob"),
    ("nbytes past blob", put_rec(2, "<Q", NBYTES, 1 << 40), "tensor 'c.u8' at .* past the blob"),
    ("non-utf8 name", bad_name, "name is not UTF-8"),
    ("name past pool", put_rec(1, "<I", NAME_OFF, 1 << 20), "past the name pool"),
    ("duplicate name", dup_name, "appears twice"),
    ("unknown dtype 17", put_rec(0, "<B", DTYPE, 17), "tensor 'a.f32': unknown dtype id 17"),
    ("unknown dtype 255", put_rec(2, "<B", DTYPE, 255), "unknown dtype id 255"),
    ("ndim 7", put_rec(0, "<B", NDIM, 7), "ndim 7 > 6"),
    ("f32 payload length", put_rec(0, "<Q", NBYTES, 20),
     "payload of 20 bytes, f32 \\(2, 3\\) needs 24"),
    ("q4tp payload length", put_rec(1, "<I", SHAPE, 5), "payload of .* q4tp \\(5, 64\\) needs"),
    ("q4tp cols", put_rec(1, "<I", SHAPE + 4, 48), "q4tp needs cols % 32 == 0"),
    ("q4tp ndim", put_rec(1, "<B", NDIM, 1), "q4tp needs a 2-D shape"),
    ("misaligned tensor", put_rec(1, "<Q", OFF, 8), "not a multiple of 64"),
    ("directory too small", huge_count, "cannot hold 1048576 records"),
    ("header not json", bad_json, "header is not UTF-8 JSON"),
]


@pytest.mark.parametrize("edit, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_broken_file(tmp_path, good, edit, message):
    raw = bytearray(good)
    edit(raw)
    p = tmp_path / "bad.cmf"
    p.write_bytes(bytes(raw))
    with pytest.raises(CmfError, match=message) as e:
        CmfFile.open(p)
    assert str(p) in str(e.value)


def test_good_file_opens(tmp_path, good):
    p = tmp_path / "good.cmf"
    p.write_bytes(good)
    with CmfFile.open(p) as f:
        assert list(f.tensors) == ["a.f32", "b.q4tp", "c.u8"]
        with pytest.raises(CmfError, match="no tensor 'nope'"):
            f.tensor("nope")


def test_unsupported_dtype_opens_but_does_not_decode(tmp_path, good):
    raw = bytearray(good)
    put_rec(2, "<B", DTYPE, 3)(raw)  # u8 -> q8_row: a known dtype this project does not decode
    p = tmp_path / "q8row.cmf"
    p.write_bytes(bytes(raw))
    with CmfFile.open(p) as f:
        assert f.tensors["c.u8"].dtype == "q8_row"
        assert len(f.tensor("c.u8")) == 5
        with pytest.raises(CmfError, match="unsupported dtype q8_row"):
            f.array("c.u8")
