"""Error texts of the driver and cuBLAS wrappers: a failed call names the call, the status and
the key arguments (no device: the bindings are replaced by fakes)."""

import pytest

from cortiq_drv.blas import cublas
from cortiq_drv.blas.cublas import Gemm
from cortiq_drv.cu import driver
from cortiq_drv.errors import CublasError, CudaError

_BAD = driver._d.CUresult.CUDA_ERROR_INVALID_VALUE


class _Failing:
    """Stands in for cuda.bindings.driver: every call returns CUDA_ERROR_INVALID_VALUE."""

    CUresult = driver._d.CUresult

    def __getattr__(self, name):
        return lambda *args: (_BAD,)


@pytest.mark.parametrize("call,args,text", [
    (driver.memset_d8_async, (0x1000, 7, 64, None),
     "cuMemsetD8Async: CUDA_ERROR_INVALID_VALUE (ptr=0x1000, byte=7, bytes=64)"),
    (driver.memcpy_htod_async, (0x2000, 0x10, 32, None),
     "cuMemcpyHtoDAsync: CUDA_ERROR_INVALID_VALUE (dst=0x2000, bytes=32)"),
    (driver.memcpy_dtoh_async, (0x10, 0x3000, 16, None),
     "cuMemcpyDtoHAsync: CUDA_ERROR_INVALID_VALUE (src=0x3000, bytes=16)"),
    (driver.memcpy_dtod_async, (0x4000, 0x5000, 8, None),
     "cuMemcpyDtoDAsync: CUDA_ERROR_INVALID_VALUE (dst=0x4000, src=0x5000, bytes=8)"),
    (driver.mem_alloc, (256,), "cuMemAlloc: CUDA_ERROR_INVALID_VALUE (bytes=256)"),
    (driver.mem_free, (0x6000,), "cuMemFree: CUDA_ERROR_INVALID_VALUE (ptr=0x6000)"),
    (driver.mem_alloc_host, (128,), "cuMemAllocHost: CUDA_ERROR_INVALID_VALUE (bytes=128)"),
    (driver.mem_free_host, (0x7000,), "cuMemFreeHost: CUDA_ERROR_INVALID_VALUE (ptr=0x7000)"),
    (driver.device_get, (1,), "cuDeviceGet: CUDA_ERROR_INVALID_VALUE (ordinal=1)"),
    (driver.module_load_data, (b"abc",),
     "cuModuleLoadData: CUDA_ERROR_INVALID_VALUE (image bytes=3)"),
    (driver.func_set_max_dyn_smem, (None, 65536, "hy_mmp"),
     "cuFuncSetAttribute: CUDA_ERROR_INVALID_VALUE (hy_mmp MAX_DYNAMIC_SHARED_SIZE_BYTES=65536)"),
])
def test_driver_wrapper_messages(monkeypatch, call, args, text):
    monkeypatch.setattr(driver, "_d", _Failing())
    with pytest.raises(CudaError) as e:
        call(*args)
    assert str(e.value) == text


class _Lib:
    """Stands in for libcublas: every GEMM returns `status`."""

    def __init__(self, status):
        self.status = status

    def cublasGemmEx(self, *args):
        return self.status

    def cublasGemmStridedBatchedEx(self, *args):
        return self.status


def _handle(status, monkeypatch):
    monkeypatch.setattr(cublas, "status_name", lambda s: f"STATUS_{s}")
    h = object.__new__(cublas.Cublas)
    h.lib, h.handle = _Lib(status), None
    return h


def test_gemm_success_raises_nothing(monkeypatch):
    h = _handle(0, monkeypatch)
    h.gemm(True, False, 4, 2, 8, 1.0, 0, 8, 0, 8, 0.0, 0, 4, Gemm.HALF)
    h.gemm_strided_batched_f16(True, 4, 2, 8, 1.0, 0, 8, 32, 0, 8, 16, 0, 4, 8, 3)


def test_gemm_failure_messages(monkeypatch):
    h = _handle(7, monkeypatch)
    with pytest.raises(CublasError) as e:
        h.gemm(True, False, 4, 2, 8, 1.0, 0, 8, 0, 8, 0.0, 0, 4, Gemm.TF32)
    assert str(e.value) == ("cublasGemmEx: STATUS_7 (TF32 ta=True tb=False m=4 n=2 k=8 lda=8 "
                            "ldb=8 ldc=4)")
    with pytest.raises(CublasError) as e:
        h.gemm_strided_batched_f16(True, 4, 2, 8, 1.0, 0, 8, 32, 0, 8, 16, 0, 4, 8, 3)
    assert str(e.value) == ("cublasGemmStridedBatchedEx: STATUS_7 (3 x m=4 n=2 k=8 ta=True "
                            "tb=False)")
