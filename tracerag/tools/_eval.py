"""``tracerag eval``: is version 2 better than version 1? A release gate for prompts and models.

``tracerag eval QUESTIONS.jsonl --baseline prompt@v1,model@extractive --candidate
prompt@v2-nocite,model@extractive`` answers every question of the set through the full pipeline
over the demo knowledge base once per configuration — same retriever, same seed, same sampling
— and compares them side by side:

- the five indicators: **citation coverage** and **citation accuracy** (means over verified
  requests, as ``tracerag metrics`` computes them), the **interception rate** of the
  adversarial self-test run on the configuration's own answers (mutated claims the verifier
  catches, all mutation kinds together), the **review rate** and the **escalation rate**;
- with expected answers or decisions in the question set: the share of answers that state the
  expected answer (the lexical support backend finds it in the answer) and the share of
  decisions as expected;
- pass / review / escalate counts, the confidence distribution, tokens and cost per request
  and per passed answer (``--prices``), latency;
- every question whose decision changed, with both request ids (``tracerag show ID``).

A configuration is ``key@value`` pairs separated by commas: ``prompt@NAME`` (a registered
prompt version, see ``tracerag.prompts``; the demo registers ``v1`` and the deliberately worse
``v2-nocite``), ``model@extractive|local``, optionally ``samples@N`` and ``tier@high|medium|low``.

The question set is JSON lines: ``{"question": ..., "id": ..., "expected_answer": ...,
"expected_decision": "pass|review|escalate"}`` (all but ``question`` optional).

Gate: the exit status is 1 when the candidate is worse than the baseline by more than the
margin (default 0.02, absolute) on any gated indicator (``--gate``, default the five), or
cannot be measured where the baseline could; 0 otherwise; 2 on a usage error. ``--json``
prints the report for CI.

Unless ``--no-store``, the run is kept in the audit store: every request, tagged with the run
(``evaluation_run`` in its record, ``channel`` ``evaluation``; these requests stay out of
``tracerag metrics`` and out of the review queue), and the run itself under its own id, whose
``evaluation`` entry holds this report — ``tracerag show RUN_ID``.
"""

from __future__ import annotations

import argparse
import getpass
import json
import math
import sys
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.trace import TracerProvider

from tracerag._llm import model_name
from tracerag._pipeline import RAGPipeline
from tracerag._routing import ESCALATE, PASS, REVIEW, Ticket
from tracerag._settings import TIERS, Tier, TierName
from tracerag._usage import Price, load_prices
from tracerag.demo._run import build_model
from tracerag.demo.kb import build_retriever
from tracerag.errors import InputError
from tracerag.prompts import get_prompt
from tracerag.signals._claims import strip_citations
from tracerag.signals._support import support
from tracerag.store._base import KIND_EVALUATION, AuditStore, now_iso
from tracerag.store._codec import RequestTrail, entries_from_record
from tracerag.store._open import cli_store_url
from tracerag.tools._command import Subparsers, add_command, add_json_argument, cli_store
from tracerag.tools._metrics import from_trails
from tracerag.tools._store_args import add_store_argument
from tracerag.tools.adversarial import cases_from_records, run_adversarial

