"""Records in and out of the audit store: entries, trails, listing, actions, metrics, opening."""

from __future__ import annotations

import inspect
import json
import threading
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples
from store_fixtures import make_record

from tracerag._state import (
    ErrorLog,
    PlanResult,
    Registration,
    RequestInput,
    RequestState,
    Retrieval,
    RunVersions,
    Sample,
    SampleSet,
)
from tracerag.config import reset_config
from tracerag.errors import ConfigurationError
from tracerag.signals._types import Material, Plan
from tracerag.store import AuditStore, DuplicateRequest, InvalidRecord, RequestNotFound, open_store
from tracerag.store._codec import entries_from_record, record_from_entries
from tracerag.store._sqlite import SCHEMA_VERSION, SQLiteAuditStore

EXPECTED_KINDS = [
    "register",
    "retrieve",
    "plan",
    "sample",
    "sample",
    "sample",
    "verify",
    "response",
    "error",
    "error",
]


def test_entries_from_record_splits_in_stage_order() -> None:
    entries = entries_from_record(make_record())
    assert [e.kind for e in entries] == EXPECTED_KINDS
    assert {e.request_id for e in entries} == {"req-0001"}
    assert all(not e.sealed for e in entries)
    register, retrieve, plan = entries[0].payload, entries[1].payload, entries[2].payload
    assert register["versions"]["prompt"] == "support-answer@3f9c2a1"
    assert register["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert [m["score"] for m in retrieve["materials"]] == [0.912, 0.803, 0.655]
    assert [m["rank"] for m in retrieve["materials"]] == [1, 2, 3]
    assert plan["plan"]["material_ids"] == ["M01", "M02"]
    assert entries[3].payload["raw"].startswith("You can return")
    assert entries[6].payload["signals"]["citations"]["fabricated"] == ["M99"]
    assert entries[7].payload["decision"] == "review"
    assert entries[8].payload["type"] == "RateLimitError"


def test_unknown_keys_travel_in_the_response_entry() -> None:
    record = make_record(ticket_id="T-9", audit_persisted=False)
    entries = entries_from_record(record)
    assert entries[7].payload["extra"] == {"ticket_id": "T-9", "audit_persisted": False}
    assert record_from_entries(entries) == record


def test_record_from_a_real_request_state_round_trips() -> None:
    errors = ErrorLog()
    errors.record_error("retrieve", ConnectionError("vector store slow"), attempt=1)
    state = RequestState(
        input=RequestInput(question="Can I change my delivery address?", request_id="ctx-1"),
        registration=Registration(
            request_id="ctx-1",
            tier="high",
            versions=RunVersions(prompt="p@1", model="m@1", tracerag="0.1.0"),
            n_samples=1,
            temperature=0.7,
            plan_mode="separate",
        ),
        retrieval=Retrieval.of(
            (Material(id="M01", text="Addresses can be changed.", score=0.8, rank=1),),
            errors=errors.freeze(),
        ),
        planning=PlanResult(Plan(material_ids=("M01",))),
        samples=SampleSet(samples=(Sample(index=0, raw="Yes [M01].", answer="Yes [M01]."),)),
    )
    state = state.with_output("retrieve", state.retrieval)
    record = state.to_record()
    assert record["errors"][0]["type"] == "ConnectionError"
    assert record["errors"][0]["attempt"] == 1
    assert record_from_entries(entries_from_record(record)) == record


@pytest.mark.parametrize(
    "bad",
    [
        {},
        {"request_id": ""},
        {"request_id": 7},
        {"request_id": "x", "question": object()},
        ["request_id", "x"],
    ],
)
def test_invalid_records_are_refused(bad: object) -> None:
    with pytest.raises(InvalidRecord):
        entries_from_record(bad)  # type: ignore[arg-type]


def test_non_finite_floats_are_stored_as_names() -> None:
    record = make_record(confidence=float("nan"))
    entries = entries_from_record(record)
    assert entries[7].payload["confidence"] == "NaN"


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=examples(60), deadline=None)
@given(
    extra=st.dictionaries(
        st.text(min_size=1).filter(lambda k: k != "request_id"), _json, max_size=4
    ),
    samples=st.lists(_json, max_size=3),
    errors=st.lists(_json, max_size=3),
)
def test_any_json_record_round_trips(extra: dict, samples: list, errors: list) -> None:
    record = {"request_id": "r", **extra, "samples": samples, "errors": errors}
    back = record_from_entries(entries_from_record(record))
    assert back == json.loads(json.dumps(record))


# ---------------------------------------------------------------------------------------------
# Through a store (both backends)


