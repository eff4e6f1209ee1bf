"""``tracerag show`` and ``tracerag audit``: read one request's trail, check the whole log.

``tracerag show REQUEST_ID`` prints the request as a timeline (``--json`` for the trail as
JSON). ``tracerag audit verify`` re-checks the hash chain and exits 1 when any entry was
changed, removed, reordered or inserted.

``tracerag audit`` is a group: another module adds a sub-subcommand with
``add_audit_command(name, help, configure)``, where ``configure(parser)`` adds the arguments
and sets ``func`` (called with the parsed arguments, returning an exit code). Call it from
that module's own ``add_parser(subparsers)``, so it is listed in ``tracerag.cli.COMMANDS``
like any command; the order of the modules in ``COMMANDS`` does not matter.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from tracerag.errors import TraceragError

Configure = Callable[[argparse.ArgumentParser], None]

# name -> (help, configure): every audit sub-subcommand registered so far
_AUDIT_COMMANDS: dict[str, tuple[str, Configure]] = {}
# the audit group of the parser being built, and the names already added to it
_audit_group: Any = None
_audit_added: set[str] = set()


def add_store_argument(parser: argparse.ArgumentParser) -> None:
    """The shared ``--store URL`` option (default: env TRACERAG_STORE, else the SQLite file)."""
    parser.add_argument(
        "--store",
        metavar="URL",
        default=None,
        help="audit store URL or path (default: $TRACERAG_STORE, else ./.tracerag/audit.sqlite)",
    )


def open_cli_store(url: str | None, **options: Any) -> Any:
    """Open the audit store for a command, or exit with a clear message."""
    from tracerag.store import cli_store_url, open_store

    try:
        return open_store(cli_store_url(url), **options)
    except (TraceragError, OSError) as exc:
        raise SystemExit(f"tracerag: cannot open the audit store: {exc}") from exc


def add_audit_command(name: str, help: str, configure: Configure) -> None:
    """Register ``tracerag audit NAME``; ``configure(parser)`` adds arguments and sets ``func``."""
    _AUDIT_COMMANDS[name] = (help, configure)
    if _audit_group is not None:
        _add_to_group(name)


def _add_to_group(name: str) -> None:
    if name in _audit_added:
        return
    help_text, configure = _AUDIT_COMMANDS[name]
    parser = _audit_group.add_parser(name, help=help_text, description=help_text)
    configure(parser)
    _audit_added.add(name)


# -- show -------------------------------------------------------------------------------------


def run_show(args: argparse.Namespace) -> int:
    """Print one request's trail as a timeline or JSON."""
    from tracerag.store import RequestNotFound
    from tracerag.tools.show import render_json, render_timeline

    store = open_cli_store(args.store)
    try:
        trail = store.get(args.request_id)
    except RequestNotFound as exc:
        print(f"tracerag show: {exc}", file=sys.stderr)
        return 1
    finally:
        store.close()
    sys.stdout.write(render_json(trail) + "\n" if args.json else render_timeline(trail))
    return 0


# -- audit verify ----------------------------------------------------------------------------


def run_verify(args: argparse.Namespace) -> int:
    """Verify the hash chain; 0 when intact, 1 on any changed/removed/reordered/inserted entry."""
    store = open_cli_store(args.store)
    try:
        report = store.verify_chain()
    finally:
        store.close()
    if args.json:
        print(json.dumps(report.to_dict(), ensure_ascii=False, indent=2))
    else:
        print(report.summary())
    return 0 if report.ok else 1


def _configure_verify(parser: argparse.ArgumentParser) -> None:
    add_store_argument(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run_verify)


add_audit_command(
    "verify",
    "re-check every audit entry's hash and link; exit 1 if anything was changed or removed",
    _configure_verify,
)


def add_parser(subparsers: Any) -> None:
    """Register ``tracerag show`` and the ``tracerag audit`` group."""
    global _audit_group

    p = subparsers.add_parser(
        "show",
        help="show one request's audit trail as a timeline",
        description="Show everything stored for one request, in the order an investigator "
        "reads it: versions, question, retrieved materials, plan, samples, verdicts, outcome, "
        "errors and review actions.",
    )
    p.add_argument("request_id", metavar="REQUEST_ID")
    add_store_argument(p)
    p.add_argument("--json", action="store_true", help="print the trail as JSON")
    p.set_defaults(func=run_show)

    audit = subparsers.add_parser(
        "audit",
        help="check the audit log (verify, ...)",
        description="Checks over the whole audit log.",
    )
    audit.set_defaults(func=lambda _args: _audit_help(audit))
    _audit_group = audit.add_subparsers(dest="audit_command", metavar="AUDIT_COMMAND")
    _audit_added.clear()
    for name in list(_AUDIT_COMMANDS):
        _add_to_group(name)


def _audit_help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2
