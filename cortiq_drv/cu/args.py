"""Typed kernel arguments packed once into a reusable parameter block (the reference's `kargs!`).

Each argument gets its own 8-byte slot; a `void*[n]` array holds the slot addresses and its
address is what cuLaunchKernel takes. Packing once and launching by address costs about half the
host time of cuda-bindings' per-call `(values, types)` form (docs/CUDA_PYTHON.md). The driver
copies the values at launch (and a graph capture records them by value), so `set` between
launches changes only later launches.
"""

from __future__ import annotations

import ctypes
import struct

from cortiq_drv.errors import CortiqError

# Argument code -> little-endian struct format: u64 pointer, i32, u32, f32.
_FORMATS = {"Q": "<Q", "i": "<i", "I": "<I", "f": "<f"}
_SLOT = 8


def dev_ptr(value) -> int:
    """A device pointer from a Buf (anything with `.ptr`), an int, or None (null)."""
    if value is None:
        return 0
    return int(getattr(value, "ptr", value))


class KArgs:
    """A packed parameter block: `addr` is the `void**` a launch takes; `set(i, v)` repacks one."""

    __slots__ = ("fmt", "addr", "_slots", "_ptrs")

    def __init__(self, fmt: str, values):
        bad = [c for c in fmt if c not in _FORMATS]
        if bad:
            raise CortiqError(f"kargs: unknown argument code(s) {bad!r} in {fmt!r} (use Q, i, I, f)")
        if len(values) != len(fmt):
            raise CortiqError(f"kargs: {fmt!r} takes {len(fmt)} values, got {len(values)}")
        self.fmt = fmt
        n = max(len(fmt), 1)
        self._slots = (ctypes.c_uint64 * n)()  # [n] 8-byte argument slots
        self._ptrs = (ctypes.c_void_p * n)()  # [n] slot addresses
        base = ctypes.addressof(self._slots)
        for i in range(n):
            self._ptrs[i] = base + _SLOT * i
        self.addr = ctypes.addressof(self._ptrs)
        for i, v in enumerate(values):
            self.set(i, v)

    def set(self, i: int, value) -> None:
        """Repack argument `i` in place (the launch address stays the same)."""
        code = self.fmt[i]
        v = dev_ptr(value) if code == "Q" else value
        try:
            struct.pack_into(_FORMATS[code], self._slots, _SLOT * i, v)
        except struct.error as e:
            raise CortiqError(f"kargs: argument {i} ({code}) = {value!r}: {e}") from e

    def slot(self, i: int) -> bytes:
        """The packed bytes of argument `i` (its own size: 8 for Q, 4 otherwise)."""
        size = struct.calcsize(_FORMATS[self.fmt[i]])
        return bytes(self._slots)[_SLOT * i:_SLOT * i + size]

    def __len__(self) -> int:
        return len(self.fmt)


def kargs(fmt: str, *values) -> KArgs:
    """Pack `values` by `fmt` codes: 'Q' u64 pointer (Buf or int), 'i' i32, 'I' u32, 'f' f32."""
    return KArgs(fmt, values)
