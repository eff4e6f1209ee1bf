"""One declaration per part of a request's state; every projection comes from it.

Each stage output (and the input, and the state) lists its signals in ``SIGNALS``. These tests
check that every declared signal reaches every place it names (stage span, OpenInference output
value, stage event, audit record, metrics outcome, root span, root metadata) on real requests,
that a signal added to a table is emitted everywhere with no other edit, and that the code that
emits does not read stage outputs by hand.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import textwrap
from collections.abc import Callable
from typing import Any, TypedDict

import pytest
from langchain_core.documents import Document
from langchain_core.prompts import ChatPromptTemplate
from langgraph.graph import START, StateGraph
from pipeline_fixtures import FAST_RETRY, GOOD, GOOD_ALT, QUESTION, WRONG_NUMBER, scripted

from tracerag import _runner as runner
from tracerag import _semconv as semconv
from tracerag import _state as state
from tracerag import events, wrap
from tracerag._declare import EACH, OMIT, Signal, jsonable, plain
from tracerag._state import (
    Decision,
    PlanResult,
    Registration,
    RequestInput,
    RequestState,
    Retrieval,
    RunVersions,
    Sample,
    SampleSet,
    Selection,
    Verification,
)
from tracerag.signals._citations import CitationReport
from tracerag.signals._consistency import ConsistencyReport
from tracerag.signals._types import Plan
from tracerag.telemetry import _instruments
from tracerag.testing import ScriptCall, ScriptedChatModel, SpanCapture

#: each part, and the stage whose span carries its ``span`` and ``io`` signals
PARTS: dict[type, str] = {
    RequestInput: "register",
    Registration: "register",
    Retrieval: "retrieve",
    PlanResult: "plan",
    SampleSet: "sample",
    Verification: "verify",
    Decision: "assemble",
    RequestState: "",
}


class Emitted:
    """Everything one request emitted, and the final state it was projected from."""

    def __init__(self) -> None:
        self.spans = SpanCapture()
        self.events: list[events.StageEvent] = []
        self.records: list[dict[str, Any]] = []
        self.outcomes: list[_instruments.RequestOutcome] = []
        self.states: list[RequestState] = []

    def sink(self, record: dict[str, Any]) -> bool:
        self.records.append(record)
        return True

    @property
    def state(self) -> RequestState:
        (final,) = self.states
        return final

    def stage_span(self, stage: str) -> Any:
        (span,) = self.spans.named(semconv.STAGE_SPANS[stage], self.state.request_id)
        return span

    def root(self) -> Any:
        return self.spans.root(self.state.request_id)

    def event(self, stage: str) -> events.StageEvent:
        (event,) = [e for e in self.events if e.stage == stage]
        return event


@pytest.fixture
def emitted(monkeypatch) -> Emitted:
    """Keep the final state the record is made from, and the metrics outcome."""
    found = Emitted()
    to_record = RequestState.to_record
    record_request = _instruments.record_request

    def keep_state(self: RequestState, response: Any = None) -> dict[str, Any]:
        found.states.append(self)
        return to_record(self, response)

    def keep_outcome(outcome: _instruments.RequestOutcome, **kwargs: Any) -> None:
        found.outcomes.append(outcome)
        record_request(outcome, **kwargs)

    monkeypatch.setattr(RequestState, "to_record", keep_state)
    monkeypatch.setattr(_instruments, "record_request", keep_outcome)
    return found


def _span_form(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(plain(v) for v in value)
    return plain(value)


def _at(record: dict[str, Any], path: str) -> Any:
    for key in path.split("."):
        assert key in record, f"record has no {path}"
        record = record[key]
    return record


def check_every_signal_reaches_its_places(found: Emitted, unstamped: tuple[type, ...] = ()) -> int:
    """Assert each declared signal of each present part is where its table says; the count.

    ``unstamped``: parts whose stage does not put them on its span (``wrap()``'s retrieve
    stage when the app retrieves only inside its runs: the sample span shows the materials).
    """
    final = found.state
    (record,) = found.records
    (outcome,) = found.outcomes
    root = found.root().attributes
    meta = json.loads(root[semconv.OI_METADATA])
    checked = 0
    for kind, part in final.parts():
        if part is None:
            continue
        stage = PARTS[kind]
        for signal in kind.SIGNALS:
            value = signal.get(final if signal.across else part)
            if value is OMIT:
                continue
            where = signal.destinations
            if "span" in where or "io" in where:
                attrs = found.stage_span(stage).attributes
            given = signal.when(value)
            shown = signal.span_as(value) if signal.span_as and given else value
            if "span" in where and given and shown is not None and kind not in unstamped:
                if signal.span == EACH:
                    for key, item in shown.items():
                        assert attrs[key] == _span_form(item), (kind.__name__, key)
                else:
                    assert attrs[signal.span] == _span_form(shown), (kind.__name__, signal.span)
            if "io" in where and given:
                output = json.loads(attrs[semconv.OI_OUTPUT_VALUE])
                assert output[signal.io] == json.loads(json.dumps(jsonable(value), default=str))
            if "stream" in where:
                event = found.event(stage)
                assert event.to_dict()["signals"][signal.stream] == jsonable(value)
            if "record" in where:
                assert _at(record, signal.record) == jsonable(value), signal.record
            if "metric" in where:
                assert getattr(outcome, signal.metric) == value, signal.metric
            if "root" in where and given and shown is not None:  # a Response was made
                assert root[signal.root] == _span_form(shown), signal.root
            if "meta" in where:
                assert meta[signal.meta] == jsonable(value), signal.meta
            checked += len(where)
    return checked


async def test_a_verified_request_emits_every_signal_where_its_part_declares_it(
    make_pipeline, emitted
) -> None:
    llm = scripted([GOOD, GOOD_ALT, WRONG_NUMBER])
    pipeline = make_pipeline(llm, n_samples=3, tracer_provider=emitted.spans.provider)
    request = {"question": QUESTION, "session_id": "s-1", "user_id": "u-1", "channel": "web"}
    await pipeline.arun(request, on_stage=emitted.events.append, record_sink=emitted.sink)
    assert all(part is not None for _, part in emitted.state.parts())
    assert check_every_signal_reaches_its_places(emitted) > 120


async def test_a_low_tier_request_emits_what_its_parts_declare(make_pipeline, emitted) -> None:
    pipeline = make_pipeline(scripted([GOOD]), tier="low", tracer_provider=emitted.spans.provider)
    await pipeline.arun(QUESTION, on_stage=emitted.events.append, record_sink=emitted.sink)
    assert emitted.state.verification is None and emitted.state.planning is None
    assert check_every_signal_reaches_its_places(emitted) > 40
    (record,) = emitted.records
    assert record["plan"] is None and record["signals"] == {}  # the layout's value


class _GraphState(TypedDict):
    question: str
    context: list[Document]
    answer: str


def _cite_returns(call: ScriptCall) -> str:
    for line in call.prompt.splitlines():
        if line.startswith("[") and "30 days" in line:
            return (
                f"Customers may return unused items within 30 days. [{line[1 : line.index(']')]}]"
            )
    return "I cannot tell. [9]"


async def test_a_wrapped_graph_emits_the_signals_read_across_the_state(retriever, emitted) -> None:
    """A graph that retrieves inside its node: the record's retrieval count and source come
    from the materials its runs added (signals declared ``across``)."""
    llm = ScriptedChatModel(responder=_cite_returns, model_name="scripted-x")
    store = retriever.vectorstore
    prompt = ChatPromptTemplate.from_messages([("human", "{question}\n{context}")])

    def retrieve(s: _GraphState) -> dict[str, Any]:
        return {"context": store.similarity_search(s["question"], k=3)}

    def generate(s: _GraphState) -> dict[str, Any]:
        numbered = "\n".join(f"[{i}] {d.page_content}" for i, d in enumerate(s["context"], 1))
        return {"answer": llm.invoke(prompt.invoke({**s, "context": numbered})).content}

    builder = StateGraph(_GraphState).add_sequence([retrieve, generate])
    builder.add_edge(START, "retrieve")
    wrapped = wrap(
        builder.compile(), n_samples=2, retry=FAST_RETRY, tracer_provider=emitted.spans.provider
    )
    await wrapped.arun(
        {"question": QUESTION}, on_stage=emitted.events.append, record_sink=emitted.sink
    )
    check_every_signal_reaches_its_places(emitted, unstamped=(Retrieval,))
    (record,) = emitted.records
    assert record["retrieval"]["source"] == "runs" and record["retrieval"]["count"] == 3
    assert record["versions"]["prompt"].startswith("sha256:")  # learned from the runs


def _counting(v: Verification) -> int:
    return len(v.by_sample)


async def test_a_signal_added_to_a_table_is_emitted_everywhere_it_names(
    make_pipeline, emitted, monkeypatch
) -> None:
    """One edit: a Signal appended to ``Verification.SIGNALS`` reaches the verify span, its
    output value, the stage event, the record, the root span and its metadata; a metric field
    is filled from whatever signal the table names for it."""
    added = Signal(
        _counting,
        span="tracerag.signal.verified_samples",
        io="verified_samples",
        stream="verified_samples",
        record="signals.verified_samples",
        root="tracerag.verified_samples",
        meta="verified_samples",
    )
    coverage = Signal(lambda v: 0.125, metric="citation_coverage")
    kept = tuple(s for s in Verification.SIGNALS if s.metric != "citation_coverage")
    monkeypatch.setattr(Verification, "SIGNALS", (*kept, added, coverage))
    pipeline = make_pipeline(scripted([GOOD]), n_samples=3, tracer_provider=emitted.spans.provider)
    await pipeline.arun(QUESTION, on_stage=emitted.events.append, record_sink=emitted.sink)
    verify = emitted.stage_span("verify").attributes
    assert verify["tracerag.signal.verified_samples"] == 3
    assert json.loads(verify[semconv.OI_OUTPUT_VALUE])["verified_samples"] == 3
    assert emitted.event("verify").to_dict()["signals"]["verified_samples"] == 3
    assert emitted.records[0]["signals"]["verified_samples"] == 3
    assert emitted.root().attributes["tracerag.verified_samples"] == 3
    meta = json.loads(emitted.root().attributes[semconv.OI_METADATA])
    assert meta["verified_samples"] == 3
    assert emitted.outcomes[0].citation_coverage == 0.125


async def test_a_part_that_is_missing_gives_its_absent_value(make_pipeline, emitted) -> None:
    """A request refused at registration: the record keeps the layout's values, the metrics
    count no samples (``absent=0``), the root span says no route."""
    pipeline = make_pipeline(
        scripted([GOOD]), model_version=None, tracer_provider=emitted.spans.provider
    )
    with pytest.raises(Exception, match="no model version"):
        await pipeline.arun(QUESTION, record_sink=emitted.sink)
    (record,) = emitted.records
    assert list(record)[: len(state.RECORD_LAYOUT)] == list(state.RECORD_LAYOUT)
    assert record["tier"] is None and record["params"] == {} and record["retrieval"] == {}
    assert emitted.outcomes[0].n_samples == 0 and emitted.outcomes[0].tier is None
    root = emitted.root().attributes
    assert semconv.DECISION not in root and root[semconv.ERROR_COUNT] == 1


def test_span_and_io_values_read_their_own_part() -> None:
    """A stage stamps its span before the state holds its output: no span or io signal may
    read across the state."""
    for kind in PARTS:
        for signal in kind.SIGNALS:
            assert not (signal.across and (signal.span or signal.io)), (kind, signal)
            assert signal.destinations, f"{kind.__name__} declares a signal that goes nowhere"


def test_stage_event_signals_come_from_the_table() -> None:
    """A StageEvent's signals are its output's ``stream`` signals, in table order."""
    decision_keys = [s.stream for s in Decision.SIGNALS if s.stream]
    assert decision_keys == ["confidence", "decision"]
    reg = Registration(
        request_id="r1",
        tier="high",  # type: ignore[arg-type]
        versions=RunVersions(prompt="p", model="m", tracerag="x"),
        n_samples=3,
        temperature=0.7,
        plan_mode="separate",  # type: ignore[arg-type]
    )
    snapshot = RequestState(input=RequestInput(question="q"), registration=reg)
    event = events.StageEvent(stage="register", skipped=False, duration_s=0.1, state=snapshot)  # type: ignore[arg-type]
    assert event.signals() == {
        "tier": "high",
        "n_samples": 3,
        "prompt_version": "p",
        "model_version": "m",
    }
    assert events.StageEvent("verify", True, None, snapshot).signals() == {}  # type: ignore[arg-type]


# -- the code that emits reads the tables, never the outputs' fields -------------------------

#: the code that turns a state into what a request emits
PROJECTIONS: list[Callable[..., Any]] = [
    RequestState.to_record,
    RequestState.root_attributes,
    RequestState.root_metadata,
    RequestState.outcome_fields,
    events.StageEvent.signals,
    events.StageEvent.to_dict,
    runner.outcome_of,
    runner._set_root,
]


def _field_names() -> set[str]:
    """Every field of the stage outputs and of what they hold."""
    kinds: list[type] = [
        *PARTS,
        Plan,
        Sample,
        Selection,
        RunVersions,
        CitationReport,
        ConsistencyReport,
    ]
    names = {f.name for kind in kinds for f in dataclasses.fields(kind)}
    # the event's own envelope, not a signal
    return names - {"request_id", "trace_id", "stage", "skipped", "duration_s"}


def test_the_projections_read_no_output_field_by_hand() -> None:
    from tracerag.stages import _retrieve as retrieve
    from tracerag.stages import _sample as sample

    fields = _field_names()
    stamping = [retrieve.record_materials, sample.record_samples]
    for function in [*PROJECTIONS, *stamping]:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
        read = sorted(
            {
                node.attr
                for node in ast.walk(tree)
                if isinstance(node, ast.Attribute) and node.attr in fields
            }
        )
        assert not read, f"{function.__qualname__} reads {read} by hand"
