"""One configuration's results in ``tracerag eval``: the question set, the arms, the outcomes.

A question set (JSON lines) and the two arms (``prompt@V,model@M``) read and checked; each
answer's outcome (route, confidence, expected answer found); an arm's indicators summarised.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracerag._routing import ESCALATE, PASS, REVIEW
from tracerag._settings import TIERS
from tracerag.errors import InputError
from tracerag.signals._claims import strip_citations
from tracerag.signals._support import support
from tracerag.store._codec import RequestTrail, entries_from_record
from tracerag.tools._metrics import from_trails

__all__ = [
    "ARM_KEYS",
    "DECISIONS",
    "DEFAULT_GATE",
    "DEFAULT_MARGIN",
    "INDICATORS",
    "RUN_CHANNEL",
    "Arm",
    "ArmResult",
    "EvalQuestion",
    "Outcome",
    "answer_matches",
    "confidence_distribution",
    "load_questions",
    "outcome_of",
    "parse_arm",
    "summarize_arm",
]


DECISIONS = (PASS, REVIEW, ESCALATE)
DEFAULT_MARGIN = 0.02
#: name -> (label, higher is better)
INDICATORS: dict[str, tuple[str, bool]] = {
    "coverage": ("citation coverage", True),
    "accuracy": ("citation accuracy", True),
    "interception": ("interception rate (adversarial)", True),
    "review": ("review rate", False),
    "escalation": ("escalation rate", False),
    "answers": ("answers as expected", True),
    "decisions": ("decisions as expected", True),
}
DEFAULT_GATE = ("coverage", "accuracy", "interception", "review", "escalation")
ARM_KEYS = ("prompt", "model", "samples", "tier")
RUN_CHANNEL = "evaluation"


# ---------------------------------------------------------------------------------------------
# Inputs


@dataclass(frozen=True)
class Arm:
    """One configuration: a prompt version and a model, optionally samples and tier."""

    prompt: str = "v1"
    model: str = "extractive"
    samples: int | None = None
    tier: str | None = None

    @property
    def label(self) -> str:
        parts = [f"prompt@{self.prompt}", f"model@{self.model}"]
        if self.samples is not None:
            parts.append(f"samples@{self.samples}")
        if self.tier is not None:
            parts.append(f"tier@{self.tier}")
        return ",".join(parts)


def parse_arm(text: str) -> Arm:
    """``"prompt@v1,model@extractive[,samples@5][,tier@high]"`` → Arm; InputError if unreadable."""
    values: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in str(text).split(","))):
        key, sep, value = item.partition("@")
        key, value = key.strip(), value.strip()
        if not sep or not value or key not in ARM_KEYS:
            raise InputError(
                f"cannot read {item!r} in {text!r}: use KEY@VALUE with KEY one of "
                f"{', '.join(ARM_KEYS)} (e.g. prompt@v1,model@extractive)"
            )
        if key in values:
            raise InputError(f"{key} is given twice in {text!r}")
        values[key] = value
    samples = values.get("samples")
    if samples is not None and (not samples.isdigit() or int(samples) < 1):
        raise InputError(f"samples@{samples}: need a positive whole number")
    tier = values.get("tier")
    if tier is not None and tier not in TIERS:
        raise InputError(f"tier@{tier}: choose high, medium or low")
    return Arm(
        prompt=values.get("prompt", "v1"),
        model=values.get("model", "extractive"),
        samples=int(samples) if samples is not None else None,
        tier=tier,
    )


@dataclass(frozen=True)
class EvalQuestion:
    """One question of the set, with what is expected of its answer (each optional)."""

    id: str
    question: str
    expected_answer: str | None = None
    expected_decision: str | None = None


def load_questions(path: str | Path) -> list[EvalQuestion]:
    """The question set from a JSON-lines file; InputError naming the line that is wrong."""
    out: list[EvalQuestion] = []
    seen: set[str] = set()
    text = Path(path).read_text(encoding="utf-8")
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise InputError(f"{path}:{number}: not JSON ({exc})") from None
        if not isinstance(row, dict) or not isinstance(row.get("question"), str):
            raise InputError(f"{path}:{number}: need an object with a 'question' string")
        if not row["question"].strip():
            raise InputError(f"{path}:{number}: the question is empty")
        decision = row.get("expected_decision")
        if decision is not None and decision not in DECISIONS:
            raise InputError(
                f"{path}:{number}: expected_decision {decision!r} is not one of {DECISIONS}"
            )
        answer = row.get("expected_answer")
        if answer is not None and (not isinstance(answer, str) or not answer.strip()):
            raise InputError(f"{path}:{number}: expected_answer must be a non-empty string")
        qid = str(row.get("id") or f"q{number}")
        if qid in seen:
            raise InputError(f"{path}:{number}: id {qid!r} is used twice")
        seen.add(qid)
        out.append(EvalQuestion(qid, row["question"].strip(), answer, decision))
    if not out:
        raise InputError(f"{path}: no questions")
    return out


# ---------------------------------------------------------------------------------------------
# One configuration's results


@dataclass(frozen=True)
class Outcome:
    """What happened to one question under one configuration."""

    question_id: str
    request_id: str
    decision: str | None
    confidence: float | None
    latency_s: float | None
    tokens: int | None
    cost: float | None
    answer_as_expected: bool | None = None
    decision_as_expected: bool | None = None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return None if math.isnan(value) else float(value)


def answer_matches(expected: str, answer: str | None) -> bool:
    """Whether the answer states the expected answer (lexical support, citations removed)."""
    if not answer or not answer.strip():
        return False

    return bool(support(expected, strip_citations(answer), backend="lexical").supported)


def outcome_of(question: EvalQuestion, record: Mapping[str, Any]) -> Outcome:
    """The outcome of a question from its audit record."""
    decision = record.get("decision")
    response = record.get("response") or {}
    spent = record.get("usage") or {}
    cost = (spent.get("cost") or {}).get("total")
    answer = response.get("answer") if isinstance(response, Mapping) else None
    return Outcome(
        question_id=question.id,
        request_id=str(record.get("request_id")),
        decision=str(decision) if decision is not None else None,
        confidence=_number(record.get("confidence")),
        latency_s=_number((record.get("timings") or {}).get("request")),
        tokens=int(spent["total_tokens"]) if "total_tokens" in spent else None,
        cost=_number(cost),
        answer_as_expected=(
            answer_matches(question.expected_answer, answer)
            if question.expected_answer is not None
            else None
        ),
        decision_as_expected=(
            decision == question.expected_decision
            if question.expected_decision is not None
            else None
        ),
    )


def _percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100]) of the values, None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def confidence_distribution(
    confidences: Iterable[float | None], pass_at: float = 0.85, review_at: float = 0.6
) -> dict[str, Any]:
    """Mean, min, p10, p50, p90, max, and how many fall below ``review_at``, in
    ``[review_at, pass_at)`` and at or above ``pass_at``."""
    values = [c for c in confidences if c is not None]
    return {
        "n": len(values),
        "mean": round(sum(values) / len(values), 4) if values else None,
        "min": min(values) if values else None,
        "p10": _percentile(values, 10),
        "p50": _percentile(values, 50),
        "p90": _percentile(values, 90),
        "max": max(values) if values else None,
        "bands": {
            "below_review": sum(1 for c in values if c < review_at),
            "review_band": sum(1 for c in values if review_at <= c < pass_at),
            "pass_band": sum(1 for c in values if c >= pass_at),
        },
    }


def _share(flags: Iterable[bool | None]) -> float | None:
    known = [f for f in flags if f is not None]
    return sum(known) / len(known) if known else None


@dataclass
class ArmResult:
    """One configuration's indicators, routes, confidence, cost and latency over the set."""

    arm: str
    prompt_version: str
    model_version: str
    outcomes: list[Outcome]
    indicators: dict[str, float | None]
    counts: dict[str, int]
    confidence: dict[str, Any]
    cost: dict[str, Any]
    latency: dict[str, float | None]
    adversarial: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "arm": self.arm,
            "prompt_version": self.prompt_version,
            "model_version": self.model_version,
            "indicators": self.indicators,
            "counts": self.counts,
            "confidence": self.confidence,
            "cost": self.cost,
            "latency": self.latency,
            "adversarial": self.adversarial,
            "outcomes": [o.__dict__ for o in self.outcomes],
        }


