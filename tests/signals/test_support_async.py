"""Support backends from async code: a slow judge does not hold up the event loop.

The judge's model is gated: a call records that it started, then waits until another coroutine
on the same loop opens the gate. A judge that blocked the event loop would keep that coroutine
from running during the call (its blocking path gives up waiting after a few seconds), so the
recorded order of events shows whether the loop stayed free. No wall-clock threshold is used.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Sequence
from typing import Any

import httpx
import pytest
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pipeline_fixtures import POLICIES
from pydantic import PrivateAttr
from server_fixtures import make_app, make_store
from waiting import WaitTimeout, await_until

import tracerag
from tracerag._llm import ReplyChatModel
from tracerag.signals._citations import SUPPORTED, averify_citations, verify_citations
from tracerag.signals._lexical import LexicalSupport
from tracerag.signals._support import (
    USAGE_ATTRIBUTES,
    Support,
    acheck_support,
    get_backend,
    usage_scope,
)
from tracerag.signals._types import Material
from tracerag.testing import ScriptedChatModel, SpanCapture

RETURNS = POLICIES[0].page_content
SLOW_CLAIM_WORD = "30 days"  # the judge is slow on claims that mention this
RETURNS_ANSWER = (
    "Customers may return unused items within 30 days of delivery for a full refund. [returns]"
)
SHIPPING_ANSWER = "Orders of $50 or more ship free within mainland China. [shipping]"
SHIPPING_QUESTION = "How much does standard shipping cost?"
BLOCKING_WAIT = 3.0  # seconds the blocking path waits for the gate before giving up


def _verdict_for(prompt: str) -> str:
    claim = prompt.split("<claim>")[-1].split("</claim>")[0].strip()
    document = prompt.split("<document>")[-1].split("</document>")[0]
    for sentence in document.replace("\n", " ").split(". "):
        words = [w for w in claim.rstrip(".").split() if len(w) > 3][:3]
        if words and all(w.lower() in sentence.lower() for w in words):
            return json.dumps({"supported": True, "quote": sentence.strip().rstrip(".")})
    return json.dumps({"supported": False, "quote": ""})


class GatedJudgeModel(ReplyChatModel):
    """A judge model that is slow (gated) on some claims; it records when calls start and end."""

    events: Any  # the caller's list, shared (not copied)
    slow_word: str = SLOW_CLAIM_WORD

    _gate: asyncio.Event | None = PrivateAttr(default=None)
    _thread_gate: threading.Event = PrivateAttr(default_factory=threading.Event)

    @property
    def _llm_type(self) -> str:
        return "gated-judge"

    def open_gate(self) -> None:
        self._thread_gate.set()
        if self._gate is not None:
            self._gate.set()

    def _is_slow(self, messages: list[BaseMessage]) -> bool:
        return self.slow_word in str(messages[-1].content).split("<claim>")[-1]

    def _result(self, messages: list[BaseMessage]) -> ChatResult:
        text = _verdict_for(str(messages[-1].content))
        message = AIMessage(
            content=text,
            usage_metadata={"input_tokens": 100, "output_tokens": 10, "total_tokens": 110},
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _reply(self, messages: list[BaseMessage], **kwargs: Any) -> ChatResult:
        if self._is_slow(messages):
            self.events.append("judge started")
            self._thread_gate.wait(BLOCKING_WAIT)
            self.events.append("judge finished")
        return self._result(messages)

    async def _areply(self, messages: list[BaseMessage], **kwargs: Any) -> ChatResult:
        if self._is_slow(messages):
            if self._gate is None:
                self._gate = asyncio.Event()
                if self._thread_gate.is_set():
                    self._gate.set()
            self.events.append("judge started")
            await asyncio.wait_for(self._gate.wait(), BLOCKING_WAIT)
            self.events.append("judge finished")
        return self._result(messages)


class ThreadRecordingLexical(LexicalSupport):
    """The lexical backend with its own scoring, noting the thread each check runs in."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def __call__(
        self, claim: str, material_text: str, *, corpus: Sequence[str] | None = None
    ) -> Support:
        self.seen.append(threading.get_ident())
        return super().__call__(claim, material_text, corpus=corpus)


async def _when(events: list[str], event: str, limit: int = 2000) -> None:
    """Wait (yielding to the loop) until ``event`` is recorded."""
    try:
        await await_until(lambda: event in events, repr(event), timeout=limit * 0.005)
    except WaitTimeout as exc:
        raise WaitTimeout(f"{exc}; events: {events}") from None


