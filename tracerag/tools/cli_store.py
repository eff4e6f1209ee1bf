"""``tracerag show`` and ``tracerag audit``: read one request's trail, check the whole log.

``tracerag show REQUEST_ID`` prints the request as a timeline (``--json`` for the trail as
JSON). ``tracerag audit verify`` re-checks the hash chain, the store's identity and the tables
derived from the chain (the material registry's tables against its chained changes too), and
exits 1 when anything was changed, removed, reordered, inserted or replaced. ``--expect-head``
anchors it outside the database (a ``head.json`` exported by the writer, or ``SEQ:HASH``); a
SQLite store's own exported head (``<file>.journal/head.json``) is used when present. The chain
key comes from ``TRACERAG_CHAIN_KEY``.

Reading commands never create a store: a missing store, a directory, a file that is not a
database or an unreachable database is one line on stderr and exit status 1.

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


def open_cli_store(url: str | None, *, create: bool = False, **options: Any) -> Any:
    """Open an existing audit store for a command, or exit 1 with one clear line."""
    from tracerag.store import cli_store_url, open_store

    target = cli_store_url(url)
    try:
        return open_store(target, create=create, **options)
    except (TraceragError, OSError) as exc:
        message = _one_line(exc)
    except Exception as exc:  # a driver error the backend did not wrap
        message = f"{type(exc).__name__}: {_one_line(exc)}"
    raise SystemExit(f"tracerag: cannot open the audit store {_shown(target)}: {message}")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _shown(target: str) -> str:
    """The store location without a password."""
    import re

    return re.sub(r"(://[^:/@]+):[^@/]*@", r"\1:***@", target)


def audit_group() -> Any:
    """The ``tracerag audit`` group of the parser built last (None before one is built)."""
    return _audit_group


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


def _expected_head(value: str | None, store_url: str) -> dict[str, Any] | None:
    """The anchor for ``--expect-head``: a JSON file, ``SEQ:HASH``; else the store's export."""
    from pathlib import Path

    from tracerag.store import journal_dir_for
    from tracerag.store.journal import HEAD_FILE

    if value is None:
        journal = journal_dir_for(store_url)
        exported = Path(journal) / HEAD_FILE if journal else None
        if exported is not None and exported.is_file():
            value = str(exported)
        else:
            return None
    if Path(value).is_file():
        try:
            data = json.loads(Path(value).read_text("utf-8"))
            return {
                "seq": int(data["seq"]),
                "hash": str(data["hash"]),
                "store_id": data.get("store_id"),
                "source": value,
            }
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SystemExit(f"tracerag: cannot read the expected head {value}: {exc}") from None
    seq, sep, digest = value.partition(":")
    if not sep or not seq.isdigit():
        raise SystemExit(
            f"tracerag: --expect-head takes a head.json file or SEQ:HASH, not {value!r}"
        )
    return {"seq": int(seq), "hash": digest.strip(), "source": "--expect-head"}


def run_verify(args: argparse.Namespace) -> int:
    """Verify chain, identity and derived tables; 0 when intact, 1 on any finding."""
    from tracerag.store import cli_store_url

    expect = _expected_head(args.expect_head, cli_store_url(args.store))
    store = open_cli_store(args.store)
    try:
        report = store.verify_chain(expect_head=expect)
        materials = _verify_materials(store)
    finally:
        store.close()
    if expect is not None and not args.json:
        print(f"anchored to head seq {expect['seq']} from {expect['source']}")
    if args.json:
        out = report.to_dict()
        if materials is not None:
            out["materials"] = {"ok": materials.ok, **materials.__dict__}
        print(json.dumps(out, ensure_ascii=False, indent=2))
    else:
        print(report.summary())
        if materials is not None:
            print(materials.summary())
    return 0 if report.ok and (materials is None or materials.ok) else 1


def _verify_materials(store: Any) -> Any:
    """The material registry's tables checked against the chain (None when the database holds
    no registry: a registry row with no chained origin is a finding, not a reason to skip)."""
    from tracerag.materials import MaterialRegistry
    from tracerag.materials.db import registry_present

    if not registry_present(store):
        return None
    registry = MaterialRegistry(store, metrics=False, baseline=False)
    try:
        return registry.verify()
    finally:
        registry.close()


def _configure_verify(parser: argparse.ArgumentParser) -> None:
    add_store_argument(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--expect-head",
        metavar="FILE|SEQ:HASH",
        default=None,
        help="a chain head kept outside the database (head.json exported by the writer, or "
        "SEQ:HASH); the chain must still contain it. Default: the store's exported head, if any",
    )
    parser.set_defaults(func=run_verify)


add_audit_command(
    "verify",
    "re-check every audit entry's hash and link, the store's identity and the tables derived "
    "from the chain (the material registry's too); exit 1 if anything was changed, removed or "
    "replaced",
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
