"""Programmatic dependent launches: the kernels the host marks `pdl` are exactly those whose code
calls pdl_begin() (griddepcontrol.wait, then launch_dependents; in EARLY_LETGO's few-row calls
launch_dependents first), the ones that touch no earlier kernel's data before it do so ahead of
every global access, those that read data of two launches back before it only load there, and
`Ctx.launch` sends a marked kernel through cuLaunchKernelEx only on sm_90 and up with
CORTIQ_DRV_PDL on (no device: NVRTC's PTX and fake driver calls)."""

import re
from types import SimpleNamespace

import pytest

from cortiq_drv import knobs
from cortiq_drv.cu import driver, nvrtc
from cortiq_drv.cu.ctx import Ctx
from cortiq_drv.cu.nvrtc import Func
from cortiq_drv.hybrid import launch, mma
from cortiq_drv.kernels import source

# Global memory traffic in PTX: cp.async from global, L1 prefetches, and generic loads and stores
# (no state space). An L2 prefetch (pf_l2) is not: it reads nothing into the kernel.
_GLOBAL = re.compile(r"\b(ld\.global|st\.global|atom\.|red\.|cp\.async\.c[ag]\.shared\.global"
                     r"|prefetch\.global\.L1|(?:ld|st)\.(?!shared|param|local|const|global)\w)")
# Kernels that load, before their wait, what a launch at least two back wrote (hyb_gdn.cuh), and
# the parameters they load it from: the front's gate dots xn, the scans their state S, the gated
# norms their gate inputs z. Before the wait they may only load (test_hyb_graphkeys checks that
# the launch just before them holds none of it).
EARLY_READERS = {"hy_gdn_front": ("xn",), "hy_gdn_scan4": ("S",), "hy_gdn_scan4_out32": ("S", "z"),
                 "hy_gdn_out32": ("z",)}
# The kernels just before a matvec, whose calls of at most HY_EARLY_ROWS rows let the next kernel
# launch before their wait (kernels/common.cuh; test_hyb_graphkeys checks that a matvec follows
# each of them).
EARLY_LETGO = ("hy_rmsnorm2", "hy_gdn_scan4_out32", "hy_finish")
# What a matvec may not do before it waits: read activations (ld.global.nc, __ldg), write or
# update global memory; its L1 prefetches are counted apart (the residual's must wait).
_MATVEC_AFTER = re.compile(r"\b(ld\.global\.nc|st\.global|atom\.|red\.|(?:ld|st)\.(?!shared|param|local|const|global)\w)")


@pytest.fixture(scope="module")
def entries(nvrtc_ok):
    """{kernel: PTX body} of hyb.cu compiled for sm_90."""
    ptx, _ = nvrtc.compile_program(source("hyb.cu"), nvrtc.options_for((), "sm_90"), "hyb.cu", ptx=True)
    text = ptx.decode()
    out = {}
    for m in re.finditer(r"\.entry (\w+)\(", text):
        end = text.find("\n}", m.end())
        out[m.group(1)] = text[m.end():end]
    return out


def test_marked_kernels_are_the_ones_that_wait(entries):
    marked = set(mma.PDL_KERNELS) | set(launch.PDL_KERNELS)
    waiting = {k for k, body in entries.items() if "griddepcontrol.wait" in body}
    assert marked <= set(entries), sorted(marked - set(entries))
    assert waiting == marked, (sorted(marked - waiting), sorted(waiting - marked))
    for k in marked:
        body = entries[k]
        wait, let = body.index("griddepcontrol.wait"), "griddepcontrol.launch_dependents"
        # EARLY_LETGO: one before the wait too (the few-row calls' way)
        assert (body.index(let) < wait) == (k in EARLY_LETGO) and body.rindex(let) > wait, k


def test_wait_comes_before_any_global_access(entries):
    # every marked kernel but the matvecs, which fetch weights and ladders first (weights no
    # kernel of the step writes; see hyb_mmp.cuh): before their first wait only cp.async, plain
    # loads (the weight stages, the ladders) and, where hy_mmp_run's PFL is on (hy_mmv at KS 8,
    # hy_mmvs), one L1 prefetch: the next item's ladder rows (pf_lad), never the residual's
    matvecs = {mma.mmp_name(*v) for v in mma.MMP_VARIANTS}
    matvecs |= {mma.mmvs_name(tb, ks) for tb in (1, 2) for ks in (8, 16)}
    matvecs |= {mma.mmr_name(ntc, tb) for ntc in (2, 3) for tb in (1, 2)}
    # the attention kernels read their call record's fields from L2 first (att_record), nothing
    # else: hy_scores n0, rb, ncap, nbcap; hy_values those and far; hy_finish n0, rb, nbcap, far
    record = {"hy_scores": 4, "hy_values": 5, "hy_finish": 4}
    for k in (set(mma.PDL_KERNELS) | set(launch.PDL_KERNELS)) - matvecs:
        body = entries[k]
        wait = body.index("griddepcontrol.wait")
        early = [body[m.start():].split(None, 1)[0] for m in _GLOBAL.finditer(body[:wait])]
        if k in EARLY_READERS:
            assert all(op.startswith("ld.global.") for op in early), (k, early)
        else:
            assert early == ["ld.global.cg.s32"] * record.get(k, 0), (k, early)
        assert _GLOBAL.search(body, wait) is not None, k
    pfl = {mma.mmp_name(0, tb, 8) for tb in (1, 2)} | {mma.mmvs_name(tb, ks) for tb in (1, 2) for ks in (8, 16)}
    for k in matvecs:
        before = entries[k][:entries[k].index("griddepcontrol.wait")]
        early = _MATVEC_AFTER.search(before)
        assert early is None, (k, early and early.group(0))
        assert before.count("prefetch.global.L1") == int(k in pfl), k
    # hy_mmvs copies its activation columns after the wait: before it, only hy_mmv's weight stages
    for tb in (1, 2):
        for ks in (8, 16):
            plain, staged = (entries[name][:entries[name].index("griddepcontrol.wait")].count("cp.async.cg")
                             for name in (mma.mmp_name(0, tb, ks), mma.mmvs_name(tb, ks)))
            assert plain == staged > 0, (tb, ks, plain, staged)