def test_judge_is_exported_at_top_level_and_not_registered_by_its_constructor():
    judge = tracerag.JudgeSupport(GatedJudgeModel(events=[]))
    assert "JudgeSupport" in dir(tracerag)
    with pytest.raises(tracerag.ConfigurationError, match="JudgeSupport"):
        get_backend("judge")
    assert get_backend(judge) is judge


async def test_sync_backends_run_off_the_event_loop():
    loop_thread = threading.get_ident()
    backend = ThreadRecordingLexical()
    result = await backend.acheck("Refunds are paid within 7 business days.", RETURNS)
    assert result.supported
    assert backend.seen and backend.seen[0] != loop_thread


async def test_a_backend_without_acheck_is_called_in_a_worker_thread():
    loop_thread = threading.get_ident()
    seen: list[int] = []
    lexical = LexicalSupport()

    class Plain:
        name = "plain"
        threshold = 0.45

        def __call__(self, claim: str, material_text: str, *, corpus: Any = None) -> Support:
            seen.append(threading.get_ident())
            return lexical(claim, material_text, corpus=corpus)

    result = await acheck_support(Plain(), "Refunds are paid within 7 business days.", RETURNS)
    assert result.supported and seen[0] != loop_thread


async def test_verify_in_a_slow_judge_call_leaves_the_loop_free():
    events: list[str] = []
    model = GatedJudgeModel(events=events)
    judge = tracerag.JudgeSupport(model, retry_wait=0.0)
    materials = [Material(id="returns", text=RETURNS)]

    async def other() -> None:
        await _when(events, "judge started")
        events.append("other ran")
        model.open_gate()

    report, _ = await asyncio.gather(
        averify_citations(RETURNS_ANSWER, materials, backend=judge), other()
    )
    assert events == ["judge started", "other ran", "judge finished"]
    assert [c.verdict for c in report.claims] == [SUPPORTED]


async def test_pipeline_verify_awaits_the_judge_and_reports_its_cost():
    events: list[str] = []
    model = GatedJudgeModel(events=events)
    judge = tracerag.JudgeSupport(model, retry_wait=0.0)
    capture = SpanCapture()
    pipeline = _pipeline(judge, capture.provider)

    async def other() -> None:
        await _when(events, "judge started")
        events.append("other ran")
        model.open_gate()

    response, _ = await asyncio.gather(
        pipeline.ainvoke("How many days do I have to return an item?"), other()
    )
    assert events[:3] == ["judge started", "other ran", "judge finished"]
    assert response.decision == "pass", response
    # adaptive sampling checks the samples' citations between rounds: the judge runs (and its
    # cost lies) in the sample stage's span, and the request's usage counts it as verification
    sampled = capture.named("tracerag.sample", response.request_id)[0]
    attrs = dict(sampled.attributes or {})
    assert attrs[USAGE_ATTRIBUTES["calls"]] == 1  # the samples agree: one distinct answer
    assert attrs[USAGE_ATTRIBUTES["input_tokens"]] == 100
    assert attrs[USAGE_ATTRIBUTES["output_tokens"]] == 10
    verify = capture.named("tracerag.verify", response.request_id)[0]
    assert USAGE_ATTRIBUTES["calls"] not in dict(verify.attributes or {})  # counted once
    root = dict(capture.named("tracerag.request", response.request_id)[0].attributes or {})
    assert root["tracerag.usage.verify.calls"] == 1
    assert root["tracerag.usage.verify.input_tokens"] == 100


def _pipeline(judge: Any, tracer_provider: Any = None) -> Any:
    from pipeline_fixtures import FAST_RETRY

    from tracerag.demo.kb import build_vectorstore

    def answer(call: Any) -> str:
        return SHIPPING_ANSWER if SHIPPING_QUESTION in call.prompt else RETURNS_ANSWER

    retriever = build_vectorstore(list(POLICIES)).as_retriever(search_kwargs={"k": 3})
    llm = ScriptedChatModel(responder=answer, temperature=0.0)
    return tracerag.RAGPipeline(
        retriever,
        llm,
        prompt_version="test-prompt-v1",
        model_version=llm.model_name,
        n_samples=3,
        temperature=0.0,
        tier="medium",
        retry=FAST_RETRY,
        support_backend=judge,
        tracer_provider=tracer_provider,
        audit=None,
    )


