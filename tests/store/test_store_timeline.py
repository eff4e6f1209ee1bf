"""render_timeline / render_json: one request as an investigator reads it."""

from __future__ import annotations

import json

from store_fixtures import make_record

from tracerag.store import RequestTrail
from tracerag.store._codec import entries_from_record
from tracerag.store._sqlite import SQLiteAuditStore
from tracerag.tools._show import render_json, render_timeline

SECTIONS = [
    "REQUEST req-0001",
    "VERSIONS",
    "QUESTION",
    "RETRIEVED MATERIALS (3)",
    "PLAN (separate, ok, 1 attempt(s))",
    "SAMPLES (3)",
    "SIGNALS AND VERDICTS",
    "OUTCOME",
    "ERRORS AND RETRIES (2)",
    "REVIEW AND OPERATOR ACTIONS",
]


def _reviewed_trail(tmp_path) -> RequestTrail:
    store = SQLiteAuditStore(tmp_path / "a.sqlite")
    try:
        store.append_record(make_record())
        store.claim_next("alice")
        store.decide(
            "req-0001",
            "alice",
            "edit",
            final_answer="Damaged items can be returned within 30 days of delivery; we pay "
            "return shipping [M01].",
            reason="second sentence cited M99, which was never retrieved",
        )
        return store.get("req-0001")
    finally:
        store.close()


def test_timeline_reads_in_the_investigators_order(tmp_path) -> None:
    text = render_timeline(_reviewed_trail(tmp_path))
    positions = [text.index(s) for s in SECTIONS]
    assert positions == sorted(positions), text


def test_timeline_shows_versions_retrieval_and_citations(tmp_path) -> None:
    text = render_timeline(_reviewed_trail(tmp_path))
    assert "prompt    support-answer@3f9c2a1" in text
    assert "model     gpt-4o-mini-2024-07-18" in text
    assert "tracerag  0.1.0" in text
    assert "tier      high" in text and "channel helpdesk" in text
    assert "I received a damaged kettle" in text
    m01 = next(line for line in text.splitlines() if "M01 " in line and "score" in line)
    assert "#1" in m01 and "0.912" in m01 and "Returns policy (2025)" in m01 and "CITED" in m01
    m02 = next(line for line in text.splitlines() if "M02 " in line and "score" in line)
    assert "CITED" not in m02 and "planned" in m02
    m03 = next(line for line in text.splitlines() if "M03 " in line and "score" in line)
    assert "STALE" in m03 and "CITED" in m03
    assert "!! cited but NOT retrieved: M99" in text


def test_timeline_shows_plan_samples_and_verdicts(tmp_path) -> None:
    text = render_timeline(_reviewed_trail(tmp_path))
    assert "materials: M01, M02" in text and "- we pay return shipping" in text
    assert "[0] ok · 1.23 s · 1 attempt(s) · tokens 812->61" in text
    assert "return postage is on us [M01] [M99]" in text  # raw sample text
    assert "[2] ERROR TimeoutError: model call timed out after 20s" in text
    assert "citations: coverage 0.75 · accuracy 0.50 · FABRICATED M99" in text
    assert "claim 1: SUPPORTED  score 0.93  cites [M01]" in text
    assert "claim 2: FABRICATED_CITATION  score 0.71  cites [M01, M99]" in text
    assert "claim 3: STALE" in text and "claim 4: UNCITED" in text and "no citation" in text
    assert 'support (M01): "Items that arrive damaged may be returned within 30 days' in text
    assert "consistency: agreement 0.80 · groups 2 · entropy 0.50" in text
    assert "pass  no_personal_data (required)" in text
    assert "FAIL  mentions_deadline - no deadline for reporting damage" in text


def test_timeline_shows_outcome_errors_and_review(tmp_path) -> None:
    text = render_timeline(_reviewed_trail(tmp_path))
    assert "confidence 0.72 -> decision REVIEW" in text
    assert "calibration isotonic@2025-02" in text
    assert "status flagged_for_review" in text
    assert "sample  RateLimitError: 429 Too Many Requests\n      attempt=1, sample=1" in text
    assert "timings: register 0.001s, retrieve 0.042s, plan 0.800s" in text
    assert "review_enqueued  by tracerag: route review" in text
    assert "review_claimed   by alice" in text
    assert "review_decision  by alice: EDIT" in text
    assert "why: second sentence cited M99, which was never retrieved" in text
    assert "final answer: Damaged items can be returned within 30 days" in text
    assert "queue: decided (review)" in text


def test_escalated_answer_is_shown_as_withheld() -> None:
    record = make_record(decision="escalate", response={"answer": None, "status": "x"})
    trail = RequestTrail("req-0001", entries_from_record(record))
    assert "answer withheld for a human" in render_timeline(trail)


def test_odd_or_partial_records_still_render() -> None:
    odd = {
        "request_id": "odd",
        "versions": "v?",
        "materials": [1, {"id": "A"}],
        "plan": "not a plan",
        "samples": ["plain text sample", None],
        "signals": {
            "citations": {"claims": ["x", {"cited_ids": None}]},
            "consistency": {"groups": [[0, 1], [2]], "n_groups": 2, "informative": False},
            "rules": ["strange"],
            "custom": {"score": 0.4},
        },
        "errors": ["boom"],
        "response": ["a", "list"],
        "timings": None,
    }
    text = render_timeline(RequestTrail("odd", entries_from_record(odd)))
    assert "REQUEST odd" in text
    assert "plain text sample" in text and "boom" in text
    assert "groups 2" in text and "not informative" in text
    assert 'custom: {"score": 0.4}' in text
    empty = render_timeline(RequestTrail("e", entries_from_record({"request_id": "e"})))
    assert "(none retrieved)" in empty and "(no plan)" in empty and "(no samples)" in empty
    assert "(no signals recorded)" in empty


def test_render_json_carries_record_entries_and_review(tmp_path) -> None:
    trail = _reviewed_trail(tmp_path)
    data = json.loads(render_json(trail))
    assert data["request_id"] == "req-0001"
    assert data["record"] == make_record()
    kinds = [e["kind"] for e in data["entries"]]
    assert kinds[0] == "register" and kinds[-1] == "review_decision"
    assert all(len(e["hash"]) == 64 for e in data["entries"])
    assert data["review"]["status"] == "decided" and data["review"]["decided_by"] == "alice"
