"""What ``tracerag explain`` will try on a stored request, and what it will cost.

The experiments' targets (the materials to mask, the values to change, the rewordings), the
number of model calls they need, known before any is made, and the refusal above the cap.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tracerag._settings import PlanMode, Tier
from tracerag.errors import TraceragError
from tracerag.signals._attribution import ClaimLink, attribute
from tracerag.store._audit_record import AuditRecord
from tracerag.text._quantities import Quantity, extract_quantities, quantities_match
from tracerag.tools._replay import (
    candidate_answer,
    recorded_options,
)

__all__ = [
    "DEFAULT_MAX_CALLS",
    "FLAG_NO_DECISIVE",
    "FLAG_PRIOR",
    "FLAG_UNSTABLE",
    "FOLLOWS",
    "IGNORES",
    "PLACEHOLDER",
    "TARGET_KINDS",
    "UNCLEAR",
    "CostTooHigh",
    "ExperimentPlan",
    "Target",
    "calls_per_run",
    "counterfactual_text",
    "light_paraphrases",
    "plan_experiments",
    "recorded_attribution",
]

DEFAULT_MAX_CALLS = 200
PLACEHOLDER = "[This material is withheld for an attribution experiment.]"
FOLLOWS = "follows"
IGNORES = "ignores"
UNCLEAR = "unclear"
FLAG_PRIOR = "answering_from_prior"
FLAG_UNSTABLE = "unstable_retrieval"
FLAG_NO_DECISIVE = "no_decisive_material"


class CostTooHigh(TraceragError):
    """The experiments would make more model calls than the cap allows."""


# -- the plan -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A value to change in a material: the quantity, and the text that replaces it."""

    material_id: str
    quantity: Quantity
    replacement: str


@dataclass(frozen=True)
class ExperimentPlan:
    """Which experiments run on a request, and the model calls they cost."""

    occlude: tuple[str, ...]
    counterfactuals: tuple[Target, ...]
    paraphrases: tuple[str, ...]
    calls_per_run: int
    notes: tuple[str, ...] = ()

    @property
    def runs(self) -> int:
        """Re-runs: the baseline and one per experiment."""
        return 1 + len(self.occlude) + len(self.counterfactuals) + len(self.paraphrases)

    @property
    def model_calls(self) -> int:
        return self.runs * self.calls_per_run


def calls_per_run(record: Mapping[str, Any]) -> int:
    """Model calls one re-run makes without retries: the samples, and a separate plan call."""
    options = recorded_options(record)
    tier, n = options["tier"], int(options["n_samples"])
    if tier == Tier.LOW:
        n = 1
    elif tier == Tier.MEDIUM:
        n = min(n, 3)
    plan_call = tier == Tier.HIGH and options["plan"] == PlanMode.SEPARATE
    return n + (1 if plan_call else 0)


@dataclass(frozen=True)
class _StoredMaterial:
    id: str
    text: str
    score: float | None
    metadata: Mapping[str, Any]


def _stored_materials(record: Mapping[str, Any]) -> list[_StoredMaterial]:
    out = []
    for m in record.get("materials") or []:
        if isinstance(m, Mapping):
            score = m.get("score")
            out.append(
                _StoredMaterial(
                    str(m.get("id")),
                    str(m.get("text") or ""),
                    float(score) if isinstance(score, (int, float)) else None,
                    dict(m.get("metadata") or {}),
                )
            )
    return out


