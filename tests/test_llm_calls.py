"""Model and retriever calls: which errors are retried, timeouts, output cap, clean text."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.messages import AIMessage
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableLambda
from pipeline_fixtures import GOOD, PLAN, QUESTION
from pydantic import BaseModel

from tracerag import RAGPipeline, RetryPolicy, wrap
from tracerag._llm import clean_message, is_transient, retry_call
from tracerag.errors import (
    CallTimeoutError,
    ConfigurationError,
    ModelTimeoutError,
    OutputTooLongError,
    RetrieverTimeoutError,
    TraceragError,
)
from tracerag.testing import ScriptedChatModel

NO_WAIT = dict(initial_wait=0.0, max_wait=0.0, jitter=0.0)
GUARD_S = 60  # only so a regression fails instead of hanging the suite; never reached


class StatusError(Exception):
    """An error shaped like a provider SDK's HTTP error."""

    def __init__(self, status_code: int) -> None:
        super().__init__(f"HTTP {status_code}")
        self.status_code = status_code


class HTTPishError(Exception):
    """An error shaped like httpx's HTTPStatusError (status on the response)."""

    def __init__(self, status_code: int) -> None:
        super().__init__(f"HTTP {status_code}")
        self.response = type("Resp", (), {"status_code": status_code})()


def _pydantic_error() -> Exception:
    class Strict(BaseModel):
        n: int

    try:
        Strict(n="not a number")  # type: ignore[arg-type]
    except Exception as exc:
        return exc
    raise AssertionError("pydantic accepted a bad value")


def _langgraph_invalid_update() -> Exception:
    errors = pytest.importorskip("langgraph.errors")
    return errors.InvalidUpdateError("two nodes wrote one channel")


@pytest.mark.parametrize(
    "error",
    [
        StatusError(400),
        StatusError(401),
        StatusError(403),
        StatusError(404),
        StatusError(422),
        HTTPishError(401),
        StatusError(501),
        ValueError("bad value from the model's code"),
        TypeError("bug"),
        KeyError("missing"),
        UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed"),
        json.JSONDecodeError("bad", "x", 0),
        OutputTooLongError(10, 5, "abcde"),
        ConfigurationError("no"),
        asyncio.CancelledError(),
    ],
    ids=lambda e: f"{type(e).__name__}-{getattr(e, 'status_code', '')}",
)
def test_errors_that_cannot_pass_on_retry_are_not_transient(error):
    assert is_transient(error) is False


def test_pydantic_and_langgraph_validation_errors_are_not_transient():
    assert is_transient(_pydantic_error()) is False
    assert is_transient(_langgraph_invalid_update()) is False


@pytest.mark.parametrize(
    "error",
    [
        StatusError(429),
        StatusError(408),
        StatusError(500),
        StatusError(503),
        HTTPishError(502),
        ConnectionError("reset"),
        TimeoutError("read timed out"),
        ModelTimeoutError(1.0),
        RetrieverTimeoutError(1.0),
        RuntimeError("provider hiccup"),
    ],
    ids=lambda e: f"{type(e).__name__}-{getattr(e, 'status_code', '')}",
)
def test_errors_that_may_pass_on_retry_are_transient(error):
    assert is_transient(error) is True


@pytest.mark.parametrize("error", [StatusError(401), StatusError(422), ValueError("x")])
def test_a_permanent_error_is_tried_once(error):
    calls = []

    async def fails() -> None:
        calls.append(1)
        raise error

    with pytest.raises(type(error)):
        asyncio.run(retry_call(fails, RetryPolicy(attempts=4, **NO_WAIT)))
    assert len(calls) == 1


def test_a_rate_limit_is_retried_up_to_the_bound():
    calls = []

    async def limited() -> None:
        calls.append(1)
        raise StatusError(429)

    with pytest.raises(StatusError):
        asyncio.run(retry_call(limited, RetryPolicy(attempts=3, **NO_WAIT)))
    assert len(calls) == 3


class _ForeverModel(ScriptedChatModel):
    """A chat model whose sample calls never return (plans answer at once)."""

    async def _agenerate(self, messages, stop=None, run_manager=None, **kwargs):
        text = self._next(messages)
        if self.calls[-1].task != "plan":
            await asyncio.Event().wait()
        return self._result(text)


class _ForeverRetriever(BaseRetriever):
    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        await asyncio.Event().wait()
        return []

    def _get_relevant_documents(self, query: str, *, run_manager: Any) -> list[Document]:
        raise NotImplementedError


def test_a_model_call_that_never_returns_becomes_a_failed_sample(retriever):
    llm = _ForeverModel(responses=[GOOD], plan_responses=[PLAN])
    policy = RetryPolicy(attempts=2, model_timeout=0.01, **NO_WAIT)
    pipeline = RAGPipeline(
        retriever,
        llm,
        prompt_version="p",
        model_version="m",
        n_samples=3,
        retry=policy,
        audit=None,
    )
    response = asyncio.run(asyncio.wait_for(pipeline.ainvoke(QUESTION), GUARD_S))
    assert response.decision == "escalate" and response.answer is None
    assert response.signal_detail.samples_failed == 3
    sample_calls = [c for c in llm.calls if c.task != "plan"]
    assert len(sample_calls) == 3 * 2  # each attempt timed out, and timeouts are retried


