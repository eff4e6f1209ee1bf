"""Calibration: reading labelled data, the two fits, the versioned file, the combiner, the CLI."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from pipeline_fixtures import GOOD, QUESTION, REPO, scripted

from tracerag.cli import main
from tracerag.config import reset_config
from tracerag.errors import ConfigurationError, InputError
from tracerag.signals._confidence import HeuristicCombiner, Signals
from tracerag.signals._rules import RuleResult
from tracerag.signals.calibrated import (
    CALIBRATION_ENV,
    FEATURES,
    CalibratedCombiner,
    Calibration,
    default_combiner,
    heuristic_confidence,
    load_calibration,
)
from tracerag.tools.calibration import (
    Example,
    compare,
    demo_calibration_rows,
    fit_calibration,
    fit_isotonic,
    fit_logistic,
    label_of,
    read_examples,
    signals_from_row,
    split_holdout,
)

EXAMPLE_DATA = REPO / "examples/calibration/demo_labelled.jsonl"
CAP = 0.59


def signals(score: float, consistency: float = 1.0, **kw) -> Signals:
    kw.setdefault("samples_ok", 5)
    return Signals(citation_score=score, self_consistency=consistency, plan_ok=True, **kw)


def synthetic(n: int = 400, seed: int = 0) -> list[Example]:
    """Answers are right with probability citation_score ** 2 (so the heuristic overstates)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        score = float(rng.choice([0.0, 0.5, 1.0], p=[0.2, 0.3, 0.5]))
        consistency = float(rng.choice([0.4, 0.6, 1.0]))
        right = bool(rng.random() < score**2 * (0.6 + 0.4 * consistency))
        out.append(
            Example(
                signals(
                    score,
                    consistency,
                    retrieval_margin=float(rng.random()) / 5,
                    semantic_entropy=float(1 - consistency),
                    citation_coverage=1.0,
                ),
                right,
            )
        )
    return out


# -- reading -------------------------------------------------------------------------------------


def test_labels():
    assert label_of({"correct": True}) is True
    assert label_of({"label": 0}) is False
    assert label_of({"label": "Approve"}) is True
    assert label_of({"label": "wrong"}) is False
    assert label_of({"question": "x"}) is None
    with pytest.raises(InputError):
        label_of({"label": "maybe"})


def test_reads_signal_rows_responses_and_records(tmp_path):
    detail = {
        "self_consistency": 0.6,
        "citation_score": 0.5,
        "citation_coverage": 1.0,
        "fabricated_citations": ["policy-9"],
        "plan_ok": True,
        "retrieval_margin": 0.1,
        "semantic_entropy": 0.9,
        "samples_ok": 5,
        "rules": [{"name": "no-pii", "passed": False, "required": True}],
    }
    rows = [
        {
            "signals": {
                "citation_score": 1.0,
                "self_consistency": 0.8,
                "plan_ok": True,
                "fabricated": False,
                "retrieval_margin": None,
            },
            "correct": True,
        },
        {"request_id": "r1", "signal_detail": detail, "label": "incorrect"},
        {
            "request_id": "r2",
            "signals": {"citations": {}},
            "response": {"signal_detail": detail},
            "correct": 1,
        },
        {"signals": {"citation_score": 0.2}},  # no label: skipped
    ]
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    examples, unlabelled = read_examples(path)
    assert unlabelled == 1
    assert [e.correct for e in examples] == [True, False, True]
    first, second, third = (e.signals for e in examples)
    assert first.citation_score == 1.0 and first.retrieval_margin is None and not first.fabricated
    assert second.fabricated and second.citation_score == 0.5 and second.samples_ok == 5
    assert second.rules[0].required and not second.rules[0].passed
    assert third == second


def test_bad_rows_name_their_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"signals": {}, "correct": true}\n{not json}\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"bad.jsonl:2"):
        read_examples(path)
    path.write_text('{"nothing": 1, "correct": true}\n', encoding="utf-8")
    with pytest.raises(InputError, match="signal_detail"):
        read_examples(path)


def test_json_array_is_accepted(tmp_path):
    path = tmp_path / "data.json"
    path.write_text(json.dumps([{"signals": {"citation_score": 1}, "correct": True}]))
    examples, _ = read_examples(path)
    assert len(examples) == 1


def test_signals_from_row_default_samples_ok():
    assert signals_from_row({"signals": {"citation_score": 1.0}}).samples_ok == 1


# -- fits ----------------------------------------------------------------------------------------


def test_logistic_recovers_known_weights():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4000, 2))
    true = np.array([2.0, -1.0])
    y = rng.random(4000) < 1 / (1 + np.exp(-(0.5 + x @ true)))
    intercept, weights = fit_logistic(x, y, l2=1e-6)
    assert intercept == pytest.approx(0.5, abs=0.15)
    assert weights == pytest.approx(true, abs=0.15)
    _, shrunk = fit_logistic(x, y, l2=2000.0)
    assert np.all(np.abs(shrunk) < np.abs(weights))


