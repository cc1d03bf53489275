"""The process-wide CUDA context (the reference's `Ctx`): device 0, its primary context, one
non-blocking stream, the arch and SM count, the memory counters, kernel launches and cuBLAS.

The primary context (not cuCtxCreate) so that cuBLAS, which uses the runtime API, shares it.
Nothing touches the driver until `Ctx.current()` is first called.
"""

from __future__ import annotations

import threading

from cortiq_drv import knobs
from cortiq_drv.cu import driver
from cortiq_drv.errors import CortiqError, CudaError, NoDevice

# Dynamic shared memory a launch may ask for without opting in (cuFuncSetAttribute).
_DEFAULT_SMEM = 48 * 1024


class Ctx:
    """Device, primary context, stream; `resident` / `kv_bytes` are byte counters the arms keep."""

    _current: "Ctx | None" = None
    _lock = threading.Lock()
    _tls = threading.local()

    def __init__(self, ordinal: int = 0):
        driver.init()
        self.device = driver.device_get(ordinal)
        self._pctx = driver.primary_ctx_retain(self.device)
        driver.ctx_set_current(self._pctx)
        major = driver.device_attr(self.device, "COMPUTE_CAPABILITY_MAJOR")
        minor = driver.device_attr(self.device, "COMPUTE_CAPABILITY_MINOR")
        self.arch = f"sm_{major}{minor}"
        # programmatic dependent launches (and griddepcontrol in the kernels) need sm_90
        self.pdl_ok = major >= 9
        self.sm_count = driver.device_attr(self.device, "MULTIPROCESSOR_COUNT")
        self.smem_optin = driver.device_attr(self.device, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN")
        self.stream = driver.stream_create_nonblocking()
        # Weights the arms hold on the card, and K/V mirrors + recurrent states (bytes).
        self.resident = 0
        self.kv_bytes = 0
        # True while `capture` records this stream (cuBLAS handle creation is illegal then).
        self.capturing = False
        self._blas = None
        self._closed = False

    @classmethod
    def current(cls) -> "Ctx":
        """The process-wide context, created on first use; made current on the calling thread."""
        ctx = cls._current
        if ctx is None:
            with cls._lock:
                if cls._current is None:
                    cls._current = Ctx()
                    cls._tls.ctx = cls._current
                ctx = cls._current
        if getattr(cls._tls, "ctx", None) is not ctx:
            driver.ctx_set_current(ctx._pctx)
            cls._tls.ctx = ctx
        return ctx

    def launch(self, f, grid: tuple[int, int], block: int, smem: int, args) -> None:
        """Launch `f` on the stream: grid (gx, gy), `block` threads, `smem` dynamic bytes."""
        self.launch_3d(f, (grid[0], grid[1], 1), block, smem, args)

    def launch_3d(self, f, grid: tuple[int, int, int], block, smem: int, args) -> None:
        """Launch with a 3-D grid; `block` is a thread count or (bx, by, bz). A kernel marked
        `pdl` goes as a programmatic dependent of the one before it when `pdl_on`."""
        if smem > f.smem_ok:
            f.allow_smem(smem)
        b3 = (block, 1, 1) if isinstance(block, int) else tuple(block)
        if f.pdl and self.pdl_on:
            driver.launch_kernel_pdl(f.handle, tuple(grid), b3, smem, self.stream, args.addr, f.name)
        else:
            driver.launch_kernel(f.handle, tuple(grid), b3, smem, self.stream, args.addr, f.name)

    @property
    def pdl_on(self) -> bool:
        """Kernels marked `pdl` launch as programmatic dependents: sm_90 and up, knobs.cuda_pdl."""
        return self.pdl_ok and knobs.get().cuda_pdl

    def sync(self) -> None:
        """Wait for everything queued on the stream."""
        driver.stream_sync(self.stream)

    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) bytes on the device."""
        return driver.mem_get_info()

    def blas(self):
        """The cuBLAS handle bound to this stream, created on first use (never inside a capture)."""
        if self._blas is None:
            if self.capturing:
                # capture() creates the handle first; it failed then (ctx.blas() says why)
                raise CortiqError("no cuBLAS handle inside a graph capture: creating one there is "
                                  "illegal and it could not be created before the capture")
            from cortiq_drv.blas.cublas import Cublas

            self._blas = Cublas(self)
        return self._blas

    def gemm(self, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, mode) -> None:
        """Column-major C = alpha op(A) op(B) + beta C through cuBLAS (see blas.cublas.gemm)."""
        self.blas().gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, mode)

    def gemm_strided_batched_f16(self, ta, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b,
                                 c, ldc, stride_c, count, tb=False, beta=0.0) -> None:
        """`count` f16 x f16 -> f32 GEMMs (the reference's `gemm_batched_h`)."""
        self.blas().gemm_strided_batched_f16(ta, m, n, k, alpha, a, lda, stride_a, b, ldb,
                                             stride_b, c, ldc, stride_c, count, tb, beta)

    def close(self) -> None:
        """Release cuBLAS, the stream and the primary context; the next `current()` makes anew."""
        if self._closed:
            return
        self._closed = True
        if self._blas is not None:
            self._blas.close()
            self._blas = None
        driver.stream_destroy(self.stream)
        driver.primary_ctx_release(self.device)
        with Ctx._lock:
            if Ctx._current is self:
                Ctx._current = None
                Ctx._tls = threading.local()


def device_available() -> tuple[bool, str]:
    """(True, arch) when a CUDA device is usable, else (False, why not)."""
    try:
        return True, Ctx.current().arch
    except (NoDevice, CudaError) as e:
        return False, str(e)