def test_a_retriever_that_never_returns_is_a_routed_failure():
    records: list[dict[str, Any]] = []
    pipeline = RAGPipeline(
        _ForeverRetriever(),
        ScriptedChatModel(responses=[GOOD], plan_responses=[PLAN]),
        prompt_version="p",
        model_version="m",
        retry=RetryPolicy(attempts=1, retriever_timeout=0.01, **NO_WAIT),
        audit=lambda record: records.append(record) or True,
    )
    response = asyncio.run(asyncio.wait_for(pipeline.ainvoke(QUESTION), GUARD_S))
    assert response.decision == "escalate"
    errors = [e for e in records[0]["errors"] if e["stage"] == "retrieve"]
    assert [e["type"] for e in errors] == ["RetrieverTimeoutError"]


def test_wrap_bounds_its_retriever_and_its_chain_runs():
    hung = _ForeverRetriever()

    async def never(question: str) -> str:
        await asyncio.Event().wait()
        return GOOD

    chain = hung | RunnableLambda(never)
    wrapped = wrap(
        chain,
        prompt_version="p",
        model_version="m",
        n_samples=2,
        audit=None,
        retry=RetryPolicy(attempts=1, model_timeout=0.01, retriever_timeout=0.01, **NO_WAIT),
    )
    response = asyncio.run(asyncio.wait_for(wrapped.ainvoke(QUESTION), GUARD_S))
    assert response.decision == "escalate"
    assert response.signal_detail.samples_failed == 2


def test_timeouts_have_sane_defaults_and_are_in_the_error_tree():
    policy = RetryPolicy()
    assert policy.model_timeout == 60.0 and policy.retriever_timeout == 10.0
    assert policy.max_output_chars == 20_000
    assert issubclass(ModelTimeoutError, CallTimeoutError)
    assert issubclass(CallTimeoutError, TraceragError)
    assert issubclass(CallTimeoutError, TimeoutError)
    with pytest.raises(ConfigurationError):
        RetryPolicy(model_timeout=0)


def test_a_megabyte_of_model_output_does_not_pass(make_pipeline):
    huge = GOOD + " " + "Customers may return unused items. " * 30_000  # ~1 MB
    assert len(huge) > 1_000_000
    records: list[dict[str, Any]] = []
    response = make_pipeline(
        ScriptedChatModel(responses=[huge], plan_responses=[PLAN]),
        audit=lambda record: records.append(record) or True,
    ).invoke(QUESTION)
    assert response.decision == "escalate"
    assert response.confidence is not None and response.confidence < 0.85
    assert response.answer is None
    assert response.signal_detail.samples_ok == 0
    failed = [e for e in records[0]["errors"] if e["type"] == "OutputTooLongError"]
    assert len(failed) == 5
    assert [len(s["raw"]) for s in records[0]["samples"]] == [20_000] * 5  # cut, not dropped
    assert all(s["raw"].startswith(GOOD) for s in records[0]["samples"])


def test_an_output_over_a_configured_cap_fails_its_sample_and_the_others_carry_on(make_pipeline):
    long_answer = GOOD + " And more." * 10
    policy = RetryPolicy(attempts=1, max_output_chars=len(GOOD) + 5, **NO_WAIT)
    llm = ScriptedChatModel(responses=[long_answer, GOOD, GOOD, GOOD], plan_responses=[PLAN])
    response = make_pipeline(llm, n_samples=4, retry=policy, audit=None).invoke(QUESTION)
    assert response.signal_detail.samples_ok == 3
    assert response.signal_detail.samples_failed == 1
    assert response.answer == GOOD


def test_wrap_caps_chain_output():
    chain = RunnableLambda(lambda q: GOOD + " padding" * 100)
    wrapped = wrap(
        chain,
        prompt_version="p",
        model_version="m",
        n_samples=2,
        audit=None,
        retry=RetryPolicy(attempts=1, max_output_chars=50, **NO_WAIT),
    )
    response = wrapped.invoke(QUESTION)
    assert response.signal_detail.samples_failed == 2
    assert response.decision == "escalate"


def test_a_lone_surrogate_in_model_output_is_replaced_and_the_record_encodes(make_pipeline):
    records: list[dict[str, Any]] = []
    llm = ScriptedChatModel(responses=[GOOD + " \ud800"], plan_responses=[PLAN + "\udfff"])
    response = asyncio.run(
        make_pipeline(llm, audit=lambda record: records.append(record) or True).ainvoke(QUESTION)
    )
    assert response.answer is not None and response.answer.endswith("\ufffd")
    response.model_dump_json().encode("utf-8")
    json.dumps(records[0], ensure_ascii=False).encode("utf-8")


def test_wrap_replaces_lone_surrogates_in_chain_output():
    chain = RunnableLambda(lambda q: GOOD + "\udc00")
    response = wrap(chain, prompt_version="p", model_version="m", n_samples=2, audit=None).invoke(
        QUESTION
    )
    response.model_dump_json().encode("utf-8")


