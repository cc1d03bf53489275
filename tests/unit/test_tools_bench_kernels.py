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
