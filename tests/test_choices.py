"""Stages, tiers, plan modes and routes are named choices that every output shows as strings."""

from __future__ import annotations

import json
from enum import Enum

import pytest
from pipeline_fixtures import GOOD, QUESTION, scripted

import tracerag
from tracerag import ConfigurationError, PlanMode, Route, Stage, Tier
from tracerag._settings import Settings


def test_a_member_is_its_string_everywhere() -> None:
    assert Tier.LOW == "low" and {"low": 1}[Tier.LOW] == 1 and hash(Tier.LOW) == hash("low")
    assert str(Route.ESCALATE) == "escalate" and f"{Route.PASS:>6}" == "  pass"
    assert repr(Stage.PLAN) == "'plan'" and repr([Stage.PLAN]) == "['plan']"
    assert json.dumps({Tier.HIGH: [PlanMode.INLINE]}) == '{"high": ["inline"]}'
    assert type(str(Tier.HIGH)) is str
    assert [str(s) for s in Stage] == [
        "register",
        "retrieve",
        "plan",
        "sample",
        "verify",
        "assemble",
    ]


def test_a_name_becomes_its_member_and_a_wrong_name_is_a_configuration_error() -> None:
    settings = Settings(retriever=None, llm=None, tier="medium", plan_mode="inline")  # type: ignore[arg-type]
    assert settings.tier is Tier.MEDIUM and settings.plan_mode is PlanMode.INLINE
    assert settings.samples_for_tier() == 3
    with pytest.raises(
        ConfigurationError, match=r"tier must be one of \('high', 'medium', 'low'\), got 'top'"
    ):
        Settings(retriever=None, llm=None, tier="top")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"plan must be one of \('separate', 'inline'\)"):
        Settings(retriever=None, llm=None, plan_mode="later")  # type: ignore[arg-type]


def test_the_top_level_exports_the_choices() -> None:
    assert {"Stage", "Tier", "PlanMode", "Route"} <= set(tracerag.__all__)
    assert tracerag.Tier is Tier


def _enums_in(value: object) -> list[object]:
    if isinstance(value, Enum):
        return [value]
    if isinstance(value, dict):
        return [e for k, v in value.items() for e in (*_enums_in(k), *_enums_in(v))]
    if isinstance(value, (list, tuple)):
        return [e for v in value for e in _enums_in(v)]
    return []


async def test_spans_records_and_events_carry_plain_strings(make_pipeline, spans) -> None:
    """What leaves tracerag (span attributes, event attributes, the record, the stream) holds
    plain strings, so an exporter or a store never meets a member."""
    records: list[dict] = []
    heard: list[dict] = []
    pipeline = make_pipeline(scripted([GOOD]), tier=Tier.MEDIUM, n_samples=2)
    response = await pipeline.arun(
        QUESTION, on_stage=lambda e: heard.append(e.to_dict()), record_sink=records.append
    )
    assert response.tier == "medium" and type(response.tier) is str
    for span in spans.for_request(response.request_id):
        assert not _enums_in(dict(span.attributes or {})), span.name
        for event in span.events:
            assert not _enums_in(dict(event.attributes or {})), (span.name, event.name)
    (record,) = records
    assert not _enums_in(record) and not _enums_in(heard)
    assert record["tier"] == "medium" and record["skipped"] == ["plan"]
    assert [e["stage"] for e in heard][-1] == "assemble"
