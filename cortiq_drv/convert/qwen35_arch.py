"""What a Qwen3.5 checkpoint must hold: the `arch` header from config.json and the tensor table.

config.json is the multimodal form (text model under `text_config`) or the flat text-only form;
key names are transformers' `Qwen3_5TextConfig`. `expected(arch)` lists every CMF tensor name of
the text model and MTP block with its shape, so the converter can check a checkpoint before it
writes a byte and name the tensor or key that is wrong.
"""

from __future__ import annotations

import json
from pathlib import Path

from cortiq_drv.errors import ConvertError

_LAYER_KIND = {"linear_attention": "LinearAttention", "full_attention": "FullAttention"}


def read_json(path: Path) -> dict:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConvertError(f"{path}: cannot read JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ConvertError(f"{path}: not a JSON object")
    return obj


class _Keys:
    """Config lookups that name the missing key: `text_config` first, then the top level."""

    def __init__(self, cfg: dict):
        self.top = cfg
        tc = cfg.get("text_config")
        self.text = tc if isinstance(tc, dict) else cfg
        self.prefix = "text_config." if self.text is not cfg else ""

    def get(self, key: str, default=None):
        if key in self.text:
            return self.text[key]
        return self.top.get(key, default)

    def need(self, key: str, kind: type = int):
        v = self.get(key)
        if v is None:
            raise ConvertError(f"config.json: missing key '{self.prefix}{key}'")
        if kind is int and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
            raise ConvertError(f"config.json: key '{self.prefix}{key}' must be a positive integer, not {v!r}")
        if kind is float and (not isinstance(v, (int, float)) or isinstance(v, bool)):
            raise ConvertError(f"config.json: key '{self.prefix}{key}' must be a number, not {v!r}")
        return v


def _rope(k: _Keys) -> tuple[float, float]:
    """rope_theta and partial_rotary_factor: from `rope_parameters` (transformers 5) or flat keys;
    the factor defaults to transformers' Qwen3.5 default, 0.25."""
    rp = k.get("rope_parameters") or {}
    if not isinstance(rp, dict):
        raise ConvertError(f"config.json: key '{k.prefix}rope_parameters' must be an object")
    theta = rp.get("rope_theta", k.get("rope_theta"))
    if theta is None:
        raise ConvertError(f"config.json: missing key '{k.prefix}rope_parameters.rope_theta' "
                           f"(or '{k.prefix}rope_theta')")
    return float(theta), float(rp.get("partial_rotary_factor", k.get("partial_rotary_factor", 0.25)))


def _layer_types(k: _Keys, n: int) -> list[str]:
    lt = k.get("layer_types")
    if lt is None:
        # transformers' default when the list is absent: full attention every fourth layer.
        interval = k.get("full_attention_interval", 4)
        return ["FullAttention" if (i + 1) % interval == 0 else "LinearAttention" for i in range(n)]
    if not isinstance(lt, list) or len(lt) != n:
        raise ConvertError(f"config.json: key '{k.prefix}layer_types' must list {n} layers, not {lt!r}")
    bad = [t for t in lt if t not in _LAYER_KIND]
    if bad:
        raise ConvertError(f"config.json: key '{k.prefix}layer_types': unsupported layer type {bad[0]!r}")
    return [_LAYER_KIND[t] for t in lt]


def arch_from_config(cfg: dict) -> dict:
    """The CMF `arch` header (FORMAT.md) of a Qwen3.5 config.json object."""
    k = _Keys(cfg)
    if k.get("num_experts"):
        raise ConvertError(f"config.json: key '{k.prefix}num_experts': mixture-of-experts models "
                           "are not supported")
    if k.get("quantization_config"):
        method = (k.get("quantization_config") or {}).get("quant_method", "?")
        raise ConvertError(f"config.json: key 'quantization_config': pre-quantized checkpoints "
                           f"({method}) are not supported; convert the bf16 release")
    n = k.need("num_hidden_layers")
    theta, prf = _rope(k)
    has_gdn = "LinearAttention" in (types := _layer_types(k, n))
    gdn = {key: (k.need(key) if has_gdn else k.get(key, 0)) for key in (
        "linear_conv_kernel_dim", "linear_num_key_heads", "linear_num_value_heads",
        "linear_key_head_dim", "linear_value_head_dim")}
    mtp_layers = int(k.get("mtp_num_hidden_layers", 0) or 0)
    return {
        "arch_name": "qwen3_5",
        "hidden_size": k.need("hidden_size"),
        "intermediate_size": k.need("intermediate_size"),
        "num_layers": n,
        "num_attention_heads": k.need("num_attention_heads"),
        "num_kv_heads": k.need("num_key_value_heads"),
        "head_dim": k.need("head_dim"),
        "vocab_size": k.need("vocab_size"),
        "layer_types": types,
        "rms_norm_eps": float(k.need("rms_norm_eps", float)),
        # Qwen3.5 stores zero-centred norm weights applied as (1 + w) (MODEL.md).
        "norm_style": "gemma",
        "rope_theta": theta,
        "partial_rotary_factor": prf,
        # Multimodal checkpoints carry the flag at the top level, in text_config or both.
        "tie_word_embeddings": bool(k.top.get("tie_word_embeddings")) or bool(k.get("tie_word_embeddings")),
        "max_position_embeddings": int(k.get("max_position_embeddings", 0) or 0),
        **gdn,
        "attn_output_gate": bool(k.get("attn_output_gate", True)),
        "mtp": {
            "num_layers": mtp_layers,
            "share_lm_head": True,
            "share_embed": not bool(k.get("mtp_use_dedicated_embeddings", False)),
        },
    }


def _attention(p: str, a: dict) -> dict[str, tuple[int, ...]]:
    h, hd, nh, nkv = a["hidden_size"], a["head_dim"], a["num_attention_heads"], a["num_kv_heads"]
    # With the output gate q_proj carries [query | gate] per head (MODEL.md).
    q_rows = nh * hd * (2 if a["attn_output_gate"] else 1)
    return {
        f"{p}self_attn.q_proj.weight": (q_rows, h),
        f"{p}self_attn.k_proj.weight": (nkv * hd, h),
        f"{p}self_attn.v_proj.weight": (nkv * hd, h),
        f"{p}self_attn.o_proj.weight": (h, nh * hd),
        f"{p}self_attn.q_norm.weight": (hd,),
        f"{p}self_attn.k_norm.weight": (hd,),
    }


def _gdn(p: str, a: dict) -> dict[str, tuple[int, ...]]:
    h, kk = a["hidden_size"], a["linear_conv_kernel_dim"]
    nk, nv = a["linear_num_key_heads"], a["linear_num_value_heads"]
    dk, dv = a["linear_key_head_dim"], a["linear_value_head_dim"]
    cdim = 2 * nk * dk + nv * dv
    return {
        f"{p}linear_attn.in_proj_qkv.weight": (cdim, h),
        f"{p}linear_attn.in_proj_z.weight": (nv * dv, h),
        f"{p}linear_attn.in_proj_a.weight": (nv, h),
        f"{p}linear_attn.in_proj_b.weight": (nv, h),
        f"{p}linear_attn.conv1d.weight": (cdim, 1, kk),
        f"{p}linear_attn.A_log": (nv,),
        f"{p}linear_attn.dt_bias": (nv,),
        f"{p}linear_attn.norm.weight": (dv,),
        f"{p}linear_attn.out_proj.weight": (h, nv * dv),
    }


def _layer(p: str, kind: str, a: dict) -> dict[str, tuple[int, ...]]:
    h, inter = a["hidden_size"], a["intermediate_size"]
    mixer = _attention(p, a) if kind == "FullAttention" else _gdn(p, a)
    return {
        f"{p}input_layernorm.weight": (h,),
        **mixer,
        f"{p}post_attention_layernorm.weight": (h,),
        f"{p}mlp.gate_proj.weight": (inter, h),
        f"{p}mlp.up_proj.weight": (inter, h),
        f"{p}mlp.down_proj.weight": (h, inter),
    }


def expected(arch: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of the model in CMF names, in file order, with its shape."""
    h, v = arch["hidden_size"], arch["vocab_size"]
    out = {"model.embed_tokens.weight": (v, h)}
    for i, kind in enumerate(arch["layer_types"]):
        out.update(_layer(f"model.layers.{i}.", kind, arch))
    out["model.norm.weight"] = (h,)
    if not arch["tie_word_embeddings"]:
        out["lm_head.weight"] = (v, h)
    if arch["mtp"]["num_layers"]:
        out["model.mtp.fc.weight"] = (h, 2 * h)
        out["model.mtp.pre_fc_norm_embedding.weight"] = (h,)
        out["model.mtp.pre_fc_norm_hidden.weight"] = (h,)
        for i in range(arch["mtp"]["num_layers"]):
            out.update(_layer(f"model.mtp.layers.{i}.", "FullAttention", arch))
        out["model.mtp.norm.weight"] = (h,)
    return out


def cmf_name(src: str) -> str | None:
    """The CMF name of a checkpoint tensor, or None for the vision tower (skipped)."""
    if src.startswith(("model.visual.", "visual.", "model.vision_tower.")):
        return None
    if src.startswith("model.language_model."):
        return "model." + src[len("model.language_model."):]
    if src.startswith("mtp."):
        return "model." + src
    return src
