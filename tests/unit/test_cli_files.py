"""`cortiq-drv convert`, `info` and `verify` on files made by tools/make_model.py."""

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from cortiq_drv.cli import main
from cortiq_drv.cmf import CmfFile

_spec = importlib.util.spec_from_file_location(
    "make_model", Path(__file__).resolve().parents[2] / "tools" / "make_model.py")
make_model = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_model)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """A q4tp CMF converted through the CLI from a generated checkpoint."""
    d = tmp_path_factory.mktemp("cli")
    src = make_model.write_hf_dir(d / "ckpt")
    assert main(["convert", str(src), str(d / "m.cmf"), "--quant", "q4tp", "--quiet"]) == 0
    return d / "m.cmf"


def test_convert_writes_a_valid_file(model, capsys):
    assert main(["verify", str(model)]) == 0
    assert "OK (71 tensors" in capsys.readouterr().out


def test_info_text(model, capsys):
    assert main(["info", str(model)]) == 0
    out = capsys.readouterr().out
    assert "arch.layer_types" in out and "FullAttention" in out
    assert "q4tp" in out and "tensors      71" in out


def test_info_json(model, capsys):
    assert main(["info", str(model), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["tensors"] == 71 and info["quant_type"] == "q4tp"
    assert info["dtypes"]["q4tp"]["count"] == 35 and info["arch"]["hidden_size"] == 64
    assert info["vocab_bytes"] > 0


def test_verify_names_a_corrupted_tensor(model, tmp_path, capsys):
    bad = Path(shutil.copy(model, tmp_path / "bad.cmf"))
    with CmfFile.open(bad) as f:
        t = f.info("model.layers.2.mlp.up_proj.weight")
    data = bytearray(bad.read_bytes())
    data[t.offset + t.nbytes // 2] ^= 0x10
    bad.write_bytes(bytes(data))
    assert main(["verify", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "'model.layers.2.mlp.up_proj.weight'" in err and "hash mismatch" in err


def test_verify_refuses_a_non_cmf_file(tmp_path, capsys):
    (tmp_path / "x.cmf").write_bytes(b"not a model" * 20)
    assert main(["verify", str(tmp_path / "x.cmf")]) == 1
    assert "cortiq-drv: error:" in capsys.readouterr().err


def test_convert_error_exit_1(tmp_path, capsys):
    src = make_model.write_hf_dir(tmp_path / "ckpt")
    (src / "config.json").unlink()
    assert main(["convert", str(src), str(tmp_path / "o.cmf"), "--quiet"]) == 1
    assert "no config.json" in capsys.readouterr().err
    assert not (tmp_path / "o.cmf").exists()
