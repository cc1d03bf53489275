"""The `cortiq-drv` command line (DESIGN.md's contracts): argument parsing and dispatch only.

Each subcommand is a small function `_cmd_<name>(args) -> int` over the library's public API.
"""

from __future__ import annotations

import argparse
import sys

from cortiq_drv.errors import CortiqError


def _register(sub) -> None:
    """Add every subcommand to `sub` (filled in as the commands land)."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cortiq-drv", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    # Subcommands are registered here by the modules' owners (info, verify, convert, logits, run,
    # demo, serve), each with `set_defaults(func=_cmd_<name>)`.
    _register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except CortiqError as e:
        print(f"cortiq-drv: error: {e}", file=sys.stderr)
        return 1
