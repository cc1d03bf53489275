"""tools/bench_kernels.py's tensor-core floor: the mma.sync work it counts for a call (every
16-row tile, the columns, 8 B columns an n-tile of the rows' three planes) and the rate kernel
that divides it, which must compile to an entry point (NVRTC, no device)."""

from cortiq_drv.cu import nvrtc


# the tools/ script the `tool` fixture (conftest) imports
TOOL = "bench_kernels"


def test_mma_flops_counts_tiles_columns_and_n_tiles(tool):
    # the 9B gate/up pair (24 576 rows, 1536 tiles) 4096 wide: one n-tile at 1..2 rows, six at 14..16
    per_tile = 2 * 16 * 4096 * 8
    assert [tool.mma_flops([24576], 4096, n) for n in (1, 2, 3, 8, 9, 16)] == [
        1536 * per_tile * k for k in (1, 1, 2, 3, 4, 6)]
    # several jobs: each one's tiles, the last ragged (40 rows: 3 tiles, 17: 2)
    assert tool.mma_flops([40, 17], 64, 1) == 2 * (3 + 2) * 16 * 64 * 8


def test_mma_rate_kernel_compiles(nvrtc_ok, tool):
    ptx, _ = nvrtc.compile_program(tool.MMA_SRC, nvrtc.options_for((), "sm_90"), "mma_rate.cu", ptx=True)
    text = ptx.decode()
    assert ".entry mma_rate(" in text
    # the chains' products all kept (the loop over iterations may be unrolled)
    mmas = text.count("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32")
    assert mmas and mmas % tool.MMA_CHAINS == 0


def test_variant_names_read_back_and_refuse_what_no_kernel_runs(tool):
    import pytest

    for var, n in (((0, 2, 16, True, False), 1), ((1, 2, 8, False, True), 8), ((2, 4, 8, False, False), 16),
                   ((0, 1, 8, False, False), 2)):
        assert tool.parse_variant(tool.variant_name(var), n) == var
    assert tool.variant_name((1, 1, 16, False, False)) == "1_1_16"
    for text, n, why in (("1_2", 1, "not NT_TB_KS"), ("1_4_8", 4, "no hy_mmp kernel 1_4_8"),
                         ("0_2_8", 3, "carries 1..2 rows, not 3"), ("1_2_8s", 1, "only hy_mmv"),
                         ("1_2_16r", 4, "hy_mmr runs"), ("1_2_8r", 2, "hy_mmr runs"), ("2_2_8x", 9, "not NT_TB_KS")):
        with pytest.raises(ValueError, match=why):
            tool.parse_variant(text, n)
