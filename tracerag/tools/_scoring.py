"""How good a confidence is: calibration error, Brier score, ranking quality and routing risk.

Every function takes confidences in [0, 1] and the matching correctness labels (True: the
answer was right). They need numpy only and are used by ``tracerag calibrate`` and benchmarks.

- ``ece``: expected calibration error over equal-width bins (15 by default).
- ``brier``: mean squared difference between confidence and label.
- ``auroc``: probability that a right answer gets a higher confidence than a wrong one.
- ``risk_coverage``: what the router does at its thresholds — the share of answers passed
  automatically and how many of those are wrong, and the shares sent to review or escalated.
- ``risk_coverage_curve``: coverage and risk at every possible pass threshold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tracerag.errors import InputError

__all__ = [
    "DEFAULT_BINS",
    "RiskCoverage",
    "auroc",
    "brier",
    "ece",
    "reliability_bins",
    "risk_coverage",
    "risk_coverage_curve",
    "summarize",
]

DEFAULT_BINS = 15


def _arrays(
    confidences: Sequence[float] | np.ndarray, correct: Sequence[bool] | np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(confidences, dtype=float).reshape(-1)
    y = np.asarray(correct, dtype=float).reshape(-1)
    if p.shape != y.shape:
        raise InputError(f"{p.size} confidences but {y.size} labels")
    if p.size and (np.isnan(p).any() or p.min() < 0.0 or p.max() > 1.0):
        raise InputError("confidences must be numbers in [0, 1]")
    if y.size and not np.isin(y, (0.0, 1.0)).all():
        raise InputError("labels must be booleans (or 0/1)")
    return p, y


def reliability_bins(
    confidences: Sequence[float] | np.ndarray,
    correct: Sequence[bool] | np.ndarray,
    bins: int = DEFAULT_BINS,
) -> list[dict[str, float]]:
    """Per non-empty equal-width bin: its range, count, mean confidence and accuracy."""
    p, y = _arrays(confidences, correct)
    if bins < 1:
        raise InputError(f"bins must be at least 1, got {bins}")
    index = np.minimum((p * bins).astype(int), bins - 1)
    out = []
    for b in range(bins):
        mask = index == b
        n = int(mask.sum())
        if n:
            out.append(
                {
                    "low": b / bins,
                    "high": (b + 1) / bins,
                    "n": n,
                    "confidence": float(p[mask].mean()),
                    "accuracy": float(y[mask].mean()),
                }
            )
    return out


def ece(
    confidences: Sequence[float] | np.ndarray,
    correct: Sequence[bool] | np.ndarray,
    bins: int = DEFAULT_BINS,
) -> float:
    """Expected calibration error: the count-weighted mean |accuracy − confidence| per bin."""
    p, y = _arrays(confidences, correct)
    if not p.size:
        return 0.0
    return float(
        sum(b["n"] * abs(b["accuracy"] - b["confidence"]) for b in reliability_bins(p, y, bins))
        / p.size
    )


def brier(confidences: Sequence[float] | np.ndarray, correct: Sequence[bool] | np.ndarray) -> float:
    """Brier score: the mean of (confidence − label)²; 0 is perfect, lower is better."""
    p, y = _arrays(confidences, correct)
    return float(np.mean((p - y) ** 2)) if p.size else 0.0


def _average_ranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(values.size, dtype=float)
    sorted_values = values[order]
    i = 0
    while i < values.size:
        j = i
        while j + 1 < values.size and sorted_values[j + 1] == sorted_values[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def auroc(
    confidences: Sequence[float] | np.ndarray, correct: Sequence[bool] | np.ndarray
) -> float | None:
    """Area under the ROC curve (ties count half); None when only one class is present."""
    p, y = _arrays(confidences, correct)
    n_pos = int(y.sum())
    n_neg = int(y.size - n_pos)
    if n_pos == 0 or n_neg == 0:
        return None
    ranks = _average_ranks(p)
    return float((ranks[y == 1.0].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


@dataclass(frozen=True)
class RiskCoverage:
    """What the router does with these confidences at its two thresholds.

    ``passed``/``reviewed``/``escalated`` are shares of all answers; ``pass_error_rate`` is the
    share of wrong answers among the automatically passed ones (None when none passed), and
    likewise for review and escalation.
    """

    n: int
    pass_at: float
    review_at: float
    passed: float
    reviewed: float
    escalated: float
    pass_error_rate: float | None
    review_error_rate: float | None
    escalate_error_rate: float | None
    wrong_passed: int

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form."""
        return asdict(self)


def risk_coverage(
    confidences: Sequence[float] | np.ndarray,
    correct: Sequence[bool] | np.ndarray,
    *,
    pass_at: float = 0.85,
    review_at: float = 0.6,
) -> RiskCoverage:
    """Shares passed, reviewed and escalated, and the error rate within each route."""
    if not 0.0 <= review_at <= pass_at <= 1.0:
        raise InputError(f"need 0 <= review_at <= pass_at <= 1, got {review_at}, {pass_at}")
    p, y = _arrays(confidences, correct)
    n = int(p.size)
    routes = {
        "pass": p >= pass_at,
        "review": (p >= review_at) & (p < pass_at),
        "escalate": p < review_at,
    }

    def share(mask: np.ndarray) -> float:
        return float(mask.sum() / n) if n else 0.0

    def error(mask: np.ndarray) -> float | None:
        return float(1.0 - y[mask].mean()) if mask.any() else None

    return RiskCoverage(
        n=n,
        pass_at=pass_at,
        review_at=review_at,
        passed=share(routes["pass"]),
        reviewed=share(routes["review"]),
        escalated=share(routes["escalate"]),
        pass_error_rate=error(routes["pass"]),
        review_error_rate=error(routes["review"]),
        escalate_error_rate=error(routes["escalate"]),
        wrong_passed=int((routes["pass"] & (y == 0.0)).sum()),
    )


def risk_coverage_curve(
    confidences: Sequence[float] | np.ndarray, correct: Sequence[bool] | np.ndarray
) -> list[tuple[float, float, float]]:
    """(threshold, coverage, risk) for passing every answer at or above each distinct confidence.

    Coverage is the share passed; risk the share of wrong answers among them. Ordered from the
    highest threshold (least coverage) down.
    """
    p, y = _arrays(confidences, correct)
    out = []
    for t in np.unique(p)[::-1]:
        mask = p >= t
        out.append((float(t), float(mask.mean()), float(1.0 - y[mask].mean())))
    return out


def summarize(
    confidences: Sequence[float] | np.ndarray,
    correct: Sequence[bool] | np.ndarray,
    *,
    bins: int = DEFAULT_BINS,
    pass_at: float = 0.85,
    review_at: float = 0.6,
) -> dict[str, Any]:
    """ECE, Brier, AUROC and the risk–coverage figures in one JSON-able dict."""
    p, y = _arrays(confidences, correct)
    return {
        "n": int(p.size),
        "accuracy": float(y.mean()) if y.size else None,
        "mean_confidence": float(p.mean()) if p.size else None,
        "ece": ece(p, y, bins),
        "brier": brier(p, y),
        "auroc": auroc(p, y),
        "risk_coverage": risk_coverage(p, y, pass_at=pass_at, review_at=review_at).to_dict(),
    }
