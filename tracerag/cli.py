"""The ``tracerag`` command. Each subcommand lives in the module of its concern.

A module listed in ``COMMANDS`` exposes ``add_parser(subparsers)``, which registers its
subcommand and sets ``func`` (called with the parsed arguments, returning an exit code).

Only the chosen command's module is imported: ``tracerag``, ``tracerag --help`` and
``tracerag --version`` import none of them (the subcommands import LangChain, pydantic, numpy),
and list the commands from ``COMMAND_TABLE``. A module in ``COMMANDS`` that the table does not
name (a plugin) is imported every time, since only its ``add_parser`` knows what it registers.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from importlib import import_module

from tracerag._version import __version__

__all__ = ["main"]

COMMANDS = [
    "tracerag.demo._run",
    "tracerag.tools._show",
    "tracerag.tools._audit",
    "tracerag.tools._replay",
    "tracerag.tools.explain",
    "tracerag.tools._indicators",
    "tracerag.server._serve",
    "tracerag.tools.calibration",
    "tracerag.tools.adversarial",
    "tracerag.tools._eval",
    "tracerag.tools._materials_commands",
    "tracerag.tools._desk_dataset",
]

#: Every command of the modules above: its one-line help and the modules that register it
#: (``audit``'s subcommands come from several). A test checks it against the modules.
COMMAND_TABLE: dict[str, tuple[str, tuple[str, ...]]] = {
    "demo": ("answer the bundled demo questions offline", ("tracerag.demo._run",)),
    "show": ("show one request's audit trail as a timeline", ("tracerag.tools._show",)),
    "audit": (
        "check the audit log (verify, ...)",
        (
            "tracerag.tools._audit",
            "tracerag.tools.adversarial",
            "tracerag.tools._materials_commands",
        ),
    ),
    "replay": (
        "re-run a stored request with its materials and parameters; show what changed",
        ("tracerag.tools._replay",),
    ),
    "explain": (
        "why this answer: occlusion and counterfactual experiments on a stored request",
        ("tracerag.tools.explain",),
    ),
    "metrics": (
        "citation coverage and accuracy, interception, review and escalation rates",
        ("tracerag.tools._indicators",),
    ),
    "serve": ("serve the answer API and the review desk over HTTP", ("tracerag.server._serve",)),
    "calibrate": (
        "fit a confidence calibration to labelled responses",
        ("tracerag.tools.calibration",),
    ),
    "eval": (
        "compare two prompt/model versions on a question set; a release gate",
        ("tracerag.tools._eval",),
    ),
    "materials": (
        "the material registry: history, impact, review, quarantine, rollback",
        ("tracerag.tools._materials_commands",),
    ),
    "trace-back": (
        "from a request to the writes behind its materials",
        ("tracerag.tools._materials_commands",),
    ),
    "feedback": (
        "record confirm / deny / clarify on an answer",
        ("tracerag.tools._materials_commands",),
    ),
    "desk": (
        "the review desk's decisions as a labelled dataset; reviewer agreement",
        ("tracerag.tools._desk_dataset",),
    ),
}

#: ``tracerag audit NAME``: the module that adds NAME to the audit group (with the group's own).
AUDIT_TABLE: dict[str, str] = {
    "verify": "tracerag.tools._audit",
    "adversarial": "tracerag.tools.adversarial",
    "materials": "tracerag.tools._materials_commands",
}

_GLOBAL_FLAGS = {"-h", "--help", "--version", "-v", "--verbose"}


def _top_parser() -> tuple[
    argparse.ArgumentParser, argparse._SubParsersAction[argparse.ArgumentParser]
]:
    parser = argparse.ArgumentParser(
        prog="tracerag",
        description="Traced, verified retrieval-augmented generation.",
        epilog="tracerag COMMAND --help shows the options of one command.",
    )
    parser.add_argument("--version", action="version", version=f"tracerag {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    return parser, subparsers


def _known_modules() -> set[str]:
    return {m for _help, modules in COMMAND_TABLE.values() for m in modules}


def modules_for(argv: Sequence[str]) -> list[str]:
    """The command modules to import for ``argv``, in ``COMMANDS`` order.

    None for no command (``tracerag``, ``--help``, ``--version``) or an unknown one, beside the
    modules ``COMMAND_TABLE`` does not name; for ``audit NAME`` the group's module and NAME's.
    """
    command, rest = None, []
    for i, token in enumerate(argv):
        if token not in _GLOBAL_FLAGS:
            command, rest = token, list(argv[i + 1 :])
            break
    wanted: set[str] = set()
    if command in COMMAND_TABLE:
        wanted.update(COMMAND_TABLE[command][1])
        sub = next((t for t in rest if not t.startswith("-")), None)
        if command == "audit" and sub in AUDIT_TABLE:
            wanted = {"tracerag.tools._audit", AUDIT_TABLE[sub]}
    known = _known_modules()
    return [m for m in COMMANDS if m in wanted or m not in known]


def _build(modules: Sequence[str]) -> argparse.ArgumentParser:
    parser, subparsers = _top_parser()
    for name in modules:
        import_module(name).add_parser(subparsers)
    for command, (help_text, _modules) in COMMAND_TABLE.items():
        if command not in subparsers.choices:  # listed in the help, loaded when chosen
            subparsers.add_parser(command, help=help_text, add_help=False)
    return parser


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every available subcommand (imports every command module)."""
    return _build(COMMANDS)


# The parser main() built last, with the modules and the audit group it was built with: a
# process that runs the same command several times (a script, the tests) builds it once (about
# 5 ms: argparse makes a help formatter per argument). Audit subcommands registered later join
# its audit group; other modules, or a new audit group, rebuild it.
_built: tuple[tuple[str, ...], object, argparse.ArgumentParser] | None = None


def _parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    global _built
    modules = tuple(modules_for(argv))
    group = _audit_group() if "tracerag.tools._audit" in modules else None
    if _built is not None and _built[0] == modules and _built[1] is group:
        return _built[2]
    parser = _build(modules)
    group = _audit_group() if "tracerag.tools._audit" in modules else None
    _built = (modules, group, parser)
    return parser


def _audit_group() -> object:
    # only once the audit command's module is imported: --help and --version stay light
    from tracerag.tools._audit import audit_group

    return audit_group()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``tracerag`` command; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser(argv)
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
