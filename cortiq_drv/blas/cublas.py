"""cuBLAS through ctypes (the reference's `c.gemm` / `gemm_batched_h` over `bl::`).

The library is `libcublas.so.13` or `.so.12`, found in the pip wheel layouts (`nvidia/cu13/lib`,
`nvidia/cublas/lib`) of every site directory, a CUDA install, or the system; the wheels' RPATH
finds cublasLt. The handle is bound to the context's stream with a fixed workspace, both set
before any capture, so GEMMs record into graphs and replay.
"""

from __future__ import annotations

import ctypes
import enum
import glob
import site
import sys
from pathlib import Path

from cortiq_drv import knobs
from cortiq_drv.cu.args import dev_ptr
from cortiq_drv.cu.buf import Buf
from cortiq_drv.errors import CublasError

NAMES = ("libcublas.so.13", "libcublas.so.12")
# Where the pip wheels put the library under a site directory (CUDA 13, then CUDA 12).
WHEEL_DIRS = ("nvidia/cu13/lib", "nvidia/cublas/lib")
# Where a CUDA install keeps it.
CUDA_DIRS = ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib")
# A fixed workspace (what cuBLAS wants on Hopper): set once, so captures never allocate.
WORKSPACE_BYTES = 32 << 20

_R_32F, _R_16F = 0, 2
_COMPUTE_32F, _COMPUTE_32F_FAST_TF32 = 68, 77
_GEMM_DEFAULT = -1
_STATUS = {0: "CUBLAS_STATUS_SUCCESS", 1: "CUBLAS_STATUS_NOT_INITIALIZED",
           3: "CUBLAS_STATUS_ALLOC_FAILED", 7: "CUBLAS_STATUS_INVALID_VALUE",
           8: "CUBLAS_STATUS_ARCH_MISMATCH", 11: "CUBLAS_STATUS_MAPPING_ERROR",
           13: "CUBLAS_STATUS_EXECUTION_FAILED", 14: "CUBLAS_STATUS_INTERNAL_ERROR",
           15: "CUBLAS_STATUS_NOT_SUPPORTED", 16: "CUBLAS_STATUS_LICENSE_ERROR"}


class Gemm(enum.Enum):
    """A GEMM's data and compute types (the reference's `Gemm`)."""

    # A, B f16; C f32; f32 accumulation.
    HALF = (_R_16F, _R_32F, _COMPUTE_32F)
    # A, B, C f32; tensor cores with TF32 inputs.
    TF32 = (_R_32F, _R_32F, _COMPUTE_32F_FAST_TF32)
    # A, B, C f32; full f32 math.
    F32 = (_R_32F, _R_32F, _COMPUTE_32F)


def library_candidates(site_dirs, cuda_roots) -> list[Path]:
    """Every path the loader tries, in order: wheel layouts under each site directory, then
    each CUDA root's library directories."""
    out = [Path(s) / sub / name for s in site_dirs for sub in WHEEL_DIRS for name in NAMES]
    out += [Path(r) / sub / name for r in cuda_roots for sub in CUDA_DIRS for name in NAMES]
    return out


def find_library(site_dirs, cuda_roots) -> Path | None:
    """The first candidate that exists, or None (then the system loader gets the bare names)."""
    return next((p for p in library_candidates(site_dirs, cuda_roots) if p.is_file()), None)


def default_roots() -> tuple[list[str], list[Path]]:
    """(site directories: sys.path and site's, in order; CUDA roots: CUDA_HOME, CUDA_PATH,
    /usr/local/cuda*)."""
    sites = [p for p in sys.path if p]
    sites += site.getsitepackages() + [site.getusersitepackages()]
    sites = list(dict.fromkeys(sites))
    roots = list(knobs.get().cuda_homes) + [Path(p) for p in sorted(glob.glob("/usr/local/cuda*"))]
    return sites, roots


def load_library() -> ctypes.CDLL:
    """Open libcublas: a found path first, else the system's `libcublas.so.13` / `.so.12`."""
    found = find_library(*default_roots())
    tried = []
    for name in ([str(found)] if found else []) + list(NAMES):
        try:
            return ctypes.CDLL(name)
        except OSError as e:
            tried.append(f"{name}: {e}")
    raise CublasError("load libcublas", "not found", "; ".join(tried))