def test_store_satisfies_the_protocol(store) -> None:
    assert isinstance(store, AuditStore)
    # isinstance on a runtime-checkable Protocol sees only that the names exist: every method
    # also takes the protocol's parameters, in order and of the same kind; more only with defaults
    members = {
        name
        for cls in AuditStore.__mro__
        if cls.__module__.startswith("tracerag.")
        for name in vars(cls)
        if not name.startswith("_")
    }
    assert {"append_record", "get", "verify_chain", "enqueue_review", "decide"} <= members
    for name in sorted(members):
        want = list(inspect.signature(getattr(AuditStore, name)).parameters.values())
        got = list(inspect.signature(getattr(type(store), name)).parameters.values())
        assert [(p.name, p.kind) for p in got[: len(want)]] == [(p.name, p.kind) for p in want], (
            name
        )
        extra = [p.name for p in got[len(want) :] if p.default is inspect.Parameter.empty]
        assert extra == [], f"{name} requires more than the protocol gives: {extra}"


def test_append_and_get_returns_everything(store) -> None:
    record = make_record()
    store.append_record(record)
    trail = store.get("req-0001")
    assert trail.record == record
    assert [e.kind for e in trail.entries if e.kind in EXPECTED_KINDS] == EXPECTED_KINDS
    seqs = [e.seq for e in trail.entries]
    assert seqs == sorted(seqs) and all(e.sealed for e in trail.entries)
    assert trail.trace_id == record["trace_id"]
    assert trail.versions["model"] == "gpt-4o-mini-2024-07-18"
    assert trail.retrieved_ids == ["M01", "M02", "M03"]
    assert trail.cited_not_retrieved == ["M99"]
    assert [c["verdict"] for c in trail.claims] == [
        "supported",
        "fabricated_citation",
        "stale",
        "uncited",
    ]
    assert len(trail.samples) == 3 and trail.samples[2]["error"].startswith("TimeoutError")
    assert trail.decision == "review" and trail.confidence == 0.72
    assert len(trail.errors) == 2
    # a review-routed record is queued in the same transaction
    assert trail.review is not None and trail.review.status == "pending"
    assert [e.kind for e in trail.actions] == ["review_enqueued"]


def test_unknown_request_raises_a_key_error(store) -> None:
    with pytest.raises(RequestNotFound) as info:
        store.get("nope")
    assert isinstance(info.value, KeyError)
    assert "nope" in str(info.value)


def test_a_record_is_written_once(store) -> None:
    store.append_record(make_record())
    with pytest.raises(DuplicateRequest):
        store.append_record(make_record())
    assert len(store.get("req-0001").of_kind("register")) == 1
    assert store.verify_chain().ok


def test_an_invalid_record_writes_nothing(store) -> None:
    store.append_record(make_record("a", decision="pass"))
    with pytest.raises(InvalidRecord):
        store.append_record({"request_id": "b", "question": object()})
    with pytest.raises(RequestNotFound):
        store.get("b")
    report = store.verify_chain()
    assert report.ok and report.head_seq == 10


def test_list_requests_newest_first_with_filters(store) -> None:
    for i, decision in enumerate(["pass", "review", "escalate", "pass"]):
        store.append_record(make_record(f"r{i}", decision=decision, confidence=0.5 + i / 10))
    listed = store.list_requests()
    assert [r.request_id for r in listed] == ["r3", "r2", "r1", "r0"]
    assert listed[0].decision == "pass" and listed[0].confidence == pytest.approx(0.8)
    assert listed[0].question.startswith("I received")
    assert listed[1].review_status == "pending" and listed[0].review_status is None
    assert [r.request_id for r in store.list_requests(decision="pass")] == ["r3", "r0"]
    assert len(store.list_requests(limit=2)) == 2
    cut = datetime.fromisoformat(listed[1].created_at)
    assert [r.request_id for r in store.list_requests(since=cut)] == ["r3", "r2"]
    assert [r.request_id for r in store.list_requests(until=cut)] == ["r1", "r0"]
    future = datetime.now(timezone.utc) + timedelta(hours=1)
    assert store.list_requests(since=future) == []
    assert len(store.list_requests(since="2000-01-01T00:00:00Z")) == 4


def test_operator_actions_are_audited(store) -> None:
    store.append_record(make_record(decision="pass"))
    entry = store.append_action(
        "req-0001",
        "operator_action",
        actor="ops:carol",
        payload={
            "what": "threshold change",
            "before": {"pass": 0.85},
            "after": {"pass": 0.9},
        },
        reason="too many wrong refunds",
    )
    assert entry.sealed and entry.actor == "ops:carol" and entry.created_at
    assert entry.payload["reason"] == "too many wrong refunds"
    trail = store.get("req-0001")
    assert trail.actions[-1] == entry
    assert trail.actions[-1].payload["before"] == {"pass": 0.85}
    with pytest.raises(RequestNotFound):
        store.append_action("missing", "note", actor="bob", payload={}, reason="x")
    with pytest.raises(InvalidRecord):
        store.append_action("req-0001", "register", actor="bob", payload={})
    with pytest.raises(InvalidRecord):
        store.append_action("req-0001", "review_decision", actor="bob", payload={})
    with pytest.raises(InvalidRecord):
        store.append_action("req-0001", "note", actor=" ", payload={})
    assert store.verify_chain().ok


