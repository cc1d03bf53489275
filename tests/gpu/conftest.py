"""Fixtures shared by the device tests: the context, the kernels of hyb.cu and basic.cu, a test's
device buffers, and the default and mid-size models on both arms (a module may define its own)."""

import pytest

import _dev
from cortiq_drv.cu import Ctx
from cortiq_drv.cu.nvrtc import compile_cubin, func, load
from cortiq_drv.default_model import SHAPES
from cortiq_drv.kernels import source


@pytest.fixture(scope="module")
def ctx():
    return Ctx.current()


@pytest.fixture(scope="module")
def kern(ctx):
    """kern(name, hpk, hd): the kernel from hyb.cu compiled for that attention geometry."""
    mods = {}

    def get(name, hpk=4, hd=256):
        if (hpk, hd) not in mods:
            mods[hpk, hd] = load(ctx, compile_cubin(source("hyb.cu"), {"HPK": hpk, "HD": hd}, ctx.arch))
        return func(mods[hpk, hd], name)

    yield get
    for m in mods.values():
        m.close()


@pytest.fixture(scope="module")
def mod(ctx):
    """basic.cu's module."""
    m = load(ctx, compile_cubin(source("basic.cu"), (), ctx.arch))
    yield m
    m.close()


@pytest.fixture
def dev(ctx):
    d = _dev.Dev(ctx)
    yield d
    d.close()


@pytest.fixture(scope="module")
def default_arm(tmp_path_factory):
    return _dev.Arm(_dev.write_model(SHAPES["default"], tmp_path_factory.mktemp("m") / "default.cmf"))


@pytest.fixture(scope="module")
def mid_arm(tmp_path_factory):
    return _dev.Arm(_dev.write_model(_dev.MID, tmp_path_factory.mktemp("m") / "mid.cmf"))
