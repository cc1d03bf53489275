"""tools/kernel_cache.py: compiles recorded as named sources, and a build from the log filling a
cache directory that a later compile_cubin of the same source and options hits."""

import json

import pytest

from cortiq_drv import knobs
from cortiq_drv.cu import nvrtc
from cortiq_drv.kernels import source


# the tools/ script the `tool` fixture (conftest) imports
TOOL = "kernel_cache"


@pytest.mark.parametrize("jobs", [1, 2])
def test_record_then_build_fills_the_cache(cache_dir, tool, tmp_path, monkeypatch, jobs):
    log = tmp_path / "compiles.jsonl"
    other = 'extern "C" __global__ void k(float* x) { x[0] = 1.0f; }\n'
    with tool.recording(log):
        nvrtc.compile_cubin(source("basic.cu"), {"UNUSED": 1}, "sm_90")
        nvrtc.compile_cubin(source("basic.cu"), {"UNUSED": 1}, "sm_90")
        nvrtc.compile_cubin(other, (), "sm_90")
    assert nvrtc.compile_cubin.__name__ == "compile_cubin"
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert lines[0] == dict(source="basic.cu", defines={"UNUSED": 1}, arch="sm_90", extra=[])
    assert len(lines) == 3 and lines[2]["source"] is None
    assert len(tool.distinct(log)) == 2

    built = tool.build(log, tmp_path / "ahead", jobs)
    assert [e["source"] for e in built] == ["basic.cu"]
    # the cache the build filled answers the same compile without NVRTC
    monkeypatch.setenv("CORTIQ_DRV_KERNEL_CACHE", str(tmp_path / "ahead"))
    knobs.reset()

    def no_compile(*a, **k):
        raise AssertionError("compiled: the built cache missed")

    monkeypatch.setattr(nvrtc, "compile_program", no_compile)
    cubin = nvrtc.compile_cubin(source("basic.cu"), {"UNUSED": 1}, "sm_90")
    files = list((tmp_path / "ahead").glob("*.cubin"))
    assert cubin.startswith(b"\x7fELF") and [f.read_bytes() for f in files] == [cubin]


def test_build_marks_hits_used_and_prune_keeps_the_newest(cache_dir, tool, tmp_path):
    """A build that finds a CUBIN already built marks it used now; prune then removes the CUBINs
    used longest ago until the rest fit (never a file that is not a CUBIN), also from the command
    line."""
    import os

    log = tmp_path / "compiles.jsonl"
    log.write_text(json.dumps(dict(source="basic.cu", defines={"UNUSED": 2}, arch="sm_90", extra=[])) + "\n")
    ahead = tmp_path / "ahead"
    tool.build(log, ahead, 1)
    (built,) = ahead.glob("*.cubin")
    os.utime(built, (1000, 1000))
    old, older, note = ahead / ("b" * 64 + ".cubin"), ahead / ("a" * 64 + ".cubin"), ahead / "notes.txt"
    for p, t in ((old, 3000), (older, 2000), (note, 1000)):
        p.write_bytes(b"\x7fELF" + bytes(96))
        os.utime(p, (t, t))
    tool.build(log, ahead, 1)
    assert built.stat().st_mtime > 3000
    size = built.stat().st_size
    assert tool.prune(ahead, size + 100) == [older]
    assert sorted(ahead.iterdir()) == sorted([built, old, note])
    assert tool.prune(ahead, size + 99) == [old]
    assert tool.main(["prune", "--dir", str(ahead), "--max-mib", "0"]) == 0
    assert list(ahead.iterdir()) == [note]
