"""The two calibration fits of ``tracerag calibrate``: logistic (L2) and isotonic.

Features from the recorded signals; the fitted calibration is a versioned file the pipeline
loads with ``TRACERAG_CALIBRATION``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import numpy as np

from tracerag._routing import Thresholds
from tracerag.errors import ConfigurationError, InputError
from tracerag.signals.calibrated import (
    FEATURES,
    METHODS,
    Calibration,
    feature_values,
    heuristic_confidence,
)

if TYPE_CHECKING:
    pass
from tracerag.tools._calibration_data import Example

__all__ = ["fit_calibration", "fit_isotonic", "fit_logistic"]


# ----------------------------------------------------------------------------------------------
# Features and the two fits


def fit_logistic(
    x: np.ndarray, y: np.ndarray, *, l2: float = 1.0, max_iter: int = 100, tol: float = 1e-10
) -> tuple[float, np.ndarray]:
    """Intercept and weights of L2-regularised logistic regression, by Newton's method (IRLS).

    The intercept is not penalised; the penalty is ``l2/2 * ||w||²``.
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    n, d = x.shape
    design = np.hstack([np.ones((n, 1)), x])
    penalty = np.full(d + 1, float(l2))
    penalty[0] = 0.0
    beta = np.zeros(d + 1)
    prior = float(np.clip(y.mean() if n else 0.5, 1e-3, 1 - 1e-3))
    beta[0] = math.log(prior / (1 - prior))
    for _ in range(max_iter):
        p = _sigmoid(design @ beta)
        gradient = design.T @ (p - y) + penalty * beta
        weights = np.maximum(p * (1 - p), 1e-12)
        hessian = (design * weights[:, None]).T @ design + np.diag(penalty) + 1e-9 * np.eye(d + 1)
        step = np.linalg.solve(hessian, gradient)
        beta = beta - step
        if float(np.max(np.abs(step))) < tol:
            break
    return float(beta[0]), beta[1:]


def fit_isotonic(
    x: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Breakpoints of the non-decreasing least-squares fit of ``y`` on ``x`` (pool-adjacent-
    violators); equal ``x`` are pooled first. Returns the distinct ``x`` and fitted values."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    w = np.ones_like(y) if weights is None else np.asarray(weights, dtype=float)
    if not x.size:
        return np.array([]), np.array([])
    order = np.argsort(x, kind="mergesort")
    xs, inverse = np.unique(x[order], return_inverse=True)
    sums = np.bincount(inverse, weights=(y * w)[order])
    totals = np.bincount(inverse, weights=w[order])
    # blocks: [value, weight, count of distinct x]
    values: list[float] = []
    block_w: list[float] = []
    sizes: list[int] = []
    for s, t in zip(sums, totals, strict=True):
        values.append(s / t)
        block_w.append(t)
        sizes.append(1)
        while len(values) > 1 and values[-2] > values[-1]:
            v2, w2, n2 = values.pop(), block_w.pop(), sizes.pop()
            v1, w1, n1 = values.pop(), block_w.pop(), sizes.pop()
            values.append((v1 * w1 + v2 * w2) / (w1 + w2))
            block_w.append(w1 + w2)
            sizes.append(n1 + n2)
    fitted = np.repeat(values, sizes)
    return xs, fitted


def fit_calibration(
    examples: Sequence[Example],
    method: str = "logistic",
    *,
    l2: float = 1.0,
    cap: float | None = None,
    provenance: Mapping[str, Any] | None = None,
) -> Calibration:
    """Fit a calibration of ``method`` to labelled examples."""
    if method not in METHODS:
        raise ConfigurationError(f"unknown method {method!r}: choose {' or '.join(METHODS)}")
    if not examples:
        raise InputError("no labelled examples to fit")
    y = np.array([e.correct for e in examples], dtype=float)
    cap = Thresholds().cap if cap is None else cap
    if method == "isotonic":
        x = np.array([heuristic_confidence(e.signals, cap) for e in examples])
        xs, ys = fit_isotonic(x, y)
        model: dict[str, Any] = {"x": _round(xs), "y": _round(ys), "heuristic_cap": cap}
        features: tuple[str, ...] = ("heuristic-v1",)
    else:
        features = FEATURES
        raw = [feature_values(e.signals) for e in examples]
        columns = []
        impute, mean, scale = [], [], []
        for name in features:
            col = np.array([np.nan if r[name] is None else r[name] for r in raw], dtype=float)
            known = col[~np.isnan(col)]
            fill = float(known.mean()) if known.size else 0.0
            col = np.where(np.isnan(col), fill, col)
            mu = float(col.mean())
            sd = float(col.std())
            sd = sd if sd > 1e-9 else 1.0
            impute.append(fill)
            mean.append(mu)
            scale.append(sd)
            columns.append((col - mu) / sd)
        design = np.column_stack(columns)
        intercept, weights = fit_logistic(design, y, l2=l2)
        model = {
            "intercept": round(intercept, 10),
            "coefficients": _round(weights),
            "mean": _round(mean),
            "scale": _round(scale),
            "impute": _round(impute),
            "l2": l2,
            "standardised": True,
        }
    return Calibration(
        method=method,
        features=features,
        model=model,
        n=len(examples),
        n_correct=int(y.sum()),
        fitted_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        provenance=dict(provenance or {}),
    )


def _sigmoid(z: np.ndarray) -> np.ndarray:
    out: np.ndarray = 1.0 / (1.0 + np.exp(-np.clip(z, -40.0, 40.0)))
    return out


def _round(values: Iterable[float], digits: int = 10) -> list[float]:
    return [round(float(v), digits) for v in values]
