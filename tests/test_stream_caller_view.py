"""Nothing measured on a withheld answer reaches a stream: the verify stage's scores and the ids
the answer cited are the operator's (the audit record), not the caller's, on every library
stream surface — stream modes, ``astream_events`` v2 custom events, the v3 run stream."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from pipeline_fixtures import FAST_RETRY, scripted

from tracerag import RAGPipeline
from tracerag.events import STREAM_MODES

QUESTION = "How many days do I have to return an item?"
# a withheld answer: a number the material does not say, and an id nothing retrieved has
WITHHELD = (
    "Customers may return unused items within 93 days of delivery for a full refund. "
    "[returns] The zebracorn clause applies. [policy-zq9]"
)
PASSED = "Customers may return unused items within 30 days of delivery for a full refund. [returns]"
MODES = [m for m in STREAM_MODES if m != "messages"]
#: a score measured on the answer, as JSON or as a Response's repr shows it (None: not measured)
MEASURED = re.compile(r"citation_(score|coverage|accuracy)[\"']?[=:]\s*[0-9]")


@pytest.fixture
def pipeline(retriever):
    def make(answer: str, records: list[dict[str, Any]]) -> RAGPipeline:
        return _pipeline(retriever, answer, records)

    return make


def _pipeline(retriever: Any, answer: str, records: list[dict[str, Any]]) -> RAGPipeline:
    llm = scripted([answer], model_name="scripted")
    return RAGPipeline(
        retriever,
        llm,
        prompt_version="v1",
        model_version="scripted",
        n_samples=3,
        retry=FAST_RETRY,
        audit=records.append,
    )


def text(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False)


def test_the_record_keeps_what_the_stream_does_not(pipeline):
    records: list[dict[str, Any]] = []
    response = pipeline(WITHHELD, records).invoke(QUESTION)
    assert response.decision == "escalate"
    assert records[-1]["signals"]["citations"]["fabricated"] == ["policy-zq9"]


@pytest.mark.parametrize("mode", MODES)
def test_no_stream_mode_carries_the_verify_scores_of_a_withheld_answer(pipeline, mode):
    records: list[dict[str, Any]] = []
    chunks = list(pipeline(WITHHELD, records).stream(QUESTION, stream_mode=mode))
    assert chunks
    seen = text(chunks)
    assert "policy-zq9" not in seen and "zebracorn" not in seen
    assert not MEASURED.search(seen), MEASURED.search(seen)
    if mode in ("updates", "custom", "debug", "values"):  # the verdicts still come
        assert '"citation_valid": false' in seen


def test_v2_custom_events_of_a_withheld_answer_keep_the_verdicts_only(pipeline):
    records: list[dict[str, Any]] = []
    stages = [
        event["data"]
        for event in _events(pipeline(WITHHELD, records))
        if event["event"] == "on_custom_event" and event["name"] == "tracerag.stage"
    ]
    names = [s["stage"] for s in stages]
    assert names.index("verify") == names.index("assemble") - 1  # told once routed
    (verify,) = [s for s in stages if s["stage"] == "verify"]
    assert verify["signals"] == {"citation_valid": False, "answers_question": True}


def test_v3_run_stream_of_a_withheld_answer_carries_no_measure_of_it(pipeline):
    records: list[dict[str, Any]] = []
    run = pipeline(WITHHELD, records).stream_events(QUESTION, version="v3")
    events = list(run)
    assert run.output.decision == "escalate"
    seen = text(events)
    assert "policy-zq9" not in seen and not MEASURED.search(seen)


def test_a_released_answer_streams_its_whole_verification(pipeline):
    records: list[dict[str, Any]] = []
    updates = list(pipeline(PASSED, records).stream(QUESTION, stream_mode="updates"))
    (verify,) = [u["verify"] for u in updates if "verify" in u]
    assert verify["citation_score"] == 1.0 and verify["citation_valid"] is True


def _events(runnable: RAGPipeline) -> list[dict[str, Any]]:
    import asyncio

    async def collect() -> list[dict[str, Any]]:
        return [e async for e in runnable.astream_events(QUESTION, version="v2")]

    return asyncio.run(collect())
