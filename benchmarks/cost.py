"""What an answer costs, against what it buys: tokens and money per request for each risk tier
and number of samples N, beside the confidence and the share of answers routed to review or
escalated — the table to choose N from.

Every configuration answers the same questions in one run: the demo knowledge base's questions
and the adversarial self-test's probe questions (English and Chinese), through ``RAGPipeline``
over the demo retriever with the offline ``ExtractiveChatModel`` at temperature 0.7, seeded
alike. Token counts are what each call read and wrote (``tracerag.usage``; the extractive
model counts in the estimator's unit). Money uses a price table: by default a MADE-UP,
ILLUSTRATIVE one (not any provider's prices) — pass ``--prices FILE`` for your own.

Tier ``low`` draws one sample whatever N is, tier ``medium`` at most three; tier ``high`` adds
a plan call to its N samples.

    python benchmarks/cost.py [--n 1,3,5,10] [--tiers low,medium,high] [--seeds 1,2,3]
        [--prices FILE] [--json]          (default seeds 1,2,3: about half a minute)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from opentelemetry.sdk.trace import TracerProvider

from tracerag import RAGPipeline
from tracerag._usage import load_prices
from tracerag.demo.kb import build_retriever
from tracerag.demo.models.extractive import ExtractiveChatModel
from tracerag.prompts import DEFAULT_PROMPT
from tracerag.tools.adversarial import demo_questions

MODEL = "tracerag-extractive-1"
#: Made up for illustration only; not any provider's prices. Currency units per 1,000 tokens.
ILLUSTRATIVE_PRICES = {MODEL: {"input_per_1k": 0.00015, "output_per_1k": 0.0006}}


class _KeepTickets:
    def __init__(self) -> None:
        self.tickets: list[Any] = []

    def handle(self, ticket: Any) -> None:
        self.tickets.append(ticket)


def run_config(
    tier: str, n: int, questions: list[str], seeds: list[int], prices: dict[str, Any]
) -> dict[str, Any]:
    """Answer every question at every seed under one tier and N; the per-request averages."""
    records: list[dict[str, Any]] = []
    retriever = build_retriever(k=4)
    started = time.perf_counter()
    for seed in seeds:
        pipeline = RAGPipeline(
            retriever,
            ExtractiveChatModel(seed=seed),
            prompt_version=DEFAULT_PROMPT.version,
            model_version=MODEL,
            n_samples=n,
            temperature=0.7,
            tier=tier,
            escalation=_KeepTickets(),
            audit=lambda record: records.append(record) or True,
            prices=prices,
            tracer_provider=TracerProvider(),
        )
        for question in questions:
            pipeline.invoke(question)
    wall = time.perf_counter() - started
    count = len(records)
    decisions = [r["decision"] for r in records]
    confidences = [r["confidence"] for r in records if r["confidence"] is not None]
    usage = [r["usage"] for r in records]
    costs = [u.get("cost", {}).get("total") or 0.0 for u in usage]
    passed = decisions.count("pass")
    verified = tier != "low"  # tier low neither verifies nor routes
    return {
        "tier": tier,
        "n": n,
        "samples": statistics.fmean(len(r["samples"]) for r in records),
        "calls": statistics.fmean(u["calls"] for u in usage),
        "input_tokens": statistics.fmean(u["input_tokens"] for u in usage),
        "output_tokens": statistics.fmean(u["output_tokens"] for u in usage),
        "cost_per_request": statistics.fmean(costs),
        "cost_per_passed": sum(costs) / passed if passed and verified else None,
        "confidence": statistics.fmean(confidences) if confidences else None,
        "pass": passed / count if verified else None,
        "review": decisions.count("review") / count if verified else None,
        "escalate": decisions.count("escalate") / count if verified else None,
        "requests": count,
        "seconds_per_request": wall / count,
    }


def _f(value: Any, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def render(rows: list[dict[str, Any]], prices_label: str, questions: int, seeds: list[int]) -> str:
    """The rows as a Markdown table with its caption."""
    lines = [
        f"{questions} demo and probe questions × seeds {','.join(map(str, seeds))}, extractive "
        f"model at temperature 0.7; money in {prices_label}",
        "",
        "| tier | N | samples | model calls | tokens in | tokens out | cost / request "
        "| mean confidence | pass | review | escalate | cost / passed answer |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['tier']} | {'any' if r['tier'] == 'low' else r['n']} | {r['samples']:.0f} "
            f"| {r['calls']:.0f} "
            f"| {r['input_tokens']:.0f} | {r['output_tokens']:.0f} "
            f"| {_f(r['cost_per_request'], '.5f')} | {_f(r['confidence'], '.2f')} "
            f"| {_f(r['pass'], '.0%')} | {_f(r['review'], '.0%')} | {_f(r['escalate'], '.0%')} "
            f"| {_f(r['cost_per_passed'], '.5f')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", default="1,3,5,10", help="numbers of samples (default 1,3,5,10)")
    parser.add_argument("--tiers", default="low,medium,high")
    parser.add_argument("--seeds", default="1,2,3", help="seeds of the extractive model")
    parser.add_argument("--prices", help="your price table (JSON); default: illustrative")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    ns = [int(x) for x in args.n.split(",") if x.strip()]
    tiers = [t.strip() for t in args.tiers.split(",") if t.strip()]
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    if args.prices:
        prices = load_prices(args.prices)
        label = f"the prices of {args.prices}"
    else:
        prices = load_prices(ILLUSTRATIVE_PRICES)
        label = (
            "MADE-UP ILLUSTRATIVE prices (0.00015 per 1k input tokens, 0.0006 per 1k output "
            "tokens; not any provider's)"
        )
    questions = demo_questions()
    rows = []
    for tier in tiers:
        # tier low draws one sample whatever N is: one row says it
        for n in ns[:1] if tier == "low" else ns:
            rows.append(run_config(tier, n, questions, seeds, prices))
    if args.json:
        json.dump({"prices": label, "seeds": seeds, "rows": rows}, sys.stdout, indent=2)
        print()
    else:
        print(render(rows, label, len(questions), seeds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
