"""Calibration and routing metrics."""

from __future__ import annotations

import numpy as np
import pytest

from tracerag.tools._scoring import (
    auroc,
    brier,
    ece,
    reliability_bins,
    risk_coverage,
    risk_coverage_curve,
    summarize,
)


def test_ece_is_zero_when_confidence_matches_accuracy():
    # in the 0.8 bin, 4 of 5 are right
    assert ece([0.8] * 5, [1, 1, 1, 1, 0]) == pytest.approx(0.0)


def test_ece_weights_bins_by_count():
    conf = [0.9] * 10 + [0.1] * 30
    right = [1] * 5 + [0] * 5 + [0] * 30  # 0.9 bin: 50% right (gap 0.4); 0.1 bin: 0% (gap 0.1)
    assert ece(conf, right) == pytest.approx((10 * 0.4 + 30 * 0.1) / 40)


def test_ece_puts_one_in_the_last_bin():
    bins = reliability_bins([1.0, 0.0], [1, 0], bins=15)
    assert [b["n"] for b in bins] == [1, 1]
    assert bins[-1]["high"] == pytest.approx(1.0)


def test_brier():
    assert brier([1.0, 0.0], [1, 0]) == 0.0
    assert brier([0.5, 0.5], [1, 0]) == pytest.approx(0.25)


def test_auroc_perfect_inverted_ties_and_one_class():
    assert auroc([0.9, 0.8, 0.2, 0.1], [1, 1, 0, 0]) == pytest.approx(1.0)
    assert auroc([0.1, 0.2, 0.8, 0.9], [1, 1, 0, 0]) == pytest.approx(0.0)
    assert auroc([0.5, 0.5], [1, 0]) == pytest.approx(0.5)
    assert auroc([0.3, 0.7], [1, 1]) is None


def test_auroc_matches_pairwise_definition():
    rng = np.random.default_rng(0)
    p = rng.random(60).round(1)
    y = rng.random(60) < p
    pos, neg = p[y], p[~y]
    pairs = [(a > b) + 0.5 * (a == b) for a in pos for b in neg]
    assert auroc(p, y) == pytest.approx(sum(pairs) / len(pairs))


def test_risk_coverage_at_thresholds():
    conf = [0.95, 0.9, 0.86, 0.7, 0.65, 0.3, 0.1, 0.0]
    right = [1, 1, 0, 1, 0, 0, 1, 0]
    rc = risk_coverage(conf, right)
    assert rc.passed == pytest.approx(3 / 8)
    assert rc.pass_error_rate == pytest.approx(1 / 3)
    assert rc.wrong_passed == 1
    assert rc.reviewed == pytest.approx(2 / 8)
    assert rc.review_error_rate == pytest.approx(0.5)
    assert rc.escalated == pytest.approx(3 / 8)
    assert rc.escalate_error_rate == pytest.approx(2 / 3)
    assert rc.to_dict()["n"] == 8


def test_risk_coverage_none_passed():
    rc = risk_coverage([0.1, 0.2], [1, 0])
    assert rc.passed == 0.0 and rc.pass_error_rate is None


def test_risk_coverage_curve_descends_in_threshold():
    curve = risk_coverage_curve([0.9, 0.5, 0.5, 0.1], [1, 0, 1, 0])
    assert [t for t, _, _ in curve] == [0.9, 0.5, 0.1]
    assert curve[0][1:] == (0.25, 0.0)
    assert curve[-1][1] == 1.0 and curve[-1][2] == pytest.approx(0.5)


def test_inputs_are_checked():
    with pytest.raises(ValueError):
        ece([0.5], [1, 0])
    with pytest.raises(ValueError):
        brier([1.5], [1])
    with pytest.raises(ValueError):
        auroc([0.5, 0.4], [2, 0])
    with pytest.raises(ValueError):
        risk_coverage([0.5], [1], pass_at=0.5, review_at=0.6)


def test_summarize_is_json_able():
    import json

    out = summarize([0.9, 0.2, 0.7], [True, False, True])
    json.dumps(out)
    assert set(out) >= {"ece", "brier", "auroc", "risk_coverage", "n", "accuracy"}
