"""kargs: the packed parameter block's bytes, in-place updates, and refusals."""

import ctypes
import struct

import pytest

from cortiq_drv.cu import kargs
from cortiq_drv.errors import CortiqError


class _FakeBuf:
    ptr = 0x7F00_0000_1000


def test_slots_hold_little_endian_values():
    a = kargs("QiIfQ", _FakeBuf(), -7, 0xFFFF_FFFF, 1.5, 0xDEAD_BEEF_0000)
    assert a.slot(0) == struct.pack("<Q", 0x7F00_0000_1000)
    assert a.slot(1) == struct.pack("<i", -7)
    assert a.slot(2) == struct.pack("<I", 0xFFFF_FFFF)
    assert a.slot(3) == struct.pack("<f", 1.5)
    assert a.slot(4) == struct.pack("<Q", 0xDEAD_BEEF_0000)
    assert len(a) == 5


def test_pointer_array_points_at_each_slot():
    a = kargs("Qif", 0x1234, 42, -0.25)
    ptrs = (ctypes.c_void_p * 3).from_address(a.addr)
    assert ctypes.c_uint64.from_address(ptrs[0]).value == 0x1234
    assert ctypes.c_int32.from_address(ptrs[1]).value == 42
    assert ctypes.c_float.from_address(ptrs[2]).value == -0.25
    # 8-byte slots, consecutive
    assert ptrs[1] - ptrs[0] == 8 and ptrs[2] - ptrs[1] == 8


def test_set_repacks_in_place_and_keeps_the_address():
    a = kargs("Qi", 1, 2)
    addr = a.addr
    a.set(1, -3)
    a.set(0, None)
    assert a.addr == addr
    assert a.slot(0) == bytes(8)
    assert a.slot(1) == struct.pack("<i", -3)
    # the upper half of a 4-byte slot stays zero after a negative value is overwritten
    a.set(1, 5)
    assert ctypes.c_uint64.from_address(ctypes.c_void_p.from_address(a.addr + 8).value).value == 5


def test_no_arguments_still_gives_an_address():
    a = kargs("")
    assert len(a) == 0 and a.addr != 0


@pytest.mark.parametrize("fmt,values,needle", [
    ("x", (1,), "unknown argument code"),
    ("ii", (1,), "takes 2 values"),
    ("i", (2**31,), "argument 0 (i)"),
    ("I", (-1,), "argument 0 (I)"),
])
def test_refusals_name_the_problem(fmt, values, needle):
    with pytest.raises(CortiqError, match=None) as e:
        kargs(fmt, *values)
    assert needle in str(e.value)
