"""Qwen3.5 checkpoint -> CMF: read-back equality per output dtype, name / config variants, the
vision tower skipped, the MTP block kept, and malformed checkpoints refused by name."""

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from _ref64 import rel_rms
from cortiq_drv.cmf import CmfFile, f16, q4tp, q8
from cortiq_drv.convert import convert
from cortiq_drv.convert import qwen35, qwen35_arch
from cortiq_drv.convert.safetensors import Checkpoint, save
from cortiq_drv.errors import ConvertError

_spec = importlib.util.spec_from_file_location(
    "make_model", Path(__file__).resolve().parents[2] / "tools" / "make_model.py")
make_model = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_model)

F32_ALWAYS = ("in_proj_a.weight", "in_proj_b.weight", "conv1d.weight", "A_log")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    return make_model.write_hf_dir(tmp_path_factory.mktemp("hf") / "ckpt")


@pytest.fixture(scope="module")
def source(hf_dir) -> dict[str, np.ndarray]:
    """The checkpoint's tensors as float32 (bf16 values), under their CMF names."""
    with Checkpoint.open(hf_dir) as ck:
        return {qwen35_arch.cmf_name(n): ck.array(n) for n in ck.names()
                if not n.startswith("model.visual.")}


def _convert(src, tmp_path, quant) -> CmfFile:
    return CmfFile.open(convert(src, tmp_path / f"out-{quant}.cmf", quant))


def test_f32_read_back_exact(hf_dir, source, tmp_path):
    with _convert(hf_dir, tmp_path, "f32") as f:
        assert set(f.tensors) == set(source)
        for name, want in source.items():
            assert f.info(name).dtype == "f32", name
            np.testing.assert_array_equal(f.array(name), want, err_msg=name)
        f.verify()


def test_f16_read_back_is_f16_rounding(hf_dir, source, tmp_path):
    with _convert(hf_dir, tmp_path, "f16") as f:
        for name, want in source.items():
            got = f.array(name)
            if name.endswith(F32_ALWAYS):
                assert f.info(name).dtype == "f32", name
                np.testing.assert_array_equal(got, want, err_msg=name)
            else:
                assert f.info(name).dtype == "f16", name
                np.testing.assert_array_equal(got, f16.round_f16(want), err_msg=name)


def test_q4tp_read_back_is_the_codec(hf_dir, source, tmp_path):
    with _convert(hf_dir, tmp_path, "q4tp") as f:
        n_q4 = 0
        for name, want in source.items():
            t = f.info(name)
            if name.endswith(F32_ALWAYS):
                assert t.dtype == "f32", name
                np.testing.assert_array_equal(f.array(name), want, err_msg=name)
            elif want.ndim == 1:
                assert t.dtype == "f16", name
                np.testing.assert_array_equal(f.array(name), f16.round_f16(want), err_msg=name)
            else:
                n_q4 += 1
                assert t.dtype == "q4tp", name
                enc = q4tp.encode(want)
                assert bytes(f.tensor(name)) == enc, name
                np.testing.assert_array_equal(f.array(name), q4tp.decode(enc, *want.shape), err_msg=name)
                # Gaussian weights on a 16-level grid: relative RMS error about 0.1.
                assert rel_rms(f.array(name), want) < 0.15, name
        assert n_q4 == 35


def test_q8_2f_within_codec_error(hf_dir, source, tmp_path):
    with _convert(hf_dir, tmp_path, "q8_2f") as f:
        for name in ("model.embed_tokens.weight", "model.layers.3.self_attn.q_proj.weight"):
            want = source[name]
            assert f.info(name).dtype == "q8_2f"
            assert bytes(f.tensor(name)) == q8.encode(want)
            assert rel_rms(f.array(name), want) < 0.02
        assert f.features & 4  # QUANT_2F


def test_q4tp_bands_equal_whole_matrix_encode(hf_dir, source, monkeypatch):
    # Bands of 5 rows (not a divisor of 384): the plane-wise join must equal the one-shot encode.
    monkeypatch.setattr(qwen35, "_BAND_ELEMS", 5 * 64)
    name = "model.embed_tokens.weight"
    with Checkpoint.open(hf_dir) as ck:
        got = b"".join(qwen35.payload(ck, make_model.hf_name(name), "q4tp"))
        assert got == q4tp.encode(source[name])
        assert b"".join(qwen35.payload(ck, make_model.hf_name(name), "f16")) == \
            f16.to_f16(source[name]).tobytes()


