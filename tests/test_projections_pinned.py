"""What a request emits, pinned: span attributes and events, stage events, the audit record, the
metrics and the caller's Response, on realistic requests through both front doors.

Every name and value a request puts on its spans, streams, records and meters is compared with
``golden/projections.json``, so a change to how the state is projected that changes a byte of
what users see fails here. Ids, times and durations are replaced by placeholders; the order of
the record's and the stream's keys is kept (they are JSON a reader may hash or diff), span
attributes are compared as maps.

A deliberate change to what is emitted: regenerate the file and review its diff::

    PINNED_WRITE=1 python -m pytest -q tests/test_projections_pinned.py
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any, TypedDict

import pytest
from langchain_core.documents import Document
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.prompts import ChatPromptTemplate
from langgraph.graph import START, StateGraph
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from pipeline_fixtures import (
    FABRICATED,
    FAST_RETRY,
    GOOD,
    GOOD_ALT,
    OFF_TOPIC,
    PLAN,
    POLICIES,
    QUESTION,
    WRONG_NUMBER,
    positional_answer,
    scripted,
    standard_chain,
)

import tracerag
from tracerag import RAGPipeline, wrap
from tracerag.telemetry import _instruments
from tracerag.testing import ScriptCall, ScriptedChatModel, SpanCapture

GOLDEN = Path(__file__).resolve().parent / "golden" / "projections.json"

ZH_QUESTION = "手机的保修期是多久？"
ZH_ANSWER = "手机享受12个月保修，人为损坏不在保修范围内。[warranty-zh]"


def _documents() -> list[Document]:
    return [Document(page_content=d.page_content, metadata=dict(d.metadata)) for d in POLICIES]


def _retriever() -> Any:
    from tracerag.demo.kb import build_vectorstore

    return build_vectorstore(_documents()).as_retriever(search_kwargs={"k": 5})


class _GraphState(TypedDict):
    question: str
    context: list[Document]
    answer: str


_GRAPH_PROMPT = ChatPromptTemplate.from_messages(
    [("human", "Answer from the context; cite passages as [n].\nQuestion: {question}\n{context}")]
)


def _numbered(docs: list[Document]) -> str:
    return "\n\n".join(f"[{i}] {d.page_content}" for i, d in enumerate(docs, 1))


def _cite_returns(call: ScriptCall) -> str:
    for line in call.prompt.splitlines():
        if line.startswith("[") and "30 days" in line:
            n = line[1 : line.index("]")]
            return f"Customers may return unused items within 30 days of delivery. [{n}]"
    return "I cannot tell. [9]"


def _graph(llm: ScriptedChatModel, *, template: bool = True) -> Any:
    """LangChain's RAG tutorial graph: it retrieves inside its own node (source ``runs``)."""
    store = _retriever().vectorstore

    def retrieve(state: _GraphState) -> dict[str, Any]:
        return {"context": store.similarity_search(state["question"], k=4)}

    def generate(state: _GraphState) -> dict[str, Any]:
        if template:
            messages = _GRAPH_PROMPT.invoke(
                {"question": state["question"], "context": _numbered(state["context"])}
            )
            return {"answer": llm.invoke(messages).content}
        prompt = f"Question: {state['question']}\n\n{_numbered(state['context'])}"
        return {"answer": llm.invoke(prompt).content}

    builder = StateGraph(_GraphState).add_sequence([retrieve, generate])
    builder.add_edge(START, "retrieve")
    return builder.compile()


def _pipeline(llm: ScriptedChatModel, spans: SpanCapture, meters: MeterProvider, **kw: Any):
    options: dict[str, Any] = {
        "prompt_version": "test-prompt-v1",
        "model_version": getattr(llm, "model_name", "fake-list-chat-model"),
        "n_samples": 3,
        "retry": FAST_RETRY,
        "tracer_provider": spans.provider,
        "meter_provider": meters,
    }
    options.update(kw)
    return RAGPipeline(_retriever(), llm, **options)


