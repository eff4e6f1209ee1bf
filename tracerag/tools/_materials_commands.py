"""``tracerag materials …``, ``tracerag trace-back`` and ``tracerag feedback``.

Investigation: ``materials show M`` (value, version history with source snippets, read hits),
``materials impact M [--version V]`` (every request that used it, with decisions),
``materials by-rule R`` (everything a rule or model version wrote), ``trace-back REQUEST_ID``
(request → materials → the writes that produced them → their history; the most likely cause
first, so one command leads from a complaint to the write).

Changes, each audited under the operator's authenticated identity: ``edit``, ``approve``,
``reject``, ``quarantine`` (also the confirmation of a quarantine the denial rule proposed),
``dismiss`` (a proposed quarantine), ``restore``, ``delete``, ``rollback-batch``. The operator
proves a named token (``TRACERAG_OPERATOR_TOKEN`` or ``--operator-token-file``) listed in
``TRACERAG_OPERATORS_FILE`` (else ``TRACERAG_REVIEWERS_FILE``); the change is recorded under
the token's name, with how it was established. ``--operator``, when given, must be that name.
Upkeep: ``pending``, ``conflicts``, ``stats``, ``verify`` (also ``tracerag audit materials``),
``purge-reads``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tracerag._identity import (
    OperatorIdentity,
    UnknownOperator,
    authenticate_operator,
    read_token_file,
)
from tracerag.config import get_config
from tracerag.errors import TraceragError
from tracerag.materials import (
    ConcurrentChange,
    InvalidTransition,
    MaterialNotFound,
    MaterialRegistry,
)
from tracerag.materials._db import MaterialStoreError
from tracerag.materials._investigate import impact, trace_back
from tracerag.materials._principal import declared_note
from tracerag.materials._render import render_trace_back, short, version_lines
from tracerag.materials.feedback import record_feedback
from tracerag.store import RequestNotFound
from tracerag.tools._audit import add_audit_command
from tracerag.tools._command import (
    Subparsers,
    add_command,
    add_json_argument,
    add_store_argument,
    print_json,
)
from tracerag.tools._store_args import open_cli_store

ACTIONS = ("approve", "reject", "quarantine", "restore", "delete", "dismiss")
_ACTION_HELP = {
    "quarantine": "quarantine a material, or confirm its proposed quarantine (a new, audited "
    "version)",
    "dismiss": "dismiss a proposed quarantine: the material stays in service (audited)",
}


def open_registry(url: str | None, **options: Any) -> Any:
    """The material registry beside the command's audit store, or exit with a message."""
    store = open_cli_store(url)
    try:
        return MaterialRegistry(store, owns_store=True, **options)
    except (TraceragError, OSError) as exc:
        store.close()
        raise SystemExit(f"tracerag: cannot open the material registry: {exc}") from exc


@contextmanager
def cli_registry(args: argparse.Namespace, **options: Any) -> Iterator[MaterialRegistry]:
    """The registry beside ``args.store``, open for the block."""
    reg = open_registry(args.store, **options)
    try:
        yield reg
    finally:
        reg.close()


