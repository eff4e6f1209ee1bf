"""``tracerag audit``: checks over the whole audit log, a group other modules add to.

``tracerag audit verify`` re-checks the hash chain, the store's identity, the tables derived
from the chain (the material registry's too) and the journal; its exit codes and the anchors
it reads are on the command-line page of the documentation. Another module adds
``tracerag audit NAME`` with ``add_audit_command(name, help, configure)``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracerag.config import get_config
from tracerag.materials import MaterialRegistry
from tracerag.materials._db import registry_present
from tracerag.materials._records import VerifyReport
from tracerag.store._base import AuditStore
from tracerag.store._journal import HEAD_FILE, REFUSED_FILE, inspect_journal
from tracerag.store._open import cli_store_url, journal_dir_for
from tracerag.tools._command import (
    Subparsers,
    add_json_argument,
    add_store_argument,
    cli_store,
    print_json,
)

Configure = Callable[[argparse.ArgumentParser], None]

# name -> (help, configure): every audit sub-subcommand registered so far
_AUDIT_COMMANDS: dict[str, tuple[str, Configure]] = {}
# the audit group of the parser being built, and the names already added to it
_audit_group: argparse._SubParsersAction[argparse.ArgumentParser] | None = None
_audit_added: set[str] = set()


def audit_group() -> argparse._SubParsersAction[argparse.ArgumentParser] | None:
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
    assert _audit_group is not None
    parser = _audit_group.add_parser(name, help=help_text, description=help_text)
    configure(parser)
    _audit_added.add(name)


# -- audit verify ----------------------------------------------------------------------------


#: exit status of ``tracerag audit verify`` when nothing was found wrong but not everything could
#: be checked (no anchor, or keyed entries without the chain key)
EXIT_INCOMPLETE = 3


def _read_head_file(path: Path, source: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text("utf-8"))
        return {
            "seq": int(data["seq"]),
            "hash": str(data["hash"]),
            "store_id": data.get("store_id"),
            "source": source,
        }
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"tracerag: cannot read the expected head {source}: {exc}") from None


def _heads_in(directory: Path) -> list[Path]:
    """``head.json`` of a journal (or anchor) directory and of its numbered slots."""
    dirs = [
        directory,
        *sorted(
            (p for p in directory.glob("*") if p.is_dir() and p.name.isdigit()),
            key=lambda p: int(p.name),
        ),
    ]
    return [d / HEAD_FILE for d in dirs if (d / HEAD_FILE).is_file()]


def _anchor_files(value: str) -> list[Path]:
    path = Path(value).expanduser()
    if path.is_dir():
        return _heads_in(path)
    return [path] if path.is_file() else []


def _expected_heads(value: str | None, store_url: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The anchors to check against, and where they were looked for.

    ``--expect-head`` (a head file, a directory holding ``head.json``, or ``SEQ:HASH``) alone
    when given; else every head exported to ``TRACERAG_AUDIT_ANCHOR`` and into the store's
    journal directory (and its numbered slots).
    """
    if value is not None:
        files = _anchor_files(value)
        if files:
            return [_read_head_file(f, str(f)) for f in files], [value]
        if Path(value).expanduser().exists():
            raise SystemExit(f"tracerag: no head.json in {value}")
        seq, sep, digest = value.partition(":")
        if not sep or not seq.isdigit():
            raise SystemExit(
                "tracerag: --expect-head takes a head.json file, a directory holding one, or "
                f"SEQ:HASH, not {value!r}"
            )
        return [{"seq": int(seq), "hash": digest.strip(), "source": "--expect-head"}], [value]
    looked: list[str] = []
    files = []
    configured = get_config().audit_anchor
    if configured:
        looked.append(configured)
        files += _anchor_files(configured)
    journal = journal_dir_for(store_url)
    if journal:
        looked.append(journal)
        files += [f for f in _heads_in(Path(journal).expanduser()) if f not in files]
    return [_read_head_file(f, str(f)) for f in files], looked


