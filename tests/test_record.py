"""The typed audit record: records of this and older versions, damaged ones, and its helpers."""

from __future__ import annotations

import asyncio

from pipeline_fixtures import FABRICATED, GOOD, QUESTION, scripted
from store_fixtures import make_record

from tracerag._state import RECORD_VERSION
from tracerag.store import RequestTrail
from tracerag.store._audit_record import AuditRecord
from tracerag.store._codec import entries_from_record


def test_a_version_1_record_without_the_field_parses_as_version_1() -> None:
    data = make_record()
    assert "record_version" not in data
    rec = AuditRecord.parse(data)
    assert rec.record_version == 1
    assert rec.versions.prompt == "support-answer@3f9c2a1"
    assert rec.retrieved_ids == ["M01", "M02", "M03"]
    assert rec.plan is not None and rec.plan.material_ids == ["M01", "M02"]
    assert [s.index for s in rec.samples] == [0, 1, 2]
    assert rec.samples[2].error == "TimeoutError: model call timed out after 20s"
    assert rec.citations.fabricated == ["M99"]
    assert rec.cited_not_retrieved == ["M99"]
    assert rec.signals.consistency is not None and rec.signals.consistency.group_count == 2
    assert rec.errors[0].type == "RateLimitError"


def test_a_record_written_by_a_pipeline_run_reads_back_typed(make_pipeline) -> None:
    records: list[dict] = []
    pipeline = make_pipeline(scripted([GOOD, GOOD, FABRICATED]), n_samples=3)
    response = asyncio.run(pipeline.arun(QUESTION, record_sink=lambda r: records.append(r) or True))
    (data,) = records
    rec = AuditRecord.parse(data)
    assert rec.record_version == RECORD_VERSION == 2
    assert rec.request_id == response.request_id and rec.trace_id == response.trace_id
    assert rec.decision == response.decision and rec.confidence == response.confidence
    assert rec.candidate_answer == GOOD
    assert rec.chosen_sample is not None and rec.chosen_sample.answer == GOOD
    assert "returns" in rec.cited_ids
    assert rec.params["n_samples"] == 3 and rec.params["plan_mode"] == "separate"
    assert [s.answer for s in rec.samples].count(FABRICATED) == 1
    assert set(rec.timings) >= {"register", "retrieve", "plan", "sample", "verify", "request"}
    # the recorded Response is the returned one, before its record was persisted
    assert rec.response is not None and rec.response.answer == response.answer
    assert data["response"]["audit_persisted"] is None and response.audit_persisted is True
    # the stored form (entries) reads back the same
    trail = RequestTrail(rec.request_id, entries_from_record(data))
    assert trail.audit == rec


def test_badly_typed_values_are_left_out_and_unknown_keys_kept() -> None:
    data = make_record(
        confidence="very",
        materials=[1, {"id": 7, "text": "x", "score": "high"}],
        plan="not a plan",
        samples=["plain text", {"index": 0, "answer": "A", "attempts": "two"}],
        errors=["boom"],
        replay_of="req-0000",
    )
    data["signals"]["rules"] = ["odd", {"name": "r", "passed": False}]
    rec = AuditRecord.parse(data)
    assert rec.confidence is None
    assert [(m.id, m.score) for m in rec.materials] == [("7", None)]
    assert rec.plan is None
    assert rec.samples[0].raw == "plain text" and rec.samples[1].attempts is None
    assert rec.errors[0].message == "boom"
    assert [r.name for r in rec.signals.rules] == ["odd", "r"]
    assert rec.rules_failed == ["r"]
    assert rec.replay_of == "req-0000"
    assert AuditRecord.parse({"request_id": "e"}).claims == []


def test_candidate_answer_falls_back_to_the_response() -> None:
    data = make_record()
    data["signals"]["selection"] = {"sample_index": 9}
    data["response"]["answer"] = "from the response"
    assert AuditRecord.parse(data).candidate_answer == "from the response"
    data["signals"]["selection"] = {"sample_index": 1}
    assert AuditRecord.parse(data).candidate_answer.startswith("Damaged items: 30 days")
