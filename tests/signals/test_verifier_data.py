"""The learned backend against the shared labelled data (read from ../shared/data, never
copied here): its features are well formed, and refitting reproduces the shipped coefficients.

Integration tests (they read the shared benchmark data, which the fast suite does not), skipped,
saying why, where the data is absent.
"""

from __future__ import annotations

import math
import sys

import pytest
from pipeline_fixtures import REPO

from tracerag.signals._learned import FEATURES, Combiner, LearnedSupport, features
from tracerag.signals._lexical import LexicalParams, analyse

pytestmark = pytest.mark.integration

BENCHMARKS = REPO / "benchmarks"


@pytest.fixture(scope="module")
def verifier_data():
    """The benchmarks' reader of the shared data (its directory joins the import path)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    import verifier_data

    return verifier_data


@pytest.fixture(scope="module")
def data(verifier_data):
    """The shared labelled pairs, read once when a test needs them; skip where they are absent."""
    root = verifier_data.data_root()
    found = verifier_data.load(root, ["wice-dev", "attributionbench-dev"])
    if not found:
        pytest.skip(f"shared labelled data not found under {root} (../shared/data)")
    return found


def test_features_are_finite_and_complete_on_real_pairs(data):
    assert data, "no labelled data set was loaded"
    for name, pairs in data.items():
        assert pairs, f"{name} has no pairs"
        for p in pairs[:25]:
            x = features(analyse(p.claim, p.material, None, LexicalParams()), p.claim, p.material)
            assert len(x) == len(FEATURES)
            assert all(math.isfinite(v) for v in x)


def test_learned_scores_rank_supported_pairs_higher(data, verifier_data):
    backend = LearnedSupport()
    rows = data.get("attributionbench-dev", [])
    pairs = [p for p in rows if p.supported][:75] + [p for p in rows if not p.supported][:75]
    scores = [backend(p.claim, p.material).score for p in pairs]
    assert {p.supported for p in pairs} == {True, False}
    assert verifier_data.auroc(scores, [p.supported for p in pairs]) > 0.6


def test_refitting_reproduces_the_shipped_coefficients(data, verifier_data):
    import numpy as np
    from verifier_fit import balance, feature_matrix, fit, training_pairs

    pairs = training_pairs({name: data[name] for name in ("wice-dev", "attributionbench-dev")})
    x = feature_matrix(pairs)
    y = np.array([float(p.supported) for p in pairs])
    refit = fit(x, y, balance([p.dataset for p in pairs], y))
    shipped = Combiner.load()
    assert np.allclose(refit.coef, shipped.coef, atol=1e-4)
    assert refit.intercept == pytest.approx(shipped.intercept, abs=1e-4)
