"""``tracerag show``: one request's audit trail as an investigator reads it, in text or JSON.

Order: versions and tier → question → retrieved materials and which of them the answer cited
(flagging cited ids that were not retrieved) → plan → raw samples → signals and per-claim
verdicts → confidence, decision and response → errors and retries → review and operator
actions. The record is read through ``tracerag.record.AuditRecord``: a record from an older or
newer pipeline still renders, with "-" where something is missing, and keys it does not know
are shown as they are.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Mapping
from typing import Any

from tracerag._routing import Route
from tracerag.store import RequestNotFound
from tracerag.store._audit_record import AuditRecord
from tracerag.store._base import (
    KIND_EVALUATION,
    KIND_EXPLANATION,
    KIND_REVIEW_DECISION,
    KIND_REVIEW_VOTE,
)
from tracerag.store._codec import RequestTrail
from tracerag.tools._command import (
    Subparsers,
    add_command,
    add_json_argument,
    add_store_argument,
    cli_store,
)
from tracerag.tools._eval_compare import render_report
from tracerag.tools._explain_render import render_attribution, render_explanations

INDENT = "  "
STAGE_ORDER = ("register", "retrieve", "plan", "sample", "verify", "assemble", "request")
WIDTH = 100


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _block(text: Any, indent: str, width: int = WIDTH) -> list[str]:
    """Text indented, wrapped, blank lines kept; raw content stays readable."""
    if text is None:
        return [f"{indent}-"]
    if not isinstance(text, str):
        text = json.dumps(text, ensure_ascii=False, indent=2, sort_keys=True)
    lines: list[str] = []
    for para in text.splitlines() or [""]:
        wrapped = textwrap.wrap(
            para, width=max(20, width - len(indent)), replace_whitespace=False
        ) or [""]
        lines += [f"{indent}{w}".rstrip() for w in wrapped]
    return lines


def _section(title: str, detail: str = "") -> list[str]:
    return ["", f"{title.upper()} {detail}".rstrip(), ""]


def _versions(rec: AuditRecord) -> list[str]:
    versions = rec.versions
    out = _section("Versions")
    out.append(f"{INDENT}prompt    {_fmt(versions.prompt)}")
    out.append(f"{INDENT}model     {_fmt(versions.model)}")
    out.append(f"{INDENT}tracerag  {_fmt(versions.tracerag)}")
    out.append(
        f"{INDENT}tier      {_fmt(rec.tier)}    channel {_fmt(rec.channel)}"
        f"    session {_fmt(rec.session_id)}    user {_fmt(rec.user_id)}"
    )
    if rec.params:
        shown = ", ".join(f"{k}={_fmt(v)}" for k, v in sorted(rec.params.items()))
        out += _block(f"params    {shown}", INDENT)
    return out


def _retrieved(rec: AuditRecord) -> list[str]:
    materials = rec.materials
    cited, missing = rec.resolved_citations()
    plan_ids = set(rec.plan.material_ids if rec.plan is not None else [])
    out = _section("Retrieved materials", f"({len(materials)})")
    if not materials:
        out.append(f"{INDENT}(none retrieved)")
    for m in sorted(materials, key=lambda m: (m.rank is None, m.rank or 0)):
        mid = m.id if m.id is not None else "?"
        marks = []
        if mid in cited:
            marks.append("CITED")
        if mid in plan_ids:
            marks.append("planned")
        if m.stale:
            marks.append("STALE")
        title = m.title or m.source or ""
        out.append(
            f"{INDENT}#{_fmt(m.rank)}  {mid:<10} score {_fmt(m.score, 3):>6}  "
            f"{title}{'  [' + ', '.join(marks) + ']' if marks else ''}"
        )
    if missing:
        out.append(f"{INDENT}!! cited but NOT retrieved: {', '.join(missing)}")
    if rec.retrieval:
        shown = ", ".join(f"{k}={_fmt(v, 3)}" for k, v in sorted(rec.retrieval.items()))
        out += _block(f"retrieval {shown}", INDENT)
    return out


def _plan(rec: AuditRecord) -> list[str]:
    plan = rec.plan
    if plan is None:
        return [*_section("Plan"), f"{INDENT}(no plan)"]
    state = "ok" if plan.ok else "FAILED"
    out = _section("Plan", f"({_fmt(plan.mode)}, {state}, {_fmt(plan.attempts)} attempt(s))")
    out.append(f"{INDENT}materials: {', '.join(plan.material_ids) or '-'}")
    if plan.key_facts:
        out.append(f"{INDENT}key facts:")
        for fact in plan.key_facts:
            out += _block(f"- {fact}", INDENT * 2)
    if plan.agreement is not None:
        out.append(f"{INDENT}agreement across samples: {_fmt(plan.agreement)}")
    if plan.error:
        out += _block(f"error: {plan.error}", INDENT)
    if plan.raw and not plan.ok:
        out.append(f"{INDENT}raw plan:")
        out += _block(plan.raw, INDENT * 2)
    return out


def _samples(rec: AuditRecord) -> list[str]:
    samples = rec.samples
    out = _section("Samples", f"({len(samples)})")
    if not samples:
        out.append(f"{INDENT}(no samples)")
    for i, s in enumerate(samples):
        status = f"ERROR {s.error}" if s.error else "ok"
        tokens = ""
        if s.input_tokens is not None or s.output_tokens is not None:
            tokens = f" · tokens {_fmt(s.input_tokens)}->{_fmt(s.output_tokens)}"
        out.append(
            f"{INDENT}[{_fmt(s.index if s.index is not None else i)}] {status} · "
            f"{_fmt(s.latency_s)} s · {_fmt(s.attempts)} attempt(s){tokens}"
        )
        out += _block(s.raw if s.raw is not None else s.answer, INDENT * 3)
    return out


def _signals(rec: AuditRecord) -> list[str]:
    signals = rec.signals
    out = _section("Signals and verdicts")
    citations = signals.citations
    if citations is not None and citations.model_fields_set:
        out.append(
            f"{INDENT}citations: coverage {_fmt(citations.coverage)} · "
            f"accuracy {_fmt(citations.accuracy)}"
            + (f" · score {_fmt(citations.score)}" if citations.score is not None else "")
            + (f" · FABRICATED {', '.join(citations.fabricated)}" if citations.fabricated else "")
            + (f" · STALE {', '.join(citations.stale)}" if citations.stale else "")
        )
    for n, claim in enumerate(rec.claims, 1):
        cited = ", ".join(claim.cited_ids) or "no citation"
        out.append(
            f"{INDENT}claim {n}: {str(claim.verdict or '?').upper()}  "
            f"score {_fmt(claim.score)}  cites [{cited}]"
        )
        out += _block(f'"{claim.text}"', INDENT * 3)
        if claim.support:
            source = claim.material_id or "?"
            out += _block(f'support ({source}): "{claim.support}"', INDENT * 3)
        if claim.reason:
            out += _block(f"why: {claim.reason}", INDENT * 3)
    consistency = signals.consistency
    if consistency is not None:
        note = f" · {consistency.note}" if consistency.note else ""
        out.append(
            f"{INDENT}consistency: agreement {_fmt(consistency.agreement)} · "
            f"groups {_fmt(consistency.group_count)} · entropy {_fmt(consistency.entropy)}"
            + (" · not informative" if consistency.informative is False else "")
            + note
        )
    if signals.rules:
        out.append(f"{INDENT}rules:")
        for rule in signals.rules:
            mark = "?" if rule.passed is None else "pass" if rule.passed else "FAIL"
            required = " (required)" if rule.required else ""
            detail = f" - {rule.detail}" if rule.detail else ""
            out.append(f"{INDENT * 2}{mark}  {rule.name or '?'}{required}{detail}")
    relevance = signals.relevance or {}
    if relevance:
        addresses = relevance.get("addresses")
        verdict = (
            "answers the question"
            if addresses is True
            else "DOES NOT ANSWER THE QUESTION"
            if addresses is False
            else "not judged"
        )
        out += _block(f"relevance ({relevance.get('method', '?')}): {verdict}", INDENT)
        if relevance.get("reason"):
            out += _block(f"why: {relevance['reason']}", INDENT * 3)
    others = dict(signals.model_extra or {})
    if signals.selection is not None:
        others["selection"] = signals.selection.model_dump()
    if signals.citations_by_sample:
        others["citations_by_sample"] = signals.citations_by_sample
    for name, value in sorted(others.items()):
        out += _block(f"{name}: {json.dumps(value, ensure_ascii=False, sort_keys=True)}", INDENT)
    if len(out) == 3:
        out.append(f"{INDENT}(no signals recorded)")
    return out


def _outcome(rec: AuditRecord) -> list[str]:
    out = _section("Outcome")
    out.append(
        f"{INDENT}confidence {_fmt(rec.confidence)} -> decision "
        f"{str(rec.decision or '-').upper()}"
        + (f"    calibration {rec.calibration}" if rec.calibration else "")
    )
    response = rec.response
    answer = response.answer if response is not None else None
    if response is not None and response.status:
        out.append(f"{INDENT}status {response.status}")
    if answer is None and rec.decision == Route.ESCALATE:
        out.append(f"{INDENT}answer withheld for a human")
    else:
        out.append(f"{INDENT}response:")
        out += _block(answer, INDENT * 2)
    if rec.timings:
        order = {name: i for i, name in enumerate(STAGE_ORDER)}
        ranked = sorted(rec.timings.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0]))
        shown = ", ".join(f"{k} {_fmt(v, 3)}s" for k, v in ranked)
        out += _block(f"timings: {shown}", INDENT)
    for key, values in (("skipped", rec.skipped), ("warnings", rec.warnings)):
        if values:
            out += _block(f"{key}: {', '.join(values)}", INDENT)
    return out


def _usage(rec: AuditRecord) -> list[str]:
    """Model calls, tokens per stage and cost (records written before usage was kept: none)."""
    spent = rec.usage
    if spent is None:
        return []
    estimated = " (estimated where the model did not report)" if spent.get("estimated") else ""
    out = _section("Usage and cost", f"({_fmt(spent.get('calls'))} model calls)")
    out.append(
        f"{INDENT}tokens in {_fmt(spent.get('input_tokens'))}, out "
        f"{_fmt(spent.get('output_tokens'))}{estimated}"
    )
    found = spent.get("cost")
    cost: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    by_cost = cost.get("by_stage") or {}
    for stage, totals in (spent.get("by_stage") or {}).items():
        if not isinstance(totals, Mapping):
            continue
        money = by_cost.get(stage)
        out.append(
            f"{INDENT * 2}{stage:<8} {_fmt(totals.get('calls'))} calls, in "
            f"{_fmt(totals.get('input_tokens'))}, out {_fmt(totals.get('output_tokens'))}"
            + (f", cost {money:.6f}" if isinstance(money, (int, float)) else "")
        )
    if cost:
        out.append(f"{INDENT}cost {_fmt(cost.get('total'), 6)}")
        if cost.get("unpriced_models"):
            out.append(f"{INDENT}no price for: {', '.join(map(str, cost['unpriced_models']))}")
    return out


def _evaluation(trail: RequestTrail) -> list[str]:
    """The report of an evaluation run (``tracerag eval``) kept under this id, if any."""
    out: list[str] = []
    for entry in trail.of_kind(KIND_EVALUATION):
        report = {k: v for k, v in entry.payload.items() if k not in {"reason", "actor"}}
        out += _section("Evaluation", f"by {entry.actor} at {entry.created_at}")
        try:
            text = render_report(report)
        except (KeyError, TypeError, ValueError):  # another version's report: show it raw
            text = _compact(report)
        out += _block(text, INDENT)
    return out


def _errors(rec: AuditRecord) -> list[str]:
    errors = rec.errors
    out = _section("Errors and retries", f"({len(errors)})")
    if not errors:
        out.append(f"{INDENT}(none)")
    for e in errors:
        out += _block(
            f"{_fmt(e.at)}  {_fmt(e.stage)}  {_fmt(e.type)}: {_fmt(e.message)}",
            INDENT,
        )
        if e.details:
            out += _block(", ".join(f"{k}={_fmt(v)}" for k, v in e.details.items()), INDENT * 3)
    return out


def _actions(trail: RequestTrail) -> list[str]:
    actions = [e for e in trail.actions if e.kind != KIND_EXPLANATION]  # own section
    out = _section("Review and operator actions", f"({len(actions)})")
    if not actions:
        out.append(f"{INDENT}(none)")
    for entry in actions:
        p = entry.payload
        line = f"{entry.created_at}  {entry.kind:<16} by {entry.actor}"
        if entry.kind == KIND_EVALUATION:  # its report has its own section
            out.append(f"{INDENT}{line}")
            out += _block(f"result: {p.get('reason')}", INDENT * 3)
            continue
        if entry.kind in (KIND_REVIEW_DECISION, KIND_REVIEW_VOTE):
            line += f": {str(p.get('action', '?')).upper()}"
        elif p.get("route"):
            line += f": route {p.get('route')}"
        out.append(f"{INDENT}{line}")
        before, after = p.get("before"), p.get("after")
        if before is not None or after is not None:
            out += _block(f"before {_compact(before)} -> after {_compact(after)}", INDENT * 3)
        if p.get("reason"):
            out += _block(f"why: {p.get('reason')}", INDENT * 3)
        if p.get("final_answer"):
            out += _block(f"final answer: {p.get('final_answer')}", INDENT * 3)
        rest = {
            k: v
            for k, v in p.items()
            if k not in {"before", "after", "reason", "final_answer", "action", "route"}
        }
        if rest:
            out += _block(_compact(rest), INDENT * 3)
    if trail.review is not None:
        r = trail.review
        out.append(
            f"{INDENT}queue: {r.status} ({r.route})"
            + (f", claimed by {r.claimed_by}" if r.claimed_by and r.status == "claimed" else "")
        )
    return out


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def render_timeline(trail: RequestTrail) -> str:
    """A readable plain-text account of one request, in the investigator's order."""
    rec = trail.audit
    first = trail.entries[0] if trail.entries else None
    last = trail.entries[-1] if trail.entries else None
    head = [
        f"REQUEST {trail.request_id}",
        f"{INDENT}trace {_fmt(rec.trace_id)}",
        f"{INDENT}started {_fmt(rec.started_at)}    recorded "
        f"{(first.created_at if first else '') or '-'}",
    ]
    if first is not None and last is not None and first.sealed:
        head.append(f"{INDENT}{len(trail.entries)} audit entries, seq {first.seq}..{last.seq}")
    else:
        head.append(f"{INDENT}{len(trail.entries)} audit entries (not stored)")
    parts = [
        head,
        _versions(rec),
        [*_section("Question"), *_block(rec.question, INDENT)],
        _retrieved(rec),
        _plan(rec),
        _samples(rec),
        _signals(rec),
        render_attribution(rec),
        _outcome(rec),
        _usage(rec),
        _evaluation(trail),
        _errors(rec),
        _actions(trail),
        render_explanations(trail.entries),
    ]
    return "\n".join(line for part in parts for line in part) + "\n"


def render_json(trail: RequestTrail) -> str:
    """The trail as JSON: reassembled record, every entry (with hashes) and review state."""
    return json.dumps(trail.to_dict(), ensure_ascii=False, indent=2)


def run_show(args: argparse.Namespace) -> int:
    """Print one request's trail as a timeline or JSON."""
    with cli_store(args) as store:
        try:
            trail = store.get(args.request_id)
        except RequestNotFound as exc:
            print(f"tracerag show: {exc}", file=sys.stderr)
            return 1
    sys.stdout.write(render_json(trail) + "\n" if args.json else render_timeline(trail))
    return 0


def add_parser(subparsers: Subparsers) -> None:
    """Register ``tracerag show``."""
    p = add_command(
        subparsers,
        "show",
        run_show,
        help="show one request's audit trail as a timeline",
        description="Show everything stored for one request, in the order an investigator "
        "reads it: versions, question, retrieved materials, plan, samples, verdicts, outcome, "
        "errors and review actions.",
    )
    p.add_argument("request_id", metavar="REQUEST_ID")
    add_store_argument(p)
    add_json_argument(p, "print the trail as JSON")
