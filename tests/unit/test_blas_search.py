"""The cuBLAS loader's search on fake directory layouts (no library is loaded)."""

from pathlib import Path

from cortiq_drv.blas import cublas


def _touch(p: Path) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(b"")
    return p


def test_cu13_wheel_layout(tmp_path):
    lib = _touch(tmp_path / "site" / "nvidia/cu13/lib/libcublas.so.13")
    assert cublas.find_library([tmp_path / "site"], []) == lib


def test_cu12_wheel_layout(tmp_path):
    lib = _touch(tmp_path / "site" / "nvidia/cublas/lib/libcublas.so.12")
    assert cublas.find_library([tmp_path / "site"], []) == lib


def test_site_dirs_searched_in_order_and_all_of_them(tmp_path):
    _touch(tmp_path / "b" / "nvidia/cublas/lib/libcublas.so.12")
    later = _touch(tmp_path / "c" / "nvidia/cu13/lib/libcublas.so.13")
    assert cublas.find_library([tmp_path / "a", tmp_path / "c", tmp_path / "b"], []) == later


def test_wheels_before_cuda_install(tmp_path):
    _touch(tmp_path / "cuda" / "lib64/libcublas.so.13")
    wheel = _touch(tmp_path / "site" / "nvidia/cublas/lib/libcublas.so.12")
    assert cublas.find_library([tmp_path / "site"], [tmp_path / "cuda"]) == wheel


def test_cuda_install_layouts(tmp_path):
    lib64 = _touch(tmp_path / "cuda-13.0" / "lib64/libcublas.so.13")
    assert cublas.find_library([tmp_path / "empty"], [tmp_path / "cuda-13.0"]) == lib64
    tgt = _touch(tmp_path / "cuda-12.9" / "targets/x86_64-linux/lib/libcublas.so.12")
    assert cublas.find_library([], [tmp_path / "cuda-12.9"]) == tgt


def test_nothing_found(tmp_path):
    _touch(tmp_path / "site" / "nvidia/cublas/lib/libcublas.so.11")
    assert cublas.find_library([tmp_path / "site"], [tmp_path / "none"]) is None


def test_default_roots_use_cuda_home_and_sys_path(monkeypatch, tmp_path):
    from cortiq_drv import knobs

    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "ch"))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr("sys.path", [str(tmp_path / "sp")])
    knobs.reset()
    try:
        sites, roots = cublas.default_roots()
    finally:
        knobs.reset()
    assert sites[0] == str(tmp_path / "sp")
    assert roots[0] == tmp_path / "ch"
