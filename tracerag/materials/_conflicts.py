"""Conflicts between materials: the same quantity (fee, period, date) stated with different values.

A quantity's *slot* is what it is about: its kind and unit (``duration``/``day``, ``money``/
``CNY``) and the content terms of the clause it sits in, numbers left out. Two quantities fill
the same slot when kind and unit agree and their clause terms overlap by at least
``min_overlap`` (Jaccard). Plain numbers (``Clause 4.2``) are not compared.

``answer_conflicts`` is the pure check the assemble stage calls: which open conflicts an answer
touches through the materials it cites (an answer citing either side goes to review).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tracerag.text._quantities import extract_quantities
from tracerag.text._words import content_terms

COMPARED_KINDS = frozenset({"money", "percent", "date", "duration"})
DEFAULT_MIN_OVERLAP = 0.5
_CLAUSE_SPLIT = re.compile(r"[,;:，；：。！？!?\n]|(?<=[a-z])\.(?=\s|$)")
_DIGITS = re.compile(r"^[\d.,]+$")


@dataclass(frozen=True)
class Slot:
    """One quantity in a material, with what it is about."""

    kind: str
    unit: str
    value: float | str
    raw: str
    terms: frozenset[str]

    @property
    def key(self) -> str:
        """A readable key: kind/unit and the clause terms."""
        return f"{self.kind}/{self.unit}:" + " ".join(sorted(self.terms))


@dataclass(frozen=True)
class Conflict:
    """Two materials stating different values for the same quantity."""

    material_a: str
    material_b: str
    key: str
    value_a: str
    value_b: str
    overlap: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form."""
        return dict(self.__dict__)


def _clauses(text: str) -> list[tuple[int, int]]:
    spans, start = [], 0
    for m in _CLAUSE_SPLIT.finditer(text):
        spans.append((start, m.start()))
        start = m.end()
    spans.append((start, len(text)))
    return spans


def quantity_slots(text: str) -> list[Slot]:
    """The compared quantities of a text, each with the terms of its clause."""
    slots = []
    clauses = _clauses(text)
    for q in extract_quantities(text):
        if q.kind not in COMPARED_KINDS:
            continue
        start, end = next(((a, b) for a, b in clauses if a <= q.start < b), (0, len(text)))
        clause = text[start : q.start] + " " + text[q.end : end]
        terms = frozenset(t for t in content_terms(clause) if not _DIGITS.match(t))
        slots.append(Slot(q.kind, q.unit, q.key[1], q.raw, terms))
    return slots


def _overlap(a: frozenset[str], b: frozenset[str]) -> float:
    if not a or not b:
        return 0.0
    return len(a & b) / len(a | b)


def compare(
    id_a: str,
    text_a: str,
    id_b: str,
    text_b: str,
    min_overlap: float = DEFAULT_MIN_OVERLAP,
) -> list[Conflict]:
    """The slots two materials share with different values (at most one conflict per slot)."""
    found: list[Conflict] = []
    slots_b = quantity_slots(text_b)
    for sa in quantity_slots(text_a):
        for sb in slots_b:
            if (sa.kind, sa.unit) != (sb.kind, sb.unit):
                continue
            overlap = _overlap(sa.terms, sb.terms)
            if overlap < min_overlap:
                continue
            # the other material states the same value for this slot: no conflict on it
            if any(
                (o.kind, o.unit, o.value) == (sa.kind, sa.unit, sa.value)
                and _overlap(sa.terms, o.terms) >= min_overlap
                for o in slots_b
            ):
                continue
            key = sa.key
            if any(c.key == key for c in found):
                continue
            found.append(Conflict(id_a, id_b, key, sa.raw, sb.raw, round(overlap, 6)))
    return found


def find_conflicts(
    material_id: str,
    text: str,
    others: Iterable[tuple[str, str]],
    min_overlap: float = DEFAULT_MIN_OVERLAP,
) -> list[Conflict]:
    """Conflicts between one material and each of ``others`` (``(id, text)`` pairs)."""
    out: list[Conflict] = []
    for other_id, other_text in others:
        if other_id == material_id:
            continue
        out += compare(material_id, text, other_id, other_text, min_overlap)
    return out


def answer_conflicts(
    cited_ids: Sequence[str], open_conflicts: Iterable[Conflict | Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The open conflicts that involve any cited material; non-empty means: send to review."""
    cited = {str(c) for c in cited_ids}
    hits = []
    for conflict in open_conflicts:
        data = conflict.to_dict() if isinstance(conflict, Conflict) else dict(conflict)
        if data.get("material_a") in cited or data.get("material_b") in cited:
            hits.append(data)
    return hits


__all__ = [
    "COMPARED_KINDS",
    "Conflict",
    "Slot",
    "answer_conflicts",
    "compare",
    "find_conflicts",
    "quantity_slots",
]
