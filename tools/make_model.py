"""Write generated Qwen3.5-architecture models: random-weight CMF files or a tiny HF checkpoint.

    python tools/make_model.py --shape default --out model.cmf
    python tools/make_model.py --shape 9b --out /tmp/q9b.cmf          # speed benchmarks (PERF.md)
    python tools/make_model.py --shape tiny --hidden 128 --layers 8 --out m.cmf
    python tools/make_model.py --hf-dir /tmp/ckpt                      # converter test input

CMF files come from `cortiq_drv.default_model` (weights drawn directly in q4tp, real Qwen3.5
vocabulary when the shape has 248320 rows). `--hf-dir` writes a Hugging Face-format Qwen3.5
checkpoint: config.json with `text_config`, bf16 safetensors in two shards with an index,
`model.language_model.*` names, one vision tensor, the `mtp.*` block, tokenizer files.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import zlib
from dataclasses import fields, replace
from pathlib import Path

import numpy as np

from cortiq_drv.convert import qwen35_arch as qa
from cortiq_drv.convert.safetensors import save
from cortiq_drv.default_model import SHAPES, Shape, build_model

# Converter-test checkpoint: every matrix has cols % 32 == 0; a small vocabulary.
HF_SHAPE = Shape(hidden=64, layers=4, heads=2, kv_heads=1, head_dim=32, gdn_k_heads=1, gdn_v_heads=2,
                 gdn_head_dim=32, ffn=96, vocab=384, max_positions=4096)
_HF_CHAT = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def hf_name(cmf: str) -> str:
    """The checkpoint name of a CMF tensor name (the inverse of `qwen35_arch.cmf_name`)."""
    if cmf.startswith("model.mtp."):
        return cmf[len("model."):]
    if cmf.startswith("model."):
        return "model.language_model." + cmf[len("model."):]
    return cmf


def hf_tensors(shape: Shape) -> dict[str, np.ndarray]:
    """Random float32 tensors of every checkpoint name (seeded per name), plus a vision tensor."""
    out = {}
    for name, tshape in qa.expected(shape.arch()).items():
        rng = np.random.default_rng([shape.seed, zlib.crc32(name.encode())])
        scale = 1.0 if len(tshape) == 1 else 1.0 / np.sqrt(tshape[-1])
        out[hf_name(name)] = (rng.standard_normal(tshape) * scale).astype(np.float32)
    out["model.visual.patch_embed.proj.weight"] = np.ones((8, 3, 2, 2), np.float32)
    return out


def _tokenizer_json(vocab: int) -> str:
    """A word-level tokenizer.json of `vocab` ids whose last three are the ChatML specials."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    words = {f"w{i}": i for i in range(vocab - 3)}
    tok = Tokenizer(WordLevel(words, unk_token="w0"))
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    return tok.to_str()


def write_hf_dir(out: Path, shape: Shape = HF_SHAPE, flat_config: bool = False,
                 plain_names: bool = False, dtype: str = "BF16") -> Path:
    """Write the checkpoint directory. `flat_config`: config.json without `text_config`;
    `plain_names`: `model.*` instead of `model.language_model.*` and no vision tensor."""
    out.mkdir(parents=True, exist_ok=True)
    tensors = hf_tensors(shape)
    if plain_names:
        tensors = {n.replace("model.language_model.", "model."): a for n, a in tensors.items()
                   if not n.startswith("model.visual.")}
    names = list(tensors)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half],
              "model-00002-of-00002.safetensors": names[half:]}
    for fname, part in shards.items():
        save(out / fname, {n: tensors[n] for n in part}, dtype)
    index = {"metadata": {}, "weight_map": {n: f for f, part in shards.items() for n in part}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    specials = shape.vocab - 3
    cfg = shape.config()
    cfg["text_config"]["eos_token_id"] = specials + 2
    if flat_config:
        cfg = {**cfg["text_config"], "architectures": ["Qwen3_5ForCausalLM"]}
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    (out / "tokenizer.json").write_text(_tokenizer_json(shape.vocab))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": _HF_CHAT, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}))
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [specials + 2, specials], "pad_token_id": specials}))
    return out


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=[*SHAPES, "custom"], default="default")
    p.add_argument("--out", type=Path, help="CMF file to write")
    p.add_argument("--hf-dir", type=Path, help="write a tiny Hugging Face checkpoint directory instead")
    for f in fields(Shape):
        p.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=None,
                       help=f"override the shape's {f.name}")
    a = p.parse_args(argv)
    if (a.out is None) == (a.hf_dir is None):
        p.error("give exactly one of --out and --hf-dir")
    return a


def main(argv=None) -> int:
    a = _args(argv)
    base = HF_SHAPE if a.hf_dir else SHAPES.get(a.shape, SHAPES["default"])
    shape = replace(base, **{f.name: getattr(a, f.name) for f in fields(Shape)
                             if getattr(a, f.name) is not None})
    t0 = time.monotonic()
    if a.hf_dir:
        path = write_hf_dir(a.hf_dir, shape)
    else:
        path = build_model(shape, a.out, a.shape)
    print(f"wrote {path} in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
