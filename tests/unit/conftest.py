"""Fixtures shared by the unit tests: NVRTC's presence, a fresh kernel cache, the hybrid arm's tiny
model, a tools/ script as a module."""

import importlib.util
import sys
from pathlib import Path

import pytest

import _tiny
from cortiq_drv import knobs
from cortiq_drv.cmf import CmfFile
from cortiq_drv.cu import nvrtc
from cortiq_drv.errors import NvrtcError
from cortiq_drv.graph import build as graph_build


@pytest.fixture(scope="module")
def hyb_tiny(tmp_path_factory):
    """The tiny model with the GDN geometry of the kernels (dk = dv = 128): (CmfFile, graph)."""
    path = _tiny.write_tiny(tmp_path_factory.mktemp("hyb") / "t.cmf", linear_key_head_dim=128,
                            linear_value_head_dim=128)
    cmf = CmfFile.open(path)
    yield cmf, graph_build(cmf)
    cmf.close()


@pytest.fixture(scope="session")
def nvrtc_ok():
    """Skips the test where NVRTC cannot be loaded (where it can, it compiles without a GPU)."""
    try:
        nvrtc.nvrtc_version()
    except NvrtcError as e:
        pytest.skip(f"NVRTC cannot be loaded: {e}")


@pytest.fixture
def cache_dir(nvrtc_ok, tmp_path, monkeypatch):
    """A fresh kernel cache directory (CORTIQ_DRV_KERNEL_CACHE) and an empty in-process memo;
    the knobs are read again before and after."""
    monkeypatch.setenv("CORTIQ_DRV_KERNEL_CACHE", str(tmp_path / "kc"))
    knobs.reset()
    monkeypatch.setattr(nvrtc, "_memo", {})
    yield tmp_path / "kc"
    knobs.reset()


@pytest.fixture(scope="module")
def tool(request):
    """tools/<TOOL>.py (the test module's TOOL) as a module named `<TOOL>_tool`, in sys.modules
    while the module's tests run (worker processes a tool starts find its functions by name)."""
    name = request.module.TOOL
    path = Path(__file__).resolve().parents[2] / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_tool", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    yield mod
    del sys.modules[spec.name]