def _wrapped(app: Any, spans: SpanCapture, meters: MeterProvider, **kw: Any):
    options: dict[str, Any] = {
        "n_samples": 3,
        "retry": FAST_RETRY,
        "tracer_provider": spans.provider,
        "meter_provider": meters,
    }
    options.update(kw)
    return wrap(app, **options)


IDS = {"question": QUESTION, "session_id": "s-1", "user_id": "u-1", "channel": "web"}

Build = Callable[[SpanCapture, MeterProvider], tuple[Any, Any]]

SCENARIOS: dict[str, Build] = {
    "pipeline_high_pass": lambda s, m: (
        _pipeline(scripted([GOOD, GOOD_ALT, GOOD]), s, m),
        IDS,
    ),
    "pipeline_high_escalate": lambda s, m: (
        _pipeline(scripted([FABRICATED, WRONG_NUMBER, OFF_TOPIC]), s, m),
        QUESTION,
    ),
    "pipeline_high_mixed": lambda s, m: (
        _pipeline(scripted([GOOD, WRONG_NUMBER, GOOD_ALT, GOOD, OFF_TOPIC]), s, m, n_samples=5),
        QUESTION,
    ),
    "pipeline_medium": lambda s, m: (
        _pipeline(scripted([GOOD, WRONG_NUMBER, GOOD]), s, m, tier="medium"),
        QUESTION,
    ),
    "pipeline_low": lambda s, m: (_pipeline(scripted([GOOD]), s, m, tier="low"), IDS),
    "pipeline_inline": lambda s, m: (
        _pipeline(
            scripted([f"PLAN: {PLAN}\nANSWER: {GOOD}", f"ANSWER: {GOOD_ALT}"]),
            s,
            m,
            plan="inline",
        ),
        QUESTION,
    ),
    "pipeline_temperature_zero": lambda s, m: (
        _pipeline(scripted([GOOD]), s, m, temperature=0.0),
        QUESTION,
    ),
    "pipeline_bad_plan": lambda s, m: (
        _pipeline(ScriptedChatModel(responses=[GOOD], plan_responses=["no plan here"]), s, m),
        QUESTION,
    ),
    "pipeline_dead_model": lambda s, m: (
        _pipeline(ScriptedChatModel(responses=[GOOD], always_fail=True), s, m),
        QUESTION,
    ),
    "pipeline_model_without_temperature": lambda s, m: (
        _pipeline(FakeListChatModel(responses=[GOOD, GOOD_ALT]), s, m, tier="medium"),
        QUESTION,
    ),
    "pipeline_refused": lambda s, m: (
        _pipeline(scripted([GOOD]), s, m, model_version=None),
        {"question": QUESTION, "request_id": "mine-1"},
    ),
    "pipeline_chinese": lambda s, m: (
        _pipeline(
            ScriptedChatModel(
                responses=[ZH_ANSWER],
                plan_responses=['{"material_ids": ["warranty-zh"], "key_facts": ["12个月"]}'],
            ),
            s,
            m,
        ),
        {"question": ZH_QUESTION, "channel": "微信"},
    ),
    "wrap_lcel": lambda s, m: (
        _wrapped(
            standard_chain(
                _retriever(), ScriptedChatModel(responder=positional_answer, model_name="sx")
            ),
            s,
            m,
        ),
        QUESTION,
    ),
    "wrap_lcel_fabricated": lambda s, m: (
        _wrapped(
            standard_chain(
                _retriever(),
                ScriptedChatModel(responses=["Returns are accepted for 30 days. [42]"]),
            ),
            s,
            m,
            n_samples=2,
        ),
        QUESTION,
    ),
    "wrap_graph_runs": lambda s, m: (
        _wrapped(
            _graph(ScriptedChatModel(responder=_cite_returns, model_name="sx", temperature=0.0)),
            s,
            m,
            n_samples=2,
        ),
        {"question": QUESTION},
    ),
    "wrap_graph_refused": lambda s, m: (
        _wrapped(
            _graph(ScriptedChatModel(responder=_cite_returns, model_name="sx"), template=False),
            s,
            m,
            n_samples=2,
        ),
        {"question": QUESTION},
    ),
}