__all__ = [
    "DEFAULT_GATE",
    "DEFAULT_MARGIN",
    "INDICATORS",
    "Arm",
    "ArmResult",
    "EvalQuestion",
    "EvalReport",
    "Outcome",
    "add_parser",
    "changed_decisions",
    "confidence_distribution",
    "evaluate",
    "gate",
    "load_questions",
    "parse_arm",
    "render_report",
    "store_report",
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


# ---------------------------------------------------------------------------------------------
# Comparison


def gate(
    baseline: Mapping[str, float | None],
    candidate: Mapping[str, float | None],
    *,
    indicators: Sequence[str] = DEFAULT_GATE,
    margins: Mapping[str, float] | None = None,
    default_margin: float = DEFAULT_MARGIN,
) -> list[dict[str, Any]]:
    """The gated indicators on which the candidate is worse than the baseline by more than the
    margin, or not measurable where the baseline was (empty: the gate passes)."""
    failures = []
    for name in indicators:
        label, higher_is_better = INDICATORS[name]
        margin = (margins or {}).get(name, default_margin)
        base, cand = baseline.get(name), candidate.get(name)
        if base is None:
            continue  # nothing to hold the candidate to
        if cand is None:
            failures.append(
                {
                    "indicator": name,
                    "label": label,
                    "baseline": base,
                    "candidate": None,
                    "margin": margin,
                    "why": f"{label}: not measurable for the candidate (baseline {_pct(base)})",
                }
            )
            continue
        worse_by = (base - cand) if higher_is_better else (cand - base)
        if worse_by > margin + 1e-12:
            failures.append(
                {
                    "indicator": name,
                    "label": label,
                    "baseline": base,
                    "candidate": cand,
                    "margin": margin,
                    "why": f"{label} {_pct(base)} → {_pct(cand)}: worse by "
                    f"{worse_by * 100:.1f} pt (margin {margin * 100:.1f} pt)",
                }
            )
    return failures


def changed_decisions(
    baseline: Sequence[Outcome], candidate: Sequence[Outcome]
) -> list[dict[str, Any]]:
    """Questions whose decision differs between the two runs, with both request ids."""
    by_id = {o.question_id: o for o in candidate}
    out = []
    for b in baseline:
        c = by_id.get(b.question_id)
        if c is not None and c.decision != b.decision:
            out.append(
                {
                    "question_id": b.question_id,
                    "baseline": b.decision,
                    "candidate": c.decision,
                    "baseline_request_id": b.request_id,
                    "candidate_request_id": c.request_id,
                    "baseline_confidence": b.confidence,
                    "candidate_confidence": c.confidence,
                }
            )
    return out


@dataclass
class EvalReport:
    """Baseline against candidate over one question set, and the gate's verdict."""

    run_id: str
    questions_file: str
    questions: int
    settings: dict[str, Any]
    baseline: ArmResult
    candidate: ArmResult
    gated: list[str]
    margins: dict[str, float]
    failures: list[dict[str, Any]]
    changed: list[dict[str, Any]]

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "questions_file": self.questions_file,
            "questions": self.questions,
            "settings": self.settings,
            "baseline": self.baseline.to_dict(),
            "candidate": self.candidate.to_dict(),
            "gate": {
                "indicators": self.gated,
                "margins": self.margins,
                "ok": self.ok,
                "failures": self.failures,
            },
            "changed_decisions": self.changed,
        }

    def render(self) -> str:
        return render_report(self.to_dict())


def _pct(value: Any) -> str:
    return "-" if value is None else f"{float(value) * 100:.1f}%"


