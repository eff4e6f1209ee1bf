"""One confidence from the signals.

The default combiner (``heuristic-v1``) is the weighted geometric mean of the measured signals:

    confidence = citation_score ** (w_c / W) * self_consistency ** (w_s / W)    (W = w_c + w_s)

where ``citation_score`` is the share of the chosen answer's claims that its cited materials
support, and ``self_consistency`` is the share of samples whose conclusion agrees with it
(failed samples agree with nothing). A signal that was not measured (e.g. consistency at
temperature 0) drops out of the mean. Then: a failed plan multiplies by 0.9, each failed
optional rule by 0.85, and two caps apply: a fabricated citation or a failed required rule caps
the confidence just below the escalation threshold. A weak signal cannot be averaged away: if
either signal is 0 the confidence is 0.

A fitted calibration (``tracerag calibrate``) plugs in through the same ``Combiner`` protocol.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tracerag.signals._rules import RuleResult


@dataclass(frozen=True)
class Signals:
    """The measured signals a combiner sees (None: not measured)."""

    citation_score: float | None = None
    fabricated: bool = False
    self_consistency: float | None = None
    consistency_informative: bool = True
    plan_ok: bool | None = None
    rules: Sequence[RuleResult] = ()
    retrieval_margin: float | None = None
    retrieval_top_score: float | None = None
    samples_ok: int = 0
    n_samples: int = 0
    semantic_entropy: float | None = None
    citation_coverage: float | None = None
    #: False: the answer does not address the question (the router sends a passing answer to
    #: review whatever the combiner says); None: not judged
    answers_question: bool | None = None


@dataclass(frozen=True)
class Combined:
    """A confidence, what capped it, and the parts it was made of."""

    value: float
    caps: list[str] = field(default_factory=list)
    parts: dict[str, float] = field(default_factory=dict)


class Combiner(Protocol):
    """Turns signals into a confidence in [0, 1]; ``cap`` is just below the escalation line."""

    @property
    def name(self) -> str:
        """The combiner's name, recorded with every confidence it makes."""
        ...

    def __call__(self, signals: Signals, *, cap: float) -> Combined: ...


@dataclass(frozen=True)
class HeuristicCombiner:
    """The documented default: weighted geometric mean with caps (see module docstring)."""

    citation_weight: float = 1.0
    consistency_weight: float = 1.0
    failed_plan_factor: float = 0.9
    failed_rule_factor: float = 0.85
    name: str = "heuristic-v1"

    def __call__(self, signals: Signals, *, cap: float) -> Combined:
        if signals.samples_ok == 0:
            return Combined(0.0, ["no successful sample"])
        weighted: list[tuple[float, float]] = []
        parts: dict[str, float] = {}
        if signals.citation_score is not None:
            weighted.append((signals.citation_score, self.citation_weight))
            parts["citation"] = signals.citation_score
        if signals.self_consistency is not None and signals.consistency_informative:
            weighted.append((signals.self_consistency, self.consistency_weight))
            parts["consistency"] = signals.self_consistency
        value = _geometric_mean(weighted) if weighted else 0.0
        if signals.plan_ok is False:
            value *= self.failed_plan_factor
            parts["plan_factor"] = self.failed_plan_factor
        return finish(value, signals, cap=cap, parts=parts, rule_factor=self.failed_rule_factor)


def hard_caps(signals: Signals) -> list[str]:
    """What forces a confidence below the escalation line: fabrication, failed required rules."""
    caps = ["fabricated citation"] if signals.fabricated else []
    caps.extend(
        f"required rule failed: {r.name}" for r in signals.rules if r.required and not r.passed
    )
    return caps


def finish(
    value: float,
    signals: Signals,
    *,
    cap: float,
    parts: dict[str, float],
    rule_factor: float = 0.85,
) -> Combined:
    """Apply the failed-optional-rule factor and the hard caps; clamp to [0, 1]."""
    for result in signals.rules:
        if not result.passed and not result.required:
            value *= rule_factor
            parts[f"rule:{result.name}"] = rule_factor
    caps = hard_caps(signals)
    if caps:
        value = min(value, cap)
    return Combined(round(min(1.0, max(0.0, value)), 4), caps, parts)


def _geometric_mean(weighted: list[tuple[float, float]]) -> float:
    total = sum(w for _, w in weighted)
    if any(v <= 0.0 for v, _ in weighted):
        return 0.0
    return math.exp(sum(w * math.log(v) for v, w in weighted) / total)
