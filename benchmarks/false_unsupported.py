"""The false-unsupported audit, and what the rival-value check costs and catches on labelled data.

Three parts, in one run:

1. **Audit**: correct answers that quote the sentences answering their question
   (``tests/signals/quoted_answers.py``: hand-written questions over the demo knowledge base and
   over seven small knowledge bases of other businesses, several phrasings per fact, English and
   Chinese, one- and two-sentence answers, and every sentence of every current demo document
   under a question made from its title), verified with the question by
   each backend, and the hand-written ones also answered through ``RAGPipeline`` by a model that
   gives the quoted answer: claims called unsupported, per language and answer length. The
   target is 0.
2. **The rival check on labelled data**: on AttributionBench dev (the one labelled set whose
   rows carry their question; English), how often the check finds a rival sentence, its
   precision (share of those pairs labelled not attributable) and recall (share of the
   not-attributable pairs it finds), and how many verdicts it withdrew from each backend; the
   same on the hand-written rival cases (``RIVAL_CASES``, both languages, which must all be
   found) against the audit's quoted answers (which must not). WiCE claims have no question, so
   the check cannot apply to them; no labelled Chinese data exists under ``../shared/data``.
3. **Verifier figures before/after**: balanced accuracy, AUROC, F1 and wrong-among-accepted of
   each backend as shipped (its own threshold; the ``fixed`` protocol of
   ``verifier_compare.py``) on WiCE dev and AttributionBench dev, with no rival check, with the
   check as it was at ``--before`` (a git revision, read with ``git show``) and with the check
   of this tree.

Usage: python benchmarks/false_unsupported.py [--data DIR] [--before REV] [--backend NAME ...]
                                              [--no-pipeline]
"""

from __future__ import annotations

import argparse
import inspect
import math
import subprocess
import sys
import time
import types
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "signals"))

from quoted_answers import RIVAL_CASES, QuotedCase, cases, material  # noqa: E402
from verifier_data import (  # noqa: E402
    Pair,
    auroc,
    balanced_accuracy,
    data_root,
    f1,
    load,
    wrong_among_accepted,
)

from tracerag.signals import _specificity as current  # noqa: E402
from tracerag.signals._citations import verify_citations  # noqa: E402
from tracerag.signals._support import Support, SupportBackend, get_backend  # noqa: E402

SPEC_PATH = "tracerag/signals/_specificity.py"
DATASETS = ("wice-dev", "attributionbench-dev")  # the development splits (wice-train: fitting)
Check = Callable[..., Support]


