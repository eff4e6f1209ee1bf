"""Stage 3, plan: which materials the answer will rely on, and the key facts it will use.

``separate`` mode (default): one plan call before sampling, at temperature 0; the samples are then
conditioned on it. Malformed JSON is retried; if it stays malformed the plan is recorded as
failed (which lowers confidence) and sampling goes on without it — never a crash.
``inline`` mode: each sample writes its own plan before its answer; this stage runs after
sampling and records those plans and how far they agree. In ``wrap()`` mode the plan is what
each sample actually cited (its cited ids and the quantities it states), with their agreement.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from collections.abc import Sequence

from langchain_core.runnables import RunnableConfig
from opentelemetry.trace import Span

from tracerag import _usage as usage
from tracerag._declare import stamp
from tracerag._llm import (
    Tries,
    ainvoke_model,
    concurrency_of,
    is_transient,
    model_name,
    model_slots,
    record_retry,
    retry_call,
    text_of,
    with_temperature,
)
from tracerag._settings import Settings
from tracerag._state import ErrorLog, PlanResult, RequestState, Sample
from tracerag.contract import validate_with
from tracerag.errors import ConfigurationError, ContractError, PlanError
from tracerag.prompts import ANSWER_LINE_RE, PLAN_LINE_RE, TASK_PLAN, prompt_messages
from tracerag.signals._claims import citation_ids, strip_citations
from tracerag.signals._types import Material, Plan
from tracerag.stages._verify import resolver_for
from tracerag.telemetry import _instruments as metrics
from tracerag.text._quantities import extract_quantities

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
    except ContractError as exc:
        raise PlanError(f"plan does not match the plan schema: {exc.message}") from None
    known = set(retrieved_ids)
    ids = [i for i in dict.fromkeys(data["material_ids"]) if i in known]
    unknown = [i for i in data["material_ids"] if i not in known]
    error = None
    if unknown:
        error = "plan named materials that were not retrieved: " + ", ".join(unknown)
    facts = tuple(data["key_facts"])
    return Plan(material_ids=tuple(ids), key_facts=facts, raw=text, mode=mode, error=error)


async def plan(
    state: RequestState, settings: Settings, span: Span, config: RunnableConfig | None = None
) -> PlanResult:
    """Separate mode: ask the model for a plan, with bounded retries.

    The first attempt runs at temperature 0. A malformed plan is retried at a raised
    temperature (0.3, then 0.6, …), since a deterministic model repeats the same malformed
    output; a transient model error is retried unchanged.
    """
    if settings.llm is None:
        raise ConfigurationError("the plan stage needs a chat model")
    base_llm = settings.llm
    llm, _ = with_temperature(base_llm, 0.0)
    materials = state.materials
    messages = prompt_messages(
        TASK_PLAN, state.standalone_question, materials, prompt=settings.prompt
    )
    retrieved = [m.id for m in materials]
    model = model_name(settings.llm) or type(settings.llm).__name__
    calls: list[usage.CallUsage] = []
    errors = ErrorLog()
    recorded = record_retry(errors, span, "plan", settings.meter_provider)

    def on_retry(attempt: int, error: BaseException) -> None:
        nonlocal llm
        if isinstance(error, PlanError):
            llm, _ = with_temperature(base_llm, min(1.0, 0.3 * attempt))
        recorded(attempt, error)

    def retry_on(error: BaseException) -> bool:
        return isinstance(error, PlanError) or is_transient(error)

    async def once() -> Plan:
        message = await ainvoke_model(
            llm, messages, config=config, max_chars=settings.retry.max_output_chars
        )
        calls.append(
            usage.note(
                usage.usage_of(message, stage=usage.STAGE_PLAN, model=model, prompt=messages)
            )
        )
        return parse_plan(text_of(message), retrieved)

    tries = Tries()
    try:
        # the plan call holds one of the model's call slots too (max_concurrency)
        async with model_slots(concurrency_of(settings.max_concurrency, base_llm), base_llm):
            parsed = await retry_call(
                once, settings.retry, on_retry=on_retry, retry_on=retry_on, tries=tries
            )
        result = dataclasses.replace(parsed, attempts=tries.count)
    except Exception as exc:
        errors.record_error("plan", exc, attempt=tries.count, final=True)
        if not isinstance(exc, PlanError):
            metrics.record_model_error("plan", exc, meter_provider=settings.meter_provider)
        result = Plan(ok=False, error=f"{type(exc).__name__}: {exc}", attempts=tries.count)
    span.set_attributes(usage.span_attributes(calls))
    planned = PlanResult(result, errors.freeze(), source="model")
    stamp(span, planned)
    return planned


def split_inline(raw: str) -> tuple[str | None, str]:
    """``(plan_text, answer)`` from an inline sample; plan_text is None when absent."""
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
        material_ids=tuple(chosen.material_ids),
        key_facts=tuple(facts),
        ok=True,
        mode=chosen.mode,
        agreement=round(count / max(1, n_samples), 4),
        attempts=1,
    )


async def plan_from_samples(
    state: RequestState, settings: Settings, span: Span, config: RunnableConfig | None = None
) -> PlanResult:
    """Inline and wrap modes: record the plans the samples wrote and how far they agree."""
    samples = state.samples.samples if state.samples is not None else ()
    plans = [s.plan if s.plan is not None else _missing(s) for s in samples]
    agreed = PlanResult(agree(plans, len(samples)), source=plans[0].mode if plans else "inline")
    stamp(span, agreed)
    return agreed


def implied_plan(sample: Sample, materials: Sequence[Material]) -> Sample:
    """The sample with the plan its answer implies: what it cited, the quantities it states.

    A chain that writes no plan (``wrap()``) is judged by what its answers actually rely on.
    """
    if not sample.ok:
        return sample
    resolve = resolver_for(materials, sample, positional=True)
    ids = [resolve(i) or i for i in citation_ids(sample.answer or "")]
    facts = [q.raw for q in extract_quantities(strip_citations(sample.answer or ""))]
    plan = Plan(material_ids=tuple(dict.fromkeys(ids)), key_facts=tuple(facts), mode="wrap")
    return dataclasses.replace(sample, plan=plan)


def _missing(sample: Sample) -> Plan:
    return Plan(ok=False, error=sample.error or f"sample {sample.index} wrote no plan")
