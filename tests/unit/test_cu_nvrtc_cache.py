"""NVRTC compile cache: content-addressed keys, on-disk hits, atomic writes, compile errors."""

import pytest

from cortiq_drv.cu import nvrtc
from cortiq_drv.errors import NvrtcError

_SRC = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] = 1.0f; }\n'


def _key(src=_SRC, defines=(("A", 1), ("B", 2)), arch="sm_90", version=(13, 0)):
    return nvrtc.cache_key(src, nvrtc.options_for(dict(defines), arch), version, arch)


def test_same_inputs_same_key_and_define_order_does_not_matter():
    assert _key() == _key()
    assert _key(defines=(("B", 2), ("A", 1))) == _key()


@pytest.mark.parametrize("change", [
    {"src": _SRC + " "},
    {"defines": (("A", 1), ("B", 3))},
    {"defines": (("A", 1),)},
    {"arch": "sm_80"},
    {"version": (13, 1)},
])
def test_any_change_gives_a_new_key(change):
    assert _key(**change) != _key()


def test_options_for_defines_forms():
    assert nvrtc.options_for({"X": None, "Y": 4}, "sm_80") == [
        "--gpu-architecture=sm_80", *nvrtc.BASE_OPTIONS, "-DX", "-DY=4"]
    assert nvrtc.options_for(["Z=1"], "sm_90", ["-lineinfo"])[-2:] == ["-DZ=1", "-lineinfo"]


def test_compile_writes_one_cubin_and_reuses_it(cache_dir, monkeypatch):
    cubin = nvrtc.compile_cubin(_SRC, {"N": 3}, "sm_80")
    assert cubin.startswith(b"\x7fELF")
    files = list(cache_dir.iterdir())
    assert [f.suffix for f in files] == [".cubin"]
    assert files[0].read_bytes() == cubin
    assert nvrtc.cubin_path(_SRC, {"N": 3}, "sm_80") == files[0]
    # a fresh process (no memo) reads the disk copy instead of compiling
    monkeypatch.setattr(nvrtc, "_memo", {})
    monkeypatch.setattr(nvrtc, "compile_program", lambda *a, **k: pytest.fail("recompiled"))
    assert nvrtc.compile_cubin(_SRC, {"N": 3}, "sm_80") == cubin


def test_torn_cache_file_is_recompiled(cache_dir):
    cubin = nvrtc.compile_cubin(_SRC, (), "sm_90")
    (path,) = cache_dir.iterdir()
    path.write_bytes(b"garbage")
    nvrtc._memo.clear()
    assert nvrtc.compile_cubin(_SRC, (), "sm_90") == cubin
    assert path.read_bytes() == cubin


def test_compile_error_carries_the_log(cache_dir):
    with pytest.raises(NvrtcError) as e:
        nvrtc.compile_cubin('extern "C" __global__ void k() { undefined_name(); }', (), "sm_90")
    assert "undefined_name" in e.value.log
    assert "NVRTC_ERROR_COMPILATION" in str(e.value)
    assert not list(cache_dir.glob("*.tmp"))
