"""``tracerag explain``'s reports as text, for the command and for ``tracerag show``.

Plain functions of the stored report (a JSON body), so a report another version wrote still
renders.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tracerag.store._audit_record import AuditRecord
from tracerag.store._base import (
    KIND_EXPLANATION,
    Entry,
)

__all__ = ["headline", "render_attribution", "render_explanations", "render_report"]

# -- rendering (also used by ``tracerag show``) ---------------------------------------------------

INDENT = "  "


def _f(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def headline(report: Mapping[str, Any]) -> str:
    flags = report.get("flags") or []
    decisive = report.get("decisive") or []
    return f"decisive: {', '.join(decisive) or 'none'}; flags: {', '.join(flags) or 'none'}"


def render_report(report: Mapping[str, Any]) -> list[str]:
    """The lines of one stored explanation report."""
    calls = report.get("model_calls") or {}
    linked = report.get("linked") or {}
    base = report.get("baseline") or {}
    rec = report.get("recorded") or {}
    lines = [
        f"explanation of {report.get('request_id')}"
        + ("  (FORCED despite other versions)" if report.get("forced") else ""),
        f"{INDENT}trace {_f(report.get('trace_id'))}, linked to span "
        f"{_f(linked.get('span_id'))} of trace {_f(linked.get('trace_id'))}",
        f"{INDENT}model calls: {_f(calls.get('made'))} made of {_f(calls.get('planned'))} "
        f"planned (cap {_f(calls.get('cap'))}, {_f(calls.get('per_run'))} per run)",
        f"{INDENT}recorded: {str(rec.get('decision') or '-').upper()} "
        f"{_f(rec.get('confidence'))}    baseline re-run: "
        f"{str(base.get('decision') or '-').upper()} {_f(base.get('confidence'))}",
    ]
    if base.get("answer"):
        lines.append(f"{INDENT}baseline answer: {base['answer']}")
    occlusion = report.get("occlusion") or []
    if occlusion:
        lines.append(f"{INDENT}occlusion (each used material masked in turn):")
        for o in occlusion:
            changed = "answer CHANGED" if o.get("answer_changed") else "answer unchanged"
            lines.append(
                f"{INDENT * 2}{o.get('material_id'):<24} {changed:<17} confidence "
                f"{_f(o.get('confidence_before'))} -> {_f(o.get('confidence_after'))}, "
                f"{_f(o.get('decision_before'))} -> {_f(o.get('decision_after'))}"
            )
            for claim in o.get("lost_claims") or []:
                lines.append(f"{INDENT * 3}lost support: {claim}")
            if o.get("answer_changed") and o.get("answer_after"):
                lines.append(f"{INDENT * 3}answer now: {o['answer_after']}")
        decisive = ", ".join(report.get("decisive") or []) or "none"
        lines.append(f"{INDENT * 2}=> decisive: {decisive}")
    for c in report.get("counterfactuals") or []:
        lines.append(
            f"{INDENT}counterfactual: {c.get('material_id')} {c.get('original')} -> "
            f"{c.get('altered')}: answer {str(c.get('outcome')).upper()}"
        )
        if c.get("answer_after"):
            lines.append(f"{INDENT * 3}answer: {c['answer_after']}")
    for p in report.get("paraphrases") or []:
        lines.append(
            f"{INDENT}paraphrase: {p.get('question')!r}: top {_f(p.get('top_before'))} -> "
            f"{_f(p.get('top_after'))}, key {list(p.get('key_before') or [])} -> "
            f"{list(p.get('key_after') or [])}, conclusion "
            f"{'FLIPPED' if p.get('conclusion_flipped') else 'held'}"
            f" => {'UNSTABLE' if p.get('unstable') else 'stable'}"
        )
    lines.append(f"{INDENT}flags: {', '.join(report.get('flags') or []) or 'none'}")
    for note in report.get("notes") or []:
        lines.append(f"{INDENT}note: {note}")
    return lines


def render_attribution(record: AuditRecord | Mapping[str, Any]) -> list[str]:
    """The tier 1–2 attribution section of ``tracerag show``."""
    attribution = AuditRecord.parse(record).signals.attribution
    out = ["", "ATTRIBUTION", ""]
    if not isinstance(attribution, Mapping):
        return [*out, f"{INDENT}(not recorded)"]
    retrieval = attribution.get("retrieval") or {}
    out.append(
        f"{INDENT}retrieval shape {str(retrieval.get('shape')).upper()}: top "
        f"{_f(retrieval.get('top_score'))}, margin {_f(retrieval.get('margin'))} "
        f"({_f(retrieval.get('relative_margin'))} of top), near the top: "
        f"{', '.join(retrieval.get('near_top') or []) or '-'}"
    )
    for m in attribution.get("materials") or []:
        terms = ", ".join(m.get("shared_terms") or []) or "none"
        out.append(
            f"{INDENT}{m.get('role')!s:<10} {m.get('id')!s:<24} share "
            f"{_f(m.get('share'))}  prompt #{_f(m.get('prompt_position'))}  "
            f"{'USED' if m.get('used') else 'not used'}: {m.get('reason')} ({m.get('detail')})"
        )
        out.append(f"{INDENT * 6}shares with the question: {terms}")
    out.append(
        f"{INDENT}claims: {_f(attribution.get('n_claims'))}, unattributed share "
        f"{_f(attribution.get('unattributed'))}"
        + (
            f", relevance floor {_f(attribution.get('relevance_floor'))}"
            if attribution.get("relevance_floor") is not None
            else ""
        )
    )
    return out


def render_explanations(entries: Sequence[Entry]) -> list[str]:
    """The stored tier 3 reports of a request, newest last (``tracerag show``)."""
    found = [e for e in entries if e.kind == KIND_EXPLANATION]
    out = ["", f"EXPLANATIONS ({len(found)})", ""]
    if not found:
        return [*out, f"{INDENT}(none; run tracerag explain REQUEST_ID)"]
    for e in found:
        out.append(f"{INDENT}{e.created_at} by {e.actor}")
        out += [f"{INDENT}{line}" for line in render_report(e.payload)]
    return out
