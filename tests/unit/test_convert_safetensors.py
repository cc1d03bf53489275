"""Safetensors reading: header parsing, bf16 / f16 / f32 decoding, row bands, sharding, errors."""

import json
import struct

import numpy as np
import pytest

from cortiq_drv.cmf import f16
from cortiq_drv.convert.safetensors import Checkpoint, save
from cortiq_drv.errors import ConvertError


def _raw_file(path, header: dict, data: bytes = b"", hlen: int | None = None):
    h = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(h) if hlen is None else hlen) + h + data)


@pytest.mark.parametrize("dtype", ["BF16", "F16", "F32"])
def test_round_trip(tmp_path, dtype):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((17, 40)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    save(tmp_path / "model.safetensors", {"a": a, "b": b}, dtype)
    want = {"BF16": lambda x: f16.from_bf16(f16.to_bf16(x)), "F16": f16.round_f16, "F32": lambda x: x}[dtype]
    with Checkpoint.open(tmp_path) as ck:
        assert ck.names() == ["a", "b"]
        assert ck.info("a").shape == (17, 40) and ck.info("a").dtype == dtype
        np.testing.assert_array_equal(ck.array("a"), want(a))
        np.testing.assert_array_equal(ck.array("b"), want(b))
        # A band of rows reads the same values as the whole tensor.
        np.testing.assert_array_equal(ck.array("a", (3, 16)), want(a)[3:16])


def test_bf16_round_to_nearest_even(tmp_path):
    # 1 + 2^-8 is halfway between two bf16 values: ties go to the even one (1.0).
    x = np.array([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, -2.5], np.float32)
    save(tmp_path / "model.safetensors", {"x": x})
    with Checkpoint.open(tmp_path) as ck:
        np.testing.assert_array_equal(ck.array("x"), [1.0, 1.0 + 2.0**-6, -2.5])


def test_sharded_index(tmp_path):
    save(tmp_path / "s1.safetensors", {"a": np.ones(4, np.float32)})
    save(tmp_path / "s2.safetensors", {"b": np.zeros((2, 2), np.float32)})
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}}))
    with Checkpoint.open(tmp_path) as ck:
        assert sorted(ck.names()) == ["a", "b"]
        np.testing.assert_array_equal(ck.array("b"), np.zeros((2, 2)))


@pytest.mark.parametrize("name, shard, match", [
    ("b", "s9.safetensors", "s9.safetensors"),  # a shard that is not there
    ("zz", "s1.safetensors", "'zz'"),  # a tensor its shard lacks
])  # fmt: skip
def test_index_naming_what_is_not_there(tmp_path, name, shard, match):
    save(tmp_path / "s1.safetensors", {"a": np.ones(4, np.float32)})
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "s1.safetensors", name: shard}}))
    with pytest.raises(ConvertError, match=match):
        Checkpoint.open(tmp_path)


@pytest.mark.parametrize("case, match", [
    ("header_len_past_end", "header length"),
    ("not_json", "not valid JSON"),
    ("offsets_past_end", "'w'.*data_offsets"),
    ("wrong_byte_count", "'w'.*12 bytes for F32"),
    ("missing_keys", "'w'.*dtype, shape and data_offsets"),
    ("bad_shape", "'w'.*bad shape"),
])  # fmt: skip
def test_malformed_headers(tmp_path, case, match):
    p = tmp_path / "model.safetensors"
    ok = {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}
    if case == "header_len_past_end":
        _raw_file(p, {"w": ok}, bytes(16), hlen=1 << 20)
    elif case == "not_json":
        p.write_bytes(struct.pack("<Q", 5) + b"{nope" + bytes(16))
    elif case == "offsets_past_end":
        _raw_file(p, {"w": {**ok, "data_offsets": [0, 64]}}, bytes(16))
    elif case == "wrong_byte_count":
        _raw_file(p, {"w": {**ok, "data_offsets": [0, 12]}}, bytes(16))
    elif case == "missing_keys":
        _raw_file(p, {"w": {"dtype": "F32", "shape": [4]}}, bytes(16))
    else:
        _raw_file(p, {"w": {**ok, "shape": [4, -1]}}, bytes(16))
    with pytest.raises(ConvertError, match=match):
        Checkpoint.open(tmp_path)


def test_unsupported_dtype_names_the_tensor(tmp_path):
    _raw_file(tmp_path / "model.safetensors",
              {"layer.w": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}}, bytes(4))
    with Checkpoint.open(tmp_path) as ck, pytest.raises(ConvertError, match="'layer.w'.*F8_E4M3"):
        ck.array("layer.w")


def test_truncated_file(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(ConvertError, match="not a safetensors file"):
        Checkpoint.open(tmp_path)


def test_empty_directory(tmp_path):
    with pytest.raises(ConvertError, match="no \\*.safetensors"):
        Checkpoint.open(tmp_path)
