"""CMF v2 model files: the container (reader on mmap, streaming writer, hash64) and the weight
codecs (q4tp, q8_2f, f16 / bf16), byte-compatible with cortiq's (docs/FORMAT.md)."""

from cortiq_drv.cmf import f16, q4tp, q8
from cortiq_drv.cmf.hash import Hash64, hash64
from cortiq_drv.cmf.layout import (BF16, DTYPE_IDS, DTYPE_NAMES, F16, F32, Q4TP, Q8_2F, QUANT_2F,
                                   TENSOR_DIR, U8, TensorInfo)
from cortiq_drv.cmf.reader import CmfFile
from cortiq_drv.cmf.writer import CmfWriter

__all__ = ["CmfFile", "CmfWriter", "TensorInfo", "Hash64", "hash64", "f16", "q4tp", "q8",
           "DTYPE_IDS", "DTYPE_NAMES", "F32", "F16", "BF16", "U8", "Q8_2F", "Q4TP", "TENSOR_DIR",
           "QUANT_2F"]
