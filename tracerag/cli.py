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


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``tracerag`` command; returns the exit code."""
    parser = build_parser()
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