def summarize_arm(
    arm: str,
    prompt_version: str,
    model_version: str,
    records: Sequence[Mapping[str, Any]],
    outcomes: Sequence[Outcome],
    adversarial: Mapping[str, Any],
) -> ArmResult:
    """One configuration's summary from its audit records, outcomes and adversarial result."""
    quality = from_trails(
        RequestTrail(str(r["request_id"]), entries_from_record(r)) for r in records
    )
    counts: dict[str, int] = {d: sum(1 for o in outcomes if o.decision == d) for d in DECISIONS}
    passed = counts[PASS]
    tokens = [o.tokens for o in outcomes if o.tokens is not None]
    costs = [o.cost for o in outcomes if o.cost is not None]
    total_cost = sum(costs) if costs and len(costs) == len(outcomes) else None
    latencies = [o.latency_s for o in outcomes if o.latency_s is not None]
    return ArmResult(
        arm=arm,
        prompt_version=prompt_version,
        model_version=model_version,
        outcomes=list(outcomes),
        indicators={
            "coverage": quality.citation_coverage,
            "accuracy": quality.citation_accuracy,
            "interception": adversarial.get("interception_rate"),
            "review": quality.human_review_rate,
            "escalation": quality.escalation_rate,
            "answers": _share(o.answer_as_expected for o in outcomes),
            "decisions": _share(o.decision_as_expected for o in outcomes),
        },
        counts=counts,
        confidence=confidence_distribution(o.confidence for o in outcomes),
        cost={
            "tokens_per_request": round(sum(tokens) / len(tokens), 1) if tokens else None,
            "model_calls": sum(int((r.get("usage") or {}).get("calls") or 0) for r in records),
            # adaptive sampling draws fewer where the route settles early: per request
            "calls_per_request": round(
                sum(int((r.get("usage") or {}).get("calls") or 0) for r in records) / len(records),
                2,
            )
            if records
            else None,
            "samples_per_request": round(
                sum(len(r.get("samples") or ()) for r in records) / len(records), 2
            )
            if records
            else None,
            "cost_total": total_cost,
            "cost_per_request": total_cost / len(outcomes) if total_cost is not None else None,
            "cost_per_passed_answer": total_cost / passed
            if total_cost is not None and passed
            else None,
            "tokens_per_passed_answer": round(sum(tokens) / passed, 1)
            if tokens and passed
            else None,
        },
        latency={
            "p50_s": _percentile(latencies, 50),
            "p95_s": _percentile(latencies, 95),
            "mean_s": round(sum(latencies) / len(latencies), 4) if latencies else None,
        },
        adversarial=dict(adversarial),
    )
