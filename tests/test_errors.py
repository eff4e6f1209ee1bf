"""One error tree: what invoke() and constructors raise; what the input boundary refuses."""

from __future__ import annotations

import asyncio
import inspect

import pytest
from langchain_core.runnables import RunnableLambda
from pipeline_fixtures import GOOD, PLAN, QUESTION

from tracerag import RAGPipeline, errors, wrap
from tracerag._pipeline import build_settings, steps_for
from tracerag._runner import run
from tracerag._state import parse_input
from tracerag.contract import validate_response
from tracerag.errors import (
    ConfigurationError,
    ContractError,
    InputError,
    MissingVersionError,
    TraceragError,
)
from tracerag.stages._table import ModelSource
from tracerag.testing import ScriptedChatModel


def test_every_error_class_is_a_tracerag_error_and_named_in_the_tree():
    classes = [
        obj
        for _, obj in inspect.getmembers(errors, inspect.isclass)
        if obj.__module__ == errors.__name__
    ]
    assert len(classes) >= 10
    for cls in classes:
        assert issubclass(cls, TraceragError)
        assert cls.__name__ in (errors.__doc__ or ""), cls.__name__
    assert sorted(errors.__all__) == sorted(c.__name__ for c in classes)
    import tracerag

    for cls in classes:
        assert getattr(tracerag, cls.__name__) is cls and cls.__name__ in tracerag.__all__


def test_store_errors_are_in_the_tree_and_keep_the_builtins_callers_catch():
    from tracerag.store import InvalidRecord, NotQueued, RequestNotFound, StoreError

    assert issubclass(StoreError, TraceragError)
    assert issubclass(RequestNotFound, KeyError) and issubclass(NotQueued, KeyError)
    assert issubclass(InvalidRecord, ValueError)


def test_validate_response_raises_a_tracerag_error_not_a_jsonschema_one():
    with pytest.raises(ContractError) as info:
        validate_response({"request_id": "r"})
    assert isinstance(info.value, TraceragError) and isinstance(info.value, ValueError)
    assert type(info.value).__module__ == "tracerag.errors"
    assert info.value.__cause__ is None and info.value.__suppress_context__

    bad = {
        "request_id": "r",
        "trace_id": None,
        "answer": None,
        "confidence": 1.5,
        "decision": "pass",
        "status": "answered",
        "signal_detail": {},
        "evidence": [],
        "versions": {"prompt": "p", "model": "m", "tracerag": "t"},
    }
    with pytest.raises(ContractError) as info:
        validate_response(bad)
    assert info.value.path == "/confidence"


def test_a_stage_without_its_dependency_raises_a_configuration_error():
    settings = build_settings(
        retriever=None,
        llm=ScriptedChatModel(responses=[GOOD], plan_responses=[PLAN]),
        prompt_version="p",
        model_version="m",
        audit=None,
    )
    with pytest.raises(ConfigurationError, match="retriever"):
        steps = steps_for("high", "separate", ModelSource())
        asyncio.run(run(parse_input(QUESTION), settings, steps))


def test_bad_audit_and_bad_chain_arguments_raise_configuration_errors(retriever):
    llm = ScriptedChatModel(responses=[GOOD])
    with pytest.raises(ConfigurationError, match="audit"):
        RAGPipeline(retriever, llm, prompt_version="p", model_version="m", audit=42)
    with pytest.raises(ConfigurationError, match="Runnable"):
        wrap(42)  # type: ignore[arg-type]


def test_a_missing_version_is_a_configuration_error(retriever):
    pipeline = RAGPipeline(
        retriever,
        ScriptedChatModel(responses=[GOOD]),
        prompt_version=None,
        model_version="m",
        audit=None,
    )
    with pytest.raises(MissingVersionError) as info:
        pipeline.invoke(QUESTION)
    assert isinstance(info.value, ConfigurationError)


@pytest.mark.parametrize(
    "question",
    [
        "\u200b",
        "\u200b\u200c\u200d\ufeff\u2060",
        " \u3164 \u2800 ",
        "\u0301\u0302",
        "\u202e\u202c\u00ad",
    ],
)
def test_a_question_of_invisible_characters_is_refused(question):
    with pytest.raises(InputError, match="visible"):
        parse_input(question)


@pytest.mark.parametrize(
    "value",
    [
        "How long? \ud800",
        "\udfff",
        {"question": QUESTION, "session_id": "s\ud800"},
        {"question": QUESTION, "user_id": "\udc00u"},
    ],
)
def test_a_lone_surrogate_in_the_input_is_refused(value):
    with pytest.raises(InputError, match="lone UTF-16 surrogate"):
        parse_input(value)


def test_valid_text_passes_the_input_boundary_and_surrogate_pairs_are_joined():
    assert parse_input("退货 \u200b要几天?").question == "退货 \u200b要几天?"
    assert parse_input("smile \ud83d\ude00").question == "smile \U0001f600"


def test_invoke_refuses_a_lone_surrogate_before_any_model_call(make_pipeline):
    llm = ScriptedChatModel(responses=[GOOD], plan_responses=[PLAN])
    with pytest.raises(InputError):
        make_pipeline(llm, audit=None).invoke(QUESTION + "\ud800")
    assert llm.call_count == 0


def test_wrap_refuses_an_invisible_question():
    chain = RunnableLambda(lambda q: GOOD)
    with pytest.raises(InputError):
        wrap(chain, prompt_version="p", model_version="m", audit=None).invoke("\u200b\u200b")
