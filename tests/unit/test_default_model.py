"""The embedded default model: deterministic bytes, built in seconds, the shape the CUDA kernels
accept, real Qwen3.5 vocabulary, random weights said plainly, activations O(1) on the host arm."""

import importlib.util
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from cortiq_drv import knobs
from cortiq_drv.cmf import CmfFile, q4tp
from cortiq_drv.default_model import SHAPES, Shape, build_model, default_model_path, random_q4tp

_spec = importlib.util.spec_from_file_location(
    "make_model", Path(__file__).resolve().parents[2] / "tools" / "make_model.py")
make_model = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_model)

# A custom shape without the Qwen3.5 vocabulary: no tokenizer derivation, built in milliseconds.
SMALL = replace(SHAPES["tiny"], vocab=512)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A private user cache (the derived tokenizer.json lands there once for the module)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CORTIQ_DRV_CACHE", str(tmp_path_factory.mktemp("cache")))
        knobs.reset()
        yield knobs.get().cache_dir
    knobs.reset()


@pytest.fixture(scope="module")
def default_file(cache) -> Path:
    return default_model_path()


def test_same_bytes_twice(tmp_path):
    a = build_model(SMALL, tmp_path / "a.cmf")
    b = build_model(SMALL, tmp_path / "b.cmf")
    assert a.read_bytes() == b.read_bytes()
    c = build_model(replace(SMALL, seed=1), tmp_path / "c.cmf")
    assert c.read_bytes() != a.read_bytes()


def test_default_is_deterministic_and_fast(default_file, tmp_path):
    t0 = time.monotonic()
    again = build_model(SHAPES["default"], tmp_path / "again.cmf", "default")
    # About a second on a laptop core; generous for a loaded CI machine.
    assert time.monotonic() - t0 < 20
    assert again.read_bytes() == default_file.read_bytes()


def test_default_path_in_cache(cache, default_file):
    assert default_file.parent == cache / "models" and default_file.is_file()
    mtime = default_file.stat().st_mtime_ns
    assert default_model_path() == default_file
    assert default_file.stat().st_mtime_ns == mtime
    other = default_model_path(build=False, shape=replace(SHAPES["default"], seed=7))
    assert other != default_file and not other.exists()


def test_default_header_and_shape(default_file):
    with CmfFile.open(default_file) as f:
        f.verify()
        h, a = f.header, f.arch
        assert h["random_weights"] is True and "RANDOM" in h["description"]
        assert h["quant_type"] == "q4tp"
        assert a["layer_types"] == (["LinearAttention"] * 3 + ["FullAttention"]) * 2
        assert a["vocab_size"] == 248320 and a["hidden_size"] == 256
        # What the CUDA attention kernels take: hd 256 (a multiple of 32), rotary 64 dims,
        # heads per KV head <= 16.
        assert a["head_dim"] == 256 and a["head_dim"] * a["partial_rotary_factor"] == 64
        assert a["num_attention_heads"] // a["num_kv_heads"] <= 16
        assert (a["linear_num_key_heads"], a["linear_num_value_heads"]) == (2, 4)
        assert a["linear_key_head_dim"] == a["linear_value_head_dim"] == 128
        assert a["mtp"]["num_layers"] == 1 and a["norm_style"] == "gemma"
        assert h["tokenizer_config"]["eos_token_ids"] == [248046, 248044]
        assert h["tokenizer_config"]["chat_template"] is None  # the built-in ChatML
        vocab = f.vocab
        assert vocab is not None and b'"<|im_end|>"' in vocab
        for t in f.tensors.values():
            if len(t.shape) == 2 and "in_proj_a" not in t.name and "in_proj_b" not in t.name:
                assert t.dtype == "q4tp", t.name
        assert f.info("model.embed_tokens.weight").shape == (248320, 256)
        assert f.info("lm_head.weight").shape == (248320, 256)
        assert "model.mtp.fc.weight" in f.tensors


def test_weight_scales(default_file):
    with CmfFile.open(default_file) as f:
        w = f.array("model.layers.0.linear_attn.in_proj_qkv.weight")
        assert abs(w.std() * np.sqrt(256) - 1) < 0.1 and abs(w.mean()) < 0.01
        assert abs(f.array("model.layers.0.mlp.down_proj.weight").std() * np.sqrt(512) - 0.5) < 0.05
        assert abs(f.array("model.layers.3.input_layernorm.weight")).max() < 0.2
        assert abs(f.array("model.layers.0.linear_attn.norm.weight").mean() - 1) < 0.05


def test_host_arm_activations_stay_o1(default_file):
    from cortiq_drv.host.model import HostModel

    m = HostModel.open(default_file)
    r = m.run(m.new_sequence(), [9707, 11, 1879, 0, 248045, 872])
    assert np.isfinite(r.logits).all()
    assert 0.3 < r.hidden.std() < 5 and 0.3 < r.logits.std() < 5


def test_random_q4tp_payload():
    rng = np.random.default_rng(0)
    b = random_q4tp(rng, 7, 96, sigma=0.1)
    assert len(b) == q4tp.nbytes(7, 96)
    nib = np.frombuffer(b[:7 * 3 * 16], np.uint8)
    # Nibble 0 (weight -8 s) never appears: weights are symmetric about zero.
    assert ((nib & 15) != 0).all() and ((nib >> 4) != 0).all()
    w = q4tp.decode(b, 7, 96)
    assert 0.07 < w.std() < 0.13


def test_shapes_geometry():
    a9, a27 = SHAPES["9b"].arch(), SHAPES["27b"].arch()
    assert (a9["hidden_size"], a9["num_layers"], a9["intermediate_size"]) == (4096, 32, 12288)
    assert a9["layer_types"].count("FullAttention") == 8
    assert (a9["num_attention_heads"], a9["num_kv_heads"]) == (16, 4)
    assert (a27["hidden_size"], a27["num_layers"], a27["linear_num_value_heads"]) == (5120, 64, 48)
    assert Shape().arch() == SHAPES["default"].arch()


def test_make_model_cli(tmp_path, capsys):
    out = tmp_path / "m.cmf"
    assert make_model.main(["--shape", "tiny", "--vocab", "256", "--layers", "2", "--full-every", "2",
                            "--out", str(out)]) == 0
    with CmfFile.open(out) as f:
        assert f.arch["layer_types"] == ["LinearAttention", "FullAttention"]
        assert f.arch["vocab_size"] == 256 and f.vocab is None
        assert f.header["provenance"]["shape"]["name"] == "tiny"
    assert make_model.main(["--hf-dir", str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    with pytest.raises(SystemExit):
        make_model.main(["--shape", "tiny"])