def test_header_arch_and_tokenizer(hf_dir, tmp_path):
    with _convert(hf_dir, tmp_path, "q4tp") as f:
        a = f.arch
        assert a["layer_types"] == ["LinearAttention"] * 3 + ["FullAttention"]
        assert (a["hidden_size"], a["intermediate_size"], a["num_layers"]) == (64, 96, 4)
        assert (a["num_attention_heads"], a["num_kv_heads"], a["head_dim"]) == (2, 1, 32)
        assert (a["linear_num_key_heads"], a["linear_num_value_heads"]) == (1, 2)
        assert (a["linear_key_head_dim"], a["linear_value_head_dim"], a["linear_conv_kernel_dim"]) == (32, 32, 4)
        assert a["norm_style"] == "gemma" and a["partial_rotary_factor"] == 0.25
        assert a["rope_theta"] == 1e7 and a["rms_norm_eps"] == 1e-6 and a["vocab_size"] == 384
        assert a["tie_word_embeddings"] is False and a["max_position_embeddings"] == 4096
        assert a["mtp"] == {"num_layers": 1, "share_lm_head": True, "share_embed": True}
        assert f.header["quant_type"] == "q4tp"
        tc = f.header["tokenizer_config"]
        assert tc["eos_token_ids"] == [383, 381] and tc["pad_token_id"] == 381
        assert tc["bos_token_id"] is None
        assert tc["chat_template"].startswith("{% for m in messages %}")
        assert f.vocab == (hf_dir / "tokenizer.json").read_bytes()


def test_vision_skipped_and_mtp_kept(hf_dir, tmp_path):
    with Checkpoint.open(hf_dir) as ck:
        assert any(n.startswith("model.visual.") for n in ck.names())
        assert "mtp.fc.weight" in ck.names()
    with _convert(hf_dir, tmp_path, "q4tp") as f:
        assert not any("visual" in n for n in f.tensors)
        assert not any(n.startswith("mtp.") for n in f.tensors)
        assert f.info("model.mtp.fc.weight").shape == (64, 128)
        assert "model.mtp.layers.0.self_attn.q_proj.weight" in f.tensors
        assert "model.mtp.pre_fc_norm_embedding.weight" in f.tensors


def test_flat_config_plain_names_single_file_f16_source(tmp_path, source):
    src = make_model.write_hf_dir(tmp_path / "flat", flat_config=True, plain_names=True)
    # Merge the shards into one model.safetensors of f16 values.
    with Checkpoint.open(src) as ck:
        tensors = {n: ck.array(n) for n in ck.names()}
    for p in src.glob("model*.safetensors*"):
        p.unlink()
    save(src / "model.safetensors", tensors, "F16")
    assert "text_config" not in json.loads((src / "config.json").read_text())
    with _convert(src, tmp_path, "f32") as f:
        assert set(f.tensors) == set(source)
        for name, want in source.items():
            # The source holds f16 roundings of the bf16 values; f32 output keeps them exactly.
            np.testing.assert_array_equal(f.array(name), f16.round_f16(want), err_msg=name)


def test_progress_callback(hf_dir, tmp_path, capsys):
    calls = []
    convert(hf_dir, tmp_path / "p.cmf", "f16", progress=lambda *a: calls.append(a))
    assert len(calls) == 71 and calls[-1][:2] == (71, 71)
    convert(hf_dir, tmp_path / "p2.cmf", "f16", progress=True)
    err = capsys.readouterr().err
    assert "[71/71] 100.0%" in err and "MB/s" in err


def _edit_config(src: Path, fn) -> None:
    cfg = json.loads((src / "config.json").read_text())
    fn(cfg)
    (src / "config.json").write_text(json.dumps(cfg))


def _copy(hf_dir, tmp_path) -> Path:
    return Path(shutil.copytree(hf_dir, tmp_path / "ckpt"))


def _rewrite_tensor(src: Path, name: str, value: np.ndarray | None, dtype="BF16", raw_dtype=None):
    """Replace (or drop, value None) one tensor in its shard; `raw_dtype` relabels its header."""
    index = json.loads((src / "model.safetensors.index.json").read_text())
    shard = src / index["weight_map"][name]
    with Checkpoint.open(src) as ck:
        tensors = {n: ck.array(n) for n in ck.names() if index["weight_map"][n] == shard.name}
    if value is None:
        del tensors[name], index["weight_map"][name]
        (src / "model.safetensors.index.json").write_text(json.dumps(index))
    else:
        tensors[name] = value
    save(shard, tensors, dtype)
    if raw_dtype:
        data = bytearray(shard.read_bytes())
        data[:] = data.replace(f'"{dtype}"'.encode(), f'"{raw_dtype}"'.encode())
        shard.write_bytes(bytes(data))


def test_missing_config_key_is_named(hf_dir, tmp_path):
    src = _copy(hf_dir, tmp_path)
    _edit_config(src, lambda c: c["text_config"].pop("hidden_size"))
    with pytest.raises(ConvertError, match="missing key 'text_config.hidden_size'"):
        convert(src, tmp_path / "x.cmf")
    assert not (tmp_path / "x.cmf").exists()


