"""The durable review queue: enqueue, claim, release, decide — and every transition audited."""

from __future__ import annotations

import threading

import pytest
from store_fixtures import make_record

from tracerag.store import (
    AlreadyDecided,
    ClaimedByOther,
    InvalidRecord,
    NotQueued,
    RequestNotFound,
)


def test_routed_records_are_queued_automatically(store) -> None:
    store.append_record(make_record("p", decision="pass", confidence=0.91))
    store.append_record(make_record("r", decision="review", confidence=0.7))
    store.append_record(make_record("e", decision="escalate", confidence=0.3))
    queue = store.list_queue()
    assert [(i.request_id, i.route, i.status) for i in queue] == [
        ("e", "escalate", "pending"),
        ("r", "review", "pending"),
    ]
    assert "confidence 0.30" in queue[0].reason and "M99" in queue[0].reason
    assert queue[0].question.startswith("I received") and queue[0].confidence == 0.3
    entry = store.get("e").actions[0]
    assert entry.kind == "review_enqueued" and entry.actor == "tracerag"
    assert entry.payload["after"] == {"status": "pending", "route": "escalate"}
    assert entry.payload["before"] is None and entry.payload["reason"] == queue[0].reason


def test_auto_enqueue_can_be_turned_off(backend) -> None:
    s = backend.open(auto_enqueue=False)
    try:
        s.append_record(make_record("e", decision="escalate"))
        assert s.list_queue() == []
        item = s.enqueue_review("e", "spot check", "review")
        assert item.status == "pending" and item.reason == "spot check"
        again = s.enqueue_review("e", "twice", "review")  # idempotent
        assert again == item
        assert len(s.get("e").of_kind("review_enqueued")) == 1
        with pytest.raises(RequestNotFound):
            s.enqueue_review("missing", "x", "review")
        with pytest.raises(InvalidRecord):
            s.enqueue_review("e", "x", "pass")
    finally:
        s.close()


def test_claim_order_is_escalations_first_then_oldest(store) -> None:
    for rid, decision in [
        ("r1", "review"),
        ("e1", "escalate"),
        ("r2", "review"),
        ("e2", "escalate"),
    ]:
        store.append_record(make_record(rid, decision=decision))
    claimed = [store.claim_next("alice").request_id for _ in range(4)]
    assert claimed == ["e1", "e2", "r1", "r2"]
    assert store.claim_next("alice") is None
    assert [i.status for i in store.list_queue(status="claimed")] == ["claimed"] * 4
    assert store.list_queue(status="pending") == []


def test_claim_is_audited(store) -> None:
    store.append_record(make_record("e", decision="escalate"))
    item = store.claim_next("alice")
    assert item.status == "claimed" and item.claimed_by == "alice" and item.claimed_at
    entry = store.get("e").actions[-1]
    assert entry.kind == "review_claimed" and entry.actor == "alice"
    assert entry.payload["before"] == {"status": "pending"}
    assert entry.payload["after"] == {"status": "claimed", "claimed_by": "alice"}


def test_release_puts_an_item_back(store) -> None:
    store.append_record(make_record("e", decision="escalate"))
    store.claim_next("alice")
    item = store.release("e", "alice", reason="end of shift")
    assert item.status == "pending" and item.claimed_by is None
    assert store.get("e").actions[-1].kind == "review_released"
    assert store.get("e").actions[-1].payload["reason"] == "end of shift"
    assert store.claim_next("bob").request_id == "e"