# -- normalising what changes from run to run ----------------------------------------------------

_TIME_KEYS = {"at", "started_at", "created_at", "duration_s", "latency_s"}
_ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(\+00:00|Z)?")
_TICKET = re.compile(r"T-[0-9a-f]{12}")
_HEX32 = re.compile(r"(?<![\w.])[0-9a-f]{32}(?!\w)")
_HEX16 = re.compile(r"(?<![\w.])[0-9a-f]{16}(?!\w)")
_SECONDS = re.compile(r'("(?:duration_s|latency_s)": )[0-9.e-]+')
_TIMINGS = re.compile(r'("timings": \{)[^}]*\}')


class _Names:
    """Stable placeholders for the ids of one run, in the order they are first seen."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}

    def __call__(self, kind: str, match: re.Match[str]) -> str:
        value = match.group(0)
        if value not in self.seen:
            count = sum(v.startswith(f"<{kind}") for v in self.seen.values())
            self.seen[value] = f"<{kind}{count}>"
        return self.seen[value]


def _text(value: str, names: _Names) -> str:
    value = value.replace(tracerag.__version__, "<version>")
    value = _ISO.sub("<time>", value)
    value = _TICKET.sub(lambda m: names("ticket", m), value)
    value = _HEX32.sub(lambda m: names("id", m), value)
    value = _HEX16.sub(lambda m: names("span", m), value)
    value = _SECONDS.sub(r'\1"<s>"', value)
    return _TIMINGS.sub(lambda m: m.group(1) + _timing_keys(m.group(0)) + "}", value)


def _timing_keys(text: str) -> str:
    return ", ".join(f'"{k}": "<s>"' for k in re.findall(r'"([a-z_]+)": [0-9.e-]+', text))


def _norm(value: Any, names: _Names, key: str | None = None) -> Any:
    if key in _TIME_KEYS and value is not None:
        return "<t>"
    if key == "timings" and isinstance(value, dict):
        return {k: "<s>" for k in value}
    if isinstance(value, dict):
        return {str(k): _norm(v, names, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_norm(v, names) for v in value]
    if isinstance(value, str):
        return _text(value, names)
    return value


def _attributes(attributes: Any, names: _Names) -> dict[str, Any]:
    out = {}
    for key in sorted(attributes or {}):
        value = attributes[key]
        if isinstance(value, tuple):
            value = list(value)
        out[key] = _norm(value, names, key.rsplit(".", 1)[-1])
        if key.endswith(("duration", "latency_s", ".seconds")):
            out[key] = "<s>"
    return out


def _metric_points(reader: InMemoryMetricReader) -> list[dict[str, Any]]:
    data = reader.get_metrics_data()
    points: list[dict[str, Any]] = []
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    entry: dict[str, Any] = {
                        "metric": metric.name,
                        "attributes": dict(sorted((point.attributes or {}).items())),
                    }
                    if isinstance(point, HistogramDataPoint):
                        entry["count"] = point.count
                        if "duration" not in metric.name:
                            entry["sum"] = round(point.sum, 9)
                    else:
                        entry["value"] = point.value  # type: ignore[union-attr]
                    points.append(entry)
    return sorted(points, key=lambda p: (p["metric"], json.dumps(p["attributes"])))


async def _capture(name: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    spans = SpanCapture()
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    runnable, request = SCENARIOS[name](spans, meters)
    outcomes: list[Any] = []
    original = _instruments.record_request

    def keep(outcome: Any, **kwargs: Any) -> None:
        outcomes.append(outcome)
        original(outcome, **kwargs)

    monkeypatch.setattr(_instruments, "record_request", keep)
    events: list[Any] = []
    records: list[dict[str, Any]] = []
    names = _Names()
    result: dict[str, Any] = {}

    def sink(record: dict[str, Any]) -> bool:
        records.append(record)
        return True

    try:
        response = await runnable.arun(request, on_stage=events.append, record_sink=sink)
        result["response"] = json.loads(response.model_dump_json())
    except Exception as exc:
        result["raised"] = f"{type(exc).__name__}: {exc}"  # named below, with the ids
    # the ids are named in the order the record gives them (then the spans')
    result["record"] = _text(json.dumps(records, ensure_ascii=False), names)
    result["stream"] = _text(json.dumps([e.to_dict() for e in events], ensure_ascii=False), names)
    if "response" in result:
        result["response"] = _norm(result["response"], names)
    if "raised" in result:
        result["raised"] = _text(result["raised"], names)
    finished = sorted(
        spans.spans(),
        key=lambda s: (
            s.name,
            (s.attributes or {}).get("tracerag.sample.index", -1),
            s.start_time or 0,
        ),
    )
    result["spans"] = [
        {
            "name": s.name,
            "status": s.status.status_code.name,
            "attributes": _attributes(s.attributes, names),
            "events": [
                {"name": e.name, "attributes": _attributes(e.attributes, names)}
                for e in s.events
                if e.name != "exception"
            ]
            + [
                {"name": "exception", "type": (e.attributes or {}).get("exception.type")}
                for e in s.events
                if e.name == "exception"
            ],
        }
        for s in finished
    ]
    result["outcomes"] = [
        _norm({f.name: _listed(getattr(o, f.name)) for f in fields(o)}, names) for o in outcomes
    ]
    result["metrics"] = _metric_points(reader)
    meters.shutdown()
    return result


def _listed(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return list(value)
    return dict(value) if isinstance(value, Mapping) else value


async def _capture_stream(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The custom events ``astream_events`` sends for a released answer."""
    spans = SpanCapture()
    meters = MeterProvider(metric_readers=[InMemoryMetricReader()])
    runnable, request = SCENARIOS["pipeline_high_pass"](spans, meters)
    names = _Names()
    sent = []
    async for event in runnable.astream_events(request, version="v2"):
        if event["event"] == "on_custom_event":
            sent.append({"name": event["name"], "data": event["data"]})
    return json.loads(_text(json.dumps(sent, ensure_ascii=False), names))


