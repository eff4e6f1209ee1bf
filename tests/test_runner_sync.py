"""invoke() from sync code and from inside a running event loop: context, loops, errors."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import threading
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.runnables import RunnableLambda
from pipeline_fixtures import GOOD, PLAN, QUESTION

from tracerag import _semconv as semconv
from tracerag._sync import run_sync
from tracerag.testing import ScriptedChatModel

marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker", default="unset")


async def _marker_and_loop() -> tuple[str, asyncio.AbstractEventLoop]:
    return marker.get(), asyncio.get_running_loop()


def _model() -> ScriptedChatModel:
    return ScriptedChatModel(responses=[GOOD], plan_responses=[PLAN])


def test_invoke_inside_a_running_loop_continues_the_callers_trace(make_pipeline, spans):
    pipeline = make_pipeline(_model(), audit=None)
    tracer = spans.provider.get_tracer("app")

    async def main() -> tuple[Any, Any]:
        with tracer.start_as_current_span("caller") as parent:
            return pipeline.invoke(QUESTION), parent.get_span_context()

    response, parent = asyncio.run(main())
    root = spans.named(semconv.SPAN_REQUEST, response.request_id)[0]
    assert root.parent is not None
    assert root.parent.span_id == parent.span_id
    assert root.context.trace_id == parent.trace_id
    assert response.trace_id == format(parent.trace_id, "032x")


def test_invoke_from_sync_code_continues_the_callers_trace(make_pipeline, spans):
    pipeline = make_pipeline(_model(), audit=None)
    with spans.provider.get_tracer("app").start_as_current_span("caller") as parent:
        response = pipeline.invoke(QUESTION)
    root = spans.named(semconv.SPAN_REQUEST, response.request_id)[0]
    assert root.parent is not None and root.parent.span_id == parent.get_span_context().span_id


class _Runs(BaseCallbackHandler):
    def __init__(self) -> None:
        self.model_starts = 0
        self.chains: list[tuple[str, Any, Any]] = []

    def on_chat_model_start(self, serialized: Any, messages: Any, **kwargs: Any) -> None:
        self.model_starts += 1

    def on_chain_start(self, serialized: Any, inputs: Any, **kwargs: Any) -> None:
        self.chains.append((kwargs.get("name"), kwargs["run_id"], kwargs.get("parent_run_id")))


def test_the_callers_callbacks_reach_the_request_when_invoke_runs_inside_a_loop(make_pipeline):
    """A sync invoke() inside an async LCEL step keeps the step's callbacks (a contextvar):
    the request's run is the step's child; the model's runs are tracerag's, not the caller's."""
    llm = _model()
    pipeline = make_pipeline(llm, audit=None, n_samples=2)
    handler = _Runs()

    async def step(question: str) -> Any:
        return pipeline.invoke(question)  # sync call while the chain's event loop runs

    response = asyncio.run(RunnableLambda(step).ainvoke(QUESTION, {"callbacks": [handler]}))
    assert response.decision == "pass"
    assert llm.call_count == 3  # one plan call, two samples
    (outer, outer_id, _), (name, _, parent) = handler.chains
    assert (outer, name, parent) == ("step", "RAGPipeline", outer_id)
    assert handler.model_starts == 0


def test_sync_calls_reuse_one_event_loop_per_thread():
    first = run_sync(_marker_and_loop)[1]
    second = run_sync(_marker_and_loop)[1]
    assert first is second
    assert not first.is_running() and not first.is_closed()


def test_calls_inside_a_running_loop_share_one_background_loop_and_see_the_callers_context():
    async def main() -> list[tuple[str, asyncio.AbstractEventLoop]]:
        marker.set("from the caller")
        caller_loop = asyncio.get_running_loop()
        seen = [run_sync(_marker_and_loop), run_sync(_marker_and_loop)]
        assert all(loop is not caller_loop for _, loop in seen)
        return seen

    seen = asyncio.run(main())
    assert [value for value, _ in seen] == ["from the caller", "from the caller"]
    assert seen[0][1] is seen[1][1]


def test_a_threads_loop_is_closed_when_the_thread_ends():
    loops: list[asyncio.AbstractEventLoop] = []
    thread = threading.Thread(target=lambda: loops.append(run_sync(_marker_and_loop)[1]))
    thread.start()
    thread.join()
    gc.collect()
    assert len(loops) == 1 and loops[0].is_closed()


def test_errors_reach_the_caller_from_both_paths():
    async def fails() -> None:
        raise LookupError("the coroutine's own error")

    with pytest.raises(LookupError, match="own error"):
        run_sync(fails)

    async def main() -> None:
        with pytest.raises(LookupError, match="own error"):
            run_sync(fails)

    asyncio.run(main())
    assert run_sync(_marker_and_loop)[0] == "unset"  # the thread's loop is still usable


def test_a_sync_call_made_on_the_background_loop_does_not_wait_on_itself():
    marker.set("outer")

    async def inner() -> str:
        return marker.get() + "+inner"

    async def outer() -> str:
        return run_sync(inner)  # runs on the background loop: must not block it on itself

    async def main() -> str:
        return run_sync(outer)

    result: list[str] = []
    thread = threading.Thread(
        target=contextvars.copy_context().run, args=(lambda: result.append(asyncio.run(main())),)
    )
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "a nested sync call deadlocked"
    assert result == ["outer+inner"]
