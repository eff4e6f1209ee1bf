"""Compare the support backends under three protocols, with the error a user pays for.

For each backend (lexical, learned, embeddings and learned-embeddings when installed, and any
``--backend`` given, e.g. ``checker`` after registering one), on WiCE dev and AttributionBench
dev, four measures: balanced accuracy (BA), AUROC, F1 of the supported class, and
wrong-among-accepted (WAA: the share of the claims a backend accepts that are labelled
unsupported), under three protocols:

* ``fixed``: the backend as shipped, at its own threshold. Its threshold (and the learned
  backends' coefficients) were chosen on these very sets, so these figures are in-sample.
* ``cv``: grouped 5-fold cross-validation (pairs of one article or one question stay in one
  fold): the threshold is chosen on the training folds (best balanced accuracy) and applied to
  the fold left out; the learned backends are also refitted on the training folds
  (``verifier_fit.evaluate``).
* ``cross``: cross-dataset: threshold (and, for the learned backends, coefficients) chosen on
  the other dataset, measured on this one — the closest to held-out data we have.

A failed hard check (a pair the backend refuses although its score reaches its threshold, or a
specificity conflict) stays refused at any threshold. AttributionBench rows carry the question
they answer: the specificity check (``tracerag.signals._specificity``) applies to them as it
does in the pipeline; ``--no-specificity`` leaves it out, for the figures before it.

A change that raises one dataset's figure while lowering the cross-dataset figure is not
shipped: compare the ``cross`` rows.

CPU cost per request: process time of one check of a claim against a material it has not seen
(``new``) and against one it has (``cached``), median over the pairs measured.

Usage: python benchmarks/verifier_compare.py [--data DIR] [--backend NAME ...] [--limit N]
                                             [--checker MODEL ...] [--before-after]
                                             [--no-specificity] [--no-adversarial] [--no-cost]
"""

from __future__ import annotations

import argparse
import hashlib
import math
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from verifier_data import (
    Pair,
    auroc,
    balanced_accuracy,
    data_root,
    f1,
    load,
    wrong_among_accepted,
)

from tracerag.errors import ConfigurationError
from tracerag.signals._specificity import check_specificity
from tracerag.signals._support import Support, SupportBackend, get_backend

#: Published zero-shot balanced accuracy on the held-out subsets (issue 11 and issue 24;
#: LLM-AggreFact figures as published by the models' authors, not measured here).
PUBLISHED = {
    "lexical (previous round)": 73.8,
    "lexical (this round's start)": 72.2,
    "learned (this round's start)": 71.9,
    "AlignScore": 74.9,
    "MiniCheck-Flan-T5-L": 77.4,
    "gpt-4o": 79.9,
    "Bespoke-MiniCheck-7B": 82.5,
}
DATASETS = ("wice-dev", "attributionbench-dev")
FOLDS = 5


def _clear_caches() -> None:
    from tracerag.signals import _lexical as lexical
    from tracerag.text import _quantities as quantities

    lexical._VIEWS.clear()
    lexical._DOC_TOKENS.clear()
    quantities._extract_cached.cache_clear()


def cpu_cost(backend: SupportBackend, pairs: Sequence[Pair], n: int = 40) -> tuple[float, float]:
    """Median process time (ms) of a check on a new material, and on a cached one."""
    new: list[float] = []
    cached: list[float] = []
    for p in pairs[:n]:
        _clear_caches()
        for holder in (backend, getattr(backend, "_similarity", None)):
            clear = getattr(holder, "clear_cache", None)
            if clear is not None:  # the embeddings backends keep sentence vectors
                clear()
        began = time.process_time()
        backend(p.claim, p.material)
        new.append(time.process_time() - began)
        began = time.process_time()
        backend(p.claim + " ", p.material)
        cached.append(time.process_time() - began)
    return statistics.median(new) * 1000, statistics.median(cached) * 1000


def fold_of(p: Pair) -> int:
    """The cross-validation fold of a pair (by its group: one article or one question)."""
    return int(hashlib.sha256((p.dataset + p.group).encode()).hexdigest(), 16) % FOLDS


def measures(scores: Sequence[float], predicted: Sequence[bool], actual: Sequence[bool]) -> dict:
    """BA, AUROC, F1 and WAA of one set of predictions."""
    return {
        "n": len(actual),
        "balanced_accuracy": balanced_accuracy(predicted, actual),
        "auroc": auroc(scores, actual),
        "f1": f1(predicted, actual),
        "wrong_among_accepted": wrong_among_accepted(predicted, actual),
    }


def _predict(scores: Sequence[float], hard: Sequence[bool], t: float) -> list[bool]:
    return [s >= t and not h for s, h in zip(scores, hard, strict=True)]


def best_threshold(scores: Sequence[float], hard: Sequence[bool], actual: Sequence[bool]) -> float:
    """The threshold of best balanced accuracy on these pairs (the middle of ties is not
    sought: the lowest best score wins, as in ``verifier_fit``)."""
    best, at = -1.0, 0.5
    for t in sorted(set(round(s, 4) for s in scores)):
        ba = balanced_accuracy(_predict(scores, hard, t), actual)
        if not math.isnan(ba) and ba > best + 1e-12:
            best, at = ba, t
    return at