def test_clean_message_joins_pairs_and_checks_block_content():
    pair = AIMessage(content="smile \ud83d\ude00")
    assert clean_message(pair, None).content == "smile \U0001f600"
    blocks = AIMessage(content=[{"type": "text", "text": "a\ud800"}, "b\udc00"])
    cleaned = clean_message(blocks, None)
    assert cleaned.content == [{"type": "text", "text": "a\ufffd"}, "b\ufffd"]
    with pytest.raises(OutputTooLongError) as info:
        clean_message(AIMessage(content=[{"type": "text", "text": "x" * 11}]), 10)
    assert info.value.length == 11 and info.value.text == "x" * 10
    untouched = AIMessage(content="fine")
    assert clean_message(untouched, 100) is untouched


def test_a_lone_surrogate_in_a_retrieved_document_does_not_crash_the_request(documents):
    from tracerag.demo.kb import build_vectorstore

    documents.append(
        Document(
            page_content="Returns \ud800 are possible within 30 days of delivery.",
            metadata={"title": "Returns \udc00 note", "source": "kb://\ud800"},
        )
    )
    retriever = build_vectorstore(documents).as_retriever(search_kwargs={"k": 6})
    records: list[dict[str, Any]] = []
    pipeline = RAGPipeline(
        retriever,
        ScriptedChatModel(responses=[GOOD], plan_responses=[PLAN]),
        prompt_version="p",
        model_version="m",
        audit=lambda record: records.append(record) or True,
    )
    response = pipeline.invoke(QUESTION)
    assert response.decision == "pass"
    texts = [m["text"] for m in records[0]["materials"]]
    assert any("\ufffd" in t for t in texts)
    json.dumps(records[0], ensure_ascii=False).encode("utf-8")


def test_a_call_that_fails_once_is_retried_and_its_attempts_and_retries_are_told():
    from tracerag._llm import Tries

    calls: list[int] = []
    heard: list[tuple[int, str]] = []
    tries = Tries()

    async def flaky() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise StatusError(503)
        return "ok"

    result = asyncio.run(
        retry_call(
            flaky,
            RetryPolicy(attempts=3, **NO_WAIT),
            on_retry=lambda attempt, error: heard.append((attempt, str(error))),
            tries=tries,
        )
    )
    assert result == "ok"
    assert len(calls) == 2 and tries.count == 2
    assert heard == [(1, "HTTP 503")]


def test_a_first_attempt_that_times_out_is_retried_under_the_same_bound():
    from tracerag._llm import Tries

    tries = Tries()
    calls: list[int] = []

    async def slow() -> None:
        calls.append(1)
        await asyncio.Event().wait()

    policy = RetryPolicy(attempts=2, model_timeout=0.01, **NO_WAIT)
    with pytest.raises(ModelTimeoutError):
        asyncio.run(asyncio.wait_for(retry_call(slow, policy, tries=tries), GUARD_S))
    assert len(calls) == 2 and tries.count == 2


def test_a_bounded_call_cancelled_from_elsewhere_is_cancelled_not_timed_out():
    from tracerag._llm import within

    started = asyncio.Event()

    async def hangs() -> None:
        started.set()
        await asyncio.Event().wait()

    async def main() -> None:
        task = asyncio.create_task(within(hangs, 30.0, ModelTimeoutError))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()

    asyncio.run(asyncio.wait_for(main(), GUARD_S))


def test_a_timeout_error_of_the_call_itself_is_not_taken_for_the_bound():
    from tracerag._llm import within

    async def own_timeout() -> None:
        raise TimeoutError("the client's own timeout")

    with pytest.raises(TimeoutError) as raised:
        asyncio.run(within(own_timeout, 30.0, ModelTimeoutError))
    assert not isinstance(raised.value, ModelTimeoutError)
    assert str(raised.value) == "the client's own timeout"


def test_bounds_nest_each_reporting_its_own_expiry():
    from tracerag._llm import within

    async def hangs() -> None:
        await asyncio.Event().wait()

    async def outer_first() -> None:
        with pytest.raises(TimeoutError) as raised:
            async with asyncio.timeout(0.01):
                await within(hangs, 30.0, ModelTimeoutError)
        assert not isinstance(raised.value, ModelTimeoutError)
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0

    async def inner_first() -> None:
        async with asyncio.timeout(30.0):
            with pytest.raises(ModelTimeoutError):
                await within(hangs, 0.01, ModelTimeoutError)
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0
        await asyncio.sleep(0)  # no cancellation is left pending on the task

    asyncio.run(asyncio.wait_for(outer_first(), GUARD_S))
    asyncio.run(asyncio.wait_for(inner_first(), GUARD_S))


def test_a_bounded_call_that_finishes_in_time_leaves_no_timer_behind():
    from tracerag._llm import within

    async def quick() -> str:
        await asyncio.sleep(0)  # a yield: the call suspends once, as a real one does
        return "ok"

    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert await within(quick, 30.0, ModelTimeoutError) == "ok"
        await asyncio.sleep(0)  # a yield, not a wait: the call's done callbacks run
        live = [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
        assert live == []

    asyncio.run(main())