_LIB: ctypes.CDLL | None = None
# Why the library could not be loaded (searched once a process).
_LIB_ERROR: CublasError | None = None
_vp, _i, _i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
_SIGS = {
    "cublasCreate_v2": [ctypes.POINTER(_vp)],
    "cublasDestroy_v2": [_vp],
    "cublasSetStream_v2": [_vp, _vp],
    "cublasSetWorkspace_v2": [_vp, _vp, ctypes.c_size_t],
    "cublasGemmEx": [_vp, _i, _i, _i, _i, _i, _vp, _vp, _i, _i, _vp, _i, _i, _vp, _vp, _i, _i,
                     _i, _i],
    "cublasGemmStridedBatchedEx": [_vp, _i, _i, _i, _i, _i, _vp, _vp, _i, _i, _i64, _vp, _i, _i,
                                   _i64, _vp, _vp, _i, _i, _i64, _i, _i, _i],
}


def lib() -> ctypes.CDLL:
    """The loaded library with the prototypes set (loaded once)."""
    global _LIB, _LIB_ERROR
    if _LIB_ERROR is not None:
        raise _LIB_ERROR
    if _LIB is None:
        try:
            cdll = load_library()
        except CublasError as e:
            _LIB_ERROR = e
            raise
        for name, argtypes in _SIGS.items():
            fn = getattr(cdll, name)
            fn.argtypes, fn.restype = argtypes, ctypes.c_int
        cdll.cublasGetStatusName.argtypes, cdll.cublasGetStatusName.restype = [_i], ctypes.c_char_p
        _LIB = cdll
    return _LIB


def status_name(status: int) -> str:
    name = lib().cublasGetStatusName(status)
    return name.decode() if name else _STATUS.get(status, f"cublasStatus {status}")


def _check(status: int, call: str, args: str = "") -> None:
    if status != 0:
        raise CublasError(call, status_name(status), args)


class Cublas:
    """A handle on the context's stream with a fixed 32 MiB workspace (create outside capture)."""

    def __init__(self, ctx):
        self.lib = lib()
        h = _vp()
        _check(self.lib.cublasCreate_v2(ctypes.byref(h)), "cublasCreate_v2")
        self.handle = h
        self.workspace = Buf.new(ctx, WORKSPACE_BYTES)
        try:
            _check(self.lib.cublasSetStream_v2(h, int(ctx.stream)), "cublasSetStream_v2")
            _check(self.lib.cublasSetWorkspace_v2(h, self.workspace.ptr, WORKSPACE_BYTES),
                   "cublasSetWorkspace_v2", f"bytes={WORKSPACE_BYTES}")
        except CublasError:
            self.close()
            raise

    def gemm(self, ta: bool, tb: bool, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
             mode: Gemm) -> None:
        """Column-major C[m, n] = alpha op(A) op(B) + beta C; op transposes when `ta` / `tb`.

        Row-major W[out][in], y[M][out] = x W^T is `gemm(True, False, out, M, in, 1, W, in, x, in,
        0, y, out, mode)` (how the reference calls it)."""
        ab, ct, comp = mode.value
        al, be = ctypes.c_float(alpha), ctypes.c_float(beta)
        _check(self.lib.cublasGemmEx(self.handle, int(ta), int(tb), m, n, k, ctypes.byref(al),
                                     dev_ptr(a), ab, lda, dev_ptr(b), ab, ldb, ctypes.byref(be),
                                     dev_ptr(c), ct, ldc, comp, _GEMM_DEFAULT),
               "cublasGemmEx", f"{mode.name} ta={ta} tb={tb} m={m} n={n} k={k} "
               f"lda={lda} ldb={ldb} ldc={ldc}")

    def gemm_strided_batched_f16(self, ta: bool, m, n, k, alpha, a, lda, stride_a, b, ldb,
                                 stride_b, c, ldc, stride_c, count, tb: bool = False,
                                 beta: float = 0.0) -> None:
        """`count` f16 x f16 -> f32 GEMMs (f32 accumulation); operand i sits `stride_*`
        elements after operand i - 1 (the reference's `gemm_batched_h`)."""
        al, be = ctypes.c_float(alpha), ctypes.c_float(beta)
        _check(self.lib.cublasGemmStridedBatchedEx(
            self.handle, int(ta), int(tb), m, n, k, ctypes.byref(al),
            dev_ptr(a), _R_16F, lda, stride_a, dev_ptr(b), _R_16F, ldb, stride_b, ctypes.byref(be),
            dev_ptr(c), _R_32F, ldc, stride_c, count, _COMPUTE_32F, _GEMM_DEFAULT),
            "cublasGemmStridedBatchedEx", f"{count} x m={m} n={n} k={k} ta={ta} tb={tb}")

    def close(self) -> None:
        """Destroy the handle and free the workspace."""
        if self.handle is not None:
            _check(self.lib.cublasDestroy_v2(self.handle), "cublasDestroy_v2")
            self.handle = None
        self.workspace.close()
