"""The runner builds an immutable state stage by stage; arun's hooks; one validated Response."""

from __future__ import annotations

import dataclasses
import re

import pytest
from pipeline_fixtures import GOOD, QUESTION, REPO, scripted

from tracerag import _semconv as semconv
from tracerag._state import Registration, RequestState, SampleSet
from tracerag.contract import Response
from tracerag.events import StageEvent

STAGES = ["register", "retrieve", "plan", "sample", "verify", "assemble"]


async def test_each_stage_event_holds_its_own_snapshot_of_the_state(make_pipeline) -> None:
    pipeline = make_pipeline(scripted([GOOD]), n_samples=3, audit=None)
    events: list[StageEvent] = []
    response = await pipeline.arun(QUESTION, on_stage=events.append)
    assert [e.stage for e in events] == STAGES
    by_stage = {e.stage: e for e in events}
    registered = by_stage["register"].state
    assert isinstance(by_stage["register"].output, Registration)
    assert registered.retrieval is None and registered.samples is None
    assert registered.registration is not None
    assert registered.registration.request_id == response.request_id
    assert by_stage["retrieve"].state.planning is None
    assert isinstance(by_stage["sample"].output, SampleSet)
    assert by_stage["verify"].state.decision is None
    final = by_stage["assemble"].state
    assert final.decision is not None and final.decision.confidence == response.confidence
    # later stages added to new states; the earlier snapshot is untouched
    assert registered.decision is None and "sample" not in registered.timings
    assert all(e.duration_s is not None and e.duration_s >= 0 for e in events)
    assert by_stage["verify"].to_dict()["signals"]["citation_valid"] is True


async def test_stage_outputs_and_settings_cannot_be_changed(make_pipeline) -> None:
    pipeline = make_pipeline(scripted([GOOD]), n_samples=2, audit=None)
    events: list[StageEvent] = []
    await pipeline.arun(QUESTION, on_stage=events.append)
    state = events[-1].state
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.samples = None  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.samples.samples[0].answer = "changed"  # type: ignore[misc,union-attr]
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.materials[0].rank = 9  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        pipeline.settings.tier = "low"  # type: ignore[misc]


async def test_async_listeners_are_awaited(make_pipeline) -> None:
    pipeline = make_pipeline(scripted([GOOD]), n_samples=1, audit=None)
    heard: list[str] = []

    async def listener(event: StageEvent) -> None:
        heard.append(event.stage)

    await pipeline.arun(QUESTION, on_stage=listener)
    assert heard == STAGES


@pytest.mark.parametrize("accepted", [True, False])
async def test_the_record_sink_of_a_call_decides_audit_persisted(
    make_pipeline, spans, accepted
) -> None:
    configured: list[dict] = []
    pipeline = make_pipeline(scripted([GOOD]), n_samples=1, audit=configured.append)
    taken: list[dict] = []

    async def sink(record: dict) -> bool:
        taken.append(record)
        return accepted

    response = await pipeline.arun(QUESTION, record_sink=sink)
    assert response.audit_persisted is accepted
    assert [r["request_id"] for r in taken] == [response.request_id]
    assert configured == []  # the call's sink replaced the configured one
    root = spans.root(response.request_id)
    assert root.attributes[semconv.AUDIT_PERSISTED] is accepted
    unrecorded = await pipeline.arun(QUESTION, record_sink=None)
    assert unrecorded.audit_persisted is None and len(taken) == 1


async def test_a_failing_sink_is_a_false_audit_persisted_not_a_failure(make_pipeline) -> None:
    def broken(record: dict) -> bool:
        raise OSError("disk full")

    pipeline = make_pipeline(scripted([GOOD]), n_samples=1, audit=broken)
    response = await pipeline.ainvoke(QUESTION)
    assert response.audit_persisted is False and response.decision == "pass"


async def test_the_response_is_validated_once_and_returned_as_built(
    make_pipeline, monkeypatch
) -> None:
    built: list[Response] = []
    validated: list[Response] = []
    original_init = Response.__init__

    def counting_init(self, **data):
        original_init(self, **data)
        built.append(self)

    def no_copy(self, *args, **kwargs):
        raise AssertionError("the Response was copied after it was validated")

    import tracerag._runner as runner

    original_validate = runner.validate_response
    monkeypatch.setattr(Response, "__init__", counting_init)
    monkeypatch.setattr(Response, "model_copy", no_copy)
    monkeypatch.setattr(
        runner, "validate_response", lambda r: (validated.append(r), original_validate(r))
    )
    pipeline = make_pipeline(scripted([GOOD]), n_samples=2, audit=lambda record: True)
    response = await pipeline.ainvoke(QUESTION)
    assert built == [response] and validated == [response]
    assert built[0] is response and validated[0] is response
    assert response.audit_persisted is True


