"""A tiny random Qwen3.5-shaped model written as a CMF, for tests (import as `import _tiny`).

`write_tiny(path)` writes vocab 512, hidden 64, 4 layers (3 GDN + 1 gated attention), head_dim 32
with partial rotary 0.25 (rd 8), 4 query heads on 2 KV heads, GDN nk 2 / nv 4 / dk = dv = 16 /
kk 4, an MTP block; matrices q4tp (or `quant="f32"`), GDN a/b projections and vectors f32.
Tensor names and shapes come from the converter's table (`convert.qwen35_arch.expected`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cortiq_drv.cmf import CmfWriter
from cortiq_drv.convert.qwen35_arch import expected


def tiny_arch(**over) -> dict:
    """The tiny model's arch header; keyword arguments override keys."""
    arch = {
        "arch_name": "qwen3_5", "hidden_size": 64, "intermediate_size": 128, "num_layers": 4,
        "num_attention_heads": 4, "num_kv_heads": 2, "head_dim": 32, "vocab_size": 512,
        "layer_types": ["LinearAttention"] * 3 + ["FullAttention"], "rms_norm_eps": 1e-6,
        "norm_style": "gemma", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
        "tie_word_embeddings": False, "max_position_embeddings": 4096,
        "linear_conv_kernel_dim": 4, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "linear_key_head_dim": 16, "linear_value_head_dim": 16, "attn_output_gate": True,
        "mtp": {"num_layers": 1, "share_lm_head": True, "share_embed": True},
    }
    arch.update(over)
    arch["num_layers"] = len(arch["layer_types"])
    return arch


def _value(rng, name: str, shape: tuple[int, ...], gemma: bool) -> np.ndarray:
    """Random weights that keep activations O(1): matrices scaled by 1/sqrt(fan-in)."""
    if name.endswith("linear_attn.norm.weight"):
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
        w = 0.1 * rng.standard_normal(shape)
        return (w if gemma else 1.0 + w).astype(np.float32)
    if name.endswith("A_log"):
        return rng.uniform(-1.0, 1.0, shape).astype(np.float32)
    if name.endswith("dt_bias"):
        return (0.5 * rng.standard_normal(shape)).astype(np.float32)
    if name.endswith("conv1d.weight"):
        return (0.5 * rng.standard_normal(shape)).astype(np.float32)
    if name == "model.embed_tokens.weight":
        return rng.standard_normal(shape).astype(np.float32)
    return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)


def _dtype(name: str, shape: tuple[int, ...], quant: str) -> str:
    small = len(shape) != 2 or "in_proj_a." in name or "in_proj_b." in name
    return "f32" if small else quant


def write_tiny(path, *, seed: int = 0, quant: str = "q4tp", **over) -> Path:
    """Write the tiny model to `path` (arch keys overridable); returns the path."""
    arch = tiny_arch(**over)
    rng = np.random.default_rng(seed)
    gemma = arch["norm_style"] == "gemma"
    header = {"arch": arch, "quant_type": quant, "provenance": {"source": "tests/unit/_tiny.py"},
              "tokenizer_config": {"eos_token_ids": [1], "bos_token_id": None, "pad_token_id": 0}}
    with CmfWriter(path, header) as w:
        for name, shape in expected(arch).items():
            w.add_array(name, _value(rng, name, shape, gemma), _dtype(name, shape, quant))
    return Path(path)