async def test_served_requests_do_not_wait_for_another_requests_slow_judge(tmp_path):
    events: list[str] = []
    model = GatedJudgeModel(events=events)
    judge = tracerag.JudgeSupport(model, retry_wait=0.0)
    app = make_app(make_store(tmp_path), _pipeline(judge))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:

        async def slow() -> dict[str, Any]:
            reply = await client.post(
                "/v1/answer", json={"question": "How many days do I have to return an item?"}
            )
            events.append("slow answered")
            return reply.json()

        async def fast() -> dict[str, Any]:
            await _when(events, "judge started")
            reply = await client.post("/v1/answer", json={"question": SHIPPING_QUESTION})
            events.append("fast answered")
            model.open_gate()
            return reply.json()

        slow_body, fast_body = await asyncio.gather(slow(), fast())
    assert events == ["judge started", "fast answered", "judge finished", "slow answered"]
    assert slow_body["decision"] == "pass", slow_body
    assert fast_body["decision"] == "pass", fast_body


def test_usage_scope_counts_sync_judge_calls_and_cache_hits():
    judge = tracerag.JudgeSupport(GatedJudgeModel(events=[]), retry_wait=0.0)
    claim = "Refunds are paid to the original payment method within 7 business days."
    with usage_scope() as usage:
        assert judge(claim, RETURNS).supported
        assert judge(claim, RETURNS).supported
    assert (usage.calls, usage.input_tokens, usage.output_tokens, usage.cached) == (1, 100, 10, 1)
    report = verify_citations(
        claim + " [returns]", [Material(id="returns", text=RETURNS)], backend=judge
    )
    assert report.valid


async def test_an_answer_is_checked_by_a_sync_backend_in_one_worker_thread():
    loop_thread = threading.get_ident()
    backend = ThreadRecordingLexical()
    answer = (
        "Customers may return unused items within 30 days of delivery. [returns] "
        "Refunds are paid within 7 business days. [returns]"
    )
    report = await averify_citations(
        answer, [Material(id="returns", text=RETURNS)], backend=backend
    )
    assert report.valid
    seen = backend.seen
    assert len(seen) == 2 and len(set(seen)) == 1 and seen[0] != loop_thread


async def test_both_citation_checks_take_the_same_options_and_refuse_others():
    answer = "Refunds are paid within 7 business days. [1]"
    materials = [Material(id="returns", text=RETURNS)]
    options = {"backend": "lexical", "resolve": {"1": "returns"}.get, "today": None}
    sync = verify_citations(answer, materials, **options)
    both = (sync, await averify_citations(answer, materials, **options))
    assert [(r.valid, r.claims[0].material_id) for r in both] == [(True, "returns")] * 2
    with pytest.raises(TypeError, match="unexpected keyword argument 'resolver'"):
        verify_citations(answer, materials, resolver=None)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected keyword argument 'resolver'"):
        await averify_citations(answer, materials, resolver=None)  # type: ignore[call-arg]


def _record_scoring_threads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The threads the lexical backend scores claims in, as it scores them."""
    from tracerag.signals import _lexical as lexical

    seen: list[int] = []
    analyse = lexical.analyse

    def recording(*args: Any, **kwargs: Any) -> Any:
        seen.append(threading.get_ident())
        return analyse(*args, **kwargs)

    monkeypatch.setattr(lexical, "analyse", recording)
    return seen


async def test_lexical_checks_of_prepared_short_materials_stay_on_the_loop(monkeypatch):
    materials = [Material(id="returns", text=RETURNS)]
    verify_citations(RETURNS_ANSWER, materials)  # prepares the material
    seen = _record_scoring_threads(monkeypatch)
    report = await averify_citations(RETURNS_ANSWER, materials)
    assert report.valid
    assert seen == [threading.get_ident()]  # quicker in place than a hop to a worker thread


async def test_lexical_checks_of_a_new_material_leave_the_loop(monkeypatch):
    fresh = RETURNS + f" Ticket {threading.get_ident()}-{id(monkeypatch)} is not a policy."
    seen = _record_scoring_threads(monkeypatch)
    report = await averify_citations(RETURNS_ANSWER, [Material(id="returns", text=fresh)])
    assert report.valid
    assert len(seen) == 1 and seen[0] != threading.get_ident()  # preparing it is costly


async def test_lexical_checks_of_long_materials_leave_the_loop(monkeypatch):
    from tracerag.signals._lexical import CHEAP_CHARS

    long_text = " ".join([RETURNS] * (CHEAP_CHARS // len(RETURNS) + 1))
    materials = [Material(id="returns", text=long_text)]
    verify_citations(RETURNS_ANSWER, materials)  # prepared, yet long
    seen = _record_scoring_threads(monkeypatch)
    report = await averify_citations(RETURNS_ANSWER, materials)
    assert report.valid
    assert len(seen) == 1 and seen[0] != threading.get_ident()