def test_bad_layer_types_is_named(hf_dir, tmp_path):
    src = _copy(hf_dir, tmp_path)
    _edit_config(src, lambda c: c["text_config"].update(layer_types=["linear_attention"] * 3))
    with pytest.raises(ConvertError, match="layer_types"):
        convert(src, tmp_path / "x.cmf")


def test_wrong_shape_is_named(hf_dir, tmp_path):
    src = _copy(hf_dir, tmp_path)
    name = "model.language_model.layers.1.mlp.up_proj.weight"
    _rewrite_tensor(src, name, np.zeros((95, 64), np.float32))
    with pytest.raises(ConvertError, match=f"'{name}': shape \\[95, 64\\], expected \\[96, 64\\]"):
        convert(src, tmp_path / "x.cmf")


def test_unsupported_dtype_is_named(hf_dir, tmp_path):
    src = _copy(hf_dir, tmp_path)
    # The shard written as F16, then relabelled as a same-size dtype the converter does not read.
    name = "model.language_model.layers.0.linear_attn.A_log"
    with Checkpoint.open(src) as ck:
        a = ck.array(name)
    _rewrite_tensor(src, name, a, dtype="F16", raw_dtype="I16")
    with pytest.raises(ConvertError, match="unsupported dtype I16"):
        convert(src, tmp_path / "x.cmf")


def test_missing_tensor_is_named(hf_dir, tmp_path):
    src = _copy(hf_dir, tmp_path)
    _rewrite_tensor(src, "mtp.norm.weight", None)
    with pytest.raises(ConvertError, match="'model.mtp.norm.weight' is missing"):
        convert(src, tmp_path / "x.cmf")


def test_unexpected_tensor_is_named(hf_dir, tmp_path):
    src = _copy(hf_dir, tmp_path)
    index = json.loads((src / "model.safetensors.index.json").read_text())
    save(src / "extra.safetensors", {"model.language_model.layers.0.self_attn.q_proj.bias": np.zeros(4)})
    index["weight_map"]["model.language_model.layers.0.self_attn.q_proj.bias"] = "extra.safetensors"
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ConvertError, match="q_proj.bias"):
        convert(src, tmp_path / "x.cmf")


def test_bad_safetensors_header_is_named(hf_dir, tmp_path):
    src = _copy(hf_dir, tmp_path)
    (src / "model-00002-of-00002.safetensors").write_bytes(b"\xff" * 8 + b"{}")
    with pytest.raises(ConvertError, match="model-00002-of-00002.safetensors: safetensors header length"):
        convert(src, tmp_path / "x.cmf")


def test_unknown_quant(hf_dir, tmp_path):
    with pytest.raises(ConvertError, match="q3"):
        convert(hf_dir, tmp_path / "x.cmf", "q3")


def test_tied_head_is_dropped(hf_dir, tmp_path):
    src = _copy(hf_dir, tmp_path)
    _edit_config(src, lambda c: c.update(tie_word_embeddings=True))
    with _convert(src, tmp_path, "f16") as f:
        assert f.arch["tie_word_embeddings"] is True
        assert "lm_head.weight" not in f.tensors and "model.embed_tokens.weight" in f.tensors


def test_mtp_count_from_tensors_and_tokenizer_fallbacks(hf_dir, tmp_path):
    src = _copy(hf_dir, tmp_path)
    _edit_config(src, lambda c: c["text_config"].pop("mtp_num_hidden_layers"))
    for name in ("tokenizer.json", "generation_config.json"):
        (src / name).unlink()
    (src / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    (src / "chat_template.jinja").write_text("{{ messages[0].content }}")
    with _convert(src, tmp_path, "f16") as f:
        assert f.arch["mtp"]["num_layers"] == 1 and "model.mtp.norm.weight" in f.tensors
        assert f.vocab is None
        tc = f.header["tokenizer_config"]
        # config.json's eos_token_id (no generation_config.json; no tokenizer.json to look up).
        assert tc["eos_token_ids"] == [383] and tc["chat_template"] == "{{ messages[0].content }}"


@pytest.mark.parametrize("edit, match", [
    (lambda c: c.update(quantization_config={"quant_method": "fp8"}), "'quantization_config'.*fp8"),
    (lambda c: c["text_config"].update(num_experts=256), "'text_config.num_experts'"),
    (lambda c: c["text_config"].update(head_dim=0), "'text_config.head_dim' must be a positive"),
    (lambda c: c["text_config"].update(layer_types=["mamba"] * 4), "unsupported layer type 'mamba'"),
    (lambda c: c["text_config"].pop("rope_parameters"), "'text_config.rope_parameters.rope_theta'"),
])  # fmt: skip
def test_unsupported_configs_are_named(hf_dir, tmp_path, edit, match):
    src = _copy(hf_dir, tmp_path)
    _edit_config(src, edit)
    with pytest.raises(ConvertError, match=match):
        convert(src, tmp_path / "x.cmf")
