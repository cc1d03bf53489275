"""Without a CUDA driver the first driver call becomes NoDevice with a clear message."""

import pytest

from cortiq_drv.cu import ctx as ctx_mod
from cortiq_drv.cu import driver
from cortiq_drv.errors import CudaError, NoDevice


class _Raising:
    """Stands in for cuda.bindings.driver where libcuda is missing: every call raises."""

    CUresult = driver._d.CUresult

    def __getattr__(self, name):
        def call(*args):
            raise RuntimeError("Failed to dlopen libcuda.so.1")
        return call


def test_missing_driver_is_nodevice(monkeypatch):
    monkeypatch.setattr(driver, "_d", _Raising())
    with pytest.raises(NoDevice, match="no CUDA driver: RuntimeError: Failed to dlopen libcuda.so.1"):
        driver.init()


def test_device_available_reports_the_reason(monkeypatch):
    monkeypatch.setattr(driver, "_d", _Raising())
    monkeypatch.setattr(ctx_mod.Ctx, "_current", None)
    ok, reason = ctx_mod.device_available()
    assert ok is False
    assert reason.startswith("no CUDA driver")


def test_cuinit_error_is_nodevice_with_the_name(monkeypatch):
    class _NoDev(_Raising):
        def cuInit(self, flags):
            return (driver._d.CUresult.CUDA_ERROR_NO_DEVICE,)

    monkeypatch.setattr(driver, "_d", _NoDev())
    with pytest.raises(NoDevice, match="CUDA_ERROR_NO_DEVICE"):
        driver.init()


def test_check_raises_cudaerror_with_call_name_and_args():
    oom = driver._d.CUresult.CUDA_ERROR_OUT_OF_MEMORY
    with pytest.raises(CudaError) as e:
        driver.check((oom, None), "cuMemAlloc", "bytes=1")
    assert e.value.call == "cuMemAlloc"
    assert e.value.name == "CUDA_ERROR_OUT_OF_MEMORY"
    assert str(e.value) == "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (bytes=1)"


def test_check_unwraps_outputs():
    ok = driver._d.CUresult.CUDA_SUCCESS
    assert driver.check((ok,), "x") is None
    assert driver.check((ok, 5), "x") == 5
    assert driver.check((ok, 5, 6), "x") == (5, 6)
