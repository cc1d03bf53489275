"""Device memory (the reference's `Buf` and plan arena) and pinned host memory.

A `Buf` owns an allocation or is a view into one (`view`, `Arena.take`); only owners free. Copies
and memsets go on the context's stream; `to_host` and `upload` synchronise it. Nothing is freed in
`__del__`: owners call `close()`.
"""

from __future__ import annotations

import ctypes

import numpy as np

from cortiq_drv.cu import driver
from cortiq_drv.errors import CortiqError

# Arena views start on this boundary (what the reference's arena rounds to).
ALIGN = 256


def _round_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


class Buf:
    """Device bytes [ptr, ptr + bytes); `owned` ones are freed by `close()`."""

    __slots__ = ("ctx", "ptr", "bytes", "owned")

    def __init__(self, ctx, ptr: int, nbytes: int, owned: bool):
        self.ctx = ctx
        self.ptr = ptr
        self.bytes = nbytes
        self.owned = owned

    @classmethod
    def new(cls, ctx, nbytes: int) -> "Buf":
        """A fresh allocation (contents undefined); 0 bytes allocates 1 (the driver refuses 0)."""
        return cls(ctx, driver.mem_alloc(max(int(nbytes), 1)), int(nbytes), True)

    @classmethod
    def from_array(cls, ctx, arr: np.ndarray) -> "Buf":
        """An allocation holding `arr`'s bytes (C order), copied synchronously."""
        a = np.ascontiguousarray(arr)
        buf = cls.new(ctx, a.nbytes)
        try:
            buf.upload(a)
        except BaseException:
            buf.close()
            raise
        return buf

    def view(self, off: int, nbytes: int) -> "Buf":
        """A non-owning Buf over [off, off + nbytes) of this one."""
        if off < 0 or nbytes < 0 or off + nbytes > self.bytes:
            raise CortiqError(f"Buf.view({off}, {nbytes}) outside a {self.bytes}-byte buffer")
        return Buf(self.ctx, self.ptr + off, nbytes, False)

    def _span(self, off: int, nbytes: int, what: str) -> None:
        if off < 0 or off + nbytes > self.bytes:
            raise CortiqError(f"Buf.{what}: {nbytes} bytes at {off} outside a {self.bytes}-byte buffer")

    def upload_async(self, host: np.ndarray, off: int = 0) -> None:
        """Queue a host -> device copy; `host` (contiguous) must stay alive until the stream syncs."""
        if not host.flags.c_contiguous:
            raise CortiqError("Buf.upload_async needs a C-contiguous array")
        self._span(off, host.nbytes, "upload")
        if host.nbytes:
            driver.memcpy_htod_async(self.ptr + off, host.ctypes.data, host.nbytes, self.ctx.stream)

    def upload(self, host: np.ndarray, off: int = 0) -> None:
        """Copy `host`'s bytes to [off, off + nbytes) and wait for it."""
        a = np.ascontiguousarray(host)
        self.upload_async(a, off)
        self.ctx.sync()

    def download_async(self, host: np.ndarray, off: int = 0) -> None:
        """Queue a device -> host copy into `host` (contiguous, writable, alive until the sync)."""
        if not host.flags.c_contiguous or not host.flags.writeable:
            raise CortiqError("Buf.download_async needs a writable C-contiguous array")
        self._span(off, host.nbytes, "download")
        if host.nbytes:
            driver.memcpy_dtoh_async(host.ctypes.data, self.ptr + off, host.nbytes, self.ctx.stream)

    def to_host(self, dtype=np.uint8, shape=None) -> np.ndarray:
        """The whole buffer as a new host array (synchronises the stream)."""
        dt = np.dtype(dtype)
        out = np.empty(self.bytes // dt.itemsize, dtype=dt)
        self.download_async(out)
        self.ctx.sync()
        return out if shape is None else out.reshape(shape)

    def copy_from(self, src: "Buf", off: int = 0) -> None:
        """Queue a device -> device copy of all of `src` to [off, off + src.bytes)."""
        self._span(off, src.bytes, "copy_from")
        if src.bytes:
            driver.memcpy_dtod_async(self.ptr + off, src.ptr, src.bytes, self.ctx.stream)

    def memset(self, byte: int = 0) -> None:
        """Queue setting every byte to `byte` (async, on the stream)."""
        if self.bytes:
            driver.memset_d8_async(self.ptr, byte, self.bytes, self.ctx.stream)

    def close(self) -> None:
        """Free an owned allocation (views do nothing); safe to call twice."""
        if self.owned and self.ptr:
            driver.mem_free(self.ptr)
        self.ptr = 0
        self.bytes = 0

    def __repr__(self) -> str:
        return f"Buf(ptr={self.ptr:#x}, bytes={self.bytes}, owned={self.owned})"


class Arena:
    """One allocation handing out 256-byte-aligned views (the reference's plan arena `arena_view`):
    the card rounds each allocation up (to 2 MiB), so many matrices in one pay that once."""

    def __init__(self, ctx, nbytes: int):
        self.buf = Buf.new(ctx, nbytes)
        self.used = 0

    @property
    def capacity(self) -> int:
        return self.buf.bytes

    def fits(self, nbytes: int) -> bool:
        return self.used + nbytes <= self.capacity

    def take(self, nbytes: int) -> Buf:
        """The next `nbytes` as a view; raises when the arena has no room."""
        if not self.fits(nbytes):
            raise CortiqError(f"Arena.take({nbytes}): {self.capacity - self.used} of "
                              f"{self.capacity} bytes left")
        v = self.buf.view(self.used, nbytes)
        self.used = min(_round_up(self.used + nbytes, ALIGN), self.capacity)
        return v

    def close(self) -> None:
        self.buf.close()


class Pinned:
    """Page-locked host bytes at a fixed address: inputs a captured graph re-reads each replay."""

    def __init__(self, nbytes: int):
        self.bytes = int(nbytes)
        self.ptr = driver.mem_alloc_host(max(self.bytes, 1))

    def array(self, dtype=np.uint8, shape=None) -> np.ndarray:
        """A numpy view of the pinned bytes (valid until `close`)."""
        raw = (ctypes.c_uint8 * self.bytes).from_address(self.ptr)
        a = np.frombuffer(raw, dtype=np.uint8).view(dtype)
        return a if shape is None else a.reshape(shape)

    def close(self) -> None:
        if self.ptr:
            driver.mem_free_host(self.ptr)
            self.ptr = 0
