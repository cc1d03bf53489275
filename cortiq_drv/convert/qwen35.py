"""Hugging Face Qwen3.5 checkpoint directory -> CMF v2 (`cortiq-drv convert`).

Streaming: tensors are checked against the table `qwen35_arch.expected` first (names, shapes,
dtypes), then decoded, encoded and written one at a time (large matrices in row bands), so a
27B conversion never holds the model in memory. Every refusal names the tensor or config key.

Storage rules: matrices (2-D, cols % 32 == 0) in the requested codec; the GDN `in_proj_a` /
`in_proj_b` (read as raw f32 by the hybrid arm, graph weight kind 4), the conv1d taps and A_log
as f32; other 1-D tensors f16 (f32 for an f32 output).
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import numpy as np

from cortiq_drv.cmf import CmfWriter
from cortiq_drv.cmf.writer import encode_iter
from cortiq_drv.convert import qwen35_arch as qa
from cortiq_drv.convert.safetensors import SUPPORTED, Checkpoint
from cortiq_drv.errors import ConvertError
from cortiq_drv.vocab import QWEN35_VOCAB

QUANTS = ("q4tp", "q8_2f", "f16", "f32")
# Rows a band holds at most when a matrix is encoded piecewise (elements, ~64 MiB of f32).
_BAND_ELEMS = 16 << 20
_F32_ALWAYS = re.compile(r"linear_attn\.(in_proj_a\.weight|in_proj_b\.weight|conv1d\.weight|A_log)$")


def storage_dtype(name: str, shape: tuple[int, ...], quant: str) -> str:
    """The CMF dtype a tensor is written in (module docstring's rules)."""
    if _F32_ALWAYS.search(name):
        return "f32"
    if len(shape) == 2 and shape[1] % 32 == 0:
        return quant
    return "f32" if quant == "f32" else "f16"


class _Rows:
    """A checkpoint matrix as a lazy 2-D source: a row slice reads just that band from the map."""

    def __init__(self, ckpt: Checkpoint, name: str):
        self._ckpt, self._name = ckpt, name
        self.shape = ckpt.info(name).shape

    def __getitem__(self, rows: slice) -> np.ndarray:
        r0, r1, _ = rows.indices(self.shape[0])
        return self._ckpt.array(self._name, (r0, max(r0, r1)))


def payload(ckpt: Checkpoint, name: str, dtype: str):
    """One checkpoint tensor's CMF payload as pieces; a matrix is read from the map in row bands
    of ~64 MiB of f32 (q8_2f reads it twice: column statistics, then rows), never whole."""
    shape = ckpt.info(name).shape
    if len(shape) != 2:
        return encode_iter(ckpt.array(name), dtype)
    return encode_iter(_Rows(ckpt, name), dtype, max(1, _BAND_ELEMS // max(shape[1], 1)))


class _Bar:
    """`[ i/n] pct MB/s name` on stderr, redrawn in place at most every 0.2 s and at the end."""

    def __init__(self, total_bytes: int):
        self.total = max(total_bytes, 1)
        self.done = 0
        self.t0 = self.last = time.monotonic()

    def __call__(self, i: int, n: int, name: str, nbytes: int) -> None:
        self.done += nbytes
        now = time.monotonic()
        if i < n and now - self.last < 0.2:
            return
        self.last = now
        rate = self.done / max(now - self.t0, 1e-6) / 1e6
        end = "\n" if i == n else ""
        print(f"\r[{i:>{len(str(n))}}/{n}] {100 * self.done / self.total:5.1f}% {rate:8.1f} MB/s  "
              f"{name[:60]:<60}", end=end, file=sys.stderr, flush=True)


def _mtp_layers_seen(names: list[str]) -> int:
    idx = {int(m.group(1)) for n in names if (m := re.match(r"mtp\.layers\.(\d+)\.", n))}
    return max(idx) + 1 if idx else 0


def _arch(src: Path, names: list[str]) -> dict:
    cfg_path = src / "config.json"
    if not cfg_path.is_file():
        raise ConvertError(f"{src}: no config.json")
    cfg = qa.read_json(cfg_path)
    arch = qa.arch_from_config(cfg)
    if not arch["mtp"]["num_layers"]:
        # Some configs omit mtp_num_hidden_layers although the checkpoint carries the block.
        arch["mtp"]["num_layers"] = _mtp_layers_seen(names)
    return arch


def plan(ckpt: Checkpoint, arch: dict) -> list[tuple[str, str]]:
    """(source name, CMF name) of every tensor to write, in file order, after checking that the
    checkpoint holds exactly the expected tensors with the expected shapes and source dtypes."""
    want = qa.expected(arch)
    found: dict[str, str] = {}
    for src in ckpt.names():
        dst = qa.cmf_name(src)
        if dst is None or (dst == "lm_head.weight" and arch["tie_word_embeddings"]):
            # The vision tower; a head stored although tied to the embedding (the engine reads
            # the embedding).
            continue
        if dst not in want:
            raise ConvertError(f"tensor {src!r}: not part of a Qwen3.5 text model with this config")
        info = ckpt.info(src)
        if tuple(info.shape) != want[dst] and not (dst.endswith("conv1d.weight")
                                                   and info.shape == (want[dst][0], want[dst][2])):
            raise ConvertError(f"tensor {src!r}: shape {list(info.shape)}, expected {list(want[dst])}")
        if info.dtype not in SUPPORTED:
            raise ConvertError(f"tensor {src!r}: unsupported dtype {info.dtype} "
                               f"(supported: {', '.join(SUPPORTED)})")
        found[dst] = src
    missing = [d for d in want if d not in found]
    if missing:
        raise ConvertError(f"tensor {missing[0]!r} is missing from the checkpoint "
                           f"({len(missing)} missing in all)")
    return [(found[d], d) for d in want]


def _token_id(tok_json: dict | None, token) -> int | None:
    """Id of a special token named in tokenizer_config.json (a string or an AddedToken object)."""
    if isinstance(token, dict):
        token = token.get("content")
    if not isinstance(token, str) or tok_json is None:
        return None
    for t in tok_json.get("added_tokens", []):
        if t.get("content") == token:
            return int(t["id"])
    return tok_json.get("model", {}).get("vocab", {}).get(token)


def _ids(v) -> list[int]:
    if v is None:
        return []
    return [int(x) for x in (v if isinstance(v, list) else [v])]


def _chat_template(src: Path, tcfg: dict) -> str | None:
    """The checkpoint's Jinja chat template: tokenizer_config.json, else chat_template.jinja / .json."""
    t = tcfg.get("chat_template")
    if isinstance(t, list):
        # The named-template form: [{"name": "default", "template": ...}, ...].
        t = next((x.get("template") for x in t if x.get("name") == "default"), None)
    if isinstance(t, str):
        return t
    if (src / "chat_template.jinja").is_file():
        return (src / "chat_template.jinja").read_text(encoding="utf-8")
    if (src / "chat_template.json").is_file():
        return qa.read_json(src / "chat_template.json").get("chat_template")
    return None


def tokenizer_config(src: Path, tok_bytes: bytes | None) -> dict:
    """CMF `tokenizer_config`: chat template, eos ids (+ bos / pad) from generation_config.json,
    config.json or tokenizer_config.json, in that order of precedence."""
    try:
        tok_json = json.loads(tok_bytes) if tok_bytes else None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConvertError(f"{src / 'tokenizer.json'}: not valid JSON: {e}") from None
    files = [src / n for n in ("generation_config.json", "config.json")]
    cfgs = [qa.read_json(p) for p in files if p.is_file()]
    cfgs += [c["text_config"] for c in cfgs if isinstance(c.get("text_config"), dict)]
    tcfg = qa.read_json(src / "tokenizer_config.json") if (src / "tokenizer_config.json").is_file() else {}

    def pick(key: str) -> list[int]:
        for c in cfgs:
            if c.get(f"{key}_id") is not None:
                return _ids(c[f"{key}_id"])
        tid = _token_id(tok_json, tcfg.get(key))
        return [] if tid is None else [tid]

    bos, pad = pick("bos_token"), pick("pad_token")
    return {
        "chat_template": _chat_template(src, tcfg),
        "eos_token_ids": pick("eos_token"),
        "bos_token_id": bos[0] if bos else None,
        "pad_token_id": pad[0] if pad else None,
    }


def vocab_bytes(src: Path, vocab_size: int) -> bytes | None:
    """The checkpoint's tokenizer.json verbatim; without one, the derived Qwen3.5 tokenizer when
    the vocabulary is Qwen3.5's (248320 rows), else none."""
    if (src / "tokenizer.json").is_file():
        return (src / "tokenizer.json").read_bytes()
    if vocab_size == QWEN35_VOCAB:
        from cortiq_drv.convert.tokenizer_json import cached_path

        return cached_path().read_bytes()
    return None


def convert(src_dir, out_path, quant: str = "q4tp", progress=False) -> Path:
    """Convert the checkpoint directory `src_dir` to the CMF file `out_path`.

    `progress`: False (silent), True (a bar on stderr) or a callable (i, n, cmf_name, nbytes)."""
    if quant not in QUANTS:
        raise ConvertError(f"unsupported --quant {quant!r} (one of {', '.join(QUANTS)})")
    src, out = Path(src_dir), Path(out_path)
    with Checkpoint.open(src) as ckpt:
        arch = _arch(src, ckpt.names())
        todo = plan(ckpt, arch)
        vocab = vocab_bytes(src, arch["vocab_size"])
        header = {
            "arch": arch,
            "quant_type": quant,
            "provenance": {"converter": "cortiq_drv.convert.qwen35", "source": src.resolve().name},
            "tokenizer_config": tokenizer_config(src, vocab),
        }
        if progress is True:
            progress = _Bar(sum(ckpt.info(s).nbytes for s, _ in todo))
        with CmfWriter(out) as w:
            for i, (s, d) in enumerate(todo, 1):
                shape = ckpt.info(s).shape
                dtype = storage_dtype(d, shape, quant)
                w.add(d, dtype, shape, payload(ckpt, s, dtype))
                if progress:
                    progress(i, len(todo), d, ckpt.info(s).nbytes)
            if vocab is not None:
                w.set_vocab(vocab)
            w.set_header(header)
    return out
