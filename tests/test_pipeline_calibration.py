"""A fitted calibration, named by TRACERAG_CALIBRATION, produces every Response's confidence."""

from __future__ import annotations

from pipeline_fixtures import GOOD, QUESTION, REPO, scripted

from tracerag.config import reset_config

EXAMPLE = REPO / "examples" / "calibration" / "calibration.json"


def test_pipeline_uses_the_calibration_named_in_the_environment(make_pipeline, monkeypatch):
    from tracerag.signals.calibrated import CalibratedCombiner

    monkeypatch.setenv("TRACERAG_CALIBRATION", str(EXAMPLE))
    pipeline = make_pipeline(scripted([GOOD]))
    assert isinstance(pipeline.settings.combiner, CalibratedCombiner)
    response = pipeline.invoke(QUESTION)
    assert response.calibration == pipeline.settings.combiner.name
    assert response.calibration.startswith(("logistic-", "isotonic-"))
    monkeypatch.delenv("TRACERAG_CALIBRATION")
    reset_config()  # the environment is read once; this test changes it on purpose
    assert make_pipeline(scripted([GOOD])).invoke(QUESTION).calibration == "heuristic-v1"