def _num(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _money(value: Any) -> str:
    return "-" if value is None else f"{float(value):.4f}"


def render_report(report: Mapping[str, Any]) -> str:
    """A report (``EvalReport.to_dict()``) as a side-by-side table for people."""
    b, c = report["baseline"], report["candidate"]
    g = report["gate"]
    failed = {f["indicator"] for f in g["failures"]}
    s = report.get("settings") or {}
    lines = [
        f"tracerag eval — {report['questions']} questions from {report['questions_file']}, "
        f"run {report['run_id']}",
        f"  baseline   {b['arm']}  (prompt {b['prompt_version']}, model {b['model_version']})",
        f"  candidate  {c['arm']}  (prompt {c['prompt_version']}, model {c['model_version']})",
        f"  {s.get('samples')} samples at temperature {s.get('temperature')}, tier "
        f"{s.get('tier')}, seed {s.get('seed')}"
        + (f", prices {s['prices']}" if s.get("prices") else ", no price table (tokens only)"),
        "",
        f"{'':<34}{'baseline':>16}{'candidate':>16}{'change':>12}  gate",
    ]
    for name, (label, _) in INDICATORS.items():
        bv, cv = b["indicators"].get(name), c["indicators"].get(name)
        if bv is None and cv is None:
            continue
        change = f"{(cv - bv) * 100:+.1f} pt" if bv is not None and cv is not None else "-"
        mark = ""
        if name in g["indicators"]:
            mark = "FAIL" if name in failed else "ok"
        lines.append(f"{label:<34}{_pct(bv):>16}{_pct(cv):>16}{change:>12}  {mark}".rstrip())

    def row(label: str, left: str, right: str) -> None:
        lines.append(f"{label:<34}{left:>16}{right:>16}")

    def routes(a: Mapping[str, Any]) -> str:
        return " / ".join(str(a["counts"].get(d, 0)) for d in DECISIONS)

    row("pass / review / escalate", routes(b), routes(c))
    for key in ("mean", "p10", "p50", "p90"):
        row(f"confidence {key}", _num(b["confidence"][key]), _num(c["confidence"][key]))

    def bands(a: Mapping[str, Any]) -> str:
        bands = a["confidence"]["bands"]
        return " / ".join(str(bands[k]) for k in ("below_review", "review_band", "pass_band"))

    row("confidence <0.6 / mid / >=0.85", bands(b), bands(c))
    row("model calls", _num(b["cost"]["model_calls"]), _num(c["cost"]["model_calls"]))
    row(
        "calls / samples per request",
        f"{_num(b['cost'].get('calls_per_request'), 2)} / "
        f"{_num(b['cost'].get('samples_per_request'), 2)}",
        f"{_num(c['cost'].get('calls_per_request'), 2)} / "
        f"{_num(c['cost'].get('samples_per_request'), 2)}",
    )
    row(
        "tokens per request",
        _num(b["cost"]["tokens_per_request"], 1),
        _num(c["cost"]["tokens_per_request"], 1),
    )
    row(
        "tokens per passed answer",
        _num(b["cost"]["tokens_per_passed_answer"], 1),
        _num(c["cost"]["tokens_per_passed_answer"], 1),
    )
    if s.get("prices"):
        row(
            "cost per request",
            _money(b["cost"]["cost_per_request"]),
            _money(c["cost"]["cost_per_request"]),
        )
        row(
            "cost per passed answer",
            _money(b["cost"]["cost_per_passed_answer"]),
            _money(c["cost"]["cost_per_passed_answer"]),
        )
    row("latency p50 / p95 (s)", _lat(b["latency"]), _lat(c["latency"]))
    changed = report["changed_decisions"]
    lines += ["", f"decision changed on {len(changed)} of {report['questions']} questions"]
    for ch in changed:
        lines.append(
            f"  {ch['question_id']:<26} {ch['baseline']} → {ch['candidate']:<9} "
            f"baseline {ch['baseline_request_id']}  candidate {ch['candidate_request_id']}"
        )
    lines.append("")
    if g["ok"]:
        lines.append(
            "result: PASS — the candidate is nowhere worse than the baseline by more than the "
            "margin on " + ", ".join(g["indicators"])
        )
    else:
        lines.append("result: FAIL — " + "; ".join(f["why"] for f in g["failures"]))
    return "\n".join(lines) + "\n"


def _lat(latency: Mapping[str, Any]) -> str:
    return f"{_num(latency.get('p50_s'), 3)} / {_num(latency.get('p95_s'), 3)}"


# ---------------------------------------------------------------------------------------------
# Running


class _KeepTickets:
    """Keeps escalation tickets without logging them (an evaluation escalates on purpose)."""

    def __init__(self) -> None:
        self.tickets: list[Ticket] = []

    def handle(self, ticket: Ticket) -> None:
        self.tickets.append(ticket)


def run_arm(
    arm: Arm,
    questions: Sequence[EvalQuestion],
    *,
    run_id: str,
    role: str,
    seed: int,
    samples: int,
    temperature: float,
    tier: Tier | TierName,
    k: int = 4,
    prices: Mapping[str, Price] | None = None,
    tracer_provider: TracerProvider | None = None,
) -> tuple[str, str, list[dict[str, Any]], list[Outcome]]:
    """Answer every question under one configuration over the demo knowledge base.

    Returns the prompt version and model version recorded, the audit records (tagged with the
    run) and the outcomes.
    """
    # imported here, not at the top: importing it registers the demo's prompt versions, which
    # only an evaluation run wants
    import tracerag.demo._prompt_versions  # noqa: F401

    prompt = get_prompt(arm.prompt)
    llm = build_model(arm.model, seed)
    model_version = model_name(llm) or type(llm).__name__
    records: list[dict[str, Any]] = []

    def keep(record: dict[str, Any]) -> bool:
        record["evaluation_run"] = {"run_id": run_id, "arm": role, "config": arm.label}
        records.append(record)
        return True

    pipeline = RAGPipeline(
        build_retriever(k=k),
        llm,
        prompt_version=prompt.version,
        model_version=model_version,
        prompt=prompt,
        n_samples=arm.samples or samples,
        temperature=temperature,
        tier=Tier.parse(arm.tier or tier, "tier"),
        escalation=_KeepTickets(),
        audit=keep,
        prices=prices,
        tracer_provider=tracer_provider,
    )
    outcomes = []
    for question in questions:
        pipeline.invoke({"question": question.question, "channel": RUN_CHANNEL})
        outcomes.append(outcome_of(question, records[-1]))
    return prompt.version, model_version, records, outcomes


def adversarial_summary(records: Sequence[Mapping[str, Any]], seed: int = 0) -> dict[str, Any]:
    """The adversarial self-test on a configuration's own answers, all mutation kinds together."""
    cases = cases_from_records(records, source="evaluation")
    report = run_adversarial(cases, floors={}, seed=seed)
    total = sum(k.total for k in report.kinds.values())
    caught = sum(k.intercepted for k in report.kinds.values())
    return {
        "answers": report.cases,
        "eligible": report.eligible,
        "mutations": total,
        "intercepted": caught,
        "interception_rate": caught / total if total else None,
        "false_alarm_rate": report.false_alarm_rate,
        "by_kind": {k: r.rate for k, r in report.kinds.items()},
    }


def evaluate(
    questions: Sequence[EvalQuestion],
    baseline: Arm,
    candidate: Arm,
    *,
    questions_file: str = "",
    seed: int = 7,
    samples: int = 5,
    temperature: float = 0.7,
    tier: Tier | TierName = "high",
    prices: Mapping[str, Price] | None = None,
    prices_label: str | None = None,
    gated: Sequence[str] = DEFAULT_GATE,
    margins: Mapping[str, float] | None = None,
    default_margin: float = DEFAULT_MARGIN,
    tracer_provider: TracerProvider | None = None,
    run_id: str | None = None,
) -> tuple[EvalReport, dict[str, list[dict[str, Any]]]]:
    """Run both configurations over the questions and compare them; also returns the records."""
    unknown = [g for g in gated if g not in INDICATORS]
    if unknown:
        raise InputError(f"unknown indicator(s) {unknown}; choose from {', '.join(INDICATORS)}")
    run_id = run_id or f"eval-{uuid.uuid4().hex[:16]}"
    results: dict[str, ArmResult] = {}
    records: dict[str, list[dict[str, Any]]] = {}
    for role, arm in (("baseline", baseline), ("candidate", candidate)):
        prompt_version, model_version, arm_records, outcomes = run_arm(
            arm,
            questions,
            run_id=run_id,
            role=role,
            seed=seed,
            samples=samples,
            temperature=temperature,
            tier=tier,
            prices=prices,
            tracer_provider=tracer_provider,
        )
        records[role] = arm_records
        results[role] = summarize_arm(
            arm.label,
            prompt_version,
            model_version,
            arm_records,
            outcomes,
            adversarial_summary(arm_records),
        )
    margin_table = {name: (margins or {}).get(name, default_margin) for name in gated}
    report = EvalReport(
        run_id=run_id,
        questions_file=questions_file,
        questions=len(questions),
        settings={
            "seed": seed,
            "samples": samples,
            "temperature": temperature,
            "tier": tier,
            "prices": prices_label,
        },
        baseline=results["baseline"],
        candidate=results["candidate"],
        gated=list(gated),
        margins=margin_table,
        failures=gate(
            results["baseline"].indicators,
            results["candidate"].indicators,
            indicators=gated,
            margins=margin_table,
        ),
        changed=changed_decisions(results["baseline"].outcomes, results["candidate"].outcomes),
    )
    return report, records


def store_report(
    store: AuditStore,
    report: EvalReport,
    records: Mapping[str, Sequence[Mapping[str, Any]]],
    actor: str,
) -> None:
    """Keep the run in the audit store: its requests, its own record, and its results."""
    for role in ("baseline", "candidate"):
        for record in records.get(role, ()):
            store.append_record(record)
    b, c = report.baseline, report.candidate
    store.append_record(
        {
            "request_id": report.run_id,
            "question": f"evaluation of {c.arm} against {b.arm} on {report.questions_file} "
            f"({report.questions} questions)",
            "channel": RUN_CHANNEL,
            "versions": {"prompt": c.prompt_version, "model": c.model_version},
            "started_at": now_iso(),
            "evaluation_run": {"run_id": report.run_id, "arm": None, "config": None},
        }
    )
    verdict = (
        "gate passed"
        if report.ok
        else "gate failed: " + "; ".join(f["why"] for f in report.failures)
    )
    store.append_action(
        report.run_id, KIND_EVALUATION, actor, payload=report.to_dict(), reason=verdict
    )


# ---------------------------------------------------------------------------------------------
# Command line


def _margins(items: Sequence[str] | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for text in items or []:
        for item in filter(None, (p.strip() for p in text.split(","))):
            name, sep, value = item.partition("=")
            if not sep or name.strip() not in INDICATORS:
                raise InputError(
                    f"cannot read margin {item!r}: use NAME=VALUE with NAME one of "
                    f"{', '.join(INDICATORS)}"
                )
            out[name.strip()] = float(value)
    return out


def _actor() -> str:
    try:
        return getpass.getuser() or "operator"
    except Exception:
        return "operator"


def _run(args: argparse.Namespace) -> int:
    from opentelemetry.sdk.trace import TracerProvider

    try:
        questions = load_questions(args.questions)
        baseline, candidate = parse_arm(args.baseline), parse_arm(args.candidate)
        gated = [g.strip() for g in args.gate.split(",") if g.strip()]
        margins = _margins(args.margin_of)
        prices = load_prices(args.prices) if args.prices else None
        # registers the demo's prompt versions (a side effect only this run wants)
        import tracerag.demo._prompt_versions  # noqa: F401

        for arm in (baseline, candidate):
            get_prompt(arm.prompt)
        if args.store and args.no_store:
            raise InputError("--store and --no-store contradict each other")
    except (OSError, ValueError, KeyError) as exc:
        print(f"tracerag eval: {exc}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    try:
        report, records = evaluate(
            questions,
            baseline,
            candidate,
            questions_file=str(args.questions),
            seed=args.seed,
            samples=args.samples,
            temperature=args.temperature,
            tier=args.tier,
            prices=prices,
            prices_label=str(args.prices) if args.prices else None,
            gated=gated,
            margins=margins,
            default_margin=args.margin,
            tracer_provider=TracerProvider(),  # trace ids for the records; nothing exported
        )
    except ValueError as exc:
        print(f"tracerag eval: {exc}", file=sys.stderr)
        return 2
    stored = None
    if not args.no_store:
        with cli_store(args, create=True, auto_enqueue=False) as store:
            store_report(store, report, records, _actor())
            stored = cli_store_url(args.store)
    if args.json:
        out = report.to_dict()
        out["stored"] = stored
        json.dump(out, sys.stdout, ensure_ascii=False, indent=2)
        print()
    else:
        print(report.render(), end="")
        if stored:
            print(f"stored in {stored} — tracerag show {report.run_id}")
        print(f"({time.perf_counter() - started:.1f} s)")
    return 0 if report.ok else 1


def add_parser(subparsers: Subparsers) -> None:
    """Register ``tracerag eval``."""
    p = add_command(
        subparsers,
        "eval",
        _run,
        help="compare two prompt/model versions on a question set; a release gate",
        description="Answer a question set under a baseline and a candidate configuration and "
        "compare the indicators, routes, confidence, cost and latency side by side. Exit 1 when "
        "the candidate is worse by more than the margin on a gated indicator.",
    )
    p.add_argument("questions", metavar="QUESTIONS.jsonl", help="the question set (JSON lines)")
    p.add_argument(
        "--baseline",
        required=True,
        metavar="prompt@V,model@M",
        help="the configuration in use, e.g. prompt@v1,model@extractive",
    )
    p.add_argument(
        "--candidate",
        required=True,
        metavar="prompt@V,model@M",
        help="the configuration to check, e.g. prompt@v2-nocite,model@extractive",
    )
    p.add_argument(
        "--gate",
        default=",".join(DEFAULT_GATE),
        help="indicators the gate checks (default: "
        + ",".join(DEFAULT_GATE)
        + "; also: answers, decisions)",
    )
    p.add_argument(
        "--margin",
        type=float,
        default=DEFAULT_MARGIN,
        help="how much worse (absolute, 0.02 = 2 points) the candidate may be",
    )
    p.add_argument(
        "--margin-of",
        action="append",
        metavar="NAME=VALUE",
        help="a margin for one indicator (repeatable)",
    )
    p.add_argument("--samples", type=int, default=5, help="samples per question (default 5)")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--tier", default="high", choices=["high", "medium", "low"])
    p.add_argument("--seed", type=int, default=7, help="seed of the extractive model")
    p.add_argument("--prices", metavar="FILE", help="price table per model (JSON) for the cost")
    add_store_argument(p)
    p.add_argument("--no-store", action="store_true", help="do not keep the run in the store")
    add_json_argument(p, "print the report as JSON")
