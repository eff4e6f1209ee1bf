"""The tail every ``tracerag`` command shares, as plain callables a command composes.

``add_command`` registers a subcommand with the function it runs; ``add_json_argument`` (and
``add_store_argument``, re-exported) add the shared options where the command's help lists them;
``cli_store`` opens the command's audit store for one run and closes it; ``print_json`` and
``emit`` print a result as JSON or as its ``render()``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol, TypeAlias

from tracerag.tools._store_args import add_store_argument, open_cli_store

__all__ = [
    "Rendered",
    "add_command",
    "add_json_argument",
    "add_store_argument",
    "cli_store",
    "emit",
    "print_json",
]

#: The ``add_subparsers()`` object a command registers in (a string: argparse's class is not
#: subscriptable at run time).
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
Run: TypeAlias = Callable[[argparse.Namespace], int]


class Rendered(Protocol):
    """A command's result: a JSON body and the text a person reads."""

    def to_dict(self) -> Mapping[str, Any]: ...

    def render(self) -> str: ...


def add_command(
    subparsers: Subparsers,
    name: str,
    run: Run,
    *,
    help: str,
    description: str | None = None,
    **options: Any,
) -> argparse.ArgumentParser:
    """Register ``tracerag NAME`` (or a group's NAME); ``run(args)`` is its exit code."""
    parser = subparsers.add_parser(name, help=help, description=description, **options)
    parser.set_defaults(func=run)
    return parser


def add_json_argument(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """The shared ``--json`` flag: print the result as JSON instead of text."""
    parser.add_argument("--json", action="store_true", help=help)


@contextmanager
def cli_store(args: argparse.Namespace, *, create: bool = False, **options: Any) -> Iterator[Any]:
    """The store named by ``args.store``, open for the block (exit 1 with one line if it cannot)."""
    store = open_cli_store(args.store, create=create, **options)
    try:
        yield store
    finally:
        store.close()


def print_json(value: object) -> None:
    """Print a JSON body as every command does: UTF-8 text as is, indented."""
    print(json.dumps(value, ensure_ascii=False, indent=2))


def emit(result: Rendered, *, as_json: bool) -> int:
    """Print ``result`` as JSON (``--json``) or as its rendered text; the exit code 0."""
    if as_json:
        print_json(result.to_dict())
    else:
        print(result.render(), end="")
    return 0
