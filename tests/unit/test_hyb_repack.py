"""The host repack into the tensor-core layout (hybrid/repack.py), decoded back independently,
equals q4tp.decode bit for bit; the HyJob table bytes; MmaSet's rules and launch rings; hy_mmp
entry points."""

import numpy as np
import pytest

from cortiq_drv.cmf import q4tp
from cortiq_drv.errors import CortiqError
from cortiq_drv.hybrid import mma, mma_rules
from cortiq_drv.hybrid.repack import pair_map, planes_bytes, repack_q4tp, repack_rows
from cortiq_drv.hybrid.repack import random_q4tp as payload


def decode_tiles(nib, codes, lad, rows, cols):
    """The weights [rows, cols] a repacked matrix stands for, read lane by lane the way the
    mma.sync m16n8k16 A fragment is defined (PTX ISA): register m of lane (gid, tig) holds row
    gid + 8 (m & 1), columns 2 tig + 8 (m >> 1) and + 1 of its k-step."""
    ntile, gpr = -(-rows // 16), cols // 32
    words = nib.reshape(ntile, gpr, 32, 2)
    q = np.zeros((ntile * 16, gpr * 32), dtype=np.int64)
    for lane in range(32):
        gid, tig = lane >> 2, lane & 3
        for s in range(2):
            x = words[:, :, lane, s].astype(np.int64)  # [ntile, gpr]
            for m in range(4):
                row = np.arange(ntile) * 16 + gid + 8 * (m & 1)
                col = np.arange(gpr) * 32 + 16 * s + 2 * tig + 8 * (m >> 1)
                q[row[:, None], col[None, :]] = (x >> (4 * m)) & 15
                q[row[:, None], col[None, :] + 1] = (x >> (4 * m + 16)) & 15
    code = codes.reshape(ntile, gpr, 16).transpose(0, 2, 1).reshape(ntile * 16, gpr)
    lo, st = lad.reshape(rows, 2).T
    rung = np.take_along_axis(q4tp.ladders(lo, st), code[:rows].astype(np.int64), axis=1)
    w = (q[:rows] - 8).astype(np.float32).reshape(rows, gpr, 32) * rung[..., None]
    return w.reshape(rows, cols), q[rows:], code[rows:]


@pytest.mark.parametrize("rows", [1, 15, 16, 17, 40])
@pytest.mark.parametrize("cols", [32, 96, 992, 1024, 1056])
def test_repack_decodes_to_q4tp(rows, cols):
    rng = np.random.default_rng(rows * 7919 + cols)
    p = payload(rows, cols, rng)
    nib, codes, lad = repack_q4tp(p, rows, cols)
    ntile, gpr = -(-rows // 16), cols // 32
    assert nib.dtype == np.uint32 and nib.size == ntile * gpr * 64
    assert codes.dtype == np.uint8 and codes.size == ntile * gpr * 16
    w, pad_q, pad_code = decode_tiles(nib, codes, lad, rows, cols)
    assert w.tobytes() == q4tp.decode(p, rows, cols).tobytes()
    assert (pad_q == 8).all() and (pad_code == 0).all()


def test_repack_of_encoded_weights():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((33, 160)).astype(np.float32)
    p = q4tp.encode(w)
    got, _, _ = decode_tiles(*repack_q4tp(p, 33, 160), 33, 160)
    assert got.tobytes() == q4tp.decode(p, 33, 160).tobytes()


@pytest.mark.parametrize("inter", [8, 24, 40])
def test_pair_interleaves_gate_and_up(inter):
    rng = np.random.default_rng(inter)
    cols = 64
    g, u = payload(inter, cols, rng), payload(inter, cols, rng)
    nib, codes, lad = repack_rows([(g, inter), (u, inter)], 2 * inter, cols, pair_map)
    w, _, _ = decode_tiles(nib, codes, lad, 2 * inter, cols)
    tiles = w.reshape(-1, 2, 8, cols)
    assert tiles[:, 0].reshape(inter, cols).tobytes() == q4tp.decode(g, inter, cols).tobytes()
    assert tiles[:, 1].reshape(inter, cols).tobytes() == q4tp.decode(u, inter, cols).tobytes()


def test_repack_refuses_bad_input():
    rng = np.random.default_rng(1)
    p = payload(4, 64, rng)
    with pytest.raises(CortiqError, match="multiple of 32"):
        repack_q4tp(p, 4, 48)
    with pytest.raises(CortiqError, match="bytes"):
        repack_q4tp(p[:-1], 4, 64)
    with pytest.raises(CortiqError, match="past payload"):
        repack_rows([(p, 4)], 5, 64)


def test_planes_bytes_covers_the_three_planes():
    for rows, cols in [(1, 32), (17, 96), (4096, 4096), (248320, 5120)]:
        ntile, gpr = -(-rows // 16), cols // 32
        b = planes_bytes(rows, cols)
        assert b % 256 == 0
        assert b >= ntile * gpr * 256 + ntile * gpr * 16 + rows * 8 + 64
        assert b < ntile * gpr * 272 + rows * 8 + 64 + 3 * 256


class _Mat:
    kind, cols = mma.KIND_Q4TP, 64

    def __init__(self, rows, base):
        self.rows = rows
        self.w, self.aux0, self.aux1 = base, base + 0x100, base + 0x200


def test_hyjob_layout_matches_the_c_struct():
    assert mma.HYJOB.itemsize == 56
    offs = [mma.HYJOB.fields[f][1] for f in ("w", "aux0", "aux1", "y", "res", "rows", "kind",
                                             "blk0", "ystride")]
    assert offs == [0, 8, 16, 24, 32, 40, 44, 48, 52]


def test_job_table_bytes():
    specs = [mma.JobSpec(_Mat(40, 0x1000), 0xA000, 0, 40, 40),
             mma.JobSpec(_Mat(16, 0x2000), 0xB000, 0xC000, 100, 16),
             mma.JobSpec(_Mat(8, 0x3000), 0xD000, 0, 8, 8)]
    for tb, blk0s, total in [(1, [0, 3, 4], 5), (2, [0, 2, 3], 4)]:
        jobs, blocks = mma.job_table(specs, mma.KIND_Q4TP, tb)
        assert blocks == total and list(jobs["blk0"]) == blk0s
        raw = jobs.tobytes()
        assert len(raw) == 3 * 56
        w, aux0, aux1, y, res = np.frombuffer(raw[56:96], dtype="<u8")
        rows, kind, blk0, ystride = np.frombuffer(raw[96:112], dtype="<i4")
        assert (w, aux0, aux1, y, res) == (0x2000, 0x2100, 0x2200, 0xB000, 0xC000)
        assert (rows, kind, blk0, ystride) == (16, 6, blk0s[1], 100)


def test_mmaset_rules():
    # K/V alone: short, KS 16, one tile a block
    assert mma_rules.set_rules([1024, 1024]) == (True, True)
    # a 9B gate/up pair: KS 8, two tiles a block
    assert mma_rules.set_rules([24576]) == (False, False)
    # the 9B o, GDN out and down (4096 rows): KS 16; the 27B's (5120): KS 8
    assert mma_rules.set_rules([4096]) == (True, False)
    assert mma_rules.set_rules([5119]) == (True, False)
    assert mma_rules.set_rules([5120]) == (False, False)
    # the rows of the whole set count: a 9B attention q + k + v and its GDN qkv + z set (the
    # plan's: a and b are f32, hy_gdn_front's) go to KS 8, and so does a set at the edge
    assert mma_rules.set_rules([8192, 1024, 1024]) == (False, False)
    assert mma_rules.set_rules([8192, 4096]) == (False, False)
    assert mma_rules.set_rules([4096, 1024]) == (False, False)
    assert mma_rules.set_rules([4096, 1023]) == (True, False)
    assert mma_rules.set_rules([2048, 2049]) == (True, False)
    assert mma.variant(1, True, False) == (0, 2, 16)
    assert mma.variant(2, False, True) == (0, 1, 8)
    assert mma.variant(3, True, False) == (1, 2, 16)
    assert mma.variant(8, False, False) == (1, 2, 8)
    assert mma.variant(9, False, False) == (2, 2, 8)
    assert mma.variant(16, True, True) == (2, 1, 16)
    assert [mma.rows_cap(nt) for nt in (0, 1, 2)] == [2, 8, 16]
    for n in (0, 17):
        with pytest.raises(CortiqError, match="1..16"):
            mma.variant(n, True, False)


def test_every_mmp_variant_is_an_entry_point():
    from cortiq_drv.cu import nvrtc
    from cortiq_drv.errors import NvrtcError
    from cortiq_drv.kernels import source

    try:
        cubin = nvrtc.compile_cubin(source("hyb.cu"), (), "sm_90")
    except NvrtcError as e:
        pytest.skip(f"NVRTC cannot be loaded: {e}")
    names = [f"hy_mmp_{nt}_{tb}_{ks}" for nt in (1, 2) for tb in (1, 2) for ks in (8, 16)]
    names += [f"hy_mmv{s}_{tb}_{ks}" for s in ("", "s") for tb in (1, 2) for ks in (8, 16)]
    names += [mma.mmr_name(ntc, tb) for ntc in (2, 3) for tb in (1, 2)]
    for name in names + ["hy_repack", "hy_split", "hy_rmsnorm2"]:
        assert name.encode() + b"\0" in cubin, name


def test_job_args_carry_the_table_by_value():
    """The launch block: argument 0 the HY_MAXJ-record table (HyJobs), then nj, p0..p2, xs, n, cols,
    packed by kargs (its checks)."""
    import ctypes
    import re

    from cortiq_drv.kernels import source

    assert int(re.search(r"#define HY_MAXJ (\d+)", source("hyb_mma.cuh")).group(1)) == mma.MAXJ
    specs = [mma.JobSpec(_Mat(40, 0x1000), 0xA000, 0, 40, 40), mma.JobSpec(_Mat(16, 0x2000), 0xB000, 0, 16, 16)]
    jobs, _ = mma.job_table(specs, mma.KIND_Q4TP, 2)
    a = mma.JobArgs(mma.jobs_block(jobs), len(jobs), mma.Planes(0x10, 0x20, 0x30, 72), 3, 64)
    ptrs = (ctypes.c_void_p * 8).from_address(a.addr)
    table = ctypes.string_at(ptrs[0], mma.MAXJ * 56)
    assert table[:112] == jobs.tobytes() and table[112:] == bytes(mma.MAXJ * 56 - 112)
    assert [ctypes.c_int32.from_address(ptrs[i]).value for i in (1, 5, 6, 7)] == [2, 72, 3, 64]
    assert [ctypes.c_uint64.from_address(ptrs[i]).value for i in (2, 3, 4)] == [0x10, 0x20, 0x30]
    # the values go through kargs' checks: a stride past int32 is refused, not wrapped
    with pytest.raises(CortiqError, match="kargs: argument 4"):
        mma.JobArgs(mma.jobs_block(jobs), len(jobs), mma.Planes(0x10, 0x20, 0x30, 1 << 31), 3, 64)
    with pytest.raises(CortiqError, match="at most"):
        mma.MmaSet(None, specs * 5, mma.KIND_Q4TP)


def test_mmp_launches_take_their_variants_ring():
    """Each variant launches with its ring's dynamic shared memory: HY_RUN_STAGES stages of
    HY_STAGE bytes a warp for hy_mmp and hy_mmr, HY_MV_STAGES for hy_mmv (the kernels' values),
    or the depths a sweep compiled them with when MmaFuncs is given them."""
    import re

    import _fakecard
    from cortiq_drv.kernels import source

    core = source("hyb_mmp_core.cuh")

    def macro(text, name):
        return int(re.search(rf"#define {name} (\d+)", text).group(1))

    mv, run, stage = (macro(core, k) for k in ("HY_MV_STAGES", "HY_RUN_STAGES", "HY_STAGE"))
    assert (mma.MV_STAGES, mma.RUN_STAGES, mma.STAGE_BYTES) == (mv, run, stage)

    class SmemCtx(_fakecard.FakeCtx):
        def launch(self, f, grid, block, smem, args):
            self.launches.append((f.name, block, smem))

    ctx = SmemCtx()
    ms = mma.MmaSet(ctx, [mma.JobSpec(_Mat(40, 0x1000), 0xA000, 0, 40, 40)], mma.KIND_Q4TP)
    p = mma.Planes(0x10, 0x20, 0x30, 64)
    variants = [(nt, tb, ks) for nt in (0, 1, 2) for tb in (1, 2) for ks in (8, 16)]
    fx = mma.MmaFuncs(ctx, _fakecard.FakeModule())
    for nt, tb, ks in variants:
        ms.launch(ctx, fx, p, 1, nt, tb, ks, staged=False)
    assert ctx.launches == [(f"hy_mmv_{tb}_{ks}" if nt == 0 else f"hy_mmp_{nt}_{tb}_{ks}", 32 * ks,
                             ks * (mv if nt == 0 else run) * stage) for nt, tb, ks in variants]
    ctx.launches.clear()
    swept = mma.MmaFuncs(ctx, _fakecard.FakeModule(), 6, 8)
    for nt, tb, ks in variants:
        ms.launch(ctx, swept, p, 1, nt, tb, ks, staged=False)
    ms.launch(ctx, swept, p, 3, 1, 2, 8, lean=True)
    assert [s for _, _, s in ctx.launches] == [ks * (6 if nt == 0 else 8) * stage for nt, tb, ks in variants] + [
        8 * 8 * stage]
    ctx.launches.clear()
    for n in (3, 5, 6, 8):
        for tb in (1, 2):
            ms.launch(ctx, fx, p, n, 1, tb, 8, lean=True)
    assert ctx.launches == [(f"hy_mmr_{(3 * n + 7) // 8}_{tb}_8", 256, 8 * run * stage)
                            for n in (3, 5, 6, 8) for tb in (1, 2)]
    for n, var in ((2, (0, 2, 8)), (4, (1, 2, 16)), (9, (2, 2, 8))):
        with pytest.raises(CortiqError, match="hy_mmr"):
            ms.launch(ctx, fx, p, n, *var, lean=True)


def test_few_row_calls_take_hy_mmp_1_where_it_walks_no_more_rounds():
    """fewer_waves on the shapes it was measured on (132 SMs; hy_mmv / hy_mmp_1 blocks resident:
    KS 16 264 / 132, KS 8 396 / 264), and `choice` on a fake card: one and two rows only, the
    set's TB and KS kept, staging first."""
    import _fakecard

    assert mma_rules.fewer_waves(128, 264, 132)  # 9B o, GDN out, down: one round each
    assert mma_rules.fewer_waves(448, 396, 264)  # 27B attention in: two rounds each
    assert mma_rules.fewer_waves(516, 396, 264)  # 27B GDN in
    assert not mma_rules.fewer_waves(320, 396, 264)  # 9B attention in: two rounds against one
    assert not mma_rules.fewer_waves(768, 396, 264)  # 9B gate/up: three against two
    assert not mma_rules.fewer_waves(160, 264, 132)  # 27B o, down at KS 16 (KS 8 since session 15)
    assert not mma_rules.fewer_waves(1088, 396, 264)  # 27B gate/up: five rounds against three
    assert not mma_rules.fewer_waves(7760, 396, 264)  # the LM heads: thirty against twenty

    class Wide(_Mat):
        cols = 4096

    ctx = _fakecard.FakeCtx()
    fx = mma.MmaFuncs(ctx, _fakecard.FakeModule())
    rounds = {ks: (fx.grid_cap[0, 2, ks], fx.grid_cap[1, 2, ks]) for ks in (8, 16)}
    for rows, ks in ((4096, 16), (14336, 8), (24576, 8)):
        ms = mma.MmaSet(ctx, [mma.JobSpec(Wide(rows, 0x1000), 0xA000, 0, rows, rows)], mma.KIND_Q4TP)
        nt = int(mma_rules.fewer_waves(ms.blocks[2], *rounds[ks]))
        # one row: where hy_mmp_1 would walk no more rounds, hy_mmvs does (stages_b), staged
        one = (0, 2, ks, True, False) if nt else (0, 2, ks, False, False)
        assert [ms.choice(fx, n) for n in (1, 2, 9, 11)] == [one, (nt, 2, ks, False, False)] + [
            (2, 2, ks, False, False), (2, 4 if ks == 8 else 2, ks, False, False)]


def test_few_row_calls_take_one_tile_a_block_where_it_evens_the_sms():
    """evens_tiles on the shapes it was measured on (132 SMs; hy_mmv_1 blocks resident: KS 8 396,
    KS 16 264), and `choice` on a fake card: one and two rows of the 27B o / GDN out / down
    (5120 rows: 160 items at TB 2) take TB 1 at the set's KS; sets with no more TB 2 items than
    SMs, or more TB 1 items than hy_mmv_1's grid, keep TB 2, and three rows and more do."""
    import _fakecard

    assert mma_rules.evens_tiles(160, 320, 132, 396)  # 27B o, GDN out, down
    assert not mma_rules.evens_tiles(128, 256, 132, 396)  # 9B o: one item an SM already
    assert not mma_rules.evens_tiles(320, 640, 132, 396)  # 9B attention in
    assert not mma_rules.evens_tiles(448, 896, 132, 396)  # 27B attention in
    assert not mma_rules.evens_tiles(768, 1536, 132, 396)  # 9B gate/up

    class Mat(_Mat):
        cols = 6144

    ctx = _fakecard.FakeCtx()
    fx = mma.MmaFuncs(ctx, _fakecard.FakeModule())
    assert fx.sm_count == 132 and [fx.grid_cap[0, 1, ks] for ks in (8, 16)] == [396, 264]
    # 4400 rows: 138 items at TB 2, but KS 16 and 275 at TB 1, more than hy_mmv_1_16's grid
    for rows, tbs in ((5120, (1, 1, 2)), (4096, (2, 2, 2)), (4400, (2, 2, 2)), (14336, (2, 2, 2))):
        ms = mma.MmaSet(ctx, [mma.JobSpec(Mat(rows, 0x1000), 0xA000, 0, rows, rows)], mma.KIND_Q4TP)
        ks = 16 if ms.ks16 else 8
        got = [ms.choice(fx, n) for n in (1, 2, 3)]
        assert [c[1] for c in got] == list(tbs) and all(c[2] == ks for c in got), (rows, got)
    # the 27B's: hy_mmv_1_8, its columns not staged (fewer_waves and stages_b see TB 1's items)
    ms = mma.MmaSet(ctx, [mma.JobSpec(Mat(5120, 0x1000), 0xA000, 0, 5120, 5120)], mma.KIND_Q4TP)
    assert [ms.choice(fx, n) for n in (1, 2)] == [(0, 1, 8, False, False)] * 2


def test_multi_row_calls_at_ks8_take_hy_mmr_where_its_grid_takes_them_in_one_wave():
    """one_wave on the shapes it was measured on (132 SMs; hy_mmp_1 / hy_mmr blocks resident at KS
    8: 264 / 396), and `choice` on a fake card at 3..8 rows: hy_mmr for the KS 8 sets whose items
    its grid takes at once and hy_mmp_1's does not, hy_mmp_1 for the others; 9 rows and more:
    hy_mmp_2."""
    import _fakecard

    assert mma_rules.one_wave(320, 264, 396)  # 9B attention in: one round against two
    assert mma_rules.one_wave(384, 264, 396)  # 9B GDN in
    assert not mma_rules.one_wave(448, 264, 396)  # 27B attention in: two rounds each
    assert not mma_rules.one_wave(512, 264, 396)  # 27B GDN in
    assert not mma_rules.one_wave(768, 264, 396)  # 9B gate/up at 3 rows: three against two
    assert not mma_rules.one_wave(7760, 264, 396)  # the heads
    assert not mma_rules.one_wave(256, 264, 396)  # one round each

    class Wide(_Mat):
        cols = 4096

    ctx = _fakecard.FakeCtx()
    fx = mma.MmaFuncs(ctx, _fakecard.FakeModule())
    cap_mmp = fx.grid_cap[1, 2, 8]
    assert [fx.mmr_cap[c][1] for c in (0, 1)] == [fx.mmr_cap[0][1]] * 2 and fx.mmr_cap[0][1] > cap_mmp
    # a KS 8 set (10 240 rows or more) of one matrix has 320 items or more at TB 2: more than
    # hy_mmp_1's grid holds on this card (the other side is one_wave's assertions above)
    assert (cap_mmp, fx.mmr_cap[0][1]) == (264, 396)
    for items in (320, fx.mmr_cap[0][1], fx.mmr_cap[0][1] + 8):
        rows = 32 * items
        ms = mma.MmaSet(ctx, [mma.JobSpec(Wide(rows, 0x1000), 0xA000, 0, rows, rows)], mma.KIND_Q4TP)
        assert ms.variant(3) == (1, 2, 8) and ms.blocks[2] == items
        lean = cap_mmp < items <= fx.mmr_cap[0][1]
        assert [ms.choice(fx, n) for n in (3, 5, 6, 8)] == [(1, 2, 8, False, lean)] * 4, items
        assert ms.choice(fx, 9) == (2, 2, 8, False, False)
    small = mma.MmaSet(ctx, [mma.JobSpec(Wide(4096, 0x1000), 0xA000, 0, 4096, 4096)], mma.KIND_Q4TP)
    assert small.choice(fx, 4) == (1, 2, 16, False, False)  # KS 16: no hy_mmr


def test_sixteen_row_calls_at_ks8_take_four_tiles_a_block():
    """four_tiles, and `choice` on a fake card: 11..16-row calls over KS 8 sets take hy_mmp_2_4_8
    (launched over the set's TB 4 job table), KS 16 sets and one-tile sets keep their TB, fewer
    rows never take TB 4; a variant no kernel has is refused by name."""
    import _fakecard

    assert mma_rules.four_tiles(2, 2, 8, 11) and mma_rules.four_tiles(2, 2, 8, 16)
    assert not mma_rules.four_tiles(2, 2, 8, 10)  # four n-tiles
    assert not any(mma_rules.four_tiles(*v, 16) for v in ((1, 2, 8), (0, 2, 8), (2, 2, 16), (2, 1, 8)))

    class Wide(_Mat):
        cols = 4096

    ctx = _fakecard.FakeCtx()
    fx = mma.MmaFuncs(ctx, _fakecard.FakeModule())
    assert (2, 4, 8) in fx.mmp and fx.grid_cap[2, 4, 8] == 132  # 255 registers: one block an SM
    specs = [mma.JobSpec(Wide(rows, 0x1000 * (i + 1)), 0xA000, 0, rows, rows) for i, rows in enumerate((24576, 40))]
    ms = mma.MmaSet(ctx, specs, mma.KIND_Q4TP)
    assert ms.blocks == {1: 1536 + 3, 2: 768 + 2, 4: 384 + 1}
    assert list(ms.jobs[4]["blk0"]) == [0, 384]
    assert [ms.choice(fx, n) for n in (8, 10, 11, 16)] == [(1, 2, 8, False, False), (2, 2, 8, False, False)] + [
        (2, 4, 8, False, False)] * 2
    small = mma.MmaSet(ctx, [mma.JobSpec(Wide(4096, 0x1000), 0xA000, 0, 4096, 4096)], mma.KIND_Q4TP)
    assert small.choice(fx, 16) == (2, 2, 16, False, False)
    short = mma.MmaSet(ctx, [mma.JobSpec(Wide(1024, 0x1000), 0xA000, 0, 1024, 1024)] * 6, mma.KIND_Q4TP)
    assert short.tb1 and not short.ks16 and short.choice(fx, 16) == (2, 1, 8, False, False)
    with pytest.raises(CortiqError, match="hy_mmp variant 1_4_8: no such kernel"):
        ms.pick(fx, mma.Planes(0x1000, 0x2000, 0x3000, 4096), 8, 1, 4, 8)


def test_one_row_calls_stage_their_columns_where_it_pays():
    """stages_b on the shapes it was measured on (132 SMs), and the launches it picks: hy_mmvs
    with the ring and the staged columns (hyb_mmp_core.cuh's hy_sb_stride: 64 bytes a group,
    columns 64 bytes mod 128 apart), hy_mmv otherwise; a forced staging that cannot be is refused,
    and so are planes that do not take 16-byte loads."""
    import _fakecard

    assert mma_rules.stages_b(128, 384, 264, 132, 132, 1)  # 9B down: one item of 384 groups a block
    assert mma_rules.stages_b(7760, 128, 396, 396, 264, 1)  # 9B LM head: about 20 items of 128
    assert not mma_rules.stages_b(768, 128, 396, 396, 264, 1)  # 9B gate/up: two items of 128
    # 27B down: 28 items would wait for a second round
    assert not mma_rules.stages_b(160, 544, 264, 132, 132, 1)
    # 27B LM head: a block an SM fewer, and hy_mmv's (thirty rounds staged against twenty)
    assert not mma_rules.stages_b(7760, 160, 396, 264, 264, 1)
    # in place of hy_mmp_1 (fewer_waves) in no more rounds than it, however few its groups
    assert mma_rules.stages_b(128, 128, 264, 132, 132, 1)  # 9B o and GDN out: one round each
    assert mma_rules.stages_b(448, 160, 396, 264, 264, 1)  # 27B attention in: two rounds each
    assert mma_rules.stages_b(516, 160, 396, 264, 264, 1)  # 27B GDN in
    assert not mma_rules.stages_b(320, 544, 396, 132, 264, 1)  # 27B down at TB 1: hy_mmv's one round
    # two rows or more: never (the heads and the 27B gate/up staged before the planes' fragment order)
    for shape in ((7760, 128, 396, 264, 264), (7760, 160, 396, 264, 264), (1088, 160, 396, 264, 264),
                  (128, 384, 264, 132, 132)):
        assert not mma_rules.stages_b(*shape, 2) and not mma_rules.stages_b(*shape, 3)
    for gpr in (1, 2, 3, 128, 384, 544):
        per = mma.staged_b_bytes(32 * gpr, 1) // 3
        assert per >= 64 * gpr and per % 128 == 64 and per - 64 * gpr < 128

    class SmemCtx(_fakecard.FakeCtx):
        def launch(self, f, grid, block, smem, args):
            self.launches.append((f.name, grid[0], smem))

    class Wide(_Mat):
        cols = 12288

    ctx = SmemCtx()
    fx = mma.MmaFuncs(ctx, _fakecard.FakeModule())
    ms = mma.MmaSet(ctx, [mma.JobSpec(Wide(4096, 0x1000), 0xA000, 0, 4096, 4096)], mma.KIND_Q4TP)
    ring = mma.ring_bytes(16, mma.MV_STAGES)
    p = mma.Planes(0x10000, 0x20000, 0x30000, 12288)
    ms.run(ctx, fx, p, 12288, 1)
    ms.run(ctx, fx, p, 12288, 2)
    ms.launch(ctx, fx, p, 1, 0, 2, 16, staged=False)
    one = mma.staged_b_bytes(12288, 1)
    # the 9B o: 128 items of 128 groups, staged at one row (in place of hy_mmp_1, in one round too)
    class Square(_Mat):
        cols = 4096

    o = mma.MmaSet(ctx, [mma.JobSpec(Square(4096, 0x1000), 0xA000, 0, 4096, 4096)], mma.KIND_Q4TP)
    o.run(ctx, fx, mma.Planes(0x10000, 0x20000, 0x30000, 4096), 4096, 1)
    # two rows: no staging; hy_mmp_1 (one block an SM) walks the 128 items in one round as hy_mmv does
    assert ctx.launches == [("hy_mmvs_2_16", 128, ring + one),
                            ("hy_mmp_1_2_16", 128, mma.ring_bytes(16, mma.RUN_STAGES)),
                            ("hy_mmv_2_16", 128, ring),
                            ("hy_mmvs_2_16", 128, ring + mma.staged_b_bytes(4096, 1))]
    # two rows' six columns 12288 wide do not fit beside hy_mmvs_2_16's rings and its static tables
    # (ptxas: 23 680 bytes) in the card's 232 448: a forced staging is refused, nothing launched
    ctx.launches.clear()
    assert ring + mma.staged_b_bytes(12288, 2) + _fakecard.FakeFunc.SMEM["hy_mmvs_2_16"] > ctx.smem_optin
    with pytest.raises(CortiqError, match="need room for their columns beside the rings"):
        ms.launch(ctx, fx, p, 2, 0, 2, 16, staged=True)
    assert ctx.launches == []
    # planes that do not take 16-byte loads, or a partial group of columns: refused, nothing launched
    ctx.launches.clear()
    for bad, n in ((mma.Planes(0x10008, 0x20000, 0x30000, 12288), 1),
                   (mma.Planes(0x10000, 0x20000, 0x30000, 12292), 2)):
        with pytest.raises(CortiqError, match="16-byte aligned planes"):
            ms.run(ctx, fx, bad, 12288, n)
        with pytest.raises(CortiqError, match="16-byte aligned planes"):
            ms.launch(ctx, fx, bad, n, 0, 2, 16, staged=False)
    with pytest.raises(CortiqError, match="whole groups of 32"):
        mma.split(ctx, fx, p, 0xB000, 12288, 100, 1)
    with pytest.raises(CortiqError, match="whole groups of 32"):
        mma.rmsnorm2(ctx, fx, 0xB000, 0xC000, 0, 12304, 1e-6, False, p, 1)
    # one row: any stride
    ms.launch(ctx, fx, mma.Planes(0x10000, 0x20000, 0x30000, 12290), 1, 0, 2, 16, staged=False)
    assert ctx.launches == [("hy_mmv_2_16", 128, ring)]
    with pytest.raises(CortiqError, match="only hy_mmv"):
        ms.launch(ctx, fx, p, 1, 1, 2, 16, staged=True)

    class LaunchOnly:
        """What a wrapper of the context offers (graphs.KtCtx): launches, no device facts."""

        def __init__(self):
            self.launches = []

        def launch(self, f, grid, block, smem, args):
            self.launches.append((f.name, grid[0], smem))

    lo = LaunchOnly()
    fresh = mma.MmaSet(ctx, [mma.JobSpec(Wide(4096, 0x1000), 0xA000, 0, 4096, 4096)], mma.KIND_Q4TP)
    fresh.run(lo, mma.MmaFuncs(ctx, _fakecard.FakeModule()), p, 12288, 1)
    assert lo.launches == [("hy_mmvs_2_16", 128, ring + one)]


def test_hfuncs_keeps_the_weight_side_fields():
    """HFuncs adds the arm's kernels to MmaFuncs without shadowing any of its fields (a kernel
    named like one replaced the matvec's shared memory table once)."""
    import _fakecard
    from cortiq_drv.hybrid.launch import HFuncs

    ctx = _fakecard.FakeCtx()
    base, full = mma.MmaFuncs(ctx, _fakecard.FakeModule()), HFuncs(ctx, _fakecard.FakeModule())
    for name, value in vars(base).items():
        assert type(getattr(full, name)) is type(value), name
    assert full.mmp_smem == base.mmp_smem and full.grid_cap == base.grid_cap
