"""How a calibration compares with the heuristic: ECE, Brier, AUROC and the routes it gives.

A seeded holdout split, the comparison, and its rendering for people.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tracerag._routing import Thresholds
from tracerag.errors import InputError
from tracerag.signals._confidence import Combined
from tracerag.tools._scoring import DEFAULT_BINS, summarize

if TYPE_CHECKING:
    pass
from tracerag.tools._calibration_data import Example

__all__ = ["compare", "render_comparison", "split_holdout"]


# ----------------------------------------------------------------------------------------------
# Evaluation


def split_holdout(
    examples: Sequence[Example], share: float, seed: int = 0
) -> tuple[list[Example], list[Example]]:
    """A (fit, held-out) split with ``share`` of each label held out, reproducible by seed."""
    if not 0.0 < share < 1.0:
        raise InputError(f"holdout share must be between 0 and 1, got {share}")
    rng = random.Random(seed)
    fit: list[Example] = []
    held: list[Example] = []
    for label in (True, False):
        group = [e for e in examples if e.correct is label]
        rng.shuffle(group)
        k = round(len(group) * share)
        held.extend(group[:k])
        fit.extend(group[k:])
    return fit, held


def compare(
    examples: Sequence[Example],
    combiners: Mapping[str, Callable[..., Combined]],
    *,
    bins: int = DEFAULT_BINS,
    thresholds: Thresholds | None = None,
) -> dict[str, dict[str, Any]]:
    """ECE, Brier, AUROC and risk–coverage of each combiner on the examples."""
    thresholds = thresholds or Thresholds()
    labels = [e.correct for e in examples]
    out = {}
    for name, combiner in combiners.items():
        confidences = [combiner(e.signals, cap=thresholds.cap).value for e in examples]
        out[name] = summarize(
            confidences,
            labels,
            bins=bins,
            pass_at=thresholds.pass_at,
            review_at=thresholds.review_at,
        )
    return out


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def render_comparison(title: str, results: Mapping[str, Mapping[str, Any]], bins: int) -> str:
    """A side-by-side table of ``compare`` results, for people."""
    names = list(results)
    width = max(16, *(len(n) + 2 for n in names))
    first = next(iter(results.values()))
    lines = [f"{title} (n={first['n']}, {_pct(first['accuracy'])} right)"]
    lines.append(" " * 26 + "".join(f"{n:>{width}}" for n in names))
    rows: list[tuple[str, Callable[[Mapping[str, Any]], str]]] = [
        (f"ECE ({bins} bins)", lambda r: _num(r["ece"])),
        ("Brier", lambda r: _num(r["brier"])),
        ("AUROC", lambda r: _num(r["auroc"])),
        ("mean confidence", lambda r: _num(r["mean_confidence"])),
        ("auto-passed", lambda r: _pct(r["risk_coverage"]["passed"])),
        ("  wrong among passed", lambda r: _pct(r["risk_coverage"]["pass_error_rate"])),
        ("reviewed", lambda r: _pct(r["risk_coverage"]["reviewed"])),
        ("  wrong among reviewed", lambda r: _pct(r["risk_coverage"]["review_error_rate"])),
        ("escalated", lambda r: _pct(r["risk_coverage"]["escalated"])),
        ("  wrong among escalated", lambda r: _pct(r["risk_coverage"]["escalate_error_rate"])),
    ]
    for label, get in rows:
        lines.append(f"  {label:<24}" + "".join(f"{get(results[n]):>{width}}" for n in names))
    return "\n".join(lines)
