"""Compare the support backends: accuracy on the labelled data, CPU cost, adversarial self-test.

For each backend available offline (lexical, learned, embeddings when installed), on WiCE dev
and AttributionBench dev: balanced accuracy, AUROC and F1 at the backend's own threshold, beside
the published figures of issue 11 (zero-shot balanced accuracy on held-out subsets). The
learned backend was fitted on these very sets, so its figures here are in-sample; its
out-of-sample figures (grouped 5-fold cross-validation, and cross-dataset) are the ones stored
with its coefficients and printed beside them.

CPU cost per request: process time of one check of a claim against a material it has not seen
(``new``) and against one it has (``cached``: the material's analysis is reused), median over
the pairs measured.

Usage: python benchmarks/verifier_compare.py [--data DIR] [--backend NAME ...] [--limit N]
                                             [--no-adversarial]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from verifier_data import auroc, balanced_accuracy, data_root, f1, load

from tracerag.errors import ConfigurationError
from tracerag.signals.support import get_backend

#: Zero-shot balanced accuracy on the held-out subsets, as reported in issue 11.
PUBLISHED = {
    "lexical (before)": 73.8,
    "embeddings (before)": 74.6,
    "AlignScore": 74.9,
    "MiniCheck-Flan-T5": 77.4,
    "gpt-4o": 79.9,
    "Bespoke-MiniCheck-7B": 82.5,
}
DATASETS = ("wice-dev", "attributionbench-dev")


def _clear_caches() -> None:
    from tracerag.signals import lexical
    from tracerag.text import quantities

    lexical._VIEWS.clear()
    lexical._DOC_TOKENS.clear()
    quantities._extract_cached.cache_clear()


def cpu_cost(backend, pairs, n: int = 40) -> tuple[float, float]:
    """Median process time (ms) of a check on a new material, and on a cached one."""
    new: list[float] = []
    cached: list[float] = []
    for p in pairs[:n]:
        _clear_caches()
        for holder in (backend, getattr(backend, "_similarity", None)):
            cache = getattr(holder, "_cache", None)
            if cache is not None:  # the embeddings backends keep sentence vectors per material
                cache.clear()
        began = time.process_time()
        backend(p.claim, p.material)
        new.append(time.process_time() - began)
        began = time.process_time()
        backend(p.claim + " ", p.material)
        cached.append(time.process_time() - began)
    return statistics.median(new) * 1000, statistics.median(cached) * 1000


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="the shared data directory (holding wice/, ...)")
    parser.add_argument("--backend", action="append", help="backend to compare (repeatable)")
    parser.add_argument("--limit", type=int, help="only the first N pairs of each dataset")
    parser.add_argument("--no-adversarial", action="store_true", help="skip the self-test")
    args = parser.parse_args(argv)
    root = data_root(args.data)
    data = load(root, DATASETS)
    if not data:
        print(f"no labelled data under {root}; pass --data DIR. Nothing to compare.")
        return 0
    if args.limit:
        data = {k: v[: args.limit] for k, v in data.items()}
    names = args.backend or ["lexical", "learned", "embeddings", "learned-embeddings"]
    print("published zero-shot balanced accuracy on held-out subsets (issue 11): "
          + ", ".join(f"{k} {v}" for k, v in PUBLISHED.items()))
    print(f"\n{'backend':<11} {'dataset':<21} {'n':>5} {'thr':>5} {'BA':>6} {'AUROC':>6} "
          f"{'F1':>6} | {'ms new':>7} {'ms cached':>9}")
    for name in names:
        try:
            backend = get_backend(name)
        except ConfigurationError as exc:
            print(f"{name:<11} skipped: {exc}")
            continue
        for dataset, pairs in data.items():
            results = [backend(p.claim, p.material) for p in pairs]
            actual = [p.supported for p in pairs]
            predicted = [r.supported for r in results]
            scores = [r.score for r in results]
            new, cached = cpu_cost(backend, pairs)
            print(
                f"{name:<11} {dataset:<21} {len(pairs):>5} {backend.threshold:5.2f} "
                f"{100 * balanced_accuracy(predicted, actual):6.1f} {auroc(scores, actual):6.3f} "
                f"{f1(predicted, actual):6.3f} | {new:7.1f} {cached:9.1f}"
                + ("  (in-sample)" if name.startswith("learned") else "")
            )
        if name.startswith("learned"):
            meta = getattr(backend, "combiner", None)
            oos = meta.meta.get("out_of_sample", {}) if meta else {}
            for kind, rows in oos.items():
                for dataset, row in rows.items():
                    if dataset in data:
                        print(
                            f"{'  ' + kind:<33} {row['n']:>5} {'':>5} "
                            f"{100 * row['balanced_accuracy']:6.1f} {row['auroc']:6.3f} "
                            f"{row['f1']:6.3f}"
                        )
    if not args.no_adversarial:
        from tracerag.tools.adversarial import demo_cases, run_adversarial

        cases = demo_cases()
        print("\nadversarial self-test (demo knowledge base): interception / false alarms")
        for name in names:
            try:
                backend = get_backend(name)
            except ConfigurationError:
                continue
            report = run_adversarial(cases, backend=backend)
            rates = ", ".join(
                f"{k} {r.intercepted}/{r.total}" for k, r in report.kinds.items() if r.total
            )
            print(f"  {name:<11} {rates}; false alarms {report.false_alarms}/{report.eligible}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