def test_metrics(store) -> None:
    store.append_record(make_record("a", decision="pass", confidence=0.9, errors=[]))
    store.append_record(make_record("b", decision="review", confidence=0.7))
    store.append_record(make_record("c", decision="escalate", confidence=0.2))
    store.decide("b", "alice", "approve")
    m = store.metrics()
    assert m.requests == 3
    assert m.by_decision == {"pass": 1, "review": 1, "escalate": 1}
    assert m.with_errors == 2
    assert m.confidence_mean == pytest.approx(0.6)
    assert m.queue == {"pending": 1, "decided": 1}
    assert m.oldest_pending_at is not None
    assert m.review_actions == {"approve": 1}
    assert m.overturn_rate == 0.0
    assert m.rate("escalate") == pytest.approx(1 / 3)
    assert m.review_seconds_median is not None and m.review_seconds_median >= 0
    assert m.entries == store.verify_chain().head_seq
    future = datetime.now(timezone.utc) + timedelta(hours=1)
    assert store.metrics(since=future).requests == 0


def test_concurrent_writers_keep_one_linear_chain(backend) -> None:
    """Threads on one store, and several store instances (app instances) on one database."""
    stores = [backend.open() for _ in range(3)]
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            s = stores[worker % len(stores)]
            for i in range(8):
                s.append_record(make_record(f"w{worker}-{i}", decision="pass"))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors
        report = stores[0].verify_chain()
        assert report.ok, report.summary()
        assert report.checked == 6 * 8 * 10
        assert len(stores[0].list_requests(limit=1000)) == 48
    finally:
        for s in stores:
            s.close()


def test_store_is_durable_across_reopen(backend) -> None:
    s = backend.open()
    s.append_record(make_record())
    s.close()
    s = backend.open()
    try:
        assert s.get("req-0001").record == make_record()
        assert s.verify_chain().ok
    finally:
        s.close()


# ---------------------------------------------------------------------------------------------
# open_store and SQLite specifics


def test_open_store_paths_and_urls(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRACERAG_STORE", raising=False)
    reset_config()
    # nothing configured: refused, and no file appears in the working directory
    with pytest.raises(ConfigurationError, match="TRACERAG_STORE"):
        open_store()
    assert list(tmp_path.iterdir()) == []

    monkeypatch.setenv("TRACERAG_STORE", str(tmp_path / "env" / "a.sqlite"))
    reset_config()
    s = open_store()
    assert s.path == str(tmp_path / "env" / "a.sqlite")
    s.close()

    s = open_store("sqlite:///rel/b.sqlite")
    assert (tmp_path / "rel" / "b.sqlite").exists()
    s.close()
    s = open_store(f"sqlite:///{tmp_path}/c.sqlite")  # sqlite:////absolute
    assert s.path == f"{tmp_path}/c.sqlite"
    s.close()
    s = open_store("sqlite://")
    assert s.path == ":memory:"
    s.append_record(make_record())
    assert s.get("req-0001").record == make_record()
    s.close()
    with pytest.raises(ConfigurationError):
        open_store("mysql://localhost/db")


def test_sqlite_uses_wal_and_records_its_schema_version(tmp_path) -> None:
    import sqlite3

    path = tmp_path / "x" / "audit.sqlite"
    s = SQLiteAuditStore(path)
    s.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    versions = [r[0] for r in conn.execute("SELECT version FROM schema_version ORDER BY 1")]
    assert versions == list(range(1, SCHEMA_VERSION + 1))
    conn.close()


def test_closed_store_refuses_work(tmp_path) -> None:
    from tracerag.store import StoreError

    s = SQLiteAuditStore(tmp_path / "a.sqlite")
    s.close()
    with pytest.raises(StoreError):
        s.append_record(make_record())


def test_append_records_writes_a_batch_in_one_go(store) -> None:
    store.append_record(make_record("old", decision="pass"))
    outcomes = store.append_records(
        [
            make_record("n1", decision="pass"),
            {"request_id": ""},
            make_record("old", decision="pass"),
            make_record("n2", decision="escalate"),
            make_record("n1", decision="pass"),
        ]
    )
    kinds = [type(o).__name__ if o else None for o in outcomes]
    assert kinds == [None, "InvalidRecord", "DuplicateRequest", None, "DuplicateRequest"]
    assert store.get("n2").review.status == "pending"
    assert [r.request_id for r in store.list_requests()] == ["n2", "n1", "old"]
    assert store.verify_chain().ok
