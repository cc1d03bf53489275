"""Kernel sources (`*.cu` entry files, `*.cuh` pieces) and the include expansion NVRTC needs.

NVRTC gets one string and no include path, so `source(name)` inlines each `#include "x.cuh"` of a
sibling file, recursively, the first time it appears (later repeats are dropped, like a guard),
with `#line` markers so compile errors name the original file and line.
"""

from __future__ import annotations

import re
from pathlib import Path

from cortiq_drv.errors import CortiqError

_DIR = Path(__file__).resolve().parent
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"[ \t]*$', re.MULTILINE)


def _expand(name: str, seen: set[str]) -> str:
    path = _DIR / name
    if path.parent != _DIR or not path.is_file():
        raise CortiqError(f"kernel source {name!r} is not a file in {_DIR}")
    seen.add(name)

    text = path.read_text()

    def inline(m: re.Match) -> str:
        inc = m.group(1)
        if inc in seen:
            return f"// {inc} already included"
        # #line keeps compiler messages pointing at the right file and line.
        after = text.count("\n", 0, m.start()) + 2
        return (f'// begin {inc}\n#line 1 "{inc}"\n{_expand(inc, seen)}\n'
                f'// end {inc}\n#line {after} "{name}"')

    return _INCLUDE.sub(inline, text)


def source(name: str) -> str:
    """The text of kernels/`name` with sibling `#include "x.cuh"` lines inlined once each."""
    return _expand(name, set())


def includes(name: str) -> list[str]:
    """The sibling files kernels/`name` includes itself, in its order (not expanded)."""
    path = _DIR / name
    if path.parent != _DIR or not path.is_file():
        raise CortiqError(f"kernel source {name!r} is not a file in {_DIR}")
    return _INCLUDE.findall(path.read_text())


def kernel_files() -> list[str]:
    """The `.cu` entry files in this directory, sorted."""
    return sorted(p.name for p in _DIR.glob("*.cu"))
