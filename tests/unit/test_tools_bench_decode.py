"""tools/bench_decode.py's --ablate: which kernels each class names, and the context that leaves a
class's launches out of a step while handing every other call to the real one (no device)."""

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