def protocols(
    pairs: dict[str, list[Pair]],
    results: dict[str, list[Support]],
    threshold: float,
    hard: dict[str, list[bool]],
) -> dict[str, dict[str, dict]]:
    """Fixed, cross-validated and cross-dataset figures of a backend with a fixed score."""
    out: dict[str, dict[str, dict]] = {"fixed": {}, "cv": {}, "cross": {}}
    for name, rows in pairs.items():
        scores = [r.score for r in results[name]]
        actual = [p.supported for p in rows]
        predicted = [r.supported for r in results[name]]
        out["fixed"][name] = measures(scores, predicted, actual)
        folds = [fold_of(p) for p in rows]
        cv_pred = [False] * len(rows)
        for k in range(FOLDS):
            train = [i for i, f in enumerate(folds) if f != k]
            t = best_threshold(
                [scores[i] for i in train],
                [hard[name][i] for i in train],
                [actual[i] for i in train],
            )
            for i, f in enumerate(folds):
                if f == k:
                    cv_pred[i] = scores[i] >= t and not hard[name][i]
        out["cv"][name] = measures(scores, cv_pred, actual)
        others = [o for o in pairs if o != name]
        if others:
            o_scores = [r.score for o in others for r in results[o]]
            o_hard = [h for o in others for h in hard[o]]
            o_actual = [p.supported for o in others for p in pairs[o]]
            t = best_threshold(o_scores, o_hard, o_actual)
            out["cross"][name] = {
                **measures(scores, _predict(scores, hard[name], t), actual),
                "threshold": t,
            }
    return out


def learned_protocols(
    backend: SupportBackend,
    pairs: dict[str, list[Pair]],
    results: dict[str, list[Support]],
    spec_hard: dict[str, list[bool]],
) -> dict[str, dict[str, dict]]:
    """The learned backend's cv and cross figures, refitted out of sample
    (``verifier_fit.evaluate``), with the specificity conflicts as failed hard checks."""
    import numpy as np
    from verifier_fit import Decider, _analyses, evaluate, feature_matrix

    from tracerag.signals._learned import FEATURES, SIMILARITY_FEATURES, similarity_features

    flat = [p for name in pairs for p in pairs[name]]
    analyses = _analyses(flat)
    x = feature_matrix(flat, analyses)
    names = FEATURES
    scorer = getattr(backend, "_similarity", None)
    similarity = scorer is not None
    if scorer is not None:  # the backend's own sentence vectors, kept from scoring
        sims = np.array(
            [
                similarity_features(
                    scorer.similarities(p.claim, p.material), a.chosen[0] if a.chosen else None
                )
                for p, a in zip(flat, analyses, strict=True)
            ],
            dtype=float,
        )
        x = np.hstack([x, sims])
        names = FEATURES + SIMILARITY_FEATURES
    y = np.array([float(p.supported) for p in flat])
    datasets = np.array([p.dataset for p in flat])
    folds = np.array([fold_of(p) for p in flat])
    decide = Decider(analyses, similarity)
    decide.hard = decide.hard | np.array([h for name in pairs for h in spec_hard[name]])
    report, _ = evaluate(x, y, datasets, folds, decide, names)
    fixed = {
        name: measures(
            [r.score for r in results[name]],
            [r.supported for r in results[name]],
            [p.supported for p in pairs[name]],
        )
        for name in pairs
    }
    return {"fixed": fixed, "cv": report["cross_validation"], "cross": report["cross_dataset"]}


def _row(label: str, kind: str, dataset: str, m: dict) -> str:
    waa = m["wrong_among_accepted"]
    return (
        f"{label:<19} {kind:<6} {dataset:<21} {m['n']:>5} "
        f"{100 * m['balanced_accuracy']:6.1f} {m['auroc']:6.3f} {m['f1']:6.3f} "
        f"{'   n/a' if math.isnan(waa) else f'{100 * waa:6.1f}'}"
    )


def print_table(label: str, report: dict[str, dict[str, dict]]) -> None:
    """One backend's rows, and each protocol's mean over the datasets."""
    for kind in ("fixed", "cv", "cross"):
        rows = report.get(kind, {})
        for dataset, m in rows.items():
            print(_row(label, kind, dataset, m))
        if len(rows) > 1:
            mean = {
                key: statistics.fmean(m[key] for m in rows.values())
                for key in ("balanced_accuracy", "auroc", "f1", "wrong_among_accepted")
            }
            mean["n"] = sum(m["n"] for m in rows.values())
            print(_row(label, kind, "mean", mean))


def score_all(backend: SupportBackend, data: dict[str, list[Pair]]) -> dict[str, list[Support]]:
    """Every pair's verdict, as the backend gives it."""
    return {
        dataset: [backend(p.claim, p.material) for p in pairs] for dataset, pairs in data.items()
    }


