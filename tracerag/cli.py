"""The ``tracerag`` command. Each subcommand lives in the module of its concern.

A module listed in ``COMMANDS`` exposes ``add_parser(subparsers)``, which registers its
subcommand and sets ``func`` (called with the parsed arguments, returning an exit code).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from importlib import import_module
from typing import Any

from tracerag import __version__

COMMANDS = [
    "tracerag.demo.run",
    "tracerag.tools.cli_store",
    "tracerag.tools.replay",
    "tracerag.tools.explain",
    "tracerag.tools.indicators",
    "tracerag.server.cli",
    "tracerag.tools.calibration",
    "tracerag.tools.adversarial",
    "tracerag.tools.eval",
    "tracerag.tools.materials",
    "tracerag.tools.desk",
]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every available subcommand."""
    parser = argparse.ArgumentParser(
        prog="tracerag",
        description="Traced, verified retrieval-augmented generation.",
    )
    parser.add_argument("--version", action="version", version=f"tracerag {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        import_module(name).add_parser(subparsers)
    return parser


# The parser main() built last, with the command modules and the audit group it was built
# with: a process that runs several commands (a script, the tests) builds it once, not once
# per command (about 5 ms each: argparse makes a help formatter per argument). Audit
# subcommands registered later join its audit group; a new group or module list rebuilds it.
_built: tuple[tuple[str, ...], Any, argparse.ArgumentParser] | None = None


def _parser() -> argparse.ArgumentParser:
    global _built
    from tracerag.tools.cli_store import audit_group

    commands = tuple(COMMANDS)
    if _built is not None and _built[0] == commands and _built[1] is audit_group():
        return _built[2]
    parser = build_parser()
    _built = (commands, audit_group(), parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``tracerag`` command; returns the exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.ERROR,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