def _old_module(rev: str) -> types.ModuleType | None:
    """``_specificity`` as it was at ``rev`` (None when git cannot show it)."""
    try:
        source = subprocess.run(
            ["git", "show", f"{rev}:{SPEC_PATH}"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    module = types.ModuleType(f"_specificity_at_{rev}")
    module.__file__ = f"{rev}:{SPEC_PATH}"
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


# -- 1. the audit --------------------------------------------------------------------------------


AuditKey = tuple[str, int, str, str]  # origin, sentences (2: two or more), language, measure


def audit(backends: Sequence[str]) -> dict[str, Counter[AuditKey]]:
    """Per backend: answers, claims and claims called unsupported, per (origin, language,
    sentences)."""
    out: dict[str, Counter[AuditKey]] = {}
    for name in backends:
        tally: Counter[AuditKey] = Counter()
        for c in cases():
            key = (c.origin, min(c.n_sentences, 2), c.lang)
            report = verify_citations(
                c.answer, [material(c.material_id)], question=c.question, backend=name
            )
            tally[(key[0], key[1], key[2], "answers")] += 1
            tally[(key[0], key[1], key[2], "claims")] += len(report.claims)
            bad = [v for v in report.claims if v.verdict != "supported"]
            tally[(key[0], key[1], key[2], "unsupported")] += len(bad)
            for v in bad:
                print(f"  [{name}] {c.question!r}: {v.text!r} -> {v.verdict}: {v.reason}")
        out[name] = tally
    return out


def audit_pipeline(hand: Sequence[QuotedCase]) -> Counter[str]:
    """The hand-written cases through ``RAGPipeline`` (the demo retriever, k=4), a model that
    answers every sample with the quoted answer: claims by verdict."""
    from tracerag import RAGPipeline, RetryPolicy
    from tracerag.demo.kb import build_retriever
    from tracerag.testing import ScriptedChatModel

    retriever = build_retriever(k=4)
    verdicts: Counter[str] = Counter()
    for c in hand:
        llm = ScriptedChatModel(responses=[c.answer], model_name="fixed-answer")
        pipeline = RAGPipeline(
            retriever,
            llm,
            prompt_version="audit-v1",
            model_version="fixed-answer",
            n_samples=3,
            retry=RetryPolicy(attempts=1, initial_wait=0.001, max_wait=0.001, jitter=0.0),
        )
        response = pipeline.invoke(c.question)
        for claim in response.claims:
            verdicts[claim.verdict] += 1
            if claim.verdict == "unsupported":
                print(f"  [pipeline] {c.question!r}: unsupported")
        verdicts["decision:" + response.decision] += 1
    return verdicts


# -- 2. the rival check on labelled data -----------------------------------------------------------


def rival_figures(pairs: Sequence[Pair], module: types.ModuleType) -> dict[str, float]:
    """How often ``module.find_conflict`` finds a rival, its precision and recall (positive:
    labelled not attributable)."""
    fires = [
        bool(p.question) and module.find_conflict(p.question, p.claim, p.material) is not None
        for p in pairs
    ]
    negatives = [not p.supported for p in pairs]
    hits = sum(f and n for f, n in zip(fires, negatives, strict=True))
    n_fire = sum(fires)
    return {
        "pairs": len(pairs),
        "with_question": sum(1 for p in pairs if p.question),
        "fires": n_fire,
        "precision": hits / n_fire if n_fire else math.nan,
        "recall": hits / sum(negatives) if any(negatives) else math.nan,
    }


def handmade_figures(module: types.ModuleType | None) -> dict[str, dict[str, float]]:
    """Per language: the hand-written rivals found (recall) and the quoted answers' claims
    flagged (false alarms), by the check of ``module``."""
    if module is None:
        return {}
    out: dict[str, dict[str, float]] = {}
    for lang in ("en", "zh"):
        rivals = [r for r in RIVAL_CASES if r[3] == lang]
        found = sum(module.find_conflict(q, c, t) is not None for q, c, t, _ in rivals)
        alarms = claims = 0
        # the answer's other claims, where the check reads them (not before it did)
        answer_level = "others" in inspect.signature(module.find_conflict).parameters
        for c in cases():
            if c.lang != lang:
                continue
            text = material(c.material_id).text
            said = [v.text for v in verify_citations(c.answer, [material(c.material_id)]).claims]
            for k, claim in enumerate(said):
                others = tuple(said[:k] + said[k + 1 :])
                extra = {"others": others} if answer_level else {}
                claims += 1
                alarms += module.find_conflict(c.question, claim, text, **extra) is not None
        fires = found + alarms
        out[lang] = {
            "rivals": len(rivals),
            "found": found,
            "quoted_claims": claims,
            "false_alarms": alarms,
            "precision": found / fires if fires else math.nan,
            "recall": found / len(rivals) if rivals else math.nan,
        }
    return out


# -- 3. verifier figures before/after --------------------------------------------------------------


def figures(
    backend: SupportBackend,
    pairs: Sequence[Pair],
    raw: Sequence[Support],
    check: Check | None,
) -> tuple[dict[str, float], int]:
    """BA, AUROC, F1 and WAA of the backend as shipped after ``check`` (None: no check), and
    how many supported verdicts the check withdrew."""
    results = []
    withdrawn = 0
    for p, r in zip(pairs, raw, strict=True):
        checked = (
            check(p.question, p.claim, p.material, r, threshold=backend.threshold)
            if check is not None and p.question
            else r
        )
        withdrawn += r.supported and not checked.supported
        results.append(checked)
    actual = [p.supported for p in pairs]
    predicted = [r.supported for r in results]
    return {
        "ba": balanced_accuracy(predicted, actual),
        "auroc": auroc([r.score for r in results], actual),
        "f1": f1(predicted, actual),
        "waa": wrong_among_accepted(predicted, actual),
    }, withdrawn


def _pct(x: float) -> str:
    return "   n/a" if math.isnan(x) else f"{100 * x:6.1f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="the shared data directory (holding wice/, ...)")
    parser.add_argument(
        "--before", default="main", help="git revision of the check to compare (default: main)"
    )
    parser.add_argument("--backend", action="append", help="backend (repeatable)")
    parser.add_argument("--no-pipeline", action="store_true", help="skip the pipeline audit")
    args = parser.parse_args(argv)
    backends = args.backend or ["lexical", "learned"]
    old = _old_module(args.before)
    began = time.perf_counter()

    print("1. false-unsupported audit (quoted answers; demo and seven other knowledge bases)")
    for name, tally in audit(backends).items():
        for origin in ("hand", "other-kb", "title"):
            for lang in ("en", "zh"):
                for n in (1, 2):
                    answers = tally[(origin, n, lang, "answers")]
                    claims = tally[(origin, n, lang, "claims")]
                    wrong = tally[(origin, n, lang, "unsupported")]
                    if answers:
                        print(
                            f"  {name:<8} {origin:<8} {lang} {n}{'+' if n == 2 else ' '} "
                            f"sentence(s): {answers:>4} answers, {claims:>4} claims, "
                            f"{wrong} called unsupported"
                        )
    if not args.no_pipeline:
        hand = [c for c in cases() if c.origin == "hand"]
        verdicts = audit_pipeline(hand)
        print(
            f"  pipeline   {len(hand)} hand-written answers (n=3, demo retriever k=4): "
            + ", ".join(f"{k} {v}" for k, v in sorted(verdicts.items()))
        )

    print("\n2. the rival check: precision and recall")
    root = data_root(args.data)
    data = load(root, DATASETS)
    if not data:
        print(f"  no labelled data under {root}: labelled figures skipped")
    for dataset, pairs in data.items():
        for label, module in (("before", old), ("after", current)):
            if module is None:
                continue
            m = rival_figures(pairs, module)
            if not m["with_question"]:
                print(f"  {dataset:<21} {label:<6} no row has a question: the check cannot apply")
                continue
            print(
                f"  {dataset:<21} {label:<6} en: {m['fires']:>3} of {m['with_question']} pairs "
                f"flagged, precision {_pct(m['precision'])} %, recall {_pct(m['recall'])} %"
            )
    for label, module in (("before", old), ("after", current)):
        for lang, m in handmade_figures(module).items():
            print(
                f"  hand-made rivals      {label:<6} {lang}: {m['found']}/{m['rivals']} rivals "
                f"found, {m['false_alarms']} false alarms on {m['quoted_claims']} quoted claims "
                f"(precision {_pct(m['precision'])} %, recall {_pct(m['recall'])} %)"
            )

    print("\n3. verifier figures as shipped (fixed protocol): no check / before / after")
    print(
        f"  {'backend':<10} {'dataset':<21} {'check':<7} {'BA':>6} {'AUROC':>6} {'F1':>6} "
        f"{'WAA %':>6} withdrew"
    )
    rows: dict[tuple[str, str], list[tuple[str, dict[str, float], int]]] = defaultdict(list)
    for name in backends:
        backend = get_backend(name)
        for dataset, pairs in data.items():
            raw = [backend(p.claim, p.material) for p in pairs]
            checks: list[tuple[str, Check | None]] = [("none", None)]
            if old is not None:
                checks.append(("before", old.check_specificity))
            checks.append(("after", current.check_specificity))
            for label, check in checks:
                m, withdrawn = figures(backend, pairs, raw, check)
                rows[(name, dataset)].append((label, m, withdrawn))
                print(
                    f"  {name:<10} {dataset:<21} {label:<7} {_pct(m['ba'])} {m['auroc']:6.3f} "
                    f"{m['f1']:6.3f} {_pct(m['waa'])} {withdrawn:>8}"
                )
    print(f"\n({time.perf_counter() - began:.0f} s; before = {args.before})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
