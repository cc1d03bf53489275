"""The `logits`, `run` and `demo` subcommands on the tiny models (no default model is built here:
`default_model_path` is replaced by one that writes the tiny model with a tokenizer)."""

import numpy as np
import pytest

import _tiny
from _tiny_vocab import write_tiny_vocab
from cortiq_drv import default_model
from cortiq_drv.cli import main
from cortiq_drv.engine import Engine


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return _tiny.write_tiny(tmp_path_factory.mktemp("cli") / "tiny.cmf")


@pytest.fixture(scope="module")
def vocab_model(tmp_path_factory):
    return write_tiny_vocab(tmp_path_factory.mktemp("cliv") / "v.cmf")


def test_logits_writes_the_engine_logits(tiny, tmp_path, capsys):
    out = tmp_path / "l.npy"
    assert main(["logits", str(tiny), "--ids", "1,2,3,400", "--out", str(out)]) == 0
    got = np.load(out)
    assert got.dtype == np.float32 and got.shape == (4, 512)
    assert np.array_equal(got, Engine.open(tiny).logits([1, 2, 3, 400]))
    assert "[4, 512]" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["--ids", "1,x"], "'x' is not a token id"),
    (["--ids", "1,999"], "token id 999 is not in the vocabulary [0, 512)"),
], ids=["not-an-id", "unknown-id"])
def test_logits_errors(tiny, tmp_path, capsys, argv, message):
    assert main(["logits", str(tiny), "--out", str(tmp_path / "x.npy")] + argv) == 1
    assert message in capsys.readouterr().err


def test_missing_model_file(tmp_path, capsys):
    assert main(["run", str(tmp_path / "nope.cmf"), "--prompt", "hi"]) == 1
    assert "no such model file" in capsys.readouterr().err


def test_run_prints_text_and_counters(vocab_model, capsys):
    assert main(["run", str(vocab_model), "--prompt", "w5 w6 w7", "--max-tokens", "6", "--greedy"]) == 0
    out = capsys.readouterr().out
    assert "running on the host arm" in out
    assert "prompt 3 tokens at" in out and "decode 5 tokens at" in out
    assert "drafts accepted" in out and "(k=3)" in out


def test_run_past_the_context_limit(tmp_path, capsys):
    m = write_tiny_vocab(tmp_path / "short.cmf", max_position_embeddings=8)
    assert main(["run", str(m), "--prompt", " ".join(f"w{i}" for i in range(2, 11))]) == 1
    assert "9 tokens, past the context limit of 8" in capsys.readouterr().err


def _fake_default(monkeypatch, path):
    calls = []

    def fake(build=True, shape=None):
        calls.append(build)
        if build and not path.is_file():
            write_tiny_vocab(path)
        return path

    monkeypatch.setattr(default_model, "default_model_path", fake)
    return calls


def test_run_without_a_model_takes_the_default(tmp_path, monkeypatch, capsys):
    calls = _fake_default(monkeypatch, tmp_path / "default.cmf")
    assert main(["run", "--prompt", "w2 w3", "--max-tokens", "3", "--seed", "1"]) == 0
    assert calls == [True] and "decode 2 tokens" in capsys.readouterr().out


def test_demo_builds_says_random_and_reports(tmp_path, monkeypatch, capsys):
    calls = _fake_default(monkeypatch, tmp_path / "default.cmf")
    assert main(["demo", "--max-tokens", "4"]) == 0
    out = capsys.readouterr().out
    assert calls == [False, True] and "building the embedded default model" in out
    assert "RANDOM" in out and "weights are random" in out
    assert "tok/s" in out and "drafts accepted" in out
    assert main(["demo", "--max-tokens", "2", "--spec-k", "0"]) == 0
    assert "building" not in capsys.readouterr().out
