"""CmfWriter -> CmfFile round trips: every supported dtype, layout rules, vocab, verify, uid."""

import json
import struct

import numpy as np
import pytest

from cortiq_drv.cmf import CmfFile, CmfWriter, f16, hash64, q4tp, q8
from cortiq_drv.cmf import layout as L
from cortiq_drv.errors import CmfError

HEADER = {"arch": {"arch_name": "qwen3_5", "hidden_size": 64}, "quant_type": "q4tp",
          "tokenizer_config": {"eos_token_ids": [1, 2], "chat_template": "{{ x }} ü"}}


def matrix(rows=48, cols=128, seed=0):
    return np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)


def write_all(path, **kw):
    w = matrix()
    with CmfWriter(path, HEADER, **kw) as cw:
        for dt in ("f32", "f16", "bf16", "q4tp", "q8_2f"):
            cw.add_array(f"m.{dt}", w, dt)
        cw.add_array("norm", np.linspace(-1, 1, 7, dtype=np.float32), "f32")
        cw.add("big", "f32", (4096 + 1,), np.arange(4097, dtype=np.float32))
        cw.set_vocab(b'{"model": {"type": "BPE"}}')
    return w


def test_round_trip_every_dtype(tmp_path):
    p = tmp_path / "m.cmf"
    w = write_all(p)
    with CmfFile.open(p) as f:
        t = f.tensors
        assert list(t) == ["m.f32", "m.f16", "m.bf16", "m.q4tp", "m.q8_2f", "norm", "big"]
        assert t["m.q4tp"].dtype == "q4tp" and t["m.q4tp"].shape == (48, 128)
        assert np.array_equal(f.array("m.f32"), w)
        assert np.array_equal(f.tensor("m.f16").view("<u2"), f16.to_f16(w).ravel())
        assert np.array_equal(f.array("m.f16"), f16.round_f16(w))
        assert np.array_equal(f.array("m.bf16"), f16.from_bf16(f16.to_bf16(w)))
        assert f.tensor("m.q4tp").tobytes() == q4tp.encode(w)
        assert np.array_equal(f.array("m.q4tp"), q4tp.decode(q4tp.encode(w), 48, 128))
        assert f.tensor("m.q8_2f").tobytes() == q8.encode(w)
        assert np.array_equal(f.array("m.q8_2f"), q8.decode(q8.encode(w), 48, 128))
        assert np.array_equal(f.array("big"), np.arange(4097, dtype=np.float32))
        assert f.array("m.f32").dtype == np.float32
        assert f.header["format"] == "cmf" and f.header["version"] == 2
        assert f.arch == HEADER["arch"]
        assert f.header["tokenizer_config"] == HEADER["tokenizer_config"]
        assert f.vocab == b'{"model": {"type": "BPE"}}'
        assert f.verify() == sum(x.nbytes for x in t.values())
        for x in t.values():
            assert hash64(f.tensor(x.name)) == x.hash


def test_layout_rules(tmp_path):
    p = tmp_path / "m.cmf"
    write_all(p)
    raw = p.read_bytes()
    env = L.ENVELOPE.unpack_from(raw, 0)
    assert env[0] == b"CMF\x01" and env[1] == 2 and env[2] == 0
    assert env[3] == L.TENSOR_DIR | L.QUANT_2F
    assert env[4] == 128 and env[6] == 128 + env[5]
    data_off = env[8]
    assert data_off % 4096 == 0
    assert env[16] == hash64(raw[128:128 + env[5]])
    assert env[17] == hash64(raw[env[6]:env[6] + env[7]])
    assert raw[env[12]:env[12] + env[13]] == b'{"model": {"type": "BPE"}}'
    assert env[12] >= data_off + env[9]
    json.loads(raw[128:128 + env[5]])
    with CmfFile.open(p) as f:
        for t in f.tensors.values():
            rel = t.offset - data_off
            assert rel % (4096 if t.nbytes >= 16 << 10 else 64) == 0, t
        # The small blob was moved down to close the reserved gap.
        assert data_off == L.round_up(env[6] + env[7], 4096)


def test_features_without_q8(tmp_path):
    p = tmp_path / "a.cmf"
    with CmfWriter(p) as w:
        w.add_array("x", matrix(2, 32), "q4tp")
    with CmfFile.open(p) as f:
        assert f.features == L.TENSOR_DIR and f.vocab is None and f.header["format"] == "cmf"


def test_streamed_pieces_and_big_blob_keeps_gap(tmp_path, monkeypatch):
    import cortiq_drv.cmf.writer as writer
    monkeypatch.setattr(writer, "_COMPACT_LIMIT", 0)
    w = matrix(64, 256)
    p = tmp_path / "s.cmf"
    with CmfWriter(p, reserve=20000) as cw:
        cw.add("q", "q4tp", w.shape, q4tp.encode_iter(w, chunk_rows=5))
        cw.add("f", "f32", w.shape, [w[:10], w[10:].tobytes()])
    with CmfFile.open(p) as f:
        assert f.tensor("q").tobytes() == q4tp.encode(w)
        assert np.array_equal(f.array("f"), w)
        assert f.tensors["q"].offset == L.round_up(128 + 20000, 4096)


