"""Adaptive sampling through TraceragMiddleware, in real ``create_agent`` apps.

The answering call is drawn as on every front door: ``min_samples`` first (started at once
right after the tool results), more only while the route could still change, at most
``n_samples``; ``min_samples == n_samples`` draws them all. A chat model that takes ``n`` draws
a round in one call, its prompt billed once; the model's ``max_concurrency`` holds across the
turn's calls. The record, the spans and the metrics say how many were drawn and why sampling
stopped.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import pytest
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatResult
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from pipeline_fixtures import FAST_RETRY
from pydantic import PrivateAttr
from wrap_apps import AGENT_QUESTION, answering, rag_agent

from tracerag import RetryPolicy, TraceragMiddleware
from tracerag import _semconv as sc
from tracerag.demo.models.extractive import ExtractiveChatModel
from tracerag.signals._attribution import UNSCORED
from tracerag.stages._stopping import first_round
from tracerag.testing import ScriptCall, ToolCallingChatModel

SENTENCE = "Under Clause 6.1, laptops and tablets are covered by an extended 24-month warranty."
WRONG_NUMBER = SENTENCE.replace("24-month", "36-month")
N = 5
#: the agreement prior of a retrieval with informative scores: the tool results here have no
#: scores, so by default the cautious (clustered) prior applies and a third sample is drawn
SCORED_PRIOR = (0.9842, 0.1162)


def middleware(spans=None, **options) -> TraceragMiddleware:
    options.setdefault("n_samples", N)
    options.setdefault("retry", FAST_RETRY)
    options.setdefault("audit", None)
    if spans is not None:
        options.setdefault("tracer_provider", spans.provider)
    return TraceragMiddleware(**options)


def ask(question: str = AGENT_QUESTION) -> dict:
    return {"messages": [{"role": "user", "content": question}]}


def model(responder=None, **extra) -> ToolCallingChatModel:
    return ToolCallingChatModel(
        responder=responder or answering("24-month"),
        model_name="tool-model-1",
        temperature=0.7,
        **extra,
    )


def alternating(call: ScriptCall) -> str:
    """Answering calls that disagree: the right number, then a wrong one, and so on."""
    claim = None if call.index % 2 else WRONG_NUMBER
    return answering("24-month", claim=claim)(call)


def unverified_first(call: ScriptCall) -> str:
    """The first two answering calls cite a source that was never shown; the rest verify."""
    if call.index in (1, 2):
        return answering("24-month", marker="nowhere")(call)
    return answering("24-month")(call)


def run(agent, how: str) -> dict:
    if how == "invoke":
        return agent.invoke(ask())
    return asyncio.run(agent.ainvoke(ask()))


def adaptive_of(records: list[dict]) -> dict:
    (record,) = records
    return record["params"]["adaptive"]


# -- how many are drawn ------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["invoke", "ainvoke"])
@pytest.mark.parametrize("speculative", [True, False])
def test_agreeing_samples_stop_at_min_samples(spans, how, speculative):
    records: list[dict] = []
    llm = model()
    verified = middleware(
        spans, audit=records.append, agreement_prior=SCORED_PRIOR, speculative=speculative
    )
    result = run(rag_agent(llm, middleware=[verified]), how)
    response = result["tracerag"]
    assert response["decision"] == "pass"
    assert result["messages"][-1].content.startswith(SENTENCE)
    # the tool round and two answering calls: the other three were never made, not even
    # speculatively
    assert llm.call_count == 1 + 2
    adaptive = adaptive_of(records)
    assert adaptive["drawn"] == 2 and adaptive["max"] == N and adaptive["min_samples"] == 2
    assert adaptive["rounds"] == 1 and adaptive["stop_reason"] == "settled"
    assert adaptive["calls"] == 2 and records[0]["usage"]["by_stage"]["sample"]["calls"] == 2
    assert 0.0 <= adaptive["stop_risk"] <= adaptive["risk_bound"] == 0.05
    assert len(records[0]["samples"]) == len(records[0]["params"]["runs"]) == 2
    assert response["signal_detail"]["samples_ok"] == 2
    stage = spans.named(sc.SPAN_SAMPLE, response["request_id"])[0]
    assert stage.attributes[sc.SAMPLES_DRAWN] == 2 and stage.attributes[sc.SAMPLES_MAX] == N
    assert stage.attributes[sc.SAMPLES_STOP] == "settled"
    assert stage.attributes[sc.SAMPLES_ROUNDS] == 1
    assert len(spans.named(sc.SPAN_SAMPLE_ONE, response["request_id"])) == 2


def test_tool_results_without_scores_take_the_cautious_prior(spans):
    records: list[dict] = []
    llm = model()
    result = rag_agent(llm, middleware=[middleware(spans, audit=records.append)]).invoke(ask())
    assert result["tracerag"]["decision"] == "pass"
    adaptive = adaptive_of(records)
    # under the cautious prior two agreeing samples cannot settle even when fully verified:
    # the first round draws the three that can, at once, instead of two and then one more
    assert adaptive["drawn"] == 3 < N and adaptive["rounds"] == 1
    assert adaptive["stop_reason"] == "settled"
    assert llm.call_count == 1 + 3


@pytest.mark.parametrize("how", ["invoke", "ainvoke"])
def test_disagreeing_samples_draw_on_to_n_samples(spans, how):
    records: list[dict] = []
    llm = model(alternating)
    verified = middleware(spans, audit=records.append, agreement_prior=SCORED_PRIOR)
    result = run(rag_agent(llm, middleware=[verified]), how)
    response = result["tracerag"]
    assert llm.call_count == 1 + N
    adaptive = adaptive_of(records)
    assert adaptive["drawn"] == N and adaptive["stop_reason"] == "exhausted"
    assert adaptive["rounds"] >= 2 and adaptive["calls"] == N
    # the route every sample gives: three of five agree on the right number
    assert response["decision"] == "review"
    assert response["signal_detail"]["self_consistency"] == pytest.approx(0.6)
    stage = spans.named(sc.SPAN_SAMPLE, response["request_id"])[0]
    assert stage.attributes[sc.SAMPLES_STOP] == "exhausted"
    assert stage.attributes[sc.SAMPLES_DRAWN] == N


def test_unverified_first_samples_draw_more_and_route_as_fixed_n(spans):
    fixed_records: list[dict] = []
    fixed = rag_agent(
        model(unverified_first),
        middleware=[middleware(spans, audit=fixed_records.append, min_samples=N)],
    ).invoke(ask())
    records: list[dict] = []
    llm = model(unverified_first)
    verified = middleware(spans, audit=records.append, agreement_prior=SCORED_PRIOR)
    result = rag_agent(llm, middleware=[verified]).invoke(ask())
    assert result["tracerag"]["decision"] == fixed["tracerag"]["decision"] == "pass"
    assert result["tracerag"]["answer"] == fixed["tracerag"]["answer"]
    adaptive = adaptive_of(records)
    # two agreeing samples that do not verify settle nothing: a third that verifies could
    # be chosen instead, so more are drawn
    assert 2 < adaptive["drawn"] <= N and adaptive["rounds"] == 2
    assert llm.call_count == 1 + adaptive["drawn"]
    assert "nowhere" not in result["messages"][-1].content


@pytest.mark.parametrize("how", ["invoke", "ainvoke"])
def test_min_samples_equal_to_n_samples_is_the_fixed_mode(spans, how):
    records: list[dict] = []
    llm = model()
    verified = middleware(spans, audit=records.append, min_samples=N)
    response = run(rag_agent(llm, middleware=[verified]), how)["tracerag"]
    assert response["decision"] == "pass"
    assert llm.call_count == 1 + N
    adaptive = adaptive_of(records)
    assert adaptive["drawn"] == N and adaptive["stop_reason"] == "fixed"
    assert adaptive["rounds"] == 1 and adaptive["min_samples"] == N
    assert len(spans.named(sc.SPAN_SAMPLE_ONE, response["request_id"])) == N


def test_the_metrics_say_how_many_were_drawn_and_why_sampling_stopped():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    verified = middleware(meter_provider=provider, agreement_prior=SCORED_PRIOR)
    rag_agent(model(), middleware=[verified]).invoke(ask())
    points = [
        point
        for rm in reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == sc.METRIC_SAMPLES
        for point in metric.data.data_points
    ]
    assert points and points[0].attributes[sc.METRIC_ATTR_STOP] == "settled"
    assert points[0].sum == 2


class ToolsAgain(ToolCallingChatModel):
    """Calls its tool again at the call numbered ``again`` instead of answering."""

    again: int = 2

    def _tool_call(self, messages, **kwargs):  # type: ignore[no-untyped-def]
        if kwargs.get("tools") and self.call_count == self.again:
            return super()._tool_call(messages, **{**kwargs, "tool_choice": "any"})
        return super()._tool_call(messages, **kwargs)


def test_a_sample_that_calls_a_tool_is_a_failed_sample_kept_with_its_error(spans):
    records: list[dict] = []
    # the tool round (call 0), the agent's answer (1), then the second sample calls the tool
    llm = ToolsAgain(responder=answering("24-month"), model_name="m", temperature=0.7)
    verified = middleware(
        spans, audit=records.append, agreement_prior=SCORED_PRIOR, speculative=False
    )
    result = rag_agent(llm, middleware=[verified]).invoke(ask())
    samples = records[0]["samples"]
    failed = [s for s in samples if s.get("error")]
    assert len(failed) == 1 and "called a tool" in failed[0]["error"]
    assert samples[1]["error"] == failed[0]["error"]  # the second sample, kept where it was
    # one answer of two settles nothing: the rule draws on
    assert adaptive_of(records)["drawn"] > 2
    assert result["tracerag"]["signal_detail"]["samples_failed"] == 1
    assert [m.type for m in result["messages"]] == ["human", "ai", "tool", "ai"]


# -- a model that takes n: a round in one call ---------------------------------------------


def answering_calls(llm_records: list[dict]) -> list[dict]:
    (record,) = llm_records
    return [c for c in record["usage"]["calls_detail"] if c["stage"] == "sample"]


@pytest.mark.parametrize("how", ["invoke", "ainvoke"])
def test_the_bundled_model_answers_a_round_in_one_call_billed_once(spans, how):
    records: list[dict] = []
    bare = rag_agent(ExtractiveChatModel(seed=1)).invoke(ask())
    bare_input = bare["messages"][-1].usage_metadata["input_tokens"]
    llm = ExtractiveChatModel(seed=1)
    verified = middleware(spans, audit=records.append, min_samples=N)
    response = run(rag_agent(llm, middleware=[verified]), how)["tracerag"]
    assert response["decision"] == "pass"
    adaptive = adaptive_of(records)
    assert adaptive["drawn"] == N and adaptive["calls"] == 1
    (call,) = answering_calls(records)
    # one call for the five answers, right after the tool results: the prompt billed once
    assert call["generations"] == N
    assert call["input_tokens"] == bare_input
    samples = records[0]["samples"]
    assert len({s["answer"] for s in samples}) >= 1 and len(samples) == N
    # every sample span says what it was shown; only the call's first carries its usage
    children = spans.named(sc.SPAN_SAMPLE_ONE, response["request_id"])
    billed = [c for c in children if sc.GENAI_USAGE_INPUT_TOKENS in (c.attributes or {})]
    assert len(children) == N and len(billed) == 1


def test_adaptive_rounds_with_n_are_one_call_each(spans):
    records: list[dict] = []
    llm = ExtractiveChatModel(seed=1)
    verified = middleware(spans, audit=records.append)
    response = rag_agent(llm, middleware=[verified]).invoke(ask())["tracerag"]
    adaptive = adaptive_of(records)
    assert adaptive["calls"] == adaptive["rounds"] < adaptive["drawn"]
    calls = answering_calls(records)
    assert sum(c.get("generations", 1) for c in calls) == adaptive["drawn"]
    assert len({c["input_tokens"] for c in calls}) == 1  # the identical prompt every round
    assert response["decision"] == "pass"


def _chat_openai(base_url: str, client: httpx.Client, aclient: httpx.AsyncClient):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        base_url=base_url,
        api_key="test-key",
        model="extractive",
        temperature=0.7,
        max_retries=0,
        timeout=30,
        http_client=client,
        http_async_client=aclient,
    )


@pytest.mark.parametrize("first", [N, 2])
def test_chat_openai_asks_for_a_round_in_one_request_with_n(first):
    pytest.importorskip("langchain_openai")
    from openai_tools import ToolCompletionsServer

    with ToolCompletionsServer.running() as server, httpx.Client(timeout=30) as client:
        aclient = httpx.AsyncClient(timeout=30)
        try:
            llm = _chat_openai(server.base_url, client, aclient)
            bare = rag_agent(llm).invoke(ask())
            bare_bodies = len(server.bodies)
            bare_input = sum(
                m.usage_metadata["input_tokens"]
                for m in bare["messages"]
                if getattr(m, "usage_metadata", None)
            )
            records: list[dict] = []
            verified = middleware(audit=records.append, min_samples=first)
            result = rag_agent(llm, middleware=[verified]).invoke(ask())
        finally:
            asyncio.run(aclient.aclose())
    assert result["tracerag"]["decision"] == "pass", result["tracerag"]["signal_detail"]
    asked = server.bodies[bare_bodies:]
    answering_bodies = asked[1:]  # the first is the tool round
    adaptive = adaptive_of(records)
    assert len(answering_bodies) == adaptive["rounds"] == adaptive["calls"]
    assert sum(int(b.get("n") or 1) for b in answering_bodies) == adaptive["drawn"]
    # the first round: min_samples, or the fewest a unanimous verified answer settles on
    expected = first_round(verified.settings, N, None, None, shape=UNSCORED)
    assert expected >= first
    assert int(answering_bodies[0].get("n") or 1) == expected
    assert [b["messages"] for b in answering_bodies] == [answering_bodies[0]["messages"]] * len(
        answering_bodies
    )
    billed = records[0]["usage"]["input_tokens"]  # the answering calls (the tool round is not)
    per_round = answering_calls(records)[0]["input_tokens"]
    assert billed == per_round * adaptive["calls"]
    if first == N:  # fixed N=5 in one request: the answering prompt billed once
        tool_round = bare_input - per_round
        assert tool_round + billed <= 1.5 * bare_input, (billed, bare_input)


# -- a model's max_concurrency -------------------------------------------------------------


class InFlight:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0

    def enter(self) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def leave(self) -> None:
        with self.lock:
            self.now -= 1


class OneSlotToolModel(ToolCallingChatModel):
    """A tool-calling model that counts the calls in flight at once (and takes its time)."""

    max_concurrency: int | None = None
    _seen: InFlight = PrivateAttr(default_factory=InFlight)

    @property
    def most(self) -> int:
        return self._seen.most

    def _reply(self, messages: list[BaseMessage], **kwargs: Any) -> ChatResult:
        self._seen.enter()
        try:
            return super()._reply(messages, **kwargs)  # sleeps ``latency``
        finally:
            self._seen.leave()

    async def _areply(self, messages: list[BaseMessage], **kwargs: Any) -> ChatResult:
        self._seen.enter()
        try:
            return await super()._areply(messages, **kwargs)
        finally:
            self._seen.leave()


@pytest.mark.parametrize("how", ["invoke", "ainvoke"])
@pytest.mark.parametrize(("limit", "most"), [(None, N), (1, 1), (2, 2)])
def test_answering_calls_beyond_the_model_limit_queue(how, limit, most):
    llm = OneSlotToolModel(
        responder=answering("24-month"), model_name="m", latency=0.02, max_concurrency=limit
    )
    verified = middleware(min_samples=N)
    response = run(rag_agent(llm, middleware=[verified]), how)["tracerag"]
    assert response["signal_detail"]["samples_ok"] == N
    assert llm.most == most


def test_the_settings_limit_overrides_the_models_own():
    llm = OneSlotToolModel(
        responder=answering("24-month"), model_name="m", latency=0.02, max_concurrency=1
    )
    verified = middleware(min_samples=N, max_concurrency=3)
    rag_agent(llm, middleware=[verified]).invoke(ask())
    assert llm.most == 3


def test_a_one_slot_model_answers_five_samples_without_timeouts():
    # each call takes 0.1 s and may take 0.3 s: five at once on one slot would wait 0.4 s
    llm = OneSlotToolModel(
        responder=answering("24-month"), model_name="m", latency=0.1, max_concurrency=1
    )
    policy = RetryPolicy(attempts=1, model_timeout=0.3)
    verified = middleware(min_samples=N, retry=policy)
    response = rag_agent(llm, middleware=[verified]).invoke(ask())["tracerag"]
    assert response["signal_detail"]["samples_ok"] == N
    assert response["signal_detail"]["samples_failed"] == 0
    assert llm.most == 1


def test_a_sample_call_that_holds_its_slot_too_long_still_times_out(spans):
    records: list[dict] = []
    llm = OneSlotToolModel(
        responder=answering("24-month"), model_name="m", latency=0.2, max_concurrency=1
    )
    policy = RetryPolicy(attempts=1, model_timeout=0.1)
    verified = middleware(spans, min_samples=3, n_samples=3, retry=policy, audit=records.append)
    response = rag_agent(llm, middleware=[verified]).invoke(ask())["tracerag"]
    # the agent's own answering call is not timed by tracerag; the two drawn beside it are
    assert response["signal_detail"]["samples_ok"] == 1
    errors = [s["error"] for s in records[0]["samples"][1:]]
    assert all(e and "ModelTimeoutError" in e for e in errors), errors


def test_a_server_that_ignores_n_leaves_no_sample_undrawn():
    """A server that answers once whatever ``n`` asks: the samples the call owed are drawn
    one call each, never copies of one answer and never lost."""
    pytest.importorskip("langchain_openai")
    from openai_tools import ToolCompletionsServer

    with ToolCompletionsServer.running() as server, httpx.Client(timeout=30) as client:
        original = server.answer
        asked_n: list[int] = []

        def one_choice(body):
            asked_n.append(int(body.get("n") or 1))
            return original({**body, "n": 1})

        server.answer = one_choice  # type: ignore[method-assign]
        aclient = httpx.AsyncClient(timeout=30)
        try:
            records: list[dict] = []
            llm = _chat_openai(server.base_url, client, aclient)
            verified = middleware(audit=records.append, min_samples=N)
            result = rag_agent(llm, middleware=[verified]).invoke(ask())
        finally:
            asyncio.run(aclient.aclose())
    response = result["tracerag"]
    assert response["signal_detail"]["samples_ok"] == N
    # the tool round; the first answering call asked for all five at once and got one; the
    # other four asked for one each
    assert asked_n == [1, N, 1, 1, 1, 1]
    assert adaptive_of(records)["calls"] == N
