"""Self-consistency: do N sampled answers reach the same conclusion?

Samples are grouped by an equivalence (pluggable: any ``(a, b) -> bool``); the default compares
conclusions, not wording: citation markers and case are dropped, numbers, amounts and dates must
not contradict, negation must agree, and the key terms must largely overlap. The report gives the
share of the largest group, the number of groups, and the (discrete) semantic entropy over the
groups (Farquhar et al., Nature 2024).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from tracerag.signals._claims import strip_citations
from tracerag.text._negation import is_negated
from tracerag.text._quantities import extract_quantities
from tracerag.text._words import content_terms

Equivalence = Callable[[str, str], bool]


@dataclass(frozen=True)
class Conclusion:
    """What an answer concludes, normalised for comparison."""

    terms: frozenset[str]
    quantities: frozenset[tuple[Any, ...]]
    negated: bool


@lru_cache(maxsize=4096)
def conclusion(answer: str) -> Conclusion:
    """The normalised conclusion of an answer."""
    text = strip_citations(answer)
    return Conclusion(
        terms=frozenset(content_terms(text)),
        quantities=frozenset(q.key for q in extract_quantities(text)),
        negated=is_negated(text),
    )


@dataclass(frozen=True)
class ConclusionEquivalence:
    """Default equivalence: compatible quantities, same polarity, overlapping key terms."""

    min_overlap: float = 0.6

    def __call__(self, a: str, b: str) -> bool:
        ca, cb = conclusion(a), conclusion(b)
        if ca.negated != cb.negated:
            return False
        if not _quantities_compatible(ca.quantities, cb.quantities):
            return False
        if not ca.terms or not cb.terms:
            return ca.terms == cb.terms
        overlap = len(ca.terms & cb.terms) / min(len(ca.terms), len(cb.terms))
        return overlap >= self.min_overlap


def _quantities_compatible(a: frozenset[tuple[Any, ...]], b: frozenset[tuple[Any, ...]]) -> bool:
    # one answer may state fewer facts, but none may state a different value for the same kind
    if a <= b or b <= a:
        return True
    kinds_a = {(k[0], k[2] if len(k) > 2 else None) for k in a - b}
    kinds_b = {(k[0], k[2] if len(k) > 2 else None) for k in b - a}
    return not (kinds_a & kinds_b)


@dataclass
class ConsistencyReport:
    """How far the samples agree."""

    agreement: float = 0.0  # share of all samples in the largest group
    n_groups: int = 0
    entropy: float = 0.0  # discrete semantic entropy over groups, in nats
    groups: list[list[int]] = field(default_factory=list)  # sample indices, largest first
    n_samples: int = 0
    n_failed: int = 0
    informative: bool = True
    note: str = ""


def score_consistency(
    answers: Sequence[str | None],
    *,
    equivalence: Equivalence | None = None,
    informative: bool = True,
    note: str = "",
) -> ConsistencyReport:
    """Group answers by conclusion; ``None`` answers are failed samples and agree with nothing."""
    equal = equivalence or ConclusionEquivalence()
    groups: list[list[int]] = []
    failed = 0
    for i, answer in enumerate(answers):
        if answer is None or not answer.strip():
            failed += 1
            continue
        for group in groups:
            if equal(answers[group[0]] or "", answer):
                group.append(i)
                break
        else:
            groups.append([i])
    groups.sort(key=len, reverse=True)
    n = len(answers)
    report = ConsistencyReport(
        groups=groups,
        n_groups=len(groups),
        n_samples=n,
        n_failed=failed,
        informative=informative and n - failed >= 2,
        note=note,
    )
    if n and groups:
        report.agreement = len(groups[0]) / n
        shares = [len(g) / n for g in groups] + ([failed / n] if failed else [])
        report.entropy = round(-sum(p * math.log(p) for p in shares if p > 0), 6) + 0.0
    if report.informative is False and not note:
        report.note = "fewer than two successful samples"
    return report
