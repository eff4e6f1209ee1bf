"""Benchmark the support backends on the WiCE dev set (claims checked against web evidence).

Reports, per support backend available offline:

(a) support classification, "supported" vs not ("partially_supported" counts as not):
    precision, recall and F1 at the backend's threshold, the best F1 over all thresholds, AUROC;
(b) evidence localisation: how often the sentence the verifier names (top-1), or one of its
    top-3 candidates, is an annotated supporting sentence (claims labelled supported or
    partially supported that have annotations);
(c) unsupported words: token-level precision, recall and F1 of the claim words the verifier
    flags as unsupported, against the annotated non-supported spans.

The data is read from ``shared/data/wice`` beside the project root, ``--data DIR`` or the
``TRACERAG_WICE_DIR`` environment variable; it is never copied into the repository. Without
the data the script says so and exits 0.

Usage: python benchmarks/verifier_wice.py [--data DIR] [--backend NAME ...] [--limit N]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from verifier_data import auroc

from tracerag.errors import ConfigurationError
from tracerag.signals._support import Support, SupportBackend, get_backend

CLAIMS_FILE = "claim-dev.jsonl"
TOKENS_FILE = "non-supported-tokens-dev.jsonl"
DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "wice"
OFFLINE_BACKENDS = ("lexical", "embeddings")


# ----------------------------------------------------------------------------------------------
# Data


@dataclass
class Example:
    """One WiCE claim with its evidence joined into a single material text."""

    claim: str
    label: str
    material: str
    offsets: list[tuple[int, int]]  # of each evidence sentence in `material`
    gold: set[int]  # indices of annotated supporting sentences
    claim_tokens: list[str] = field(default_factory=list)
    non_supported: list[bool] = field(default_factory=list)

    @property
    def supported(self) -> bool:
        return self.label == "supported"

    def sentence_index(self, start: int, end: int) -> int | None:
        """The evidence sentence a span of the material falls in (by its start)."""
        for i, (a, b) in enumerate(self.offsets):
            if a <= start < b or (start == a == b):
                return i
        for i, (a, b) in enumerate(self.offsets):
            if a < end and start < b:
                return i
        return None


def _field(row: dict[str, Any], name: str) -> Any:
    value = row.get(name)
    if isinstance(value, str) and name != "claim" and name != "label":
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value
    return value


def _example(row: dict[str, Any]) -> Example:
    evidence = [str(s) for s in _field(row, "evidence") or []]
    parts: list[str] = []
    offsets: list[tuple[int, int]] = []
    pos = 0
    for sentence in evidence:
        offsets.append((pos, pos + len(sentence)))
        parts.append(sentence)
        pos += len(sentence) + 1
    gold: set[int] = set()
    for group in _field(row, "supporting_sentences") or []:
        gold.update(int(i) for i in (group if isinstance(group, list) else [group]))
    return Example(
        claim=str(row["claim"]),
        label=str(row["label"]),
        material="\n".join(parts),
        offsets=offsets,
        gold=gold,
        claim_tokens=[str(t) for t in _field(row, "claim_tokens") or []],
        non_supported=[bool(x) for x in _field(row, "non_supported_spans") or []],
    )


def load(path: Path, limit: int | None = None) -> list[Example]:
    """The examples of one WiCE jsonl file that have a claim and evidence."""
    out: list[Example] = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            ex = _example(json.loads(line))
            if ex.claim.strip() and ex.material.strip():
                out.append(ex)
            if limit is not None and len(out) >= limit:
                break
    return out


# ----------------------------------------------------------------------------------------------
# Metrics


def prf(predicted: Sequence[bool], actual: Sequence[bool]) -> tuple[float, float, float]:
    """Precision, recall and F1 of the positive class."""
    tp = sum(p and a for p, a in zip(predicted, actual, strict=True))
    fp = sum(p and not a for p, a in zip(predicted, actual, strict=True))
    fn = sum(a and not p for p, a in zip(predicted, actual, strict=True))
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def best_f1(scores: Sequence[float], actual: Sequence[bool]) -> tuple[float, float]:
    """The best F1 over all thresholds, and the threshold reaching it."""
    best = (0.0, 0.0)
    for t in sorted(set(scores)):
        f1 = prf([s >= t for s in scores], actual)[2]
        if f1 > best[0]:
            best = (f1, t)
    return best


def _term_spans(claim: str, terms: Iterable[str]) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    for term in terms:
        if not term:
            continue
        start = claim.find(term)
        while start >= 0:
            spans.append((start, start + len(term)))
            start = claim.find(term, start + 1)
    return spans


def flagged_tokens(claim: str, tokens: Sequence[str], terms: Iterable[str]) -> list[bool]:
    """Which of the claim's tokens fall inside one of the flagged terms."""
    spans = _term_spans(claim, terms)
    out: list[bool] = []
    pos = 0
    for tok in tokens:
        at = claim.find(tok, pos)
        if at < 0:
            out.append(False)
            continue
        end = at + len(tok)
        pos = end
        out.append(any(a < end and at < b for a, b in spans))
    return out


# ----------------------------------------------------------------------------------------------
# Evaluation


@dataclass
class Report:
    backend: str
    threshold: float
    n: int
    precision: float
    recall: float
    f1: float
    best_f1: float
    best_threshold: float
    auroc: float
    n_evidence: int
    top1: float
    top3: float
    n_token_claims: int
    token_precision: float
    token_recall: float
    token_f1: float
    seconds: float


