"""RAGPipeline and wrap() run one stage table: the same tier gives the same stages and signals."""

from __future__ import annotations

import pytest
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough
from pipeline_fixtures import FAST_RETRY, GOOD, PLAN, QUESTION

from tracerag import RAGPipeline, wrap
from tracerag import _semconv as semconv
from tracerag.testing import ScriptCall, ScriptedChatModel


def inline(call: ScriptCall) -> str:
    """Writes its plan before its answer when asked to (inline plan mode)."""
    if call.task == "plan_and_answer":
        return f"PLAN: {PLAN}\nANSWER: {GOOD}"
    return PLAN if call.task == "plan" else GOOD


def chain_of(retriever, llm):
    prompt = ChatPromptTemplate.from_messages([("human", "{context}\n{question}")])
    inputs = {"context": retriever, "question": RunnablePassthrough()}
    return inputs | prompt | llm | StrOutputParser()


def stage_runs(spans, request_id: str) -> list[tuple[str, bool]]:
    """(stage, skipped) for each stage span of a request, in the order the stages ran."""
    stages = sorted(
        (s for s in spans.for_request(request_id) if semconv.STAGE in (s.attributes or {})),
        key=lambda s: s.start_time or 0,
    )
    assert stages, "the request has no stage spans"
    return [(s.attributes[semconv.STAGE], s.attributes[semconv.STAGE_SKIPPED]) for s in stages]


@pytest.mark.parametrize("tier", ["high", "medium", "low"])
async def test_both_front_doors_run_the_same_stages_for_a_tier(retriever, spans, tier):
    llm = ScriptedChatModel(responder=inline, temperature=0.7)
    pipeline = RAGPipeline(
        retriever,
        llm,
        prompt_version="p",
        model_version="m",
        plan="inline",
        tier=tier,
        n_samples=3,
        retry=FAST_RETRY,
        audit=None,
        tracer_provider=spans.provider,
    )
    wrapped = wrap(
        chain_of(retriever, ScriptedChatModel(responses=[GOOD], temperature=0.7)),
        tier=tier,
        n_samples=3,
        retry=FAST_RETRY,
        audit=None,
        tracer_provider=spans.provider,
    )
    by_pipeline = await pipeline.ainvoke(QUESTION)
    by_wrap = await wrapped.ainvoke(QUESTION)
    assert stage_runs(spans, by_pipeline.request_id) == stage_runs(spans, by_wrap.request_id)
    assert by_pipeline.signal_detail.plan_ok == by_wrap.signal_detail.plan_ok


async def test_medium_tier_skips_the_plan_and_gives_one_confidence_through_both(retriever, spans):
    """The same answers get the same confidence whichever front door they came through."""
    llm = ScriptedChatModel(responses=[GOOD], plan_responses=[PLAN], temperature=0.7)
    pipeline = RAGPipeline(
        retriever,
        llm,
        prompt_version="p",
        model_version="m",
        tier="medium",
        retry=FAST_RETRY,
        audit=None,
        tracer_provider=spans.provider,
    )
    wrapped = wrap(
        chain_of(retriever, ScriptedChatModel(responses=[GOOD], temperature=0.7)),
        tier="medium",
        retry=FAST_RETRY,
        audit=None,
        tracer_provider=spans.provider,
    )
    by_pipeline = await pipeline.ainvoke(QUESTION)
    by_wrap = await wrapped.ainvoke(QUESTION)
    for response in (by_pipeline, by_wrap):
        assert ("plan", True) in stage_runs(spans, response.request_id)
        assert response.signal_detail.plan_ok is None
    # medium draws at most three, adaptively alike through both: these agree, so two
    assert by_pipeline.signal_detail.samples_ok == by_wrap.signal_detail.samples_ok == 2
    assert by_wrap.confidence == by_pipeline.confidence
    assert by_wrap.decision == by_pipeline.decision == "pass"


def test_both_front_doors_take_the_shared_options_and_refuse_the_others(retriever):
    llm = ScriptedChatModel(responder=inline, temperature=0.7)
    shared = {"n_samples": 2, "tier": "medium", "thresholds": (0.8, 0.5), "audit": None}
    pipeline = RAGPipeline(retriever, llm, prompt_version="p", model_version="m", **shared)
    wrapped = wrap(chain_of(retriever, llm), **shared)
    for front in (pipeline, wrapped):
        assert (front.settings.n_samples, front.settings.tier) == (2, "medium")
        assert (front.settings.thresholds.pass_at, front.settings.thresholds.review_at) == (
            0.8,
            0.5,
        )
    with pytest.raises(TypeError, match="unexpected keyword argument 'k'"):
        wrap(chain_of(retriever, llm), k=3)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected keyword argument 'plan_mode'"):
        RAGPipeline(  # type: ignore[call-arg]
            retriever, llm, prompt_version="p", model_version="m", plan_mode="inline"
        )