@pytest.mark.parametrize("pdl,arch_ok,env,want", [
    (True, True, None, "pdl"),
    (True, True, "0", "plain"),
    (True, False, None, "plain"),
    (False, True, None, "plain"),
])
def test_launch_goes_programmatic_only_when_marked_and_allowed(monkeypatch, pdl, arch_ok, env, want):
    calls = []
    monkeypatch.setattr(driver, "launch_kernel", lambda *a: calls.append(("plain", a)))
    monkeypatch.setattr(driver, "launch_kernel_pdl", lambda *a: calls.append(("pdl", a)))
    if env is None:
        monkeypatch.delenv("CORTIQ_DRV_PDL", raising=False)
    else:
        monkeypatch.setenv("CORTIQ_DRV_PDL", env)
    knobs.reset()
    try:
        f = Func("handle", "hy_rmsnorm2")
        f.pdl = pdl
        ctx = Ctx.__new__(Ctx)  # no device: only what a launch reads
        ctx.stream, ctx.pdl_ok = "s", arch_ok
        ctx.launch_3d(f, (3, 2, 1), 256, 0, SimpleNamespace(addr=1234))
        ctx.launch(f, (5, 1), 128, 0, SimpleNamespace(addr=99))
    finally:
        knobs.reset()
    assert [c[0] for c in calls] == [want, want]
    assert calls[0][1] == ("handle", (3, 2, 1), (256, 1, 1), 0, "s", 1234, "hy_rmsnorm2")
    assert calls[1][1] == ("handle", (5, 1, 1), (128, 1, 1), 0, "s", 99, "hy_rmsnorm2")


def test_pdl_launch_failure_names_the_kernel(monkeypatch):
    bad = driver._d.CUresult.CUDA_ERROR_INVALID_VALUE
    monkeypatch.setattr(driver._d, "cuLaunchKernelEx", lambda *a: (bad,))
    with pytest.raises(Exception, match=r"cuLaunchKernelEx: CUDA_ERROR_INVALID_VALUE \(hy_qk \(programmatic\) "
                                        r"grid=\(1, 2, 1\)"):
        driver.launch_kernel_pdl(None, (1, 2, 1), (64, 1, 1), 0, None, 0, "hy_qk")


def test_pdl_configs_are_made_once_a_shape(monkeypatch):
    """A programmatic launch reuses the configuration of its (grid, block, smem, stream): each
    launch gets one with its own fields, the same object for the same shape, and the table starts
    again when full."""
    seen = []
    monkeypatch.setattr(driver._d, "cuLaunchKernelEx", lambda cfg, f, p, x: (seen.append(cfg), (driver._SUCCESS,))[1])
    monkeypatch.setattr(driver, "_PDL_CFGS", {})
    stream = driver._d.CUstream(77)
    for grid, smem in [((4, 1, 1), 0), ((4, 1, 1), 0), ((8, 2, 1), 96), ((4, 1, 1), 0)]:
        driver.launch_kernel_pdl(None, grid, (128, 1, 1), smem, stream, 0, "hy_qk")
    assert seen[0] is seen[1] is seen[3] and seen[2] is not seen[0]
    c = seen[2]
    assert (c.gridDimX, c.gridDimY, c.gridDimZ, c.blockDimX, c.sharedMemBytes, c.numAttrs) == (8, 2, 1, 128, 96, 1)
    assert int(c.hStream) == 77
    monkeypatch.setattr(driver, "_PDL_CFGS_MAX", 2)
    driver.launch_kernel_pdl(None, (9, 1, 1), (32, 1, 1), 0, stream, 0, "hy_qk")
    assert len(driver._PDL_CFGS) == 1


def test_taps_ring_and_mirror_rows_go_to_l2_before_the_wait(entries):
    # the GDN front's taps and ring and attention's K / V mirror rows, fetched while the kernel
    # before still runs (pf_l2: prefetch.global.L2, allowed ahead of the wait; the front's gate
    # dots and the scans' states are loaded there outright: EARLY_READERS)
    for k in ("hy_gdn_front", "hy_scores", "hy_values"):
        body = entries[k]
        assert body.index("prefetch.global.L2") < body.index("griddepcontrol.wait"), k
