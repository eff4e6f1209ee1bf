"""The registry's parts, each on its own: batch ids, operators, the action table, one version's
commit steps, outcomes, the conflicts a version opens, identities from the chain, the baseline
and feedback's steps; and the direction of composition (no part imports the registry)."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from tracerag._identity import APP_VOUCHED, DECLARED, DESK_NAMED, SYSTEM_METHOD, OperatorIdentity
from tracerag.errors import InputError
from tracerag.materials import (
    ConcurrentChange,
    FeedbackLimits,
    InvalidTransition,
    MaterialRegistry,
    MaterialVersion,
    _reads,
)
from tracerag.materials._baseline import baseline_pending
from tracerag.materials._batches import Batches
from tracerag.materials._chained_rows import chained_changes, identities_of, read_row
from tracerag.materials._commit import base_row, clear_abandoned, row_after
from tracerag.materials._conflict_table import (
    CONFLICT_COLUMNS,
    conflict_candidates,
    open_conflicts_of,
    opened_conflicts,
)
from tracerag.materials._model import iso, utcnow
from tracerag.materials._operator import require_operator
from tracerag.materials._outcomes import moved
from tracerag.materials._transitions import MOVES, Action, action_of
from tracerag.materials.feedback import NOTE_REASON, GivenVerdict, _held_back

ROW = {
    "current_version": 2,
    "status": "active",
    "content_hash": "h2",
    "ema": 0.5,
    "outcomes": 4,
    "denials": 1,
    "pending_version": None,
}


# -- batches ----------------------------------------------------------------------------------
def test_a_batch_scope_gives_its_writes_one_id_and_restores_the_outer_one() -> None:
    batches = Batches()
    assert batches.current() is None
    with batches.scope("outer") as outer:
        assert outer == "outer" and batches.current() == "outer"
        with batches.scope() as inner:
            assert inner.startswith("batch-") and inner != "outer"
            assert batches.current() == inner
            assert batches.current("given") == "given"  # a version's own batch id wins
        assert batches.current() == "outer"
    assert batches.current() is None


def test_a_batch_scope_is_left_on_an_error_and_is_per_thread() -> None:
    batches = Batches()
    seen: list[str | None] = []
    with pytest.raises(RuntimeError, match="boom"), batches.scope("b-1"):
        worker = threading.Thread(target=lambda: seen.append(batches.current()))
        worker.start()
        worker.join()
        raise RuntimeError("boom")
    assert seen == [None]  # another thread's writes are not in this thread's batch
    assert batches.current() is None


# -- operators --------------------------------------------------------------------------------
def test_an_operator_is_named_and_a_bare_name_is_declared() -> None:
    assert require_operator("alice") == OperatorIdentity("alice", DECLARED)
    assert require_operator("tracerag") == OperatorIdentity("tracerag", SYSTEM_METHOD)
    given = OperatorIdentity("tracerag", DESK_NAMED)
    assert require_operator(given) is given  # an identity is kept as given
    for nobody in ("", "   ", OperatorIdentity(" "), None, 7):
        with pytest.raises(InputError, match="needs a named operator"):
            require_operator(nobody)  # type: ignore[arg-type]


# -- transitions ------------------------------------------------------------------------------
def test_the_action_table_names_every_action_once() -> None:
    assert set(MOVES) == set(Action)
    assert action_of("restore") is Action.RESTORE
    assert {a for a, m in MOVES.items() if m.resets_denials} == {Action.RESTORE, Action.DISMISS}
    assert MOVES[Action.REJECT].target == "deleted"
    with pytest.raises(InputError) as err:
        action_of("archive")
    assert str(err.value) == (
        "action must be one of ['approve', 'delete', 'dismiss', 'quarantine', 'reject', "
        "'restore'], not 'archive'"
    )


def test_a_transition_refuses_a_status_it_does_not_start_from(
    registry: MaterialRegistry,
) -> None:
    registry.register("a", "Gift cards never expire.", operator="kb", written_by="i@1")
    with pytest.raises(InvalidTransition, match="cannot restore 'a': it is active"):
        registry.restore("a", operator="lead", reason="r")
    with pytest.raises(InvalidTransition, match="no quarantine is proposed"):
        registry.dismiss("a", operator="lead", reason="r")
    with pytest.raises(InputError, match="a quarantine needs a reason"):
        registry.quarantine("a", operator="lead", reason=" ")
    assert [s.version.change for s in registry.history("a")] == ["create"]  # nothing written


# -- one version's commit ---------------------------------------------------------------------
def test_the_row_after_a_commit() -> None:
    new = MaterialVersion(material_id="m", version=3, content="x", written_by="w", operator="o")
    fresh = row_after(None, new, prior=0.7, make_current=True, pending="keep", reset_denials=True)
    assert fresh == {
        "current_version": 3,
        "status": "active",
        "content_hash": new.content_hash,
        "ema": 0.7,
        "outcomes": 0,
        "denials": 0,
        "pending_version": None,
    }
    held = row_after(ROW, new, prior=0.7, make_current=False, pending="set", reset_denials=False)
    assert held == {**ROW, "pending_version": 3}  # the version in service stays
    served = row_after(
        {**ROW, "pending_version": 3},
        new,
        prior=0.7,
        make_current=True,
        pending="clear",
        reset_denials=True,
    )
    assert served == {
        **ROW,
        "current_version": 3,
        "content_hash": new.content_hash,
        "denials": 0,
        "pending_version": None,
    }
    assert ROW["denials"] == 1  # the row given is not changed


def _unsealed(cur: Any, material_id: str, version: int, created_at: str) -> None:
    cur.execute(
        "INSERT INTO material_versions (material_id, version, status, written_by, operator, "
        "change, content_hash, created_at, body, body_hash) "
        "VALUES (?, ?, 'active', 'w', 'o', 'edit', 'h', ?, '{}', 'b')",
        (material_id, version, created_at),
    )


def test_a_commit_waits_for_a_version_in_flight_and_clears_an_abandoned_one(
    registry: MaterialRegistry,
) -> None:
    v = registry.register("a", "Gift cards never expire.", operator="kb", written_by="i@1")
    with registry.db.write() as cur:
        assert base_row(cur, v, 1) == read_row(cur, "a")
        with pytest.raises(ConcurrentChange, match="is at version 1, not 2"):
            base_row(cur, v, 2)
        _unsealed(cur, "a", 2, iso(utcnow()) or "")
    in_flight = "version 2 of 'a' is being written elsewhere"
    with pytest.raises(ConcurrentChange, match=in_flight), registry.db.write() as cur:
        clear_abandoned(cur, "a")
    with registry.db.write() as cur:
        cur.execute("DELETE FROM material_versions WHERE version = 2")
        _unsealed(cur, "a", 2, iso(utcnow() - timedelta(minutes=5)) or "")
        clear_abandoned(cur, "a")
        cur.execute("SELECT version FROM material_versions WHERE material_id = 'a'")
        assert [int(r[0]) for r in cur.fetchall()] == [1]  # the sealed version is kept


# -- outcomes ---------------------------------------------------------------------------------
def test_an_outcome_moves_the_ema_and_counts_only_a_weighted_denial() -> None:
    denied = moved(ROW, "deny", rate=0.5, weight=1.0, count_denial=True)
    assert (denied["ema"], denied["outcomes"], denied["denials"]) == (0.25, 5, 2)
    spared = moved(ROW, "deny", rate=0.5, weight=1.0, count_denial=False)
    assert (spared["ema"], spared["denials"]) == (0.25, 1)
    unweighted = moved(ROW, "deny", rate=0.5, weight=0.0, count_denial=True)
    assert (unweighted["ema"], unweighted["outcomes"], unweighted["denials"]) == (0.5, 5, 1)
    confirmed = moved(ROW, "confirm", rate=0.5, weight=1.0, count_denial=True)
    assert confirmed["ema"] == 0.75 and confirmed["denials"] == 1
    assert ROW["outcomes"] == 4  # the row given is not changed


def test_an_unknown_verdict_moves_nothing(registry: MaterialRegistry) -> None:
    registry.register("a", "Gift cards never expire.", operator="kb", written_by="i@1")
    with pytest.raises(InputError, match="verdict must be one of"):
        registry.apply_outcome("a", "maybe")
    assert registry.get("a").outcomes == 0


# -- conflicts a version opens ----------------------------------------------------------------
def test_the_conflicts_a_version_would_open(registry: MaterialRegistry) -> None:
    registry.register("old", "已拆封商品可在签收后30天内退货。", operator="kb", written_by="i@1")
    new = MaterialVersion(
        material_id="new", version=1, content="已拆封商品可在签收后7天内退货。", written_by="w"
    )
    looked: list[str] = []

    def find(material_id: str) -> Any:
        looked.append(material_id)
        return registry.find(material_id)

    ((conflict, version_b),) = conflict_candidates(registry.db, new, find, 0.5)
    assert (conflict.material_b, version_b, looked) == ("old", 1, ["new"])
    pending = replace(new, status="pending_review")
    assert conflict_candidates(registry.db, pending, find, 0.5) == []
    assert looked == ["new"]  # a version not going into service is not looked up
    same = MaterialVersion(
        material_id="old", version=2, content=registry.get("old").current.content
    )
    assert conflict_candidates(registry.db, same, registry.find, 0.5) == []  # text in service
    with registry.db.read() as cur:
        row = read_row(cur, "old")
        assert (
            opened_conflicts(
                cur, registry.db, same, row, serves=True, candidates=None, min_overlap=0.5
            )
            == []
        )
        assert (
            opened_conflicts(
                cur, registry.db, new, None, serves=False, candidates=None, min_overlap=0.5
            )
            == []
        )
        (opened,) = opened_conflicts(
            cur, registry.db, new, None, serves=True, candidates=None, min_overlap=0.5
        )
    assert tuple(opened) == CONFLICT_COLUMNS
    assert (opened["material_a"], opened["material_b"]) == ("new", "old")


def test_a_conflict_is_stored_and_read_by_the_same_columns(registry: MaterialRegistry) -> None:
    registry.register("old", "已拆封商品可在签收后30天内退货。", operator="kb", written_by="i@1")
    registry.register(
        "new", "已拆封商品可在签收后7天内退货。", operator="kb", written_by="i@1", gate=False
    )
    with registry.db.read() as cur:
        (stored,) = open_conflicts_of(cur, "new")
    (record,) = registry.conflicts()
    assert stored == {c: getattr(record, c) for c in CONFLICT_COLUMNS}


# -- identities, baseline ---------------------------------------------------------------------
def _entry(seq: int, payload: dict[str, Any], actor: str = "kb") -> Any:
    return SimpleNamespace(seq=seq, payload=payload, actor=actor)


def test_identities_come_from_the_chained_versions_only() -> None:
    events = {
        1: _entry(1, {"material_change": {"version": 1}, "identity": {"name": "kb", "x": 1}}),
        2: _entry(2, {"outcome": {"verdict": "deny"}}),
        3: _entry(3, {"material_change": {"version": 2}}, actor="bob"),
    }
    assert list(chained_changes(events)) == [1, 3]
    assert identities_of(events) == {
        1: {"name": "kb", "x": 1, "audit_seq": 1},
        2: {**OperatorIdentity("bob").to_dict(), "audit_seq": 3},  # declared, from the actor
    }


def test_a_fresh_registry_has_its_baseline_done(registry: MaterialRegistry) -> None:
    assert not baseline_pending(registry.db)
    with registry.db.write() as cur:
        cur.execute("UPDATE material_baseline SET done = 0 WHERE id = 1")
    assert baseline_pending(registry.db)


# -- reads ------------------------------------------------------------------------------------
def test_states_are_read_in_chunks(registry: MaterialRegistry, monkeypatch) -> None:
    monkeypatch.setattr(_reads, "CHUNK", 2)
    for i in range(5):
        registry.register(f"m{i}", f"Policy {i} applies.", operator="kb", written_by="i@1")
    states = registry.states(["m4", "nope", "m0", "m2", "m1", "m3", "m0"])
    assert sorted(states) == ["m0", "m1", "m2", "m3", "m4"]
    assert [s.material_id for s in registry.materials("active")] == [f"m{i}" for i in range(5)]
    assert registry.find("nope") is None


# -- feedback's steps -------------------------------------------------------------------------
def _given(who: OperatorIdentity, limits: FeedbackLimits | None) -> GivenVerdict:
    return GivenVerdict(
        "r-1", "deny", who, limits, None, None, None, "feedback", {}, {}, frozenset(), utcnow()
    )


def test_a_verdict_is_held_back_by_its_principal_and_its_window(
    registry: MaterialRegistry,
) -> None:
    user = OperatorIdentity("u1", APP_VOUCHED)
    limits = FeedbackLimits(material_window=60.0, per_material=1)
    with registry.db.write() as cur:
        assert _held_back(cur, _given(OperatorIdentity("u1"), limits), "a") == NOTE_REASON
        assert _held_back(cur, _given(user, None), "a") is None
        assert _held_back(cur, _given(user, limits), "a") is None
        cur.execute(
            "INSERT INTO material_feedback_effects (feedback_id, material_id, principal, "
            "counted, created_at) VALUES ('fb-1', 'a', 'u2', 1, ?)",
            (iso(utcnow()),),
        )
        assert _held_back(cur, _given(user, limits), "a") == (
            "the material received as many counted verdicts as it may in the window"
        )
        lead = OperatorIdentity("u2", DESK_NAMED)  # a person with authority is not capped...
        assert _held_back(cur, _given(OperatorIdentity("u3", DESK_NAMED), limits), "a") is None
        assert _held_back(cur, _given(lead, limits), "a") == (  # ...but moves it once a window
            "this principal's verdicts moved this material within the window"
        )


def test_a_given_verdict_counts_only_for_an_established_principal() -> None:
    note = _given(OperatorIdentity("u1"), None)
    assert (note.counts, note.principal) == (False, None)
    vouched = _given(OperatorIdentity("u1", APP_VOUCHED), None)
    assert (vouched.counts, vouched.principal) == (True, "u1")
    assert vouched.feedback_id.startswith("fb-") and vouched.feedback_id != note.feedback_id
    assert vouched.since(60) < vouched.created


# -- composition ------------------------------------------------------------------------------
def test_what_the_parts_share_cannot_be_swapped_under_them(registry: MaterialRegistry) -> None:
    from tracerag.materials import CredibilityPolicy, WriteGate

    for name, value in (
        ("policy", CredibilityPolicy(quarantine_after=9)),
        ("gate", WriteGate()),
        ("store", None),
        ("db", None),
        ("read_retention_days", 1),
    ):
        with pytest.raises(AttributeError):
            setattr(registry, name, value)
    assert registry.policy.quarantine_after == 3  # as the fixture opened it


def test_no_part_of_the_registry_imports_the_registry() -> None:
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("tracerag")
    parts = [
        "_baseline",
        "_batches",
        "_commit",
        "_conflict_table",
        "_chained_rows",
        "_operator",
        "_outcomes",
        "_reads",
        "_transitions",
        "_usage_log",
        "_reconcile",
        "_versions",
    ]
    for part in parts:
        imported = graph.find_modules_directly_imported_by(f"tracerag.materials.{part}")
        assert "tracerag.materials._registry" not in imported, part
        assert "tracerag.materials.feedback" not in imported, part
    assert "tracerag.materials._registry" in graph.find_modules_directly_imported_by(
        "tracerag.materials.feedback"
    )
