"""Deterministic failures of an app run are not retried; transient ones are."""

from __future__ import annotations

import asyncio
from typing import TypedDict

import pydantic
import pytest
from langgraph.errors import GraphRecursionError, InvalidUpdateError
from langgraph.graph import START, StateGraph

from tracerag._llm import Tries, retry_call
from tracerag._settings import RetryPolicy
from tracerag.errors import ConfigurationError
from tracerag.testing import ScriptedModelError
from tracerag.wrapping._retryable import is_deterministic, is_transient

FAST = RetryPolicy(attempts=3, initial_wait=0.001, max_wait=0.01, jitter=0.0)


class AuthenticationError(Exception):
    """Named as provider SDKs name it (openai, anthropic)."""

    status_code = 401


class RateLimitError(Exception):
    status_code = 429


class HTTPStatusError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"status {status}")
        self.response = type("Response", (), {"status_code": status})()


class Model(pydantic.BaseModel):
    n: int


def validation_error() -> pydantic.ValidationError:
    try:
        Model(n="many")
    except pydantic.ValidationError as exc:
        return exc
    raise AssertionError("pydantic accepted a bad value")


@pytest.mark.parametrize(
    "error",
    [
        InvalidUpdateError("Expected dict, got How long?"),
        GraphRecursionError("Recursion limit of 25 reached"),
        validation_error(),
        AuthenticationError("invalid api key"),
        HTTPStatusError(403),
        KeyError("question"),
        ConfigurationError("bad"),
        TypeError("bad call"),
    ],
)
def test_deterministic_errors_are_not_retried(error):
    assert not is_transient(error)


@pytest.mark.parametrize(
    "error",
    [
        TimeoutError("read timed out"),
        ConnectionError("reset by peer"),
        RateLimitError("slow down"),
        HTTPStatusError(503),
        ScriptedModelError("flaky"),
        RuntimeError("upstream hiccup"),
    ],
)
def test_transient_errors_are_retried(error):
    assert is_transient(error)
    assert not is_deterministic(error)


def test_a_graph_given_the_wrong_input_is_tried_once():
    class State(TypedDict):
        question: str
        answer: str

    def answer(state: State):
        return {"answer": "x"}

    builder = StateGraph(State).add_sequence([answer])
    builder.add_edge(START, "answer")
    graph = builder.compile()
    tries = Tries()

    async def run():
        return await retry_call(
            lambda: graph.ainvoke("How long?"), FAST, retry_on=is_transient, tries=tries
        )

    with pytest.raises(InvalidUpdateError):
        asyncio.run(run())
    assert tries.count == 1
