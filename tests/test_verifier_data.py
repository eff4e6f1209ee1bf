"""The learned backend against the shared labelled data (read from ../shared/data, never
copied here): its features are well formed, and refitting reproduces the shipped coefficients.

Skipped, saying why, where the data is absent.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from verifier_data import data_root, load  # noqa: E402

from tracerag.signals.learned import FEATURES, Combiner, LearnedSupport, features  # noqa: E402
from tracerag.signals.lexical import LexicalParams, analyse  # noqa: E402

ROOT = data_root()
DATA = load(ROOT, ["wice-dev", "attributionbench-dev"])
needs_data = pytest.mark.skipif(
    not DATA, reason=f"shared labelled data not found under {ROOT} (../shared/data)"
)


@needs_data
def test_features_are_finite_and_complete_on_real_pairs():
    for pairs in DATA.values():
        for p in pairs[:25]:
            x = features(analyse(p.claim, p.material, None, LexicalParams()), p.claim, p.material)
            assert len(x) == len(FEATURES)
            assert all(math.isfinite(v) for v in x)


@needs_data
def test_learned_scores_rank_supported_pairs_higher():
    from verifier_data import auroc

    backend = LearnedSupport()
    rows = DATA.get("attributionbench-dev", [])
    pairs = [p for p in rows if p.supported][:75] + [p for p in rows if not p.supported][:75]
    scores = [backend(p.claim, p.material).score for p in pairs]
    assert auroc(scores, [p.supported for p in pairs]) > 0.6


@pytest.mark.integration
@needs_data
def test_refitting_reproduces_the_shipped_coefficients():
    import numpy as np
    from verifier_fit import balance, feature_matrix, fit, training_pairs

    pairs = training_pairs({name: DATA[name] for name in ("wice-dev", "attributionbench-dev")})
    x = feature_matrix(pairs)
    y = np.array([float(p.supported) for p in pairs])
    refit = fit(x, y, balance([p.dataset for p in pairs], y))
    shipped = Combiner.load()
    assert np.allclose(refit.coef, shipped.coef, atol=1e-4)
    assert refit.intercept == pytest.approx(shipped.intercept, abs=1e-4)