def _journal_findings(store_url: str, key: str | None) -> tuple[list[str], list[str]]:
    """Refused and not-authentic frames in the store's journal: (findings, notes)."""
    journal = journal_dir_for(store_url)
    if not journal or not Path(journal).expanduser().is_dir():
        return [], []
    findings, notes = [], []
    for state in inspect_journal(journal, key):
        if state.refused:
            findings.append(
                f"journal: {state.refused} records were refused as not authentic (written by "
                f"someone without the chain key) and kept aside in "
                f"{state.directory / REFUSED_FILE}"
            )
        if state.not_authentic:
            findings.append(
                f"journal: {state.not_authentic} of the {state.pending} records still in "
                f"{state.directory} are not authentic (they will be refused)"
            )
        elif state.pending:
            notes.append(
                f"  note: {state.pending} records are still in the journal {state.directory} "
                "(written to the store at the next start, if not already: not checked here)"
            )
    return findings, notes


def run_verify(args: argparse.Namespace) -> int:
    """Verify chain, identity, derived tables and the journal.

    Exit 0 when intact and everything could be checked, 1 on any finding, 3 when nothing was
    found but something could not be checked (no anchor, or keyed entries without the key).
    """
    url = cli_store_url(args.store)
    anchors, looked = _expected_heads(args.expect_head, url)
    with cli_store(args) as store:
        report = store.verify_chain(expect_head=anchors or None)
        materials = _verify_materials(store)
    findings, journal_notes = _journal_findings(url, get_config().chain_key)
    ok = report.ok and (materials is None or materials.ok) and not findings
    complete = report.complete and (materials is None or materials.complete)
    status = 0 if ok and complete else (1 if not ok else EXIT_INCOMPLETE)
    if args.json:
        out = report.to_dict()
        if materials is not None:
            out["materials"] = {"ok": materials.ok, **materials.__dict__}
        out["journal"] = findings
        out["anchors"] = [a["source"] for a in anchors]
        out["exit_status"] = status
        print_json(out)
        return status
    for anchor in anchors:
        print(f"anchored to head seq {anchor['seq']} from {anchor['source']}")
    if not anchors:
        where = ", ".join(looked) if looked else "nowhere: no journal or TRACERAG_AUDIT_ANCHOR"
        print(
            f"no anchor: looked in {where} (give --expect-head FILE|DIR|SEQ:HASH, or set "
            "TRACERAG_AUDIT_ANCHOR)"
        )
    print(report.summary())
    if materials is not None:
        print(materials.summary())
    for finding in findings:
        print(f"  {finding}")
    for note in journal_notes:
        print(note)
    if status == EXIT_INCOMPLETE:
        print(
            f"exit status {EXIT_INCOMPLETE}: nothing was found wrong, but not everything could be "
            "checked (see NOT CHECKED above)"
        )
    return status


def _verify_materials(store: AuditStore) -> VerifyReport | None:
    """The material registry's tables checked against the chain (None when the database holds
    no registry: a registry row with no chained origin is a finding, not a reason to skip)."""
    if not registry_present(store):
        return None
    registry = MaterialRegistry(store, metrics=False, baseline=False)
    try:
        return registry.verify()
    finally:
        registry.close()


def _configure_verify(parser: argparse.ArgumentParser) -> None:
    add_store_argument(parser)
    add_json_argument(parser, "print the report as JSON")
    parser.add_argument(
        "--expect-head",
        metavar="FILE|DIR|SEQ:HASH",
        default=None,
        help="a chain head kept outside the database (a head.json exported by the writer, a "
        "directory holding one, or SEQ:HASH); the chain must still contain it. Default: the "
        "heads exported to $TRACERAG_AUDIT_ANCHOR and into the store's journal directory",
    )
    parser.set_defaults(func=run_verify)


add_audit_command(
    "verify",
    "re-check every audit entry's hash and link, the store's identity, the tables derived "
    "from the chain (the material registry's too) and the journal; exit 1 if anything was "
    "changed, removed, replaced or forged, 3 if nothing was but something could not be checked "
    "(no anchor, or keyed entries without TRACERAG_CHAIN_KEY), 0 when intact",
    _configure_verify,
)


def add_parser(subparsers: Subparsers) -> None:
    """Register the ``tracerag audit`` group."""
    global _audit_group

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
