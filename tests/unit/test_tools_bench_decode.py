"""tools/bench_decode.py's --ablate: which kernels each class names, and the context that leaves a
class's launches out of a step while handing every other call to the real one; --timeline: the
records' arithmetic and the define reaching hyb.cu's compile; --force and decode_choices: the
keys, and the choices recorded and replaced while a shape runs (no device)."""

from types import SimpleNamespace

from cortiq_drv.hybrid import launch, mma


# the tools/ script the `tool` fixture (conftest) imports
TOOL = "bench_decode"


def test_classes_name_the_step_kernels(tool):
    matvecs = {mma.mmp_name(*v) for v in mma.MMP_VARIANTS} | {mma.mmvs_name(tb, ks) for tb in (1, 2) for ks in (8, 16)}
    matvecs |= {mma.mmr_name(ntc, tb) for ntc in (2, 3) for tb in (1, 2)}
    assert all(tool.in_class(k, tool.ABLATE["matvecs"]) for k in matvecs)
    # every PDL kernel of the step but the pick is in one class, and only one
    step = set(launch.PDL_KERNELS) - {"hy_argmax"} | {"hy_rmsnorm2"} | matvecs
    for k in step:
        assert sum(tool.in_class(k, m) for m in tool.ABLATE.values()) == 1, k
    assert not any(tool.in_class("hy_argmax", m) for m in tool.ABLATE.values())
    assert not tool.in_class("hy_gdn_scan4_out", tool.ABLATE["gdn_scan"])


class _Ctx:
    def __init__(self):
        self.calls, self.stream = [], 7

    def launch_3d(self, f, grid, block, smem, args):
        self.calls.append((f.name, grid, block, smem, args))

    def sync(self):
        self.calls.append("sync")


def test_skipping_drops_the_class_and_forwards_the_rest(tool):
    real = _Ctx()
    ctx = tool._Skipping(real, tool.ABLATE["norms"])
    norm, mv = SimpleNamespace(name="hy_rmsnorm2"), SimpleNamespace(name="hy_mmv_2_8")
    ctx.launch(norm, (4, 1), 256, 0, "a")
    ctx.launch(mv, (396, 1), 256, 34816, "b")
    ctx.launch_3d(norm, (4, 1, 1), 256, 0, "c")
    ctx.sync()
    assert real.calls == [("hy_mmv_2_8", (396, 1, 1), 256, 34816, "b"), "sync"]
    assert ctx.stream == 7
    ctx.use_graphs = False
    assert real.use_graphs is False


def test_timeline_classes_times_each_launch_between_wait_returns(tool):
    import numpy as np
    import pytest

    end = 1 << 63
    # (grid, entered pdl_begin, its wait returned, SM << 32 | block) a block; the ends of blocks
    # that record them (hy_tl_end: the matvecs, the norm) (grid | 1 << 63, time, 0, block); ns.
    # Grid 5's blocks: the earliest of each time counts, the latest end.
    rec = np.array([[5, 100, 1000, 0], [5, 120, 1100, 1], [5 | end, 5000, 0, 0], [5 | end, 5200, 0, 1],
                    [9, 3000, 5600, 0], [9 | end, 5700, 0, 0], [11, 5800, 6000, 0], [11 | end, 7000, 0, 0],
                    [13, 6500, 7400, 0]], dtype=np.uint64)
    got = tool.timeline_classes(rec, ["hy_mmv_2_8", "hy_rmsnorm2", "hy_mmv_2_8", "hy_gdn_front"])
    # [launches, seg, lead, body, drain] us: the first matvec 4.6 to the norm's wait return, its
    # last block done 4.2 after its own, 0.4 before the norm's; the norm entered pdl_begin 2.0
    # after the matvec's wait returned, its block done 0.1 after its own, 0.3 before the next
    # matvec's (seg 1.4, body 1.0, drain 0.4); the last launch (no end records: no body) has no
    # seg past its own wait return
    assert got == {"hy_mmv_2_8": [2, 6.0, 0.2, 5.2, 0.8], "hy_rmsnorm2": [1, 0.4, 2.0, 0.1, 0.3],
                   "hy_gdn_front": [1, 0.0, 0.5, 0.0, 0.0]}
    with pytest.raises(SystemExit, match="4 grids recorded, 2 recording launches"):
        tool.timeline_classes(rec, ["hy_mmv_2_8", "hy_rmsnorm2"])


def test_card_compiles_hyb_with_its_defines(monkeypatch):
    """--timeline's HY_TIMELINE reaches hyb.cu's compile through Card.defines; the loaded module
    stays reachable from the kernels (its hy_tl symbols)."""
    import _fakecard

    from cortiq_drv.hybrid import state

    seen = []
    module = _fakecard.FakeModule()
    monkeypatch.setattr(state, "compile_cubin", lambda src, defines, arch: seen.append(dict(defines)) or b"")
    monkeypatch.setattr(state, "load", lambda ctx, cubin: module)
    ctx = _fakecard.FakeCtx()
    ctx.arch = "sm_90"
    card = state.Card(ctx)
    assert card.funcs(4, 256).module is module and seen == [{"HPK": 4, "HD": 256}]
    card.defines["HY_TIMELINE"] = 8
    card.funcs(4, 256)
    assert seen[1] == {"HPK": 4, "HD": 256, "HY_TIMELINE": 8}


def test_force_parses_set_keys_and_variants(tool):
    import pytest

    assert tool.parse_force("") == {}
    assert tool.parse_force("1@128x4096=0_2_16s,8@768x4096=1_2_8r") == {
        "1@128x4096": (0, 2, 16, True, False), "8@768x4096": (1, 2, 8, False, True)}
    for text, why in (("128x4096=0_2_16", "not ROWS@ITEMSxCOLS=VARIANT"), ("1@128x4096", "not ROWS@"),
                      ("1@128x4096=", "not ROWS@"), ("3@128x4096=0_2_16", "carries 1..2 rows, not 3")):
        with pytest.raises(ValueError, match=why):
            tool.parse_force(text)


def test_choices_records_each_set_and_puts_forced_variants_in_place(tool):
    import _fakecard

    class Mat:
        kind, cols = mma.KIND_Q4TP, 4096

        def __init__(self, rows, base):
            self.rows, self.w, self.aux0, self.aux1 = rows, base, base + 0x100, base + 0x200

    ctx = _fakecard.FakeCtx()
    fx = mma.MmaFuncs(ctx, _fakecard.FakeModule())
    o = mma.MmaSet(ctx, [mma.JobSpec(Mat(4096, 0x1000), 0xA000, 0, 4096, 4096)], mma.KIND_Q4TP)
    gate_up = mma.MmaSet(ctx, [mma.JobSpec(Mat(24576, 0x2000), 0xB000, 0, 24576, 24576)], mma.KIND_Q4TP)
    real = mma.MmaSet.choice
    force = tool.parse_force("1@128x4096=1_2_16,8@999x4096=1_1_8")
    with tool.Choices(force) as ch:
        assert o.choice(fx, 1) == (1, 2, 16, False, False)
        assert gate_up.choice(fx, 1) == real(gate_up, fx, 1)
        assert o.choice(fx, 8) == real(o, fx, 8)
    assert mma.MmaSet.choice is real
    assert ch.seen == {"1@128x4096": "1_2_16", "1@768x4096": "0_2_8", "8@128x4096": "1_2_16"}
    assert ch.matched == {"1@128x4096"}
