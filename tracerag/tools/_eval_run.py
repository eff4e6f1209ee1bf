"""Running ``tracerag eval``: both arms over the demo knowledge base, kept in the audit store.

Each arm answers the question set through the full pipeline; the run, its requests and its
report are appended to the audit trail so ``tracerag show`` finds them.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.trace import TracerProvider

from tracerag._llm import model_name
from tracerag._pipeline import RAGPipeline
from tracerag._routing import Ticket
from tracerag._settings import Tier, TierName
from tracerag._usage import Price
from tracerag.demo._run import build_model
from tracerag.demo.kb import build_retriever
from tracerag.errors import InputError
from tracerag.prompts import get_prompt
from tracerag.store._base import KIND_EVALUATION, AuditStore, now_iso
from tracerag.tools._eval_compare import EvalReport, changed_decisions, gate
from tracerag.tools._eval_results import (
    DEFAULT_GATE,
    DEFAULT_MARGIN,
    INDICATORS,
    RUN_CHANNEL,
    Arm,
    ArmResult,
    EvalQuestion,
    Outcome,
    outcome_of,
    summarize_arm,
)
from tracerag.tools.adversarial import cases_from_records, run_adversarial

__all__ = ["adversarial_summary", "evaluate", "run_arm", "store_report"]


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