#: set to 1 to write what the requests emit now into the pinned file (the scenarios run),
#: instead of comparing
WRITE = os.environ.get("PINNED_WRITE") == "1"


@pytest.fixture(scope="module")
def golden() -> Iterator[dict[str, Any]]:
    if not WRITE:
        yield json.loads(GOLDEN.read_text("utf-8"))
        return
    fresh: dict[str, Any] = json.loads(GOLDEN.read_text("utf-8")) if GOLDEN.exists() else {}
    yield fresh
    GOLDEN.parent.mkdir(exist_ok=True)
    ordered = {name: fresh[name] for name in [*SCENARIOS, "astream_events"] if name in fresh}
    GOLDEN.write_text(json.dumps(ordered, ensure_ascii=False, indent=1) + "\n", "utf-8")


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_what_a_request_emits_is_unchanged(name, golden, monkeypatch) -> None:
    got = json.loads(json.dumps(await _capture(name, monkeypatch), ensure_ascii=False))
    if WRITE:
        golden[name] = got
        return
    expected = golden[name]
    for part in ("raised", "response", "stream", "record", "outcomes", "metrics"):
        assert got.get(part) == expected.get(part), f"{name}: {part} changed"
    assert [s["name"] for s in got["spans"]] == [s["name"] for s in expected["spans"]]
    for mine, theirs in zip(got["spans"], expected["spans"], strict=True):
        assert mine == theirs, f"{name}: span {mine['name']} changed"


async def test_the_stream_of_custom_events_is_unchanged(golden, monkeypatch) -> None:
    got = await _capture_stream(monkeypatch)
    if WRITE:
        golden["astream_events"] = got
        return
    assert got == golden["astream_events"]