def test_header_outgrowing_reserve_moves_blob(tmp_path):
    p = tmp_path / "r.cmf"
    names = [f"model.layers.{i}.mlp.down_proj.weight" for i in range(120)]
    with CmfWriter(p, {"arch": {"pad": "x" * 9000}}, reserve=0) as cw:
        for i, n in enumerate(names):
            cw.add_array(n, np.full(20, i, dtype=np.float32))
    with CmfFile.open(p) as f:
        assert list(f.tensors) == names
        assert all(f.array(n)[0] == i for i, n in enumerate(names))
        f.verify()


def test_uid_stable_and_content_bound(tmp_path):
    a, b, c = tmp_path / "a.cmf", tmp_path / "b.cmf", tmp_path / "c.cmf"
    write_all(a)
    write_all(b)
    with CmfWriter(c, HEADER) as cw:
        cw.add_array("m.f32", matrix(seed=1))
    with CmfFile.open(a) as fa, CmfFile.open(b) as fb, CmfFile.open(c) as fc:
        assert fa.uid == fb.uid and len(fa.uid) == 16
        assert fa.uid != fc.uid
    assert a.read_bytes() == b.read_bytes()


def test_verify_names_the_tensor(tmp_path):
    p = tmp_path / "m.cmf"
    write_all(p)
    with CmfFile.open(p) as f:
        off = f.tensors["m.q4tp"].offset + 100
    raw = bytearray(p.read_bytes())
    raw[off] ^= 1
    p.write_bytes(bytes(raw))
    with CmfFile.open(p) as f:
        with pytest.raises(CmfError, match=r"hash mismatch in tensor 'm.q4tp'"):
            f.verify()
    # A flipped header byte inside a JSON string: still valid JSON, the header hash catches it.
    raw = bytearray(p.read_bytes())
    i = raw.index(b"qwen3_5")
    raw[i] = ord("Q")
    p.write_bytes(bytes(raw))
    with CmfFile.open(p) as f:
        with pytest.raises(CmfError, match="header JSON"):
            f.verify()


def test_writer_errors_leave_nothing(tmp_path):
    p = tmp_path / "x.cmf"
    with pytest.raises(CmfError, match="payload of 12 bytes"):
        with CmfWriter(p) as w:
            w.add("a", "f32", (4,), bytes(12))
    with pytest.raises(RuntimeError):
        with CmfWriter(p) as w:
            w.add_array("a", matrix(2, 32))
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    with CmfWriter(p) as w:
        w.add("a", "f32", (1,), bytes(4))
        with pytest.raises(CmfError, match="added twice"):
            w.add("a", "f32", (1,), bytes(4))
        with pytest.raises(CmfError, match="cannot write dtype q8_row"):
            w.add("b", "q8_row", (1,), bytes(4))
        with pytest.raises(CmfError, match="unknown dtype"):
            w.add("b", "f64", (1,), bytes(8))
        with pytest.raises(CmfError, match="at most 6 dims"):
            w.add("b", "u8", (1,) * 7, bytes(1))
    assert [x.name for x in tmp_path.iterdir()] == ["x.cmf"]


def test_closed_file_and_views(tmp_path):
    p = tmp_path / "m.cmf"
    write_all(p)
    f = CmfFile.open(p)
    view = f.array("m.f32")
    f.close()
    # A view handed out before close stays valid; the file refuses new reads.
    assert view.shape == (48, 128) and float(view[0, 0]) == float(matrix()[0, 0])
    with pytest.raises(CmfError, match="closed"):
        f.tensor("m.f32")
    assert struct.calcsize("<4sIII" + "Q" * 14) == 128


def test_failed_add_leaves_no_trace(tmp_path):
    # A payload that fails midway (NaN in a later q4tp chunk) is dropped; the file stays exact.
    bad = matrix(8, 64)
    bad[6, 3] = np.nan
    p, q = tmp_path / "p.cmf", tmp_path / "q.cmf"
    with CmfWriter(p) as w:
        w.add_array("a", matrix(4, 32))
        with pytest.raises(CmfError, match="inf or NaN"):
            w.add("b", "q4tp", bad.shape, q4tp.encode_iter(bad, chunk_rows=2))
        w.add_array("c", matrix(2, 32, seed=2))
    with CmfWriter(q) as w:
        w.add_array("a", matrix(4, 32))
        w.add_array("c", matrix(2, 32, seed=2))
    assert p.read_bytes() == q.read_bytes()
