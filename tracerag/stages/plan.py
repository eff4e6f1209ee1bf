"""Stage 3, plan: which materials the answer will rely on, and the key facts it will use.

``separate`` mode (default): one plan call before sampling, at temperature 0; the samples are then
conditioned on it. Malformed JSON is retried; if it stays malformed the plan is recorded as
failed (which lowers confidence) and sampling goes on without it — never a crash.
``inline`` mode: each sample writes its own plan before its answer; this stage runs after
sampling and records those plans and how far they agree. In ``wrap()`` mode the plan is what
each sample actually cited (its cited ids and the quantities it states), with their agreement.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence

import jsonschema
from langchain_core.runnables import RunnableConfig
from opentelemetry.trace import Span

from tracerag import metrics, semconv, usage
from tracerag.context import Plan, RequestContext, Sample
from tracerag.contract import validate_with
from tracerag.errors import ConfigurationError, PlanError
from tracerag.llm import (
    Tries,
    is_transient,
    model_name,
    record_retry,
    retry_call,
    text_of,
    with_temperature,
)
from tracerag.prompts import TASK_PLAN, prompt_messages
from tracerag.settings import Settings

_JSON_OBJECT = re.compile(r"\{.*\}", re.S)


def parse_plan(text: str, retrieved_ids: Sequence[str], *, mode: str = "separate") -> Plan:
    """A Plan from model output; raises PlanError if it is not valid plan JSON."""
    match = _JSON_OBJECT.search(text or "")
    if not match:
        raise PlanError("plan is not a JSON object")
    try:
        data = json.loads(match.group(0))
    except json.JSONDecodeError as exc:
        raise PlanError(f"plan is not valid JSON: {exc}") from exc
    try:
        validate_with("plan.schema.json", data)
    except jsonschema.ValidationError as exc:
        raise PlanError(f"plan does not match the plan schema: {exc.message}") from None
    known = set(retrieved_ids)
    ids = [i for i in dict.fromkeys(data["material_ids"]) if i in known]
    unknown = [i for i in data["material_ids"] if i not in known]
    plan = Plan(material_ids=ids, key_facts=list(data["key_facts"]), raw=text, mode=mode)
    if unknown:
        plan.error = "plan named materials that were not retrieved: " + ", ".join(unknown)
    return plan


async def plan(
    ctx: RequestContext, settings: Settings, span: Span, config: RunnableConfig | None = None
) -> RequestContext:
    """Separate mode: ask the model for a plan, with bounded retries.

    The first attempt runs at temperature 0. A malformed plan is retried at a raised
    temperature (0.3, then 0.6, …), since a deterministic model repeats the same malformed
    output; a transient model error is retried unchanged.
    """
    if settings.llm is None:
        raise ConfigurationError("the plan stage needs a chat model")
    deterministic, _ = with_temperature(settings.llm, 0.0)
    llm = deterministic
    messages = prompt_messages(TASK_PLAN, ctx.question, ctx.materials, prompt=settings.prompt)
    retrieved = [m.id for m in ctx.materials]
    model = model_name(settings.llm) or type(settings.llm).__name__
    calls: list[usage.CallUsage] = []

    recorded = record_retry(ctx, span, "plan", settings.meter_provider)

    def on_retry(attempt: int, error: BaseException) -> None:
        nonlocal llm
        if isinstance(error, PlanError):
            llm, _ = with_temperature(settings.llm, min(1.0, 0.3 * attempt))
        recorded(attempt, error)

    def retry_on(error: BaseException) -> bool:
        return isinstance(error, PlanError) or is_transient(error)

    async def once() -> Plan:
        message = await llm.ainvoke(messages, config=config)
        calls.append(
            usage.note(
                usage.usage_of(message, stage=usage.STAGE_PLAN, model=model, prompt=messages)
            )
        )
        return parse_plan(text_of(message), retrieved)

    tries = Tries()
    try:
        result = await retry_call(
            once, settings.retry, on_retry=on_retry, retry_on=retry_on, tries=tries
        )
        result.attempts = tries.count
    except Exception as exc:
        ctx.record_error("plan", exc, attempt=tries.count, final=True)
        if not isinstance(exc, PlanError):
            metrics.record_model_error("plan", exc, meter_provider=settings.meter_provider)
        result = Plan(ok=False, error=f"{type(exc).__name__}: {exc}", attempts=tries.count)
    ctx.plan = result
    span.set_attributes(usage.span_attributes(calls))
    record_plan(ctx.plan, span, source="model")
    return ctx


def split_inline(raw: str) -> tuple[str | None, str]:
    """``(plan_text, answer)`` from an inline sample; plan_text is None when absent."""
    from tracerag.prompts import ANSWER_LINE_RE, PLAN_LINE_RE

    plan_match = PLAN_LINE_RE.search(raw)
    answer_match = ANSWER_LINE_RE.search(raw)
    plan_text = plan_match.group("plan") if plan_match else None
    if answer_match:
        return plan_text, answer_match.group("answer").strip()
    if plan_match:
        return plan_text, (raw[: plan_match.start()] + raw[plan_match.end() :]).strip()
    return None, raw.strip()


def agree(plans: Sequence[Plan], n_samples: int) -> Plan:
    """The most common plan among the samples', with the share of samples that hold it."""
    good = [p for p in plans if p.ok]
    if not good:
        errors = sorted({p.error for p in plans if p.error})
        return Plan(ok=False, error="; ".join(errors) or "no sample wrote a plan", agreement=0.0)
    counts = Counter(frozenset(p.material_ids) for p in good)
    ids, count = counts.most_common(1)[0]
    chosen = next(p for p in good if frozenset(p.material_ids) == ids)
    facts = list(
        dict.fromkeys(f for p in good if frozenset(p.material_ids) == ids for f in p.key_facts)
    )
    return Plan(
        material_ids=list(chosen.material_ids),
        key_facts=facts,
        ok=True,
        mode=chosen.mode,
        agreement=round(count / max(1, n_samples), 4),
        attempts=1,
    )


async def plan_from_samples(
    ctx: RequestContext, settings: Settings, span: Span, config: RunnableConfig | None = None
) -> RequestContext:
    """Inline and wrap modes: record the plans the samples wrote and how far they agree."""
    plans = [s.plan if s.plan is not None else _missing(s) for s in ctx.samples]
    ctx.plan = agree(plans, len(ctx.samples))
    record_plan(ctx.plan, span, source=plans[0].mode if plans else "inline")
    return ctx


def _missing(sample: Sample) -> Plan:
    return Plan(ok=False, error=sample.error or f"sample {sample.index} wrote no plan")


def record_plan(result: Plan, span: Span, *, source: str) -> None:
    """Put a plan on its span."""
    span.set_attribute(semconv.PLAN_OK, result.ok)
    span.set_attribute(semconv.PLAN_SOURCE, source)
    span.set_attribute(semconv.PLAN_ATTEMPTS, result.attempts)
    span.set_attribute(semconv.PLAN_MATERIAL_IDS, result.material_ids)
    span.set_attribute(semconv.PLAN_KEY_FACTS, result.key_facts)
    if result.agreement is not None:
        span.set_attribute(semconv.PLAN_AGREEMENT, result.agreement)
    if result.error:
        span.set_attribute(semconv.PLAN_ERROR, result.error)