def test_logistic_survives_separable_data():
    x = np.array([[0.0], [0.1], [0.9], [1.0]])
    intercept, weights = fit_logistic(x, np.array([0, 0, 1, 1]), l2=1.0)
    assert np.isfinite(intercept) and np.all(np.isfinite(weights)) and weights[0] > 0


def test_isotonic_pools_adjacent_violators():
    xs, ys = fit_isotonic(np.array([1, 2, 3, 4]), np.array([1.0, 3.0, 2.0, 4.0]))
    assert list(xs) == [1, 2, 3, 4]
    assert list(ys) == [1.0, 2.5, 2.5, 4.0]
    xs, ys = fit_isotonic(np.array([0.5, 0.5, 0.2]), np.array([1.0, 0.0, 1.0]))
    assert list(xs) == [0.2, 0.5] and list(ys) == pytest.approx([2 / 3, 2 / 3])
    assert np.all(np.diff(fit_isotonic(np.random.rand(50), np.random.rand(50))[1]) >= 0)


@pytest.mark.parametrize("method", ["logistic", "isotonic"])
def test_fit_beats_the_heuristic_where_it_overstates(method):
    train, test = synthetic(600, seed=0), synthetic(400, seed=1)
    calibration = fit_calibration(train, method)
    results = compare(test, {"h": HeuristicCombiner(), "c": CalibratedCombiner(calibration)})
    assert results["c"]["ece"] < results["h"]["ece"]
    assert results["c"]["brier"] < results["h"]["brier"]


def test_holdout_split_is_stratified_and_reproducible():
    data = synthetic(100)
    fit, held = split_holdout(data, 0.3, seed=4)
    assert len(fit) + len(held) == 100
    right = sum(e.correct for e in data)
    assert sum(e.correct for e in held) == round(right * 0.3)
    assert split_holdout(data, 0.3, seed=4)[1] == held
    with pytest.raises(InputError):
        split_holdout(data, 1.0)


# -- the file ------------------------------------------------------------------------------------


def test_file_round_trip_and_content_id(tmp_path):
    calibration = fit_calibration(synthetic(200), "logistic", provenance={"data": "x"})
    assert re.fullmatch(r"logistic-[0-9a-f]{8}", calibration.id)
    path = calibration.save(tmp_path / "cal.json")
    data = json.loads(path.read_text())
    assert data["format"] == "tracerag.calibration" and data["format_version"] == 1
    assert data["id"] == calibration.id and data["features"] == list(FEATURES)
    assert data["n"] == 200 and data["fitted_at"]
    loaded = load_calibration(path)
    s = signals(0.5, 0.6)
    assert loaded.probability(s) == pytest.approx(calibration.probability(s))
    # refitting the same data gives the same id (the fit time is not part of it)
    assert fit_calibration(synthetic(200), "logistic").id == calibration.id


def test_changed_file_is_refused(tmp_path):
    path = fit_calibration(synthetic(100), "isotonic").save(tmp_path / "cal.json")
    data = json.loads(path.read_text())
    data["model"]["y"][-1] = 1.0 if data["model"]["y"][-1] != 1.0 else 0.9
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigurationError, match="does not match its content"):
        load_calibration(path)
    data["format_version"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigurationError, match="format version 99"):
        load_calibration(path)
    path.write_text("{}")
    with pytest.raises(ConfigurationError, match="not a tracerag calibration"):
        load_calibration(path)


# -- the combiner --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def calibration() -> Calibration:
    return fit_calibration(synthetic(300), "logistic")


def test_combiner_name_is_the_calibration_id(calibration, tmp_path):
    combiner = CalibratedCombiner.from_file(calibration.save(tmp_path / "c.json"))
    assert combiner.name == calibration.id
    out = combiner(signals(1.0), cap=CAP)
    assert 0.0 <= out.value <= 1.0 and out.caps == []
    assert out.parts["calibrated"] == pytest.approx(calibration.probability(signals(1.0)))


def test_combiner_keeps_the_heuristic_caps(calibration):
    combiner = CalibratedCombiner(calibration)
    high = combiner(signals(1.0), cap=CAP).value
    assert high > CAP
    assert combiner(signals(1.0, fabricated=True), cap=CAP).value <= CAP
    failed = (RuleResult("no-pii", False, required=True),)
    capped = combiner(signals(1.0, rules=failed), cap=CAP)
    assert capped.value <= CAP and capped.caps == ["required rule failed: no-pii"]
    optional = (RuleResult("tone", False, required=False),)
    assert combiner(signals(1.0, rules=optional), cap=CAP).value == pytest.approx(
        round(high * 0.85, 4), abs=1e-4
    )
    none = combiner(Signals(citation_score=1.0, samples_ok=0), cap=CAP)
    assert none.value == 0.0 and none.caps == ["no successful sample"]


