"""The request state as a package: each part lives in the module of its concern, and
``from tracerag._state import X`` keeps working for every name it exported."""

from __future__ import annotations

import dataclasses

import pytest

import tracerag._state as state
from tracerag._choices import PlanMode, Tier
from tracerag._state import _fill, _input, _outputs, _record, _response
from tracerag._state._outputs import Registration, RunVersions
from tracerag.errors import InputError

HOMES = {
    _input: {"INPUT_KEYS", "MAX_EARLIER_TURNS", "Conversation", "RequestInput", "parse_input"},
    _outputs: {
        "ErrorLog",
        "PlanResult",
        "Registration",
        "Retrieval",
        "RunVersions",
        "Sample",
        "SampleSet",
        "Selection",
        "StageError",
        "StageRefusal",
        "Verification",
    },
    _response: {"Decision"},
    _record: {"RECORD_LAYOUT", "RECORD_VERSION", "RequestState"},
}


@pytest.mark.parametrize("name", sorted(state.__all__))
def test_every_name_of_the_package_is_its_home_module_s(name: str) -> None:
    homes = [module for module, names in HOMES.items() if name in names]
    if name == "ConversationSource":  # a Literal alias: no __module__ to check
        assert getattr(state, name) is _input.ConversationSource
        return
    assert len(homes) == 1, name
    assert getattr(state, name) is getattr(homes[0], name)
    assert name in homes[0].__all__


def test_the_package_exports_exactly_what_the_module_did() -> None:
    assert set(state.__all__) == set().union(*HOMES.values()) | {"ConversationSource"}


def test_a_part_s_record_keys_are_filled_in_their_sections_as_json() -> None:
    registration = Registration(
        request_id="r1",
        tier=Tier.HIGH,
        versions=RunVersions(prompt="p1"),
        n_samples=3,
        temperature=0.7,
        plan_mode=PlanMode.SEPARATE,
    )
    own = _fill.record_of(registration)
    assert own == {
        "tier": "high",
        "params": {"n_samples": 3, "temperature": 0.7, "plan_mode": "separate", "k": None},
    }
    assert type(own["tier"]) is str  # the Enum written as its JSON value
    # versions_from_runs is left out while empty (OMIT), written once a run supplied one
    later = _fill.record_of(dataclasses.replace(registration, versions_from_runs=("prompt",)))
    assert later["params"]["versions_from_runs"] == ["prompt"]
    absent: dict = {}
    _fill.fill_record(absent, _fill.compiled(Registration.SIGNALS).record, None, None)
    assert absent == {}  # a missing part writes nothing of its own


def test_parse_input_refuses_what_is_not_a_question_in_the_project_s_error_shape() -> None:
    with pytest.raises(InputError, match="got int"):
        state.parse_input(42)  # type: ignore[arg-type]
    assert state.parse_input("  How long?  ").question.strip() == "How long?"
