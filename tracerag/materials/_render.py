"""Plain-text views of materials for people: a version with its provenance, a trace-back."""

from __future__ import annotations

from typing import Any


def short(text: str | None, width: int = 100) -> str:
    """The text on one line, cut to ``width`` characters."""
    text = " ".join((text or "").split())
    return text if len(text) <= width else text[: width - 1] + "…"


def version_lines(sv: Any, indent: str = "  ", mark: str = "") -> list[str]:
    """A stored version: change, status, who, rule, batch, audit entry, why, provenance, text."""
    v = sv.version
    p = v.provenance
    where = ", ".join(
        x
        for x in (
            p.source_type,
            p.document_id and f"doc {p.document_id}",
            p.section and f"section {p.section}",
            p.page and f"page {p.page}",
            p.origin_url,
            p.parents and "from " + ", ".join(p.parents),
        )
        if x
    )
    lines = [
        f"{indent}v{v.version}{mark} {v.change} → {v.status}  by {v.operator}  "
        f"rule {v.written_by}  at {v.created_at}"
        + (f"  batch {v.batch_id}" if v.batch_id else "")
        + (f"  audit #{sv.audit_seq}" if sv.audit_seq else "  (not sealed)"),
    ]
    if v.reason:
        lines.append(f"{indent}    why: {v.reason}")
    if v.gate and v.gate.get("reasons"):
        reasons = "; ".join(f"{r['rule']}: {r['match']}" for r in v.gate["reasons"])
        lines.append(f"{indent}    gate {v.gate.get('rules_version')}: {reasons}")
    lines.append(f"{indent}    provenance: {where}")
    validity = [
        f"valid {v.valid_from or '…'} to {v.valid_until or '…'}",
        v.last_confirmed and f"confirmed {v.last_confirmed}",
        v.superseded_by and f"superseded by {v.superseded_by}",
        v.supersedes and f"supersedes {v.supersedes}",
    ]
    lines.append(f"{indent}    " + "; ".join(x for x in validity if x))
    lines.append(f"{indent}    text: {v.content}")
    if v.source_snippet != v.content:
        lines.append(f"{indent}    source snippet: {v.source_snippet}")
    return lines


def _verdict_line(f: dict[str, Any]) -> str:
    """``deny by user:li``; a note says its declared name is unverified and it did not count."""
    if f.get("method") == "declared":
        name = str(f.get("declared_user") or f["operator"]).removeprefix("unverified:")
        return f"{f['verdict']} by {name} (unverified note, not counted)"
    counted = f.get("counted") or f.get("method") == "legacy"
    return f"{f['verdict']} by {f['operator']}" + ("" if counted else " (not counted)")


def render_trace_back(tb: Any) -> str:
    """A trace-back for people: the most likely cause first."""
    feedback = ", ".join(_verdict_line(f) for f in tb.feedback) or "-"
    lines = [
        f"request {tb.request_id}: {short(tb.question)}",
        f"  decision {tb.decision}  confidence {tb.confidence}  review {tb.review_action or '-'}"
        f"  feedback {feedback}",
    ]
    suspect = tb.suspect
    if suspect is not None and suspect.write is not None:
        origin = suspect.origin or suspect.write
        o = origin.version
        lines.append(
            f"most likely cause: {o.material_id} v{o.version}, written by {o.operator} "
            f"with {o.written_by} at {o.created_at}"
            + (f" in batch {o.batch_id}" if o.batch_id else "")
            + (f" (audit #{origin.audit_seq})" if origin.audit_seq else "")
        )
        w = suspect.write.version
        if w.version != o.version:
            lines.append(
                f"  in service as v{w.version} ({w.change} by {w.operator} with {w.written_by}"
                + (f": {w.reason}" if w.reason else "")
                + ")"
            )
    else:
        lines.append("most likely cause: no registered material carried this answer")
    lines.append(f"materials used ({len(tb.materials)}), most suspect first:")
    for m in tb.materials:
        lines.append(
            f"- {m.material_id} v{m.used_version}  share {m.share:.2f}  "
            f"{'cited' if m.cited else 'not cited'}  rank {m.rank_before}→{m.rank_after}  "
            f"now {m.current_status}"
            + (f"  credibility {m.credibility:.3f}" if m.credibility is not None else "")
            + (f"  denials {m.denials}" if m.denials else "")
        )
        if m.origin is not None and m.write is not None and m.origin is not m.write:
            lines.append("  the write that produced its text:")
            lines += version_lines(m.origin, indent="    ")
        if m.write is not None:
            lines.append("  the version used:")
            lines += version_lines(m.write, indent="    ")
        later = [s for s in m.history if m.used_version and s.version.version > m.used_version]
        earlier = [s for s in m.history if m.used_version and s.version.version < m.used_version]
        for title, rows in (("earlier", earlier), ("since then", later)):
            if rows:
                lines.append(f"  history {title}:")
                for sv in rows:
                    v = sv.version
                    lines.append(
                        f"    v{v.version} {v.change} → {v.status} by {v.operator} "
                        f"({v.written_by}) at {v.created_at}"
                        + (f": {v.reason}" if v.reason else "")
                    )
    return "\n".join(lines) + "\n"


__all__ = ["render_trace_back", "short", "version_lines"]
