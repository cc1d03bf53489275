"""Record the kernel compiles a run makes, and build them ahead of time into a kernel cache.

A run on the card compiles each kernel module it loads with NVRTC (`cu.nvrtc.compile_cubin`): on
the H200 machine a cold GPU suite takes about 190 s, a warm one about 60 s. NVRTC needs no GPU,
and a compile's cache key is its source, options, NVRTC version and arch, so the same CUBINs can
be built on a CPU machine and carried to the card in the cache directory.

  python3 tools/kernel_cache.py record LOG -- PYTEST_ARGS...
      runs pytest in this process with every compile_cubin call appended to LOG as a JSON line
      (`source`: the kernel file, or "weight_side" for `mma.weight_side_source()`; `defines`,
      `arch`, `extra`), e.g. `record $OUT/compiles.jsonl -- tests/gpu -m gpu --require-gpu -q`
  python3 tools/kernel_cache.py build LOG [--dir DIR] [-j N]
      compiles each distinct logged compile from the sources as they are now into DIR (default:
      the kernel cache, CORTIQ_DRV_KERNEL_CACHE), N processes at a time; a CUBIN already there is
      marked used now (its modification time), like one just built
  python3 tools/kernel_cache.py prune [--dir DIR] [--max-mib M]
      removes the CUBINs of DIR used longest ago until the rest hold at most M MiB (default 56:
      the device tool carries 64 MiB in all), so builds for several trees can share one directory

A compile of any other source (a test's own) is logged with `source` null; build reports and
skips it, as it does a logged file this tree no longer has. For the device tool: `build LOG --dir
.kc` here (`.kc/` is git-ignored; once for each tree a call runs, with PYTHONPATH at that tree),
`prune --dir .kc`, then a run that carries `.kc` with CORTIQ_DRV_KERNEL_CACHE=.kc.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path

# only the nvrtc module at import: `recording` must wrap compile_cubin before the modules a run
# imports bind it by name (`from cortiq_drv.cu.nvrtc import compile_cubin`)
from cortiq_drv.cu import nvrtc

WEIGHT_SIDE = "weight_side"
# The most a pruned kernel cache keeps by default (MiB).
PRUNE_MIB = 56


def source_text(name: str) -> str:
    """The text a logged source name stands for, from the sources as they are now."""
    from cortiq_drv.hybrid.mma import weight_side_source
    from cortiq_drv.kernels import source

    return weight_side_source() if name == WEIGHT_SIDE else source(name)


def source_name(src: str) -> str | None:
    """The name `source_text` gives `src` back for, or None."""
    from cortiq_drv.kernels import kernel_files

    for name in [*kernel_files(), WEIGHT_SIDE]:
        if source_text(name) == src:
            return name
    return None


def entry(src: str, defines, arch: str, extra) -> dict:
    """One compile as a log line's fields (defines as `options_for` takes them, JSON-shaped)."""
    defs = dict(defines) if isinstance(defines, dict) else list(defines)
    return dict(source=source_name(src), defines=defs, arch=arch, extra=list(extra))


@contextmanager
def recording(log: Path):
    """While open, `nvrtc.compile_cubin` appends each call to `log`, then compiles as before.
    Calls through the module attribute, and through names bound from it while the `with` is
    open (the modules a run imports), are logged; names bound before it are not."""
    inner = nvrtc.compile_cubin

    def logged(src: str, defines=(), arch: str = "sm_90", extra=()) -> bytes:
        with open(log, "a") as f:
            f.write(json.dumps(entry(src, defines, arch, extra)) + "\n")
        return inner(src, defines, arch, extra)

    nvrtc.compile_cubin = logged
    try:
        yield
    finally:
        nvrtc.compile_cubin = inner


def record(log: Path, pytest_args: list[str]) -> int:
    """pytest.main(pytest_args) with its compiles logged to `log` (`recording`): its exit code."""
    import pytest

    with recording(log):
        return int(pytest.main(pytest_args))


def distinct(log: Path) -> list[dict]:
    """The log's compiles, each once, in first-seen order."""
    seen, out = set(), []
    for line in log.read_text().splitlines():
        if not line.strip():
            continue
        e = json.loads(line)
        key = json.dumps(e, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


def _build_one(e: dict) -> tuple[str, float]:
    t0 = time.perf_counter()
    args = (source_text(e["source"]), e["defines"], e["arch"], e["extra"])
    nvrtc.compile_cubin(*args)
    # a hit counts as used now, as a fresh build does, so `prune` keeps it
    os.utime(nvrtc.cubin_path(*args))
    return f"{e['source']} {e['defines']} {e['arch']} {' '.join(e['extra'])}".rstrip(), time.perf_counter() - t0


def build(log: Path, cache_dir: Path | None, jobs: int) -> list[dict]:
    """Compile `log`'s distinct compiles of this tree's sources into `cache_dir` (or the knob's
    kernel cache), `jobs` processes at a time: the compiles built (the others are reported)."""
    from cortiq_drv import knobs
    from cortiq_drv.kernels import kernel_files

    if cache_dir is not None:
        os.environ["CORTIQ_DRV_KERNEL_CACHE"] = str(cache_dir)
        knobs.reset()
    known = {*kernel_files(), WEIGHT_SIDE}
    todo = []
    for e in distinct(log):
        if e["source"] in known:
            todo.append(e)
        else:
            print(f"skipped: source {e['source']!r} is not a kernel source of this tree")
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as ex:
            done = list(ex.map(_build_one, todo))
    else:
        done = [_build_one(e) for e in todo]
    for what, s in done:
        print(f"{what}: {s:.1f} s")
    print(f"{len(todo)} compiles in {knobs.get().kernel_cache}")
    return todo


def prune(cache_dir: Path | None, max_bytes: int) -> list[Path]:
    """Remove the CUBINs of `cache_dir` (or the knob's kernel cache) used longest ago (modification
    time: `build` and a compile set it) until the rest hold at most `max_bytes`: the files
    removed. Other files are left alone."""
    from cortiq_drv import knobs

    root = cache_dir if cache_dir is not None else knobs.get().kernel_cache
    files = sorted(root.glob("*.cubin"), key=lambda p: p.stat().st_mtime, reverse=True)
    kept, removed = 0, []
    for p in files:
        size = p.stat().st_size
        if kept + size <= max_bytes and not removed:
            kept += size
        else:
            p.unlink()
            removed.append(p)
    print(f"{len(removed)} CUBINs removed, {len(files) - len(removed)} kept ({kept / 2**20:.1f} MiB) in {root}")
    return removed


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="run pytest, logging each compile")
    rec.add_argument("log", type=Path)
    bld = sub.add_parser("build", help="compile a log's compiles into a cache directory")
    bld.add_argument("log", type=Path)
    bld.add_argument("--dir", type=Path, default=None)
    bld.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    prn = sub.add_parser("prune", help="keep a cache directory's most recently used CUBINs")
    prn.add_argument("--dir", type=Path, default=None)
    prn.add_argument("--max-mib", type=float, default=PRUNE_MIB)
    rest: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, rest = argv[:at], argv[at + 1:]
    a = ap.parse_args(argv)
    if a.cmd == "record":
        return record(a.log, rest)
    if rest:
        ap.error(f"{a.cmd} takes no arguments after --")
    if a.cmd == "prune":
        prune(a.dir, int(a.max_mib * 2**20))
    else:
        build(a.log, a.dir, a.jobs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