def operator_identity(args: argparse.Namespace) -> OperatorIdentity:
    """The operator the command's token proves; exit 2 with the reason when it proves none."""
    config = get_config()
    token = config.operator_token
    if args.operator_token_file:
        try:
            token = Path(args.operator_token_file).read_text("utf-8").strip()
        except OSError as exc:
            raise SystemExit(f"tracerag: cannot read the operator token file: {exc}") from None
    path = config.operators_file or config.reviewers_file
    try:
        credentials = read_token_file(path) if path else {}
        return authenticate_operator(token, credentials, args.operator)
    except (OSError, ValueError) as exc:  # UnknownOperator is a ValueError
        kind = "refused" if isinstance(exc, UnknownOperator) else "cannot read the operators"
        print(f"tracerag materials: {kind}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def run_show(args: argparse.Namespace) -> int:
    """Print a material now, its history and its read hits."""
    with cli_registry(args) as reg:
        try:
            state = reg.get(args.material_id)
        except MaterialNotFound as exc:
            print(f"tracerag materials show: {exc}", file=sys.stderr)
            return 1
        history = reg.history(args.material_id)
        identities = reg.identities(args.material_id)
        reads = reg.reads(args.material_id, limit=args.limit)
        cred = reg.credibility(state)
        if args.json:
            out = {
                "material_id": state.material_id,
                "status": state.status,
                "proposed_quarantine": state.proposed_quarantine,
                "current_version": state.current.version,
                "pending_version": state.pending,
                "ema": state.ema,
                "credibility": cred,
                "denials": state.denials,
                "usage": state.usage.to_dict(),
                "history": [
                    {
                        **s.version.body(),
                        "audit_seq": s.audit_seq,
                        "body_hash": s.body_hash,
                        "identity": identities.get(s.version.version),
                    }
                    for s in history
                ],
                "reads": [h.__dict__ for h in reads],
            }
            print_json(out)
            return 0
        v = state.current
        print(f"material {v.material_id}" + (f" — {v.title}" if v.title else ""))
        print(
            f"  status {state.status}, version {v.version}"
            + (f", edit v{state.pending} waiting for review" if state.pending else "")
        )
        if state.proposed_quarantine:
            print(
                f"  quarantine PROPOSED ({state.proposed_quarantine}); still in retrieval, "
                "answers citing it go to review; confirm with `tracerag materials quarantine`, "
                "or `tracerag materials dismiss`"
            )
        stale = v.stale_reason()
        print(
            f"  credibility {cred:.3f} (EMA {state.ema:.3f} over {state.outcomes} outcomes"
            f"{', stale: ' + stale if stale else ''}); denials since restore {state.denials}"
        )
        u = state.usage
        print(
            f"  usage of v{v.version}: {u.retrievals} retrievals, {u.citations} citations, "
            f"{u.passed} in passed answers; reviews {u.approvals} approved / {u.edits} edited / "
            f"{u.rejections} rejected; users {u.confirmations} confirmed / {u.denials} denied"
        )
        print(f"  value: {v.content}")
        print(f"history ({len(history)} versions, oldest first):")
        for sv in history:
            print("\n".join(version_lines(sv)))
        print(f"read hits ({len(reads)} shown, newest first):")
        for h in reads:
            print(
                f"  {h.created_at}  {h.request_id}  v{h.version}  rank "
                f"{h.rank_before}→{h.rank_after}  {'cited' if h.cited else 'not cited'}  "
                f"decision {h.decision}" + ("  COMPLAINT" if h.complained else "")
            )
        return 0


def run_impact(args: argparse.Namespace) -> int:
    """Every request that used a material (version), with its decisions."""
    with cli_registry(args) as reg:
        rows = impact(reg, args.material_id, args.version)
    if args.json:
        out = [
            {**r.hit.__dict__, "review_action": r.review_action, "feedback": list(r.feedback)}
            for r in rows
        ]
        print_json(out)
        return 0
    which = f"v{args.version}" if args.version else "any version"
    print(f"{len(rows)} requests used {args.material_id} ({which}):")
    for r in rows:
        h = r.hit
        print(
            f"  {h.request_id}  v{h.version}  {h.created_at}  decision {h.decision}  "
            f"review {r.review_action or '-'}  feedback {','.join(r.feedback) or '-'}  "
            f"{'cited' if h.cited else 'not cited'}"
        )
    return 0


def run_by_rule(args: argparse.Namespace) -> int:
    """Everything one write rule or model version wrote."""
    with cli_registry(args) as reg:
        rows = reg.by_rule(args.rule)
    if args.json:
        print_json([s.version.body() for s in rows])
        return 0
    print(f"{len(rows)} versions written by {args.rule}:")
    for sv in rows:
        v = sv.version
        print(
            f"  {v.material_id} v{v.version} {v.change} → {v.status}  by {v.operator}  "
            f"at {v.created_at}" + (f"  batch {v.batch_id}" if v.batch_id else "")
        )
        print(f"      {short(v.content)}")
    return 0


def run_action(args: argparse.Namespace) -> int:
    """approve / reject / quarantine / restore / delete one material."""
    who = operator_identity(args)
    with cli_registry(args) as reg:
        try:
            v = reg.transition(args.material_id, args.action, operator=who, reason=args.reason)
        except (MaterialNotFound, InvalidTransition, ValueError) as exc:
            print(f"tracerag materials {args.action}: {exc}", file=sys.stderr)
            return 1
    print(f"{v.material_id} v{v.version}: {v.change} → {v.status} (by {v.operator})")
    if v.status in ("quarantined", "deleted"):
        print(
            "  withheld from now on by every retriever governed by this registry "
            "(tracerag serve's, registry.govern(...)); a retriever that does not consult the "
            "registry still returns it"
        )
    return 0


def run_edit(args: argparse.Namespace) -> int:
    """A manual edit: a new version (changed text goes through the write gate)."""
    fields = {
        k: getattr(args, k)
        for k in ("valid_from", "valid_until", "superseded_by", "title")
        if getattr(args, k) is not None
    }
    if args.content is None and not fields:
        print("tracerag materials edit: nothing to change", file=sys.stderr)
        return 2
    who = operator_identity(args)
    with cli_registry(args) as reg:
        try:
            v = reg.edit(
                args.material_id,
                content=args.content,
                operator=who,
                written_by="manual",
                reason=args.reason,
                **fields,
            )
            pending = reg.get(args.material_id).pending
        except (MaterialNotFound, ConcurrentChange, ValueError) as exc:
            print(f"tracerag materials edit: {exc}", file=sys.stderr)
            return 1
    held = v.gate and v.gate.get("reasons")
    print(
        f"{v.material_id} v{v.version}: edit → {v.status} (by {v.operator})"
        + (f"; waiting for review beside the version in service (v{pending})" if pending else "")
        + ("; gate: " + "; ".join(f"{r['rule']}: {r['match']}" for r in held) if held else "")
    )
    return 0


def run_rollback(args: argparse.Namespace) -> int:
    """Roll a batch back."""
    who = operator_identity(args)
    with cli_registry(args) as reg:
        try:
            result = reg.rollback_batch(
                args.batch_id, operator=who, reason=args.reason, force=args.force
            )
        except MaterialStoreError as exc:
            print(f"tracerag materials rollback-batch: {exc}", file=sys.stderr)
            return 1
    print(
        f"rolled back {args.batch_id} as {result.rollback_batch_id}: "
        f"restored {', '.join(result.restored) or 'none'}; "
        f"deleted {', '.join(result.deleted) or 'none'}"
    )
    for mid, why in result.skipped.items():
        print(f"  skipped {mid}: {why}")
    return 1 if result.skipped else 0


def run_pending(args: argparse.Namespace) -> int:
    """Writes waiting for review, and quarantines proposed by denials."""
    with cli_registry(args) as reg:
        for state in reg.pending():
            number = state.pending or state.current.version
            sv = reg.version(state.material_id, number)
            print("\n".join(version_lines(sv, indent="", mark=f" of {state.material_id}")))
        for state in reg.proposals():
            print(
                f"quarantine proposed of {state.material_id} (v{state.current.version}, "
                f"{state.denials} denials): {state.proposed_quarantine}"
            )
    return 0


def run_conflicts(args: argparse.Namespace) -> int:
    """Open conflicts between active materials."""
    with cli_registry(args) as reg:
        rows = reg.conflicts(None if args.all else "open")
    if args.json:
        print_json([c.to_dict() for c in rows])
        return 0
    for c in rows:
        print(
            f"{c.conflict_id}  {c.status}  {c.material_a}@v{c.version_a} says {c.value_a}, "
            f"{c.material_b}@v{c.version_b} says {c.value_b}  ({c.slot_key})"
            + (f"  resolved: {c.resolution}" if c.resolution else "")
        )
    return 0


def run_stats(args: argparse.Namespace) -> int:
    """Figures: materials by status, pending writes, conflicts, credibility distribution."""
    with cli_registry(args) as reg:
        print_json(reg.stats())
    return 0


def run_verify(args: argparse.Namespace) -> int:
    """Check the registry's tables against the hash chain; exit 1 on any difference."""
    with cli_registry(args, baseline=False) as reg:
        chain = reg.store.verify_chain()
        report = reg.verify()
    print(chain.summary())
    print(report.summary())
    return 0 if chain.ok and report.ok else 1


def run_purge(args: argparse.Namespace) -> int:
    """Delete read hits past retention (complained-about requests are kept)."""
    with cli_registry(args) as reg:
        n = reg.purge_reads(days=args.days)
    print(f"deleted {n} read hits older than {args.days or reg.read_retention_days} days")
    return 0


def run_trace_back(args: argparse.Namespace) -> int:
    """From a request to the materials it used and the writes that produced them."""
    with cli_registry(args) as reg:
        try:
            tb = trace_back(reg, args.request_id)
        except RequestNotFound as exc:
            print(f"tracerag trace-back: {exc}", file=sys.stderr)
            return 1
    if args.json:
        print_json(tb.to_dict())
    else:
        sys.stdout.write(render_trace_back(tb))
    return 0


def feedback_principal(args: argparse.Namespace) -> OperatorIdentity:
    """The operator an operator token proves (the verdict counts), else the ``--operator``
    name as declared (kept as an unverified note that counts for nothing)."""
    if args.operator_token_file or get_config().operator_token:
        return operator_identity(args)
    if not args.operator:
        print(
            "tracerag feedback: give --operator NAME, or an operator token for the verdict to "
            "count",
            file=sys.stderr,
        )
        raise SystemExit(2)
    print(
        f"tracerag feedback: no operator token: kept as an unverified note of {args.operator!r} "
        "that counts for nothing",
        file=sys.stderr,
    )
    return declared_note(args.operator)


def run_feedback(args: argparse.Namespace) -> int:
    """Record a verdict on an answer (as ``record_feedback`` does)."""
    who = feedback_principal(args)
    with cli_registry(args) as reg:
        try:
            result = record_feedback(
                args.request_id,
                args.verdict,
                args.comment,
                args.correction,
                registry=reg,
                operator=who,
                declared_user=None if who.authenticated else args.operator,
            )
        except (RequestNotFound, MaterialStoreError, ValueError) as exc:
            print(f"tracerag feedback: {exc}", file=sys.stderr)
            return 1
    print_json(result.to_dict())
    return 0


def _operator(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--operator",
        default=None,
        help="your operator name; must be the one your token belongs to (optional)",
    )
    p.add_argument(
        "--operator-token-file",
        default=None,
        metavar="FILE",
        help="a file holding your operator token (else $TRACERAG_OPERATOR_TOKEN)",
    )


def add_parser(subparsers: Subparsers) -> None:
    """Register ``tracerag materials``, ``tracerag trace-back`` and ``tracerag feedback``."""
    m = subparsers.add_parser(
        "materials",
        help="the material registry: history, impact, review, quarantine, rollback",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )

    def _help(_args: argparse.Namespace) -> int:
        m.print_help()
        return 2

    m.set_defaults(func=_help)
    sub = m.add_subparsers(dest="materials_command", metavar="MATERIALS_COMMAND")
    _add_reads(sub)
    _add_changes(sub)
    _add_upkeep(sub)
    _add_trace_back(subparsers)
    _add_feedback(subparsers)


def _add_reads(sub: Subparsers) -> None:
    """``materials show``, ``impact`` and ``by-rule``: investigation, nothing written."""
    p = add_command(sub, "show", run_show, help="current value, version history, read hits")
    p.add_argument("material_id", metavar="MATERIAL_ID")
    p.add_argument("--limit", type=int, default=50, help="read hits shown (default 50)")
    add_json_argument(p)
    add_store_argument(p)

    p = add_command(sub, "impact", run_impact, help="every request that used a material (version)")
    p.add_argument("material_id", metavar="MATERIAL_ID")
    p.add_argument("--version", type=int, default=None)
    add_json_argument(p)
    add_store_argument(p)

    p = add_command(
        sub, "by-rule", run_by_rule, help="everything a write rule or model version wrote"
    )
    p.add_argument("rule", metavar="RULE")
    add_json_argument(p)
    add_store_argument(p)


def _add_changes(sub: Subparsers) -> None:
    """The audited changes: the transitions, ``edit`` and ``rollback-batch``."""
    for action in ACTIONS:
        p = add_command(
            sub,
            action,
            run_action,
            help=_ACTION_HELP.get(action, f"{action} a material (a new, audited version)"),
        )
        p.set_defaults(action=action)
        p.add_argument("material_id", metavar="MATERIAL_ID")
        _operator(p)
        p.add_argument("--reason", required=True, help="why (recorded)")
        add_store_argument(p)

    p = add_command(
        sub, "edit", run_edit, help="a manual edit (a new, audited version; text is gated)"
    )
    p.add_argument("material_id", metavar="MATERIAL_ID")
    p.add_argument("--content", default=None, help="the new text")
    for name in ("valid-from", "valid-until", "superseded-by", "title"):
        p.add_argument(f"--{name}", default=None)
    _operator(p)
    p.add_argument("--reason", required=True, help="why (recorded)")
    add_store_argument(p)

    p = add_command(sub, "rollback-batch", run_rollback, help="restore what a batch changed")
    p.add_argument("batch_id", metavar="BATCH_ID")
    _operator(p)
    p.add_argument("--reason", required=True)
    p.add_argument("--force", action="store_true", help="also materials changed since")
    add_store_argument(p)


def _add_upkeep(sub: Subparsers) -> None:
    """``pending``, ``stats``, ``verify``, ``conflicts`` and ``purge-reads``."""
    for name, func, text in (
        ("pending", run_pending, "writes waiting for review and proposed quarantines"),
        ("stats", run_stats, "materials by status, pending writes, conflicts, credibility"),
        ("verify", run_verify, "check the registry against the hash chain"),
    ):
        p = add_command(sub, name, func, help=text)
        add_store_argument(p)

    p = add_command(sub, "conflicts", run_conflicts, help="materials stating different values")
    p.add_argument("--all", action="store_true", help="resolved ones too")
    add_json_argument(p)
    add_store_argument(p)

    p = add_command(sub, "purge-reads", run_purge, help="delete read hits past retention")
    p.add_argument("--days", type=int, default=None, help="retention (default 30)")
    add_store_argument(p)


def _add_trace_back(subparsers: Subparsers) -> None:
    """``tracerag trace-back``: from a request to the writes behind its materials."""
    t = add_command(
        subparsers,
        "trace-back",
        run_trace_back,
        help="from a request to the writes behind its materials",
        description="Request → materials used → the writes that produced them → their change "
        "history, the most likely cause first.",
    )
    t.add_argument("request_id", metavar="REQUEST_ID")
    add_json_argument(t)
    add_store_argument(t)


def _add_feedback(subparsers: Subparsers) -> None:
    """``tracerag feedback``: a verdict on an answer."""
    f = add_command(
        subparsers, "feedback", run_feedback, help="record confirm / deny / clarify on an answer"
    )
    f.add_argument("request_id", metavar="REQUEST_ID")
    f.add_argument("verdict", choices=["confirm", "deny", "clarify"])
    f.add_argument("--comment", default=None)
    f.add_argument("--correction", default=None, help="the right answer (clarify)")
    _operator(f)
    add_store_argument(f)


def _configure_audit(parser: argparse.ArgumentParser) -> None:
    add_store_argument(parser)
    parser.set_defaults(func=run_verify)


add_audit_command(
    "materials",
    "check the material registry against the hash chain; exit 1 on any difference",
    _configure_audit,
)
