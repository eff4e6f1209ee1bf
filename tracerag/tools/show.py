"""One request's audit trail as an investigator reads it, in plain text or JSON.

Order: versions and tier → question → retrieved materials and which of them the answer cited
(flagging cited ids that were not retrieved) → plan → raw samples → signals and per-claim
verdicts → confidence, decision and response → errors and retries → review and operator
actions. Every field is read defensively: a record from an older or newer pipeline still
renders, with "-" where something is missing.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Mapping
from typing import Any

from tracerag.store.base import KIND_EVALUATION, KIND_REVIEW_DECISION, RequestTrail, _dig

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


def _answer_text(response: Any) -> Any:
    if isinstance(response, Mapping):
        for key in ("answer", "text", "output", "content"):
            if key in response:
                return response[key]
    return response


def _versions(trail: RequestTrail, rec: Mapping[str, Any]) -> list[str]:
    versions = trail.versions if isinstance(trail.versions, Mapping) else {}
    out = _section("Versions")
    out.append(f"{INDENT}prompt    {_fmt(versions.get('prompt'))}")
    out.append(f"{INDENT}model     {_fmt(versions.get('model'))}")
    out.append(f"{INDENT}tracerag  {_fmt(versions.get('tracerag'))}")
    out.append(
        f"{INDENT}tier      {_fmt(rec.get('tier'))}    channel {_fmt(rec.get('channel'))}"
        f"    session {_fmt(rec.get('session_id'))}    user {_fmt(rec.get('user_id'))}"
    )
    params = rec.get("params")
    if isinstance(params, Mapping) and params:
        shown = ", ".join(f"{k}={_fmt(v)}" for k, v in sorted(params.items()))
        out += _block(f"params    {shown}", INDENT)
    return out


def _retrieved(trail: RequestTrail, rec: Mapping[str, Any]) -> list[str]:
    materials = trail.materials
    cited = set(trail.cited_ids)
    plan_ids = set(_dig(rec, "plan", "material_ids", default=[]) or [])
    out = _section("Retrieved materials", f"({len(materials)})")
    if not materials:
        out.append(f"{INDENT}(none retrieved)")
    for m in sorted(materials, key=lambda m: (m.get("rank") is None, m.get("rank") or 0)):
        mid = str(m.get("id", "?"))
        marks = []
        if mid in cited:
            marks.append("CITED")
        if mid in plan_ids:
            marks.append("planned")
        meta = m.get("metadata") if isinstance(m.get("metadata"), Mapping) else {}
        stale = meta.get("superseded_by") or meta.get("status") in {
            "superseded",
            "stale",
            "withdrawn",
            "expired",
        }
        if stale:
            marks.append("STALE")
        title = m.get("title") or m.get("source") or ""
        out.append(
            f"{INDENT}#{_fmt(m.get('rank'))}  {mid:<10} score {_fmt(m.get('score'), 3):>6}  "
            f"{title}{'  [' + ', '.join(marks) + ']' if marks else ''}"
        )
    missing = trail.cited_not_retrieved
    if missing:
        out.append(f"{INDENT}!! cited but NOT retrieved: {', '.join(missing)}")
    retrieval = rec.get("retrieval")
    if isinstance(retrieval, Mapping) and retrieval:
        shown = ", ".join(f"{k}={_fmt(v, 3)}" for k, v in sorted(retrieval.items()))
        out += _block(f"retrieval {shown}", INDENT)
    return out


def _plan(rec: Mapping[str, Any]) -> list[str]:
    plan = rec.get("plan")
    if not isinstance(plan, Mapping):
        return [*_section("Plan"), f"{INDENT}(no plan)"]
    state = "ok" if plan.get("ok", True) else "FAILED"
    out = _section(
        "Plan", f"({_fmt(plan.get('mode'))}, {state}, {_fmt(plan.get('attempts'))} attempt(s))"
    )
    out.append(f"{INDENT}materials: {', '.join(map(str, plan.get('material_ids') or [])) or '-'}")
    facts = plan.get("key_facts") or []
    if facts:
        out.append(f"{INDENT}key facts:")
        for fact in facts:
            out += _block(f"- {fact}", INDENT * 2)
    if plan.get("agreement") is not None:
        out.append(f"{INDENT}agreement across samples: {_fmt(plan.get('agreement'))}")
    if plan.get("error"):
        out += _block(f"error: {plan.get('error')}", INDENT)
    if plan.get("raw") and not plan.get("ok", True):
        out.append(f"{INDENT}raw plan:")
        out += _block(plan.get("raw"), INDENT * 2)
    return out


def _samples(trail: RequestTrail) -> list[str]:
    samples = trail.samples
    out = _section("Samples", f"({len(samples)})")
    if not samples:
        out.append(f"{INDENT}(no samples)")
    for i, s in enumerate(samples):
        if not isinstance(s, Mapping):
            out.append(f"{INDENT}[{i}]")
            out += _block(s, INDENT * 3)
            continue
        status = f"ERROR {s.get('error')}" if s.get("error") else "ok"
        tokens = ""
        if s.get("input_tokens") is not None or s.get("output_tokens") is not None:
            tokens = f" · tokens {_fmt(s.get('input_tokens'))}->{_fmt(s.get('output_tokens'))}"
        out.append(
            f"{INDENT}[{_fmt(s.get('index', i))}] {status} · {_fmt(s.get('latency_s'))} s"
            f" · {_fmt(s.get('attempts'))} attempt(s){tokens}"
        )
        out += _block(s.get("raw") if s.get("raw") is not None else s.get("answer"), INDENT * 3)
    return out


def _signals(trail: RequestTrail) -> list[str]:
    signals = trail.signals
    out = _section("Signals and verdicts")
    citations = signals.get("citations") if isinstance(signals.get("citations"), Mapping) else {}
    if citations:
        fabricated = citations.get("fabricated") or []
        stale = citations.get("stale") or []
        out.append(
            f"{INDENT}citations: coverage {_fmt(citations.get('coverage'))} · "
            f"accuracy {_fmt(citations.get('accuracy'))}"
            + (f" · score {_fmt(citations.get('score'))}" if "score" in citations else "")
            + (f" · FABRICATED {', '.join(map(str, fabricated))}" if fabricated else "")
            + (f" · STALE {', '.join(map(str, stale))}" if stale else "")
        )
    claims = trail.claims
    for n, claim in enumerate(claims, 1):
        cited = ", ".join(map(str, claim.get("cited_ids") or [])) or "no citation"
        out.append(
            f"{INDENT}claim {n}: {str(claim.get('verdict', '?')).upper()}  "
            f"score {_fmt(claim.get('score'))}  cites [{cited}]"
        )
        out += _block(f'"{claim.get("text", "")}"', INDENT * 3)
        sentence = claim.get("sentence") or claim.get("quote")
        if sentence:
            source = claim.get("material_id") or "?"
            out += _block(f'support ({source}): "{sentence}"', INDENT * 3)
        if claim.get("reason"):
            out += _block(f"why: {claim.get('reason')}", INDENT * 3)
    consistency = signals.get("consistency")
    if isinstance(consistency, Mapping):
        groups = consistency.get("n_groups", consistency.get("groups"))
        if isinstance(groups, list):
            groups = len(groups)
        note = f" · {consistency.get('note')}" if consistency.get("note") else ""
        informative = consistency.get("informative")
        out.append(
            f"{INDENT}consistency: agreement {_fmt(consistency.get('agreement'))} · "
            f"groups {_fmt(groups)} · entropy {_fmt(consistency.get('entropy'))}"
            + (" · not informative" if informative is False else "")
            + note
        )
    rules = signals.get("rules")
    if isinstance(rules, list) and rules:
        out.append(f"{INDENT}rules:")
        for rule in rules:
            if not isinstance(rule, Mapping):
                out.append(f"{INDENT * 2}{rule}")
                continue
            mark = "pass" if rule.get("passed") else "FAIL"
            required = " (required)" if rule.get("required") else ""
            detail = f" - {rule.get('detail')}" if rule.get("detail") else ""
            out.append(f"{INDENT * 2}{mark}  {rule.get('name', '?')}{required}{detail}")
    others = {k: v for k, v in signals.items() if k not in {"citations", "consistency", "rules"}}
    for name, value in sorted(others.items()):
        out += _block(f"{name}: {json.dumps(value, ensure_ascii=False, sort_keys=True)}", INDENT)
    if len(out) == 3:
        out.append(f"{INDENT}(no signals recorded)")
    return out


def _outcome(rec: Mapping[str, Any]) -> list[str]:
    out = _section("Outcome")
    out.append(
        f"{INDENT}confidence {_fmt(rec.get('confidence'))} -> decision "
        f"{str(rec.get('decision') or '-').upper()}"
        + (f"    calibration {rec.get('calibration')}" if rec.get("calibration") else "")
    )
    response = rec.get("response")
    answer = _answer_text(response)
    if isinstance(response, Mapping) and response.get("status"):
        out.append(f"{INDENT}status {response.get('status')}")
    if answer is None and rec.get("decision") == "escalate":
        out.append(f"{INDENT}answer withheld for a human")
    else:
        out.append(f"{INDENT}response:")
        out += _block(answer, INDENT * 2)
    timings = rec.get("timings")
    if isinstance(timings, Mapping) and timings:
        order = {name: i for i, name in enumerate(STAGE_ORDER)}
        ranked = sorted(timings.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0]))
        shown = ", ".join(f"{k} {_fmt(v, 3)}s" for k, v in ranked)
        out += _block(f"timings: {shown}", INDENT)
    for key in ("skipped", "warnings"):
        if rec.get(key):
            out += _block(f"{key}: {', '.join(map(str, rec[key]))}", INDENT)
    return out


def _usage(rec: Mapping[str, Any]) -> list[str]:
    """Model calls, tokens per stage and cost (records written before usage was kept: none)."""
    spent = rec.get("usage")
    if not isinstance(spent, Mapping):
        return []
    estimated = " (estimated where the model did not report)" if spent.get("estimated") else ""
    out = _section("Usage and cost", f"({_fmt(spent.get('calls'))} model calls)")
    out.append(
        f"{INDENT}tokens in {_fmt(spent.get('input_tokens'))}, out "
        f"{_fmt(spent.get('output_tokens'))}{estimated}"
    )
    cost = spent.get("cost") if isinstance(spent.get("cost"), Mapping) else {}
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
    from tracerag.tools.eval import render_report

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


def _errors(trail: RequestTrail) -> list[str]:
    errors = trail.errors
    out = _section("Errors and retries", f"({len(errors)})")
    if not errors:
        out.append(f"{INDENT}(none)")
    for e in errors:
        if not isinstance(e, Mapping):
            out += _block(str(e), INDENT)
            continue
        extra = {k: v for k, v in e.items() if k not in {"stage", "type", "message", "at"}}
        out += _block(
            f"{_fmt(e.get('at'))}  {_fmt(e.get('stage'))}  {_fmt(e.get('type'))}: "
            f"{_fmt(e.get('message'))}",
            INDENT,
        )
        if extra:
            out += _block(", ".join(f"{k}={_fmt(v)}" for k, v in extra.items()), INDENT * 3)
    return out


def _actions(trail: RequestTrail) -> list[str]:
    actions = trail.actions
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
        if entry.kind == KIND_REVIEW_DECISION:
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
    rec = trail.record
    first = trail.entries[0] if trail.entries else None
    last = trail.entries[-1] if trail.entries else None
    head = [
        f"REQUEST {trail.request_id}",
        f"{INDENT}trace {_fmt(rec.get('trace_id'))}",
        f"{INDENT}started {_fmt(rec.get('started_at'))}    recorded "
        f"{(first.created_at if first else '') or '-'}",
    ]
    if first is not None and last is not None and first.sealed:
        head.append(f"{INDENT}{len(trail.entries)} audit entries, seq {first.seq}..{last.seq}")
    else:
        head.append(f"{INDENT}{len(trail.entries)} audit entries (not stored)")
    parts = [
        head,
        _versions(trail, rec),
        [*_section("Question"), *_block(rec.get("question"), INDENT)],
        _retrieved(trail, rec),
        _plan(rec),
        _samples(trail),
        _signals(trail),
        _outcome(rec),
        _usage(rec),
        _evaluation(trail),
        _errors(trail),
        _actions(trail),
    ]
    return "\n".join(line for part in parts for line in part) + "\n"


def render_json(trail: RequestTrail) -> str:
    """The trail as JSON: reassembled record, every entry (with hashes) and review state."""
    return json.dumps(trail.to_dict(), ensure_ascii=False, indent=2)
