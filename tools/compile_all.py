"""Compile every kernel file for one arch and print each kernel's registers and spills.

Usage: python3 tools/compile_all.py [--arch sm_90] [-D NAME=VALUE ...]
Exit 1 if any file fails to compile (its log is printed)."""

from __future__ import annotations

import argparse
import re
import time

from cortiq_drv.cu.nvrtc import compile_program, options_for
from cortiq_drv.errors import NvrtcError
from cortiq_drv.kernels import kernel_files, source

_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")


def report(log: str) -> list[tuple[str, int, int, int, int]]:
    """(kernel, registers, stack, spill stores, spill loads) per entry in a -Xptxas=-v log."""
    rows, name, spill = [], None, (0, 0, 0)
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            name, spill = m.group(1), (0, 0, 0)
        elif m := _SPILL.search(line):
            spill = tuple(int(v) for v in m.groups())
        elif (m := _REGS.search(line)) and name:
            rows.append((name, int(m.group(1)), *spill))
            name = None
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE")
    a = ap.parse_args(argv)
    failed = 0
    for name in kernel_files():
        t0 = time.perf_counter()
        try:
            _, log = compile_program(source(name), options_for(a.defines, a.arch, ["-Xptxas=-v"]),
                                     name)
        except NvrtcError as e:
            print(f"{name}: FAILED\n{e}")
            failed += 1
            continue
        print(f"{name}: {a.arch} in {time.perf_counter() - t0:.2f} s")
        for kern, regs, stack, st, ld in report(log):
            warn = "  <-- spills" if st or ld else ""
            print(f"  {kern:40s} regs {regs:4d}  stack {stack:5d}  spill st {st:5d} ld {ld:5d}{warn}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
