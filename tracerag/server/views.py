"""What the review desk shows: a stored trail turned into plain values for the templates.

Every string here is untrusted text (questions, answers, retrieved documents); the templates
render it with autoescaping, so markup in a document is shown, never run. Highlights are
returned as (before, marked, after) pieces for the template to wrap in ``<mark>``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from tracerag.store.base import RequestTrail, _dig
from tracerag.tools.replay import candidate_answer


@dataclass(frozen=True)
class Highlight:
    """A material's text cut around its supporting sentence."""

    before: str
    marked: str
    after: str

    @property
    def found(self) -> bool:
        return bool(self.marked)


def highlight(text: str, start: Any, end: Any, sentence: str | None) -> Highlight:
    """The text with the sentence at ``[start, end)`` marked.

    The stored offsets are trusted only if they cut out the stored sentence (or, without a
    sentence, are in range); otherwise the sentence is searched for; failing that nothing is
    marked.
    """
    ok = (
        isinstance(start, int)
        and isinstance(end, int)
        and not isinstance(start, bool)
        and 0 <= start < end <= len(text)
    )
    if ok and (not sentence or text[start:end] == sentence):
        return Highlight(text[:start], text[start:end], text[end:])
    if sentence:
        at = text.find(sentence)
        if at >= 0:
            return Highlight(text[:at], sentence, text[at + len(sentence) :])
    return Highlight(text, "", "")


@dataclass
class CitedMaterial:
    """One material a claim cites, as the reviewer sees it."""

    id: str
    retrieved: bool
    title: str = ""
    source: str | None = None
    score: Any = None
    stale: str | None = None
    text: Highlight | None = None
    supports: bool = False


@dataclass
class ClaimView:
    """One claim of the candidate answer with its verdict and cited materials."""

    text: str
    verdict: str
    score: Any
    reason: str
    materials: list[CitedMaterial] = field(default_factory=list)


@dataclass
class SampleView:
    """One sampled answer."""

    index: Any
    answer: str | None
    error: str | None
    chosen: bool
    in_group: bool


def _stale(material: Mapping[str, Any]) -> str | None:
    meta = material.get("metadata") if isinstance(material.get("metadata"), Mapping) else {}
    if meta.get("superseded_by"):
        return f"superseded by {meta['superseded_by']}"
    if meta.get("status") in {"superseded", "stale", "withdrawn", "expired"}:
        return f"marked {meta['status']}"
    if meta.get("valid_until"):
        return f"valid until {meta['valid_until']}"
    return None


def claim_views(trail: RequestTrail) -> list[ClaimView]:
    """Each claim with every cited material, the supporting sentence marked in its text."""
    materials = {str(m.get("id")): m for m in trail.materials}
    out: list[ClaimView] = []
    for claim in trail.claims:
        view = ClaimView(
            text=str(claim.get("text") or ""),
            verdict=str(claim.get("verdict") or "?"),
            score=claim.get("score"),
            reason=str(claim.get("reason") or ""),
        )
        support_id = claim.get("material_id")
        sentence = claim.get("sentence") or claim.get("quote")
        for cid in [str(c) for c in claim.get("cited_ids") or []]:
            m = materials.get(cid)
            if m is None:
                view.materials.append(CitedMaterial(id=cid, retrieved=False))
                continue
            text = str(m.get("text") or "")
            supports = support_id is not None and str(support_id) == cid and bool(sentence)
            view.materials.append(
                CitedMaterial(
                    id=cid,
                    retrieved=True,
                    title=str(m.get("title") or cid),
                    source=m.get("source"),
                    score=m.get("score"),
                    stale=_stale(m),
                    text=highlight(text, claim.get("start"), claim.get("end"), sentence)
                    if supports
                    else Highlight(text, "", ""),
                    supports=supports,
                )
            )
        out.append(view)
    return out