def test_decide_records_the_final_word(store) -> None:
    store.append_record(make_record("e", decision="escalate"))
    assert store.get_decision("e") is None
    store.claim_next("alice")
    decision = store.decide(
        "e",
        "alice",
        "edit",
        final_answer="Damaged items: 30 days from delivery; we pay return shipping [M01].",
        reason="answer cited a document that was not retrieved (M99)",
    )
    assert decision.action == "edit" and decision.reviewer == "alice"
    assert store.get_decision("e") == decision
    trail = store.get("e")
    assert trail.review.status == "decided" and trail.review.action == "edit"
    entry = trail.review_decision
    assert entry.actor == "alice"
    assert entry.payload["before"] == {"status": "claimed", "claimed_by": "alice"}
    assert entry.payload["after"] == {"status": "decided", "action": "edit"}
    assert entry.payload["final_answer"].startswith("Damaged items")
    assert entry.payload["reason"].startswith("answer cited")
    assert [e.kind for e in trail.actions] == [
        "review_enqueued",
        "review_claimed",
        "review_decision",
    ]
    assert store.verify_chain().ok


def test_a_decision_is_final(store) -> None:
    store.append_record(make_record("r", decision="review"))
    store.decide("r", "alice", "approve")  # deciding without claiming is allowed
    with pytest.raises(AlreadyDecided) as info:
        store.decide("r", "bob", "reject", reason="no")
    assert info.value.decided_by == "alice" and info.value.action == "approve"
    with pytest.raises(AlreadyDecided):
        store.release("r", "bob")
    assert len(store.get("r").of_kind("review_decision")) == 1


def test_decide_validates_its_input(store) -> None:
    store.append_record(make_record("r", decision="review"))
    store.append_record(make_record("p", decision="pass"))
    with pytest.raises(ValueError):
        store.decide("r", "alice", "maybe")
    with pytest.raises(ValueError):
        store.decide("r", "alice", "edit", final_answer="", reason="x")
    with pytest.raises(ValueError):
        store.decide("r", "alice", "reject")  # no reason
    with pytest.raises(InvalidRecord):
        store.decide("r", "", "approve")
    with pytest.raises(NotQueued):
        store.decide("p", "alice", "approve")
    with pytest.raises(RequestNotFound):
        store.decide("missing", "alice", "approve")
    store.claim_next("alice")
    with pytest.raises(ClaimedByOther):
        store.decide("r", "bob", "approve")
    assert store.get_decision("p") is None
    with pytest.raises(RequestNotFound):
        store.get_decision("missing")


def test_concurrent_reviewers_never_take_the_same_item(backend) -> None:
    setup = backend.open()
    for i in range(12):
        setup.append_record(make_record(f"q{i}", decision="escalate" if i % 3 else "review"))
    stores = [backend.open() for _ in range(4)]  # four app instances, or four reviewers
    taken: dict[str, list[str]] = {}
    lock = threading.Lock()
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def reviewer(n: int) -> None:
        name = f"reviewer-{n}"
        s = stores[n % 4]
        barrier.wait()
        try:
            while (item := s.claim_next(name)) is not None:
                with lock:
                    taken.setdefault(item.request_id, []).append(name)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=reviewer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors
        assert sorted(taken) == sorted(f"q{i}" for i in range(12))
        assert all(len(names) == 1 for names in taken.values()), taken
        assert setup.verify_chain().ok
    finally:
        for s in [setup, *stores]:
            s.close()


def test_concurrent_decisions_exactly_one_wins(backend) -> None:
    setup = backend.open()
    setup.append_record(make_record("hot", decision="escalate"))
    stores = [backend.open() for _ in range(4)]
    outcomes: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def decide(n: int) -> None:
        barrier.wait()
        try:
            stores[n % 4].decide("hot", f"reviewer-{n}", "reject", reason=f"reason {n}")
            result = f"won:{n}"
        except AlreadyDecided:
            result = "already"
        except BaseException as exc:  # pragma: no cover - reported below
            result = f"error:{exc!r}"
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=decide, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        winners = [o for o in outcomes if o.startswith("won")]
        assert len(winners) == 1, outcomes
        assert outcomes.count("already") == 7, outcomes
        n = int(winners[0].split(":")[1])
        decision = setup.get_decision("hot")
        assert decision.reviewer == f"reviewer-{n}" and decision.reason == f"reason {n}"
        assert len(setup.get("hot").of_kind("review_decision")) == 1
        assert setup.verify_chain().ok
    finally:
        for s in [setup, *stores]:
            s.close()
