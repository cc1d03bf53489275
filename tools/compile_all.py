"""Compile every kernel file for one arch and print each kernel's registers and spills.

Usage: python3 tools/compile_all.py [--arch sm_90] [-D NAME=VALUE ...]
Exit 1 if any file fails to compile (its log is printed)."""

from __future__ import annotations

import argparse
import time

from cortiq_drv.cu.nvrtc import compile_program, options_for, ptxas_report
from cortiq_drv.errors import NvrtcError
from cortiq_drv.kernels import kernel_files, source


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
        for kern, regs, stack, st, ld, smem in ptxas_report(log):
            warn = "  <-- spills" if st or ld else ""
            print(f"  {kern:40s} regs {regs:4d}  stack {stack:5d}  spill st {st:5d} ld {ld:5d}  smem {smem:6d}{warn}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
