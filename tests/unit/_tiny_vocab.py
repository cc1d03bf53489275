"""The tiny model of `_tiny.py` with a small word-level tokenizer.json in its vocab section (the
engine's text path and a padded head: the tokenizer knows `words` + 1 ids, the head has 512 rows)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers

import _tiny
from cortiq_drv.cmf import CmfWriter
from cortiq_drv.convert.qwen35_arch import expected


def word_tokenizer(words: int = 300) -> bytes:
    """tokenizer.json of `[UNK]` (id 0) and the words w1 .. w{words}, split on whitespace."""
    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, words + 1)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok.to_str().encode()


def write_tiny_vocab(path, *, words: int = 300, seed: int = 0, **over) -> Path:
    """`_tiny.write_tiny` plus the word tokenizer; eos id 1 (w1)."""
    arch = _tiny.tiny_arch(**over)
    rng = np.random.default_rng(seed)
    header = {"arch": arch, "quant_type": "q4tp", "provenance": {"source": "tests/unit/_tiny_vocab.py"},
              "description": "tiny test model with RANDOM weights",
              "tokenizer_config": {"eos_token_ids": [1], "bos_token_id": None, "pad_token_id": 0}}
    with CmfWriter(path, header) as w:
        for name, shape in expected(arch).items():
            w.add_array(name, _tiny._value(rng, name, shape, True), _tiny._dtype(name, shape, "q4tp"))
        w.set_vocab(word_tokenizer(words))
    return Path(path)