def sample_views(trail: RequestTrail) -> list[SampleView]:
    """The sampled answers, the chosen one and its agreeing group marked."""
    selection = _dig(trail.signals, "selection", default={}) or {}
    chosen = selection.get("sample_index")
    group = set(selection.get("group") or [])
    out = []
    for i, s in enumerate(trail.samples):
        if not isinstance(s, Mapping):
            out.append(SampleView(i, str(s), None, False, False))
            continue
        index = s.get("index", i)
        out.append(
            SampleView(
                index=index,
                answer=s.get("answer"),
                error=s.get("error"),
                chosen=index == chosen,
                in_group=index in group,
            )
        )
    return out


@dataclass(frozen=True)
class Why:
    """One signal that sent a request to a person, and the signals-table row it belongs to."""

    text: str
    row: str


CONSISTENCY_FLOOR = 0.6  # a self-consistency below this is named as a reason


def why(trail: RequestTrail) -> list[Why]:
    """The signals that sent a request to review, most telling first."""
    rec = trail.record
    citations = _dig(trail.signals, "citations", default={}) or {}
    selection = _dig(trail.signals, "selection", default={}) or {}
    consistency = _dig(trail.signals, "consistency", default={}) or {}
    out: list[Why] = []
    for mid in citations.get("fabricated") or []:
        out.append(Why(f"fabricated citation: {mid} was never retrieved", "fabricated citations"))
    for mid in citations.get("stale") or []:
        out.append(Why(f"stale citation to {mid}", "outdated materials cited"))
    verdicts = [str(c.get("verdict")) for c in trail.claims if isinstance(c, Mapping)]
    if verdicts.count("uncited"):
        out.append(Why(f"{verdicts.count('uncited')} uncited claim(s)", "citation coverage"))
    if verdicts.count("unsupported"):
        out.append(
            Why(f"{verdicts.count('unsupported')} claim(s) not supported", "citation accuracy")
        )
    for rule in _dig(trail.signals, "rules", default=[]) or []:
        if isinstance(rule, Mapping) and rule.get("passed") is False:
            detail = f" ({rule.get('detail')})" if rule.get("detail") else ""
            out.append(Why(f"rule {rule.get('name')} failed{detail}", f"rule {rule.get('name')}"))
    share = selection.get("share", consistency.get("agreement"))
    if isinstance(share, (int, float)) and share < CONSISTENCY_FLOOR:
        out.append(Why(f"self-consistency {share:.2f}", "self-consistency"))
    plan = rec.get("plan") if isinstance(rec.get("plan"), Mapping) else None
    if plan is not None and plan.get("ok") is False:
        out.append(Why("the plan failed", "plan"))
    if trail.errors:
        out.append(Why(f"{len(trail.errors)} error(s) during the request", "errors"))
    caps = _dig(rec, "response", "signal_detail", "confidence_caps", default=[]) or []
    if caps:
        out.append(Why("confidence capped by " + ", ".join(map(str, caps)), "confidence capped by"))
    if not out:
        confidence = rec.get("confidence")
        text = f"confidence {confidence:.2f}" if isinstance(confidence, float) else "low confidence"
        out.append(Why(text, "confidence"))
    return out


@dataclass(frozen=True)
class SignalRow:
    """One row of the signals table; ``flagged`` when it is why the request was routed."""

    name: str
    value: str
    flagged: bool = False


