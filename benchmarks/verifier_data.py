"""The labelled data the verifier benchmarks read, and the measures they report.

Data is read from ``shared/data`` beside the project root (or ``--data DIR``, or
``TRACERAG_SHARED_DATA``) and never copied into the repository:

* WiCE ``claim-dev.jsonl`` (supported vs partially/not supported),
* WiCE ``non-supported-tokens-train.jsonl`` (partially supported claims of the training split:
  negatives only),
* AttributionBench ``dev-genSearch-expertqa.jsonl`` (attributable vs not; Stanford-GenSearch
  and ExpertQA).
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

DEFAULT_ROOT = Path(__file__).resolve().parents[1].parent / "shared" / "data"
_MARKER_RE = re.compile(r"\s*\[\d+(?:\s*,\s*\d+)*\]")


@dataclass(frozen=True)
class Pair:
    """One claim, the material it is checked against, and whether the material supports it."""

    dataset: str  # "wice-dev" | "wice-train" | "attributionbench-dev"
    group: str  # rows that share a material or source document
    claim: str
    material: str
    supported: bool
    question: str = ""  # the question the claim answers, where the dataset has one


def data_root(arg: str | None = None) -> Path:
    """Where the shared data is: ``arg``, then ``TRACERAG_SHARED_DATA``, then beside the project."""
    if arg:
        return Path(arg)
    env = os.environ.get("TRACERAG_SHARED_DATA")
    return Path(env) if env else DEFAULT_ROOT


def _literal(value: object) -> object:
    if isinstance(value, str):
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value
    return value


def _wice(path: Path, dataset: str) -> list[Pair]:
    out: list[Pair] = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            evidence = [str(s) for s in _literal(row.get("evidence")) or []]
            material = "\n".join(evidence)
            claim = str(row["claim"]).strip()
            meta = _literal(row.get("meta")) or {}
            group = str(meta.get("id", "")).split("-")[0] if isinstance(meta, dict) else ""
            if claim and material.strip():
                out.append(
                    Pair(dataset, group or claim, claim, material, row["label"] == "supported")
                )
    return out


def _attributionbench(path: Path) -> list[Pair]:
    out: list[Pair] = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            claim = _MARKER_RE.sub("", str(row["claim"])).strip()
            material = "\n\n".join(str(r) for r in row.get("references") or [])
            if claim and material.strip():
                question = str(row.get("question", ""))
                out.append(
                    Pair(
                        "attributionbench-dev",
                        question[:200],
                        claim,
                        material,
                        row["attribution_label"] == "attributable",
                        question,
                    )
                )
    return out


FILES = {
    "wice-dev": ("wice/claim-dev.jsonl", lambda p: _wice(p, "wice-dev")),
    "wice-train": ("wice/non-supported-tokens-train.jsonl", lambda p: _wice(p, "wice-train")),
    "attributionbench-dev": ("attributionbench/dev-genSearch-expertqa.jsonl", _attributionbench),
}


def load(root: Path, names: Sequence[str] = tuple(FILES)) -> dict[str, list[Pair]]:
    """The datasets that are present under ``root`` (absent ones are left out)."""
    out: dict[str, list[Pair]] = {}
    for name in names:
        rel, reader = FILES[name]
        if (root / rel).is_file():
            out[name] = reader(root / rel)
    return out


# ----------------------------------------------------------------------------------------------
# Measures


def auroc(scores: Sequence[float], actual: Sequence[bool]) -> float:
    """Area under the ROC curve (ties count half)."""
    pairs = sorted(zip(scores, actual, strict=True), key=lambda x: x[0])
    n_pos = sum(actual)
    n_neg = len(actual) - n_pos
    if not n_pos or not n_neg:
        return float("nan")
    rank_sum = 0.0
    i = 0
    while i < len(pairs):
        j = i
        while j < len(pairs) and pairs[j][0] == pairs[i][0]:
            j += 1
        rank_sum += (i + 1 + j) / 2 * sum(1 for k in range(i, j) if pairs[k][1])
        i = j
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def balanced_accuracy(predicted: Sequence[bool], actual: Sequence[bool]) -> float:
    """Mean of the recall of supported and of unsupported pairs."""
    tp = sum(p and a for p, a in zip(predicted, actual, strict=True))
    tn = sum(not p and not a for p, a in zip(predicted, actual, strict=True))
    pos = sum(actual)
    neg = len(actual) - pos
    if not pos or not neg:
        return float("nan")
    return (tp / pos + tn / neg) / 2


def f1(predicted: Sequence[bool], actual: Sequence[bool]) -> float:
    """F1 of the supported class."""
    tp = sum(p and a for p, a in zip(predicted, actual, strict=True))
    fp = sum(p and not a for p, a in zip(predicted, actual, strict=True))
    fn = sum(a and not p for p, a in zip(predicted, actual, strict=True))
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def wrong_among_accepted(predicted: Sequence[bool], actual: Sequence[bool]) -> float:
    """The share of accepted (predicted supported) pairs that are labelled unsupported: the
    error a user pays for. NaN when nothing is accepted."""
    accepted = [a for p, a in zip(predicted, actual, strict=True) if p]
    return sum(not a for a in accepted) / len(accepted) if accepted else float("nan")


def best_balanced_threshold(scores: Sequence[float], actual: Sequence[bool]) -> float:
    """The threshold with the highest balanced accuracy (the middle of the best run)."""
    candidates = sorted(set(scores))
    best, at = -1.0, 0.5
    for t in candidates:
        ba = balanced_accuracy([s >= t for s in scores], actual)
        if not math.isnan(ba) and ba > best + 1e-12:
            best, at = ba, t
    return at