def with_specificity(
    backend: SupportBackend,
    data: dict[str, list[Pair]],
    raw: dict[str, list[Support]],
    specificity: bool,
) -> tuple[dict[str, list[Support]], dict[str, list[bool]], dict[str, list[bool]], int]:
    """The verdicts after the specificity check (where the pair has a question), which pairs
    are refused by a hard check, which by the specificity check, and how many verdicts the
    specificity check withdrew."""
    results: dict[str, list[Support]] = {}
    hard: dict[str, list[bool]] = {}
    spec: dict[str, list[bool]] = {}
    withdrawn = 0
    for dataset, pairs in data.items():
        rows, hrow, srow = [], [], []
        for p, r in zip(pairs, raw[dataset], strict=True):
            checked = (
                check_specificity(p.question, p.claim, p.material, r, threshold=backend.threshold)
                if specificity
                else r
            )
            flagged = r.supported and not checked.supported
            withdrawn += flagged
            rows.append(checked)
            srow.append(flagged)
            hrow.append(flagged or (not r.supported and r.score >= backend.threshold))
        results[dataset], hard[dataset], spec[dataset] = rows, hrow, srow
    return results, hard, spec, withdrawn


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="the shared data directory (holding wice/, ...)")
    parser.add_argument("--backend", action="append", help="backend to compare (repeatable)")
    parser.add_argument("--limit", type=int, help="only the first N pairs of each dataset")
    parser.add_argument(
        "--checker",
        action="append",
        default=[],
        metavar="MODEL",
        help="also compare CheckerSupport(MODEL): a model directory or id "
        "(repeatable; the checker extra)",
    )
    parser.add_argument(
        "--no-specificity",
        action="store_true",
        help="leave the question-specificity check out (the figures before it)",
    )
    parser.add_argument(
        "--before-after",
        action="store_true",
        help="print each backend without, then with, the specificity check",
    )
    parser.add_argument("--no-adversarial", action="store_true", help="skip the self-test")
    parser.add_argument("--no-cost", action="store_true", help="skip the CPU cost measure")
    args = parser.parse_args(argv)
    root = data_root(args.data)
    data = load(root, DATASETS)
    if not data:
        print(f"no labelled data under {root}; pass --data DIR. Nothing to compare.")
        return 0
    if args.limit:
        data = {k: v[: args.limit] for k, v in data.items()}
    names = args.backend or ["lexical", "learned", "embeddings", "learned-embeddings"]
    for model in args.checker:
        from tracerag.signals._checker import CheckerSupport

        checker = CheckerSupport(model, name=f"checker:{Path(model).name}")
        checker.register()
        names.append(checker.name)
    modes = [False, True] if args.before_after else [not args.no_specificity]
    print(
        "published zero-shot balanced accuracy on the held-out subsets (published, not "
        "measured here): " + ", ".join(f"{k} {v}" for k, v in PUBLISHED.items())
    )
    print(
        f"\n{'backend':<19} {'proto':<6} {'dataset':<21} {'n':>5} {'BA':>6} {'AUROC':>6} "
        f"{'F1':>6} {'WAA%':>6}"
    )
    costs: list[str] = []
    for name in names:
        try:
            backend = get_backend(name)
        except ConfigurationError as exc:
            print(f"{name:<19} skipped: {exc}")
            continue
        began = time.perf_counter()
        raw = score_all(backend, data)
        took = time.perf_counter() - began
        for specificity in modes:
            results, hard, spec, withdrawn = with_specificity(backend, data, raw, specificity)
            if name.startswith("learned"):
                report = learned_protocols(backend, data, results, spec)
            else:
                report = protocols(data, results, backend.threshold, hard)
            label = f"{name}{'+spec' if specificity else ''}"
            print_table(label, report)
            print(
                f"{'':<19} threshold {backend.threshold:.3f}; specificity "
                + (f"withdrew {withdrawn}" if specificity else "off")
                + f"; scored in {took:.0f}s"
                + (
                    "; fixed rows in-sample (fitted on these sets)"
                    if name.startswith("learned")
                    else ""
                )
            )
        if not args.no_cost:
            for dataset, pairs in data.items():
                new, cached = cpu_cost(backend, pairs)
                costs.append(f"{name:<19} {dataset:<21} {new:8.1f} {cached:9.1f}")
    if costs:
        print(f"\n{'backend':<19} {'dataset':<21} {'ms new':>8} {'ms cached':>9}")
        print("\n".join(costs))
    if not args.no_adversarial:
        from tracerag.tools.adversarial import demo_cases, run_adversarial

        cases = demo_cases()
        print("\nadversarial self-test (demo knowledge base): interception / false alarms")
        for name in names:
            try:
                backend = get_backend(name)
            except ConfigurationError:
                continue
            adv = run_adversarial(cases, backend=backend)
            rates = ", ".join(
                f"{k} {r.intercepted}/{r.total}" for k, r in adv.kinds.items() if r.total
            )
            print(f"  {name:<11} {rates}; false alarms {adv.false_alarms}/{adv.eligible}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
