"""The desk's decisions as a labelled dataset (``tracerag desk export``), reviewer agreement,
and ``tracerag calibrate --from-desk``: a real fit to the reviewers' verdicts."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from store_fixtures import make_record

from tracerag.cli import main
from tracerag.store._sqlite import SQLiteAuditStore
from tracerag.tools._desk_dataset import agreement, desk_rows, fleiss_kappa, write_csv
from tracerag.tools.calibration import desk_examples


def detail(score: float, consistency: float, coverage: float) -> dict:
    return {
        "citation_score": score,
        "self_consistency": consistency,
        "consistency_informative": True,
        "plan_ok": True,
        "fabricated_citations": [],
        "retrieval_margin": 0.1,
        "semantic_entropy": 1 - consistency,
        "citation_coverage": coverage,
        "samples_ok": 5,
        "n_samples": 5,
    }


def routed(rid: str, score: float, consistency: float = 0.8, coverage: float = 1.0) -> dict:
    """A routed record whose Response carries its signals, as the pipeline writes it."""
    return make_record(
        rid,
        decision="review",
        confidence=round(0.5 + 0.3 * score, 4),
        response={
            "answer": "You can return it within 30 days [M01].",
            "status": "flagged_for_review",
            "decision": "review",
            "signal_detail": detail(score, consistency, coverage),
        },
    )


@pytest.fixture(scope="module")
def desk_store(tmp_path_factory):
    """300 reviewed answers: reviewers approve an answer with probability citation_score ** 3
    (the heuristic, which trusts the citation score linearly, overstates the weak ones); 20
    old-layout records decided without recorded signals."""
    rng = np.random.default_rng(7)
    path = tmp_path_factory.mktemp("desk") / "audit.sqlite"
    store = SQLiteAuditStore(str(path), synchronous="OFF")  # a test: no power cuts
    records, verdicts = [], []
    for i in range(300):
        score = float(rng.uniform(0.2, 1.0))
        records.append(routed(f"r-{i:03d}", score, float(rng.uniform(0.4, 1.0))))
        verdicts.append("approve" if rng.random() < score**3 else "reject")
    records += [make_record(f"old-{i}", decision="review") for i in range(20)]
    for start in range(0, len(records), 100):
        store.append_records(records[start : start + 100])
    for i, action in enumerate(verdicts):
        store.review(
            f"r-{i:03d}",
            "alice",
            action,
            "ok" if action == "approve" else None,
            None if action == "approve" else "not supported",
            scores={"grounded": 3},
        )
    for i in range(20):
        store.decide(f"old-{i}", "bob", "approve", "ok")
    yield store, verdicts
    store.close()


def test_desk_examples_are_the_decided_items_with_their_signals(desk_store) -> None:
    store, verdicts = desk_store
    examples, skipped = desk_examples(store)
    assert len(examples) == 300 and skipped == 20
    assert sum(e.correct for e in examples) == verdicts.count("approve")
    first = next(e for e in examples if e.meta["request_id"] == "r-000")
    assert first.correct == (verdicts[0] == "approve")
    assert first.signals.citation_score is not None and first.signals.samples_ok == 5


def test_calibrate_from_the_desk_fits_the_reviewers_verdicts(desk_store, tmp_path, capsys):
    store, _ = desk_store
    out = tmp_path / "calibration.json"
    code = main(
        [
            "calibrate",
            "--from-desk",
            "--store",
            store.path,
            "--holdout",
            "0.3",
            "--out",
            str(out),
            "--json",
        ]
    )
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    cal = result["calibration"]
    assert cal["n"] == 210  # 70% of the 300 decisions with signals
    desk = cal["provenance"]["desk"]
    assert desk["decisions"] == 300 and desk["skipped_without_signals"] == 20
    assert desk["labels_sha256"].startswith("sha256:")
    assert any("only sees answers routed to people" in n for n in result["notes"])
    held = cal["provenance"]["evaluation"]["holdout"]
    fitted, heuristic = held[cal["id"]], held["heuristic-v1"]
    # the fit learned the reviewers: better calibrated and sharper than the heuristic on the
    # 90 decisions it never saw
    assert fitted["brier"] < heuristic["brier"]
    assert fitted["ece"] < heuristic["ece"]
    weights = dict(zip(cal["features"], cal["model"]["coefficients"], strict=True))
    assert weights["citation_score"] > 0.5  # the signal that decides the verdicts
    assert out.exists()


def test_calibrate_from_the_desk_refuses_what_it_cannot_fit(tmp_path, capsys) -> None:
    store = SQLiteAuditStore(str(tmp_path / "audit.sqlite"))
    store.append_record(routed("only", 0.9))
    store.decide("only", "alice", "approve", "ok")
    store.close()
    assert main(["calibrate", "--from-desk", "--store", str(tmp_path / "audit.sqlite")]) == 2
    assert "every row has the same label" in capsys.readouterr().err
    assert main(["calibrate"]) == 2
    assert "give DATA.jsonl, --from-desk, or both" in capsys.readouterr().err


def test_the_export_command_writes_jsonl_and_csv(desk_store, tmp_path, capsys) -> None:
    store, verdicts = desk_store
    jsonl, table = tmp_path / "d.jsonl", tmp_path / "d.csv"
    assert main(["desk", "export", "--store", store.path, "--out", str(jsonl)]) == 0
    assert "320 review item(s)" in capsys.readouterr().err
    rows = [json.loads(line) for line in jsonl.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == 320
    labelled = {r["request_id"]: r["label"] for r in rows}
    assert labelled["r-000"] == ("correct" if verdicts[0] == "approve" else "incorrect")
    assert (
        main(["desk", "export", "--store", store.path, "--format", "csv", "--out", str(table)]) == 0
    )
    with table.open(encoding="utf-8", newline="") as fh:
        parsed = list(csv.DictReader(fh))
    assert len(parsed) == 320 and parsed[0]["score_grounded"] == "3.0"
    assert json.loads(parsed[0]["claims"])[0]["verdict"] == "supported"


def test_fleiss_kappa_matches_the_textbook_example() -> None:
    # Fleiss (1971) as worked in the literature: 10 subjects, 14 raters, 5 categories
    table = [
        [0, 0, 0, 0, 14],
        [0, 2, 6, 4, 2],
        [0, 0, 3, 5, 6],
        [0, 3, 9, 2, 0],
        [2, 2, 8, 1, 1],
        [7, 7, 0, 0, 0],
        [3, 2, 6, 3, 0],
        [2, 5, 3, 2, 2],
        [6, 5, 2, 1, 0],
        [0, 2, 2, 3, 7],
    ]
    assert fleiss_kappa(table) == pytest.approx(0.210, abs=0.001)
    assert fleiss_kappa([[2, 0], [2, 0]]) is None  # one category only: undefined
    assert fleiss_kappa([[2, 0], [1, 0]]) is None  # unequal raters


def test_agreement_counts_independent_judgements_only() -> None:
    def row(actions, scores, how):
        return {
            "reviews": [
                {"action": a, "scores": {"grounded": s}, "settled": i == len(actions) - 1}
                for i, (a, s) in enumerate(zip(actions, scores, strict=True))
            ],
            "decision": {"agreement": how},
        }

    rows = [
        row(["approve", "approve"], [5, 4], "unanimous"),
        row(["reject", "reject"], [1, 1], "unanimous"),
        # a dispute: the settling judgement knew both votes and is left out
        row(["approve", "reject", "reject"], [4, 1, 2], "adjudicated"),
        row(["approve"], [5], "single"),
    ]
    result = agreement(rows)
    assert result["items"] == 3 and result["unanimous"] == pytest.approx(2 / 3, abs=1e-4)
    assert result["kappa_items"] == 3 and result["kappa"] is not None
    assert result["dimensions"]["grounded"] == {
        "pairs": 3,
        "mean_abs_diff": pytest.approx(4 / 3, abs=1e-4),
        "within_one": pytest.approx(2 / 3, abs=1e-4),
    }
    assert agreement([row(["approve"], [5], "single")])["items"] == 0


def test_desk_rows_and_csv_in_memory(desk_store) -> None:
    import io

    store, _ = desk_store
    rows = list(desk_rows(store, route="review"))
    assert len(rows) == 320 and all(r["queue"] == "review" for r in rows)
    assert list(desk_rows(store, route="escalate")) == []
    buffer = io.StringIO()
    assert write_csv(rows[:3], buffer) == 3
    assert buffer.getvalue().splitlines()[0].startswith("request_id,queue,question,answer")
