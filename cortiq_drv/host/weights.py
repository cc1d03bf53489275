"""Decoded float32 weights of one CMF under a memory budget (the host arm's weight store).

Matrices are decoded once and kept, least recently used out first, while their float32 bytes fit
the budget (`CORTIQ_DRV_HOST_WEIGHT_MB`). A matrix larger than the whole budget is never held: its
products run over bands of rows decoded one at a time, so a model larger than RAM in float32 still
runs, slowly. Embedding rows are decoded one by one from the payload.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ..cmf import f16, layout, q4tp, q8
from ..errors import CmfError

# Bytes of float32 one band of a streamed matrix takes at most.
_BAND_BYTES = 64 << 20


def _select(planes: list[np.ndarray], index) -> bytes:
    """The rows `index` of each per-row plane [rows, bytes_per_row], concatenated plane by plane."""
    return b"".join(np.ascontiguousarray(p[index]).tobytes() for p in planes)


def decode_rows(dtype: int, raw, shape: tuple[int, ...], index) -> np.ndarray:
    """float32 rows `index` (a slice or an int array) of a 2-D payload, without decoding the rest."""
    rows, cols = shape
    buf = np.frombuffer(raw, dtype=np.uint8)
    if dtype == layout.Q4TP:
        po, co, stride = q4tp.sections(rows, cols)
        planes = [buf[:po].reshape(rows, -1), buf[po:co].reshape(rows, 4),
                  buf[co:co + rows * stride].reshape(rows, stride)]
        n = len(range(rows)[index]) if isinstance(index, slice) else len(index)
        return q4tp.decode(_select(planes, index), n, cols)
    if dtype == layout.Q8_2F:
        ro, co = q8.sections(rows, cols)
        planes = [buf[:ro].reshape(rows, cols), buf[ro:co].reshape(rows, 2)]
        n = len(range(rows)[index]) if isinstance(index, slice) else len(index)
        return q8.decode(_select(planes, index) + bytes(buf[co:]), n, cols)
    if dtype == layout.F32:
        return np.frombuffer(raw, dtype="<f4").reshape(rows, cols)[index].astype(np.float32)
    if dtype == layout.F16:
        return f16.from_f16(np.frombuffer(raw, dtype="<u2").reshape(rows, cols)[index])
    if dtype == layout.BF16:
        return f16.from_bf16(np.frombuffer(raw, dtype="<u2").reshape(rows, cols)[index])
    raise CmfError(f"dtype {layout.DTYPE_NAMES.get(dtype, dtype)} has no host decoder")


class WeightCache:
    """Decoded tensors of `cmf` by name, at most `budget` bytes of float32 held (LRU by bytes)."""

    def __init__(self, cmf, budget: int):
        self._cmf = cmf
        self.budget = budget
        self._held: OrderedDict[str, np.ndarray] = OrderedDict()
        self.held_bytes = 0
        self.decodes = 0

    def _info(self, name: str):
        info = self._cmf.tensors.get(name)
        if info is None:
            raise CmfError(f"the model has no tensor {name!r}")
        return layout.dtype_id(info.dtype), tuple(int(d) for d in info.shape)

    def _fits(self, name: str) -> bool:
        _, shape = self._info(name)
        return 4 * int(np.prod(shape)) <= self.budget

    def get(self, name: str) -> np.ndarray:
        """The whole tensor as float32 (kept if it fits the budget)."""
        w = self._held.get(name)
        if w is not None:
            self._held.move_to_end(name)
            return w
        w = np.ascontiguousarray(self._cmf.array(name), dtype=np.float32)
        self.decodes += 1
        if w.nbytes <= self.budget:
            while self.held_bytes + w.nbytes > self.budget:
                _, old = self._held.popitem(last=False)
                self.held_bytes -= old.nbytes
            self._held[name] = w
            self.held_bytes += w.nbytes
        return w

    def matmul(self, name: str, x: np.ndarray) -> np.ndarray:
        """x [T, cols] @ W.T -> [T, rows]; a matrix over the budget streams in bands of rows."""
        if name in self._held or self._fits(name):
            return x @ self.get(name).T
        dtype, (rows, cols) = self._info(name)
        raw = self._cmf.tensor(name)
        band = max(1, min(self.budget, _BAND_BYTES) // (4 * cols))
        y = np.empty((x.shape[0], rows), dtype=np.float32)
        for r0 in range(0, rows, band):
            r1 = min(rows, r0 + band)
            y[:, r0:r1] = x @ decode_rows(dtype, raw, (rows, cols), slice(r0, r1)).T
        return y

    def rows(self, name: str, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` of a matrix (the embedding gather) [len(ids), cols]."""
        if name in self._held:
            return self.get(name)[ids]
        dtype, shape = self._info(name)
        return decode_rows(dtype, self._cmf.tensor(name), shape, np.asarray(ids, dtype=np.int64))
