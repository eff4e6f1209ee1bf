"""``tracerag metrics``: indicators over stored requests in a window."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from store_fixtures import make_record

from tracerag import cli
from tracerag.store._sqlite import SQLiteAuditStore
from tracerag.tools._metrics import compute, interception_reasons, parse_since


def record(
    rid: str,
    decision: str,
    *,
    coverage: float | None = 1.0,
    accuracy: float = 1.0,
    verdicts: tuple[str, ...] = ("supported",),
    fabricated: tuple[str, ...] = (),
    stale: tuple[str, ...] = (),
    started_at: datetime | None = None,
    **extra,
):
    rec = make_record(rid, decision=decision, **extra)
    rec["started_at"] = (started_at or datetime.now(timezone.utc)).isoformat()
    rec["confidence"] = {"pass": 0.95, "review": 0.7, "escalate": 0.3}[decision]
    if coverage is None:  # tier low: nothing verified
        rec["signals"] = {}
        rec["tier"] = "low"
        return rec
    rec["signals"]["citations"] = {
        "claims": [
            {"text": f"claim {i}", "cited_ids": ["M01"], "verdict": v, "score": 1.0}
            for i, v in enumerate(verdicts)
        ],
        "coverage": coverage,
        "accuracy": accuracy,
        "fabricated": list(fabricated),
        "stale": list(stale),
    }
    return rec


@pytest.fixture
def store(tmp_path):
    s = SQLiteAuditStore(str(tmp_path / "audit.sqlite"))
    s.append_record(record("pass-1", "pass"))
    s.append_record(record("pass-2", "pass", coverage=0.5, accuracy=0.5))
    s.append_record(
        record(
            "review-1",
            "review",
            coverage=0.75,
            accuracy=0.5,
            verdicts=("supported", "fabricated_citation", "stale"),
            fabricated=("M99",),
            stale=("M03",),
        )
    )
    s.append_record(
        record(
            "esc-decided",
            "escalate",
            coverage=1.0,
            accuracy=0.0,
            verdicts=("unsupported",),
            started_at=datetime.now(timezone.utc) - timedelta(hours=1),
        )
    )
    s.append_record(record("esc-open", "escalate", verdicts=("unsupported",)))
    s.append_record(record("low-1", "pass", coverage=None))
    s.append_record(record("replayed", "escalate", replay_of="esc-decided"))
    s.decide("esc-decided", "alice", "edit", "Corrected answer.", "wrong number")
    yield s
    s.close()


def test_indicators_over_everything(store):
    out = compute(store)
    assert out.requests == 6 and out.replays == 1
    assert out.by_decision == {"pass": 3, "review": 1, "escalate": 2}
    assert out.verified == 5
    assert out.citation_coverage == pytest.approx((1.0 + 0.5 + 0.75 + 1.0 + 1.0) / 5)
    assert out.citation_accuracy == pytest.approx((1.0 + 0.5 + 0.5 + 0.0 + 1.0) / 5)
    assert out.intercepted == 3
    assert out.verifier_interception_rate == pytest.approx(3 / 5)
    assert out.intercepted_by == {"fabricated_citation": 1, "stale": 1, "unsupported": 2}
    assert out.human_review_rate == pytest.approx(1 / 6)
    assert out.escalation_rate == pytest.approx(2 / 6)
    assert out.escalations_resolved == 1 and out.escalations_open == 1
    assert 3590 < out.mean_time_to_resolution_s < 3700
    text = out.render()
    assert "verifier interception rate    60.0%" in text
    assert "mean time to resolution       60.0 min" in text or "1.0 h" in text


def test_a_window_in_the_future_is_empty(store):
    out = compute(store, since=datetime.now(timezone.utc) + timedelta(days=1))
    assert out.requests == 0 and out.verifier_interception_rate is None
    assert "requests                      0" in out.render()


def test_the_window_bounds_and_limit(store):
    assert compute(store, until=datetime.now(timezone.utc) - timedelta(days=1)).requests == 0
    limited = compute(store, limit=2)
    assert limited.truncated and limited.requests + limited.replays == 2


def test_interception_reasons_of_an_unverified_trail(store):
    assert interception_reasons(store.get("low-1")) is None
    assert interception_reasons(store.get("pass-1")) == []
    assert interception_reasons(store.get("review-1")) == ["fabricated_citation", "stale"]


def test_parse_since():
    now = datetime(2025, 3, 4, 12, 0, tzinfo=timezone.utc)
    assert parse_since("1h", now) == now - timedelta(hours=1)
    assert parse_since("7d", now) == now - timedelta(days=7)
    assert parse_since("30m", now) == now - timedelta(minutes=30)
    assert parse_since("2w", now) == now - timedelta(weeks=2)
    assert parse_since("2025-03-01T00:00:00Z") == datetime(2025, 3, 1, tzinfo=timezone.utc)
    assert parse_since("2025-03-01") == datetime(2025, 3, 1, tzinfo=timezone.utc)
    assert parse_since("") is None and parse_since(None) is None
    with pytest.raises(ValueError, match="ISO-8601"):
        parse_since("last tuesday")


def test_metrics_command_json(store, capsys):
    assert cli.main(["metrics", "--store", store.path, "--since", "1h", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["requests"] == 6 and data["escalation_rate"] == pytest.approx(2 / 6)
    assert data["since"] is not None


def test_metrics_command_text_and_bad_window(store, capsys):
    assert cli.main(["metrics", "--store", store.path, "--since", ""]) == 0
    out = capsys.readouterr().out
    assert "citation coverage" in out and "human-review rate" in out
    assert cli.main(["metrics", "--store", store.path, "--since", "soon"]) == 2