def test_isotonic_combiner_maps_the_heuristic():
    calibration = fit_calibration(synthetic(300), "isotonic")
    assert calibration.features == ("heuristic-v1",)
    s = signals(0.5, 0.6)
    xs, ys = calibration.model["x"], calibration.model["y"]
    assert calibration.probability(s) == pytest.approx(
        float(np.interp(heuristic_confidence(s, CAP), xs, ys))
    )


def test_default_combiner_from_env(calibration, tmp_path, monkeypatch):
    monkeypatch.delenv(CALIBRATION_ENV, raising=False)
    assert isinstance(default_combiner(), HeuristicCombiner)
    path = calibration.save(tmp_path / "c.json")
    monkeypatch.setenv(CALIBRATION_ENV, str(path))
    reset_config()  # the environment is read once; this test changes it on purpose
    combiner = default_combiner()
    assert isinstance(combiner, CalibratedCombiner) and combiner.name == calibration.id
    monkeypatch.setenv(CALIBRATION_ENV, str(tmp_path / "missing.json"))
    reset_config()
    with pytest.raises(ConfigurationError, match=CALIBRATION_ENV):
        default_combiner()


def test_every_response_records_its_calibration(calibration, make_pipeline):
    pipeline = make_pipeline(scripted([GOOD]), combiner=CalibratedCombiner(calibration))
    response = pipeline.invoke(QUESTION)
    assert response.calibration == calibration.id
    assert response.confidence == pytest.approx(
        CalibratedCombiner(calibration)(
            Signals(
                citation_score=response.signal_detail.citation_score,
                self_consistency=response.signal_detail.self_consistency,
                plan_ok=response.signal_detail.plan_ok,
                retrieval_margin=response.signal_detail.retrieval_margin,
                semantic_entropy=response.signal_detail.semantic_entropy,
                citation_coverage=response.signal_detail.citation_coverage,
                samples_ok=response.signal_detail.samples_ok,
            ),
            cap=CAP,
        ).value,
        abs=1e-3,
    )


# -- the synthetic demo set and the command ------------------------------------------------------


def test_demo_rows_are_labelled_by_construction():
    rows = demo_calibration_rows(
        seeds=[1],
        questions=["How long is the warranty on a laptop?", "你们招聘兼职店员吗？"],
        kinds=["wrong_material"],
        rates=[1.0],
    )
    assert len(rows) == 4
    by = {(r["question"][:3], r["mutation"]): r for r in rows}
    assert by[("How", None)]["correct"] is True
    assert by[("How", "wrong_material")]["correct"] is False  # every sample cites the wrong doc
    assert by[("你们招", None)]["correct"] is False  # a refusal is not an answer
    assert set(rows[0]["signals"]) >= {"citation_score", "self_consistency", "fabricated"}


def test_example_data_is_there_and_readable():
    examples, unlabelled = read_examples(EXAMPLE_DATA)
    assert len(examples) > 500 and unlabelled == 0
    share = sum(e.correct for e in examples) / len(examples)
    assert 0.3 < share < 0.8


def test_calibrate_command(tmp_path, capsys):
    out = tmp_path / "cal.json"
    code = main(["calibrate", str(EXAMPLE_DATA), "--out", str(out), "--holdout", "0.3"])
    text = capsys.readouterr().out
    assert code == 0
    calibration = load_calibration(out)
    assert calibration.id in text and "heuristic-v1" in text
    assert "ECE (15 bins)" in text and "held-out 30%" in text and "wrong among passed" in text
    held = calibration.provenance["evaluation"]["holdout"]
    assert held[calibration.id]["ece"] < held["heuristic-v1"]["ece"]
    assert held[calibration.id]["brier"] < held["heuristic-v1"]["brier"]


def test_calibrate_command_isotonic_json(tmp_path, capsys):
    out = tmp_path / "iso.json"
    assert (
        main(["calibrate", str(EXAMPLE_DATA), "--method", "isotonic", "--out", str(out), "--json"])
        == 0
    )
    printed = json.loads(capsys.readouterr().out)
    assert printed["calibration"]["id"].startswith("isotonic-")


def test_calibrate_command_rejects_bad_data(tmp_path, capsys):
    path = tmp_path / "one-label.jsonl"
    path.write_text('{"signals": {"citation_score": 1}, "correct": true}\n')
    assert main(["calibrate", str(path), "--out", str(tmp_path / "x.json")]) == 2
    assert "same label" in capsys.readouterr().err