def recorded_attribution(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record's tier 1–2 attribution, computed from its claims when it predates them."""
    audit = AuditRecord.parse(record)
    stored = audit.signals.attribution
    if stored is not None and stored.get("materials") is not None:
        return dict(stored)
    materials = _stored_materials(record)
    ids = {m.id for m in materials}
    claims = []
    for c in audit.citations.claims:
        cited = tuple(i for i in dict.fromkeys(c.cited_ids) if i in ids)
        claims.append(ClaimLink(str(c.verdict), cited, c.material_id))
    return attribute(audit.question or "", materials, claims).to_record()


_DIGITS_RE = re.compile(r"\d+(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")
_CN_NUMBER_RE = re.compile(r"[零〇一二两三四五六七八九十百千万亿]+")
_EN_NUMBER_RE = re.compile(
    r"\b(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|fifteen|twenty|"
    r"thirty|forty|fifty|sixty|ninety|hundred)\b",
    re.I,
)
_YEAR_RE = re.compile(r"(?<!\d)[12]\d{3}(?!\d)")


def _changed_number(value: float) -> float:
    new = value * 1.6
    if float(value).is_integer():
        new = float(round(new))
        if new == value:
            new = value + 1
    return round(new, 2)


def _number_text(value: float, like: str) -> str:
    text = str(int(value)) if float(value).is_integer() else f"{value:g}"
    if "," in like and float(value).is_integer():
        text = f"{int(value):,}"
    return text


def counterfactual_text(q: Quantity) -> str | None:
    """The quantity's text with a clearly different value (500元 → 800元, a year later), or None.

    Numbers become 1.6 times as large (rounded); a date moves one year on. The result must read
    back as a quantity of the same kind with another value, else None.
    """
    raw = q.raw
    if q.kind == "date":
        m = _YEAR_RE.search(raw)
        if m is None:
            return None
        new = f"{raw[: m.start()]}{int(m.group()) + 1}{raw[m.end() :]}"
    else:
        m = _DIGITS_RE.search(raw)
        if m is not None:
            number = float(m.group().replace(",", ""))
            span = (m.start(), m.end())
            like = m.group()
        else:
            m = _CN_NUMBER_RE.search(raw) or _EN_NUMBER_RE.search(raw)
            if m is None or q.number is None:
                return None
            number, span, like = float(q.number), (m.start(), m.end()), ""
        replacement = _number_text(_changed_number(number), like)
        new = f"{raw[: span[0]]}{replacement}{raw[span[1] :]}"
    again = [x for x in extract_quantities(new) if x.kind == q.kind]
    if len(again) != 1 or again[0].key == q.key:
        return None
    return new


#: kinds of stated value a counterfactual changes, first choice first
TARGET_KINDS = ("money", "duration", "date", "percent", "number")


def _worth_changing(q: Quantity) -> bool:
    # a bare decimal is most often a clause or version number ("Clause 6.1"), not a fact
    return q.kind in TARGET_KINDS and not (q.kind == "number" and not float(q.value).is_integer())


def _targets(
    record: Mapping[str, Any], used: Sequence[str], limit: int
) -> tuple[list[Target], list[str]]:
    answer = candidate_answer(record) or ""
    stated = extract_quantities(answer)
    by_id = {m.id: m for m in _stored_materials(record)}
    targets: list[Target] = []
    notes: list[str] = []
    if not stated:
        notes.append("counterfactual skipped: the answer states no amount, date or duration")
        return targets, notes
    for mid in used:
        material = by_id.get(mid)
        if material is None or len(targets) >= limit:
            continue
        taken = [q for q in extract_quantities(material.text) if _worth_changing(q)]
        taken.sort(key=lambda q: TARGET_KINDS.index(q.kind))
        for q in taken:
            if not any(quantities_match(a, [q]) for a in stated):
                continue
            replacement = counterfactual_text(q)
            if replacement is not None:
                targets.append(Target(mid, q, replacement))
                break
    if not targets:
        notes.append("counterfactual skipped: no value the answer states could be changed")
    return targets, notes


_POLITE_ZH = ("请问", "您好，", "你好，")
_POLITE_EN = re.compile(r"^(?:please|could you tell me|can you tell me)[,:]?\s+", re.I)


def light_paraphrases(question: str) -> list[str]:
    """One light rewording of the question: a polite opening added or removed.

    Content words stay; pass real paraphrases to ``explain`` to test more than wording.
    """
    q = question.strip()
    if re.search(r"[\u4e00-\u9fff]", q):
        for prefix in _POLITE_ZH:
            if q.startswith(prefix):
                return [q[len(prefix) :].lstrip("，, ")]
        return [f"请问{q}"]
    m = _POLITE_EN.match(q)
    if m:
        rest = q[m.end() :]
        return [rest[:1].upper() + rest[1:]]
    return [f"Could you tell me: {q[:1].lower()}{q[1:]}"]


def plan_experiments(
    record: Mapping[str, Any],
    *,
    counterfactuals: int = 2,
    paraphrases: Sequence[str] | None = None,
) -> ExperimentPlan:
    """The experiments for a stored request: occlusion of every used material, counterfactuals
    on up to ``counterfactuals`` values the answer states, and the given ``paraphrases``."""
    attribution = recorded_attribution(record)
    used = [str(m["id"]) for m in attribution.get("materials") or [] if m.get("used")]
    notes: list[str] = []
    if not used:
        notes.append("no material supports the answer: nothing to occlude")
    targets, more = _targets(record, used, counterfactuals) if counterfactuals else ([], [])
    notes += more
    return ExperimentPlan(
        occlude=tuple(used),
        counterfactuals=tuple(targets),
        paraphrases=tuple(paraphrases or ()),
        calls_per_run=calls_per_run(record),
        notes=tuple(notes),
    )