async def test_a_refused_request_is_recorded_with_its_id(make_pipeline) -> None:
    records: list[dict] = []
    pipeline = make_pipeline(scripted([GOOD]), model_version=None, audit=records.append)
    with pytest.raises(Exception, match="no model version"):
        await pipeline.ainvoke({"question": QUESTION, "request_id": "mine-1"})
    (record,) = records
    assert record["request_id"] == "mine-1"
    assert record["errors"][-1]["stage"] == "request"
    assert record["errors"][-1]["type"] == "MissingVersionError"
    assert "register" in record["timings"] and "request" in record["timings"]


def test_stages_and_the_runner_never_read_the_environment() -> None:
    package = REPO / "tracerag"
    sources = [*sorted((package / "stages").glob("*.py"))]
    sources += [package / name for name in ("_runner.py", "_pipeline.py")]
    state_modules = sorted((package / "_state").glob("*.py"))
    assert len(state_modules) >= 5  # the package and its input, outputs, response and record
    sources += state_modules
    sources += [package / "store" / "_audit_record.py"]
    sources += [package / name for name in ("_runnable.py", "_sync.py", "_declare.py")]
    sources += [package / name for name in ("_choices.py", "events.py")]
    wrap_modules = sorted((package / "wrapping").glob("*.py"))
    assert len(wrap_modules) >= 8  # the package and its private modules
    sources += wrap_modules
    for path in sources:
        text = path.read_text("utf-8")
        found = re.findall(r"os\.environ|getenv|get_config\(", text)
        assert not found, f"{path.name} reads the environment: {found}"


def test_the_state_of_a_request_is_frozen() -> None:
    fields = {f.name for f in dataclasses.fields(RequestState)}
    assert {"registration", "retrieval", "planning", "samples", "verification", "decision"} <= (
        fields
    )
    assert RequestState.__dataclass_params__.frozen  # type: ignore[attr-defined]


async def test_the_call_hooks_pass_through_every_surface(make_pipeline) -> None:
    """on_stage and record_sink given to ainvoke, invoke, astream or bound with .bind() are
    arun's hooks for that call: nothing is dropped."""
    pipeline = make_pipeline(scripted([GOOD]), n_samples=1, audit=None)
    heard: list[str] = []
    kept: list[dict] = []

    def sink(record: dict) -> bool:
        kept.append(record)
        return True

    response = await pipeline.ainvoke(
        QUESTION, on_stage=lambda e: heard.append(e.stage), record_sink=sink
    )
    assert heard == STAGES and response.audit_persisted is True
    assert [r["request_id"] for r in kept] == [response.request_id]
    chunks = [c async for c in pipeline.astream(QUESTION, record_sink=sink)]
    assert chunks[0].audit_persisted is True and len(kept) == 2
    bound = pipeline.bind(record_sink=sink)
    assert (await bound.ainvoke(QUESTION)).audit_persisted is True and len(kept) == 3


def test_invoke_and_batch_pass_the_hooks_too(make_pipeline) -> None:
    pipeline = make_pipeline(scripted([GOOD]), n_samples=1, audit=None)
    kept: list[dict] = []
    response = pipeline.invoke(QUESTION, record_sink=lambda r: kept.append(r) or True)
    assert response.audit_persisted is True and len(kept) == 1
    answers = pipeline.batch([QUESTION, QUESTION], record_sink=lambda r: kept.append(r) or True)
    assert [a.audit_persisted for a in answers] == [True, True] and len(kept) == 3


@pytest.mark.parametrize("surface", ["invoke", "ainvoke", "astream", "batch"])
async def test_a_keyword_a_surface_does_not_take_is_refused_by_name(make_pipeline, surface) -> None:
    pipeline = make_pipeline(scripted([GOOD]), n_samples=1, audit=None)
    with pytest.raises(TypeError, match="unexpected keyword argument 'stop'"):
        if surface == "invoke":
            pipeline.invoke(QUESTION, stop=["\\n"])
        elif surface == "ainvoke":
            await pipeline.ainvoke(QUESTION, stop=["\\n"])
        elif surface == "astream":
            [c async for c in pipeline.astream(QUESTION, stop=["\\n"])]
        else:
            pipeline.batch([QUESTION], stop=["\\n"])