def signal_rows(trail: RequestTrail, flagged: set[str] | None = None) -> list[SignalRow]:
    """The signals behind the confidence, the ones that routed the request flagged."""
    flagged = flagged if flagged is not None else {w.row for w in why(trail)}
    rec = trail.record
    citations = _dig(trail.signals, "citations", default={}) or {}
    consistency = _dig(trail.signals, "consistency", default={}) or {}
    selection = _dig(trail.signals, "selection", default={}) or {}
    retrieval = rec.get("retrieval") if isinstance(rec.get("retrieval"), Mapping) else {}
    plan = rec.get("plan") if isinstance(rec.get("plan"), Mapping) else None

    def fmt(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, bool):
            return "yes" if value else "no"
        if isinstance(value, float):
            return f"{value:.2f}"
        if isinstance(value, list):
            return ", ".join(map(str, value)) or "none"
        return str(value)

    rows = [
        ("confidence", fmt(rec.get("confidence"))),
        ("decision", fmt(rec.get("decision"))),
        ("citation score", fmt(citations.get("score"))),
        ("citation coverage", fmt(citations.get("coverage"))),
        ("citation accuracy", fmt(citations.get("accuracy"))),
        ("fabricated citations", fmt(citations.get("fabricated") or [])),
        ("outdated materials cited", fmt(citations.get("stale") or [])),
        ("self-consistency", fmt(selection.get("share", consistency.get("agreement")))),
        ("conclusion groups", fmt(consistency.get("n_groups"))),
        ("semantic entropy", fmt(consistency.get("entropy"))),
        ("plan", "-" if plan is None else ("ok" if plan.get("ok", True) else "FAILED")),
        ("retrieval top score", fmt(retrieval.get("top_score"))),
        ("retrieval margin", fmt(retrieval.get("score_margin"))),
        ("errors", str(len(trail.errors))),
    ]
    for rule in _dig(trail.signals, "rules", default=[]) or []:
        if isinstance(rule, Mapping):
            state = "pass" if rule.get("passed") else "FAIL"
            detail = f" — {rule.get('detail')}" if rule.get("detail") else ""
            rows.append((f"rule {rule.get('name')}", f"{state}{detail}"))
    caps = _dig(rec, "response", "signal_detail", "confidence_caps", default=[]) or []
    if caps:
        rows.append(("confidence capped by", fmt(caps)))
    return [SignalRow(name, value, name in flagged) for name, value in rows]


def uncited_materials(trail: RequestTrail) -> list[CitedMaterial]:
    """Materials that were retrieved but cited by no claim (e.g. the current policy when the
    answer cited a superseded one)."""
    cited = {str(c) for claim in trail.claims for c in (claim.get("cited_ids") or [])}
    out = []
    for m in trail.materials:
        mid = str(m.get("id"))
        if mid in cited:
            continue
        out.append(
            CitedMaterial(
                id=mid,
                retrieved=True,
                title=str(m.get("title") or mid),
                source=m.get("source"),
                score=m.get("score"),
                stale=_stale(m),
                text=Highlight(str(m.get("text") or ""), "", ""),
            )
        )
    return out


_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]")


def lang_of(text: str | None) -> str:
    """A BCP 47 tag for a user text: ``zh`` when it has CJK characters, else ``en``."""
    return "zh" if text and _CJK.search(text) else "en"


def when(value: Any) -> str:
    """An ISO timestamp for people: ``2026-11-30 15:08 UTC`` (unchanged when unparseable)."""
    if not value:
        return "-"
    try:
        moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return str(value)
    if moment.tzinfo is not None:
        moment = moment.astimezone(timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def item_context(
    trail: RequestTrail, trace_ui: tuple[str, str | None] | None = None
) -> dict[str, Any]:
    """Everything the item page shows about one queued request."""
    rec = trail.record
    response = rec.get("response") if isinstance(rec.get("response"), Mapping) else {}
    decision = trail.review_decision
    reasons = why(trail)
    trace_id = rec.get("trace_id")
    trace_url = None
    if trace_ui is not None and trace_id:
        from tracerag.tracing import trace_link

        try:
            trace_url = trace_link(str(trace_id), trace_ui[0], trace_ui[1])
        except ValueError:
            trace_url = None
    return {
        "why": reasons,
        "uncited": uncited_materials(trail),
        "trace_url": trace_url,
        "trace_backend": trace_ui[0] if trace_ui else None,
        "request_id": trail.request_id,
        "question": rec.get("question") or "",
        "trace_id": rec.get("trace_id"),
        "ticket_id": response.get("ticket_id"),
        "started_at": rec.get("started_at"),
        "route": rec.get("decision"),
        "confidence": rec.get("confidence"),
        "candidate": candidate_answer(rec),
        "samples": sample_views(trail),
        "signals": signal_rows(trail, {w.row for w in reasons}),
        "claims": claim_views(trail),
        "review": trail.review,
        "decision": decision.payload if decision is not None else None,
        "decided_by": decision.actor if decision is not None else None,
        "decided_at": decision.created_at if decision is not None else None,
        "versions": rec.get("versions") or {},
    }
