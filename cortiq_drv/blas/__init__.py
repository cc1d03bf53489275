"""cuBLAS through ctypes: the only package that touches libcublas. Loads nothing at import."""

from cortiq_drv.blas.cublas import Cublas, Gemm

__all__ = ["Cublas", "Gemm"]
