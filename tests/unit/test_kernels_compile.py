"""Every kernel file compiles with NVRTC for sm_80 and sm_90 with no -D defines (compile-only,
no GPU needed); `source` inlines sibling headers once each."""

import pytest

from cortiq_drv.cu import nvrtc
from cortiq_drv.errors import CortiqError
from cortiq_drv.kernels import kernel_files, source


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", kernel_files())
def test_kernel_compiles(nvrtc_ok, name, arch):
    src = source(name)
    cubin, log = nvrtc.compile_program(src, nvrtc.options_for((), arch), name)
    assert cubin.startswith(b"\x7fELF"), log


def test_fake_card_registers_and_shared_memory_are_ptxas_own(nvrtc_ok):
    """The fake card's register and static shared memory tables (`_fakecard.FakeFunc.REGS` and
    `SMEM`, from which its grid caps come) hold what ptxas gives every weight-side kernel on
    sm_90, so a kernel change that moves a count fails here instead of leaving the fake card's
    caps off the card's (a static size of 0 let the fake card fit three staged 5120-wide blocks
    an SM where the card fits two)."""
    import _fakecard
    from cortiq_drv.hybrid import mma

    _, log = nvrtc.compile_program(mma.weight_side_source(), nvrtc.options_for((), "sm_90", ["-Xptxas=-v"]),
                                   "weights.cu")
    rows = [r for r in nvrtc.ptxas_report(log) if r[0].startswith("hy_mm")]
    regs = {k: r for k, r, *_ in rows}
    smem = {k: sm for k, *_, sm in rows}
    # every entry of the tables names kernels that exist (a renamed one would fall back to 64 / 0)
    assert all(any(k.startswith(p) for k in regs) for p in _fakecard.FakeFunc.REGS)
    assert set(_fakecard.FakeFunc.SMEM) == set(smem)
    assert {k: _fakecard.FakeFunc(k).attr("NUM_REGS") for k in regs} == regs
    assert {k: _fakecard.FakeFunc(k).attr("SHARED_SIZE_BYTES") for k in smem} == smem


def test_ptxas_report_reads_each_entry():
    log = ("ptxas info    : Compiling entry function 'a' for 'sm_90'\n"
           "ptxas info    : Function properties for a\n"
           "    24 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
           "ptxas info    : Used 80 registers, used 1 barriers, 15424 bytes smem\n"
           "ptxas info    : Compiling entry function 'b' for 'sm_90'\n"
           "ptxas info    : Used 32 registers\n")
    assert nvrtc.ptxas_report(log) == [("a", 80, 24, 8, 12, 15424), ("b", 32, 0, 0, 0, 0)]


def test_basic_cu_is_among_the_kernel_files():
    assert "basic.cu" in kernel_files()


def test_source_inlines_common_once():
    text = source("basic.cu")
    assert '#include "common.cuh"' not in text
    assert text.count("// begin common.cuh") == 1
    assert "f32_to_bf16" in text


def test_missing_source_is_an_error():
    with pytest.raises(CortiqError, match="no_such.cu"):
        source("no_such.cu")


def test_line_markers_point_back_at_the_including_file():
    # basic.cu includes common.cuh on its line 2, so the text after it is line 3 of basic.cu
    text = source("basic.cu")
    assert '#line 1 "common.cuh"' in text
    assert '#line 3 "basic.cu"' in text


def test_includes_lists_an_entry_files_own_includes_in_order():
    from cortiq_drv.hybrid import mma
    from cortiq_drv.kernels import includes

    inc = includes("hyb.cu")
    assert inc[:4] == ["common.cuh", "hyb_mma.cuh", "hyb_mmp_core.cuh", "hyb_mmp.cuh"]
    # the weight side is hyb.cu's pieces up to hyb_mmp.cuh, common.cuh first
    text = mma.weight_side_source()
    assert text.startswith(source("common.cuh")) and "#define HY_MMV(" in text and "hy_gdn_front" not in text
    with pytest.raises(CortiqError, match="no_such.cu"):
        includes("no_such.cu")