def run_support(backend: SupportBackend, examples: Sequence[Example]) -> list[Support]:
    """The backend's verdict on every example."""
    return [backend(ex.claim, ex.material) for ex in examples]


def evaluate(
    backend: SupportBackend,
    claims: Sequence[Example],
    token_claims: Sequence[Example] = (),
) -> Report:
    """All three measures for one backend."""
    began = time.perf_counter()
    results = run_support(backend, claims)
    actual = [ex.supported for ex in claims]
    scores = [r.score for r in results]
    precision, recall, f1 = prf([r.supported for r in results], actual)
    bf1, bt = best_f1(scores, actual)

    hits1 = hits3 = n_evidence = 0
    for ex, r in zip(claims, results, strict=True):
        if ex.label not in ("supported", "partially_supported") or not ex.gold:
            continue
        n_evidence += 1
        top = ex.sentence_index(r.start, r.end)
        hits1 += top in ex.gold
        ranked = [ex.sentence_index(a, b) for a, b, _ in r.candidates[:3]] or [top]
        hits3 += any(i in ex.gold for i in ranked)

    tp = fp = fn = 0
    for ex in token_claims:
        r = backend(ex.claim, ex.material)
        pred = flagged_tokens(ex.claim, ex.claim_tokens, r.unsupported_terms)
        gold = ex.non_supported[: len(pred)]
        tp += sum(p and g for p, g in zip(pred, gold, strict=False))
        fp += sum(p and not g for p, g in zip(pred, gold, strict=False))
        fn += sum(g and not p for p, g in zip(pred, gold, strict=False))
    tprec = tp / (tp + fp) if tp + fp else 0.0
    trec = tp / (tp + fn) if tp + fn else 0.0
    tf1 = 2 * tprec * trec / (tprec + trec) if tprec + trec else 0.0

    return Report(
        backend=backend.name,
        threshold=backend.threshold,
        n=len(claims),
        precision=precision,
        recall=recall,
        f1=f1,
        best_f1=bf1,
        best_threshold=bt,
        auroc=auroc(scores, actual),
        n_evidence=n_evidence,
        top1=hits1 / n_evidence if n_evidence else 0.0,
        top3=hits3 / n_evidence if n_evidence else 0.0,
        n_token_claims=len(token_claims),
        token_precision=tprec,
        token_recall=trec,
        token_f1=tf1,
        seconds=time.perf_counter() - began,
    )


def format_table(reports: Sequence[Report]) -> str:
    """A compact text table of the reports."""
    head = (
        f"{'backend':<11} {'thr':>5} {'P':>5} {'R':>5} {'F1':>5} {'bestF1':>6} {'@thr':>5} "
        f"{'AUROC':>5} | {'top1':>5} {'top3':>5} | {'tokP':>5} {'tokR':>5} {'tokF1':>5} | "
        f"{'sec':>5}"
    )
    lines = [head, "-" * len(head)]
    for r in reports:
        lines.append(
            f"{r.backend:<11} {r.threshold:5.2f} {r.precision:5.3f} {r.recall:5.3f} {r.f1:5.3f} "
            f"{r.best_f1:6.3f} {r.best_threshold:5.2f} {r.auroc:5.3f} | {r.top1:5.3f} "
            f"{r.top3:5.3f} | {r.token_precision:5.3f} {r.token_recall:5.3f} {r.token_f1:5.3f} | "
            f"{r.seconds:5.1f}"
        )
    return "\n".join(lines)


def data_dir(arg: str | None) -> Path:
    """Where the WiCE files are: --data, then TRACERAG_WICE_DIR, then beside the project."""
    if arg:
        return Path(arg)
    env = os.environ.get("TRACERAG_WICE_DIR")
    if env:
        return Path(env)
    return DEFAULT_DATA


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="directory holding the WiCE dev files")
    parser.add_argument(
        "--backend",
        action="append",
        help="support backend to evaluate (repeatable; default: every offline backend)",
    )
    parser.add_argument("--limit", type=int, help="evaluate only the first N claims")
    args = parser.parse_args(argv)

    root = data_dir(args.data)
    claims_path = root / CLAIMS_FILE
    if not claims_path.is_file():
        print(
            f"WiCE data not found ({claims_path} is missing); pass --data DIR or set "
            "TRACERAG_WICE_DIR. Nothing to benchmark."
        )
        return 0
    claims = load(claims_path, args.limit)
    tokens_path = root / TOKENS_FILE
    token_claims = load(tokens_path, args.limit) if tokens_path.is_file() else []

    names = args.backend or list(OFFLINE_BACKENDS)
    reports: list[Report] = []
    for name in names:
        try:
            backend = get_backend(name)
        except ConfigurationError as exc:
            print(f"skipping backend {name!r}: {exc}")
            continue
        reports.append(evaluate(backend, claims, token_claims))

    labels: dict[str, int] = {}
    for ex in claims:
        labels[ex.label] = labels.get(ex.label, 0) + 1
    counts = ", ".join(f"{k} {v}" for k, v in sorted(labels.items()))
    print(
        f"WiCE dev: {len(claims)} claims ({counts}); "
        f"{len(token_claims)} claims with token annotations"
    )
    if reports:
        r0 = reports[0]
        print(
            f"(a) supported vs not; (b) evidence sentence among annotated ({r0.n_evidence} "
            f"claims); (c) unsupported-token flags ({r0.n_token_claims} claims)"
        )
        print(format_table(reports))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
