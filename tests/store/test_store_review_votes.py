"""Several reviewers per item: votes with rubric scores, agreement, disputes; comments and
assignments — all chained, read back from the chain, and the chain still verifies."""

from __future__ import annotations

import threading

import pytest
from store_fixtures import make_record

from tracerag.store import AlreadyDecided, InvalidRecord, NotQueued, RequestNotFound
from tracerag.store._base import AlreadyReviewed, ClaimedByOther


def queued(store, *ids: str, decision: str = "escalate") -> None:
    for rid in ids:
        store.append_record(make_record(rid, decision=decision, confidence=0.3))


def test_one_reviewer_decides_at_once_with_scores(store) -> None:
    queued(store, "a")
    outcome = store.review("a", "alice", "approve", "the answer", scores={"grounded": 4})
    assert outcome.decision is not None and outcome.agreement == "single"
    assert (outcome.reviews, outcome.required, outcome.disputed) == (1, 1, False)
    entry = store.get("a").review_decision
    assert entry.payload["scores"] == {"grounded": 4}
    assert entry.payload["agreement"] == "single" and "votes" not in entry.payload
    assert store.get_decision("a").reviewer == "alice"
    assert store.verify_chain().ok


def test_two_reviewers_who_agree_settle_the_item(store) -> None:
    queued(store, "b")
    first = store.review("b", "alice", "reject", reason="wrong policy", required=2)
    assert first.decision is None and first.reviews == 1 and not first.disputed
    assert store.list_queue("pending")[0].request_id == "b"  # still open for the second
    with pytest.raises(AlreadyReviewed):
        store.review("b", "alice", "reject", reason="again", required=2)
    second = store.review(
        "b", "bob", "reject", reason="cites 2022", scores={"grounded": 1}, required=2
    )
    assert second.decision is not None and second.agreement == "unanimous"
    payload = store.get("b").review_decision.payload
    assert [v["reviewer"] for v in payload["votes"]] == ["alice"]
    assert payload["votes"][0]["action"] == "reject" and payload["scores"] == {"grounded": 1}
    assert store.verify_chain().ok


def test_disagreement_leaves_the_item_disputed_until_one_more_settles_it(store) -> None:
    queued(store, "c")
    store.review("c", "alice", "approve", "ok", required=2)
    disputed = store.review("c", "bob", "reject", reason="unsupported", required=2)
    assert disputed.decision is None and disputed.disputed and disputed.reviews == 2
    assert store.get_decision("c") is None
    # anyone settles a dispute, one of the voters included
    settled = store.review("c", "alice", "edit", "fixed [M01]", "fixed the claim", required=2)
    assert settled.decision is not None and settled.agreement == "adjudicated"
    assert settled.decision.action == "edit"
    assert [v["reviewer"] for v in store.get("c").review_decision.payload["votes"]] == [
        "alice",
        "bob",
    ]
    with pytest.raises(AlreadyDecided):
        store.review("c", "carol", "approve", "late", required=2)
    assert store.verify_chain().ok


def test_bad_judgements_are_refused(store) -> None:
    queued(store, "d")
    with pytest.raises(ValueError, match="needs a reason"):
        store.review("d", "alice", "reject")
    with pytest.raises(ValueError, match="action"):
        store.review("d", "alice", "maybe")
    with pytest.raises(InvalidRecord, match="number"):
        store.review("d", "alice", "approve", "x", scores={"grounded": "high"})
    with pytest.raises(InvalidRecord, match="rubric dimension"):
        store.review("d", "alice", "approve", "x", scores={"no spaces": 3})
    with pytest.raises(InvalidRecord, match="at least one"):
        store.review("d", "alice", "approve", "x", required=0)
    with pytest.raises(NotQueued):
        store.append_record(make_record("p", decision="pass"))
        store.review("p", "alice", "approve", "x")
    with pytest.raises(RequestNotFound):
        store.review("nope", "alice", "approve", "x")
    store.claim_next("carol")  # the store's own claim holds it for carol
    with pytest.raises(ClaimedByOther):
        store.review("d", "alice", "approve", "x")
    assert store.get_decision("d") is None


def test_votes_cannot_be_appended_around_the_queue(store) -> None:
    queued(store, "e")
    for kind in ("review_vote", "review_comment", "review_assigned"):
        with pytest.raises(InvalidRecord, match="review queue operations"):
            store.append_action("e", kind, "mallory", {"action": "approve"})


def test_concurrent_votes_count_each_reviewer_once(store) -> None:
    """Three reviewers vote at once on an item needing two: exactly one decision, and its votes
    plus the decider are the first two judgements in the chain."""
    queued(store, "f")
    outcomes: list = []
    errors: list = []

    def vote(name: str) -> None:
        try:
            outcomes.append(store.review("f", name, "approve", "ok", required=2))
        except AlreadyDecided as exc:
            errors.append(exc)

    threads = [threading.Thread(target=vote, args=(n,)) for n in ("alice", "bob", "carol")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    decided = [o for o in outcomes if o.decision is not None]
    assert len(decided) == 1 and len(outcomes) == 2 and len(errors) == 1
    trail = store.get("f")
    assert len(trail.of_kind("review_vote")) == 1 and len(trail.of_kind("review_decision")) == 1
    assert store.verify_chain().ok


def test_comments_and_assignments_are_chained_and_read_back(store) -> None:
    queued(store, "g", "h")
    store.comment("g", "alice", "  M99 不存在，请核对  ")
    assert store.assign("g", "bob", "alice").payload == {
        "assignee": "bob",
        "before": None,
        "reason": None,
    }
    assert store.assign("g", "bob", "alice") is None  # nothing changes
    store.assign("g", None, "bob")
    store.assign("h", "李伟", "alice")
    with pytest.raises(InvalidRecord):
        store.comment("g", "alice", "   ")
    found = store.review_entries(["review_comment", "review_assigned"], ["g"])
    assert [(e.kind, e.actor) for e in found] == [
        ("review_comment", "alice"),
        ("review_assigned", "alice"),
        ("review_assigned", "bob"),
    ]
    assert found[0].payload["text"] == "M99 不存在，请核对"
    everywhere = store.review_entries(["review_assigned"], open_only=True)
    assert {e.request_id for e in everywhere} == {"g", "h"}
    store.decide("h", "alice", "approve", "ok")
    store.comment("h", "alice", "decided items take comments too")
    assert {e.request_id for e in store.review_entries(["review_assigned"], open_only=True)} == {
        "g"
    }
    with pytest.raises(AlreadyDecided):
        store.assign("h", "bob", "alice")
    assert store.verify_chain().ok
