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

Fixed N against adaptive sampling (``--adaptive``): the same requests answered with every
sample drawn (``min_samples=N``) and adaptively (the default ``min_samples`` and stop risk),
paired: each request gets a fresh model seeded by its run's seed and its question, so the
adaptive request's samples are the first ones of the fixed request's. Per front door — the
pipeline over the demo retriever, ``wrap()`` around LangChain's RAG agent (``create_agent``
with a retrieval tool) and the same agent with ``TraceragMiddleware`` (``--doors`` picks
some) — model calls, tokens billed and wall time per request, calls on
requests that pass, and how often the route (and the chosen answer) agrees with fixed N; on the
demo questions and on the labelled calibration set (``demo_calibration_rows``: the demo and
probe questions, clean and with mutated samples), the AUROC of the confidence against the
labels. ``--fit-prior`` refits the agreement prior (``tracerag._adaptive``) on the labelled
set at fixed N and prints it by retrieval shape.

    python benchmarks/cost.py --adaptive [--seeds 1,2] [--doors pipeline,wrap,middleware]
        [--json]                                                      (a few minutes)
    python benchmarks/cost.py --fit-prior
    python benchmarks/cost.py --calibration      (logistic fitted at fixed N, used adaptively)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from langchain_core.utils.function_calling import convert_to_openai_tool
from opentelemetry.sdk.trace import TracerProvider

from tracerag import RAGPipeline
from tracerag._llm import ReplyChatModel
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
            min_samples=n,  # every sample drawn: the table to choose N from (fixed N)
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


# -- fixed N against adaptive sampling -----------------------------------------------------------


def auroc(scores: list[float], labels: list[bool]) -> float | None:
    """The probability that a right answer's confidence ranks above a wrong one's (ties: half)."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    if not pos or not neg:
        return None
    wins = sum((p > q) + 0.5 * (p == q) for p in pos for q in neg)
    return wins / (len(pos) * len(neg))


def _summary(rows: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    passed = [r for r in rows if r["decision"] == "pass"]
    return {
        "requests": len(rows),
        "calls": statistics.fmean(r["model_calls"] for r in rows),
        "calls_when_pass": statistics.fmean(r["model_calls"] for r in passed) if passed else None,
        "samples": statistics.fmean(r["samples_drawn"] for r in rows),
        "input_tokens": statistics.fmean(r["input_tokens"] for r in rows),
        "output_tokens": statistics.fmean(r["output_tokens"] for r in rows),
        "seconds_per_request": wall / len(rows) if rows else None,
        "pass": len(passed) / len(rows),
        "auroc": auroc(
            [r["heuristic_confidence"] or 0.0 for r in rows], [bool(r["correct"]) for r in rows]
        ),
    }


def _agreement(fixed: list[dict[str, Any]], adaptive: list[dict[str, Any]]) -> dict[str, Any]:
    assert len(fixed) == len(adaptive)
    same = [a["decision"] == f["decision"] for f, a in zip(fixed, adaptive, strict=True)]
    differ = [
        {
            "question": f["question"],
            "mutation": f.get("mutation"),
            "fixed": f["decision"],
            "adaptive": a["decision"],
            "samples": a["samples_drawn"],
        }
        for f, a in zip(fixed, adaptive, strict=True)
        if f["decision"] != a["decision"]
    ]
    return {"route_agreement": sum(same) / len(same), "differ": differ}


def labelled_pairs(seeds: list[int], kinds: list[str] | None, n: int) -> dict[str, Any]:
    """The labelled rows answered at fixed N and adaptively (paired), and what each took."""
    from tracerag.tools.calibration import demo_calibration_rows

    out: dict[str, Any] = {}
    rows: dict[str, list[dict[str, Any]]] = {}
    for mode, first in (("fixed", n), ("adaptive", None)):
        started = time.perf_counter()
        rows[mode] = demo_calibration_rows(
            seeds, kinds=kinds, n_samples=n, min_samples=first, paired=True
        )
        out[mode] = _summary(rows[mode], time.perf_counter() - started)
    out.update(_agreement(rows["fixed"], rows["adaptive"]))
    return out


def _agent(model: Any, middleware: list[Any] | None = None) -> Any:
    """LangChain's RAG agent over the demo knowledge base: ``create_agent`` with a
    ``content_and_artifact`` retrieval tool (the tutorial's)."""
    from langchain.agents import create_agent
    from langchain.tools import tool

    from tracerag.demo.kb import build_vectorstore

    store = build_vectorstore()

    @tool(response_format="content_and_artifact")
    def retrieve_context(query: str) -> tuple[str, list[Any]]:
        """Retrieve information to help answer a query."""
        docs = store.similarity_search(query, k=4)
        text = "\n\n".join(f"Source: {d.metadata}\nContent: {d.page_content}" for d in docs)
        return text, docs

    return create_agent(
        model,
        [retrieve_context],
        middleware=middleware or (),
        system_prompt=(
            "You have access to a tool that retrieves context from the store's policies. Use "
            "the tool to help answer user queries, and cite each source you use by its id."
        ),
    )


def wrap_pairs(questions: list[str], seeds: list[int], n: int) -> dict[str, Any]:
    """wrap(agent) at fixed N and adaptively, a fresh seeded model per request."""
    from tracerag import wrap

    out: dict[str, Any] = {}
    decisions: dict[str, list[str]] = {}
    for mode, first in (("fixed", n), ("adaptive", None)):
        records: list[dict[str, Any]] = []
        started = time.perf_counter()
        for seed in seeds:
            for i, question in enumerate(questions):
                app = wrap(
                    _agent(ExtractiveChatModel(seed=seed * 1000 + i)),
                    n_samples=n,
                    escalation=_KeepTickets(),
                    audit=records.append,
                    tracer_provider=TracerProvider(),
                    **({"min_samples": first} if first is not None else {}),
                )
                app.invoke({"messages": [{"role": "user", "content": question}]})
        wall = time.perf_counter() - started
        rows = [
            {
                "question": r["question"],
                "decision": r["decision"],
                "model_calls": r["usage"]["calls"],
                "samples_drawn": len(r["samples"]),
                "input_tokens": r["usage"]["input_tokens"],
                "output_tokens": r["usage"]["output_tokens"],
                "heuristic_confidence": r["confidence"],
                "correct": r["decision"] == "pass",  # no labels here: AUROC not reported
            }
            for r in records
        ]
        summary = _summary(rows, wall)
        summary["auroc"] = None
        out[mode] = summary
        decisions[mode] = [r["decision"] for r in rows]
        out[f"{mode}_rows"] = rows
    out.update(_agreement(out.pop("fixed_rows"), out.pop("adaptive_rows")))
    return out


def middleware_pairs(
    questions: list[str], seeds: list[int], n: int, *, one_per_call: bool = False
) -> dict[str, Any]:
    """The same agent with ``TraceragMiddleware`` at fixed N and adaptively, a fresh seeded
    model per request (``one_per_call``: behind a model without ``n``). The agent's
    tool-calling call is counted with the answering ones (the turn's every call, as
    wrap(agent) counts its runs' calls)."""
    from tracerag import TraceragMiddleware

    def model_of(seed: int) -> Any:
        base = ExtractiveChatModel(seed=seed)
        return _OnePerCallTools(base=base) if one_per_call else base

    out: dict[str, Any] = {}
    for mode, first in (("fixed", n), ("adaptive", None)):
        records: list[dict[str, Any]] = []
        tool_rounds: list[tuple[int, int]] = []
        started = time.perf_counter()
        for seed in seeds:
            for i, question in enumerate(questions):
                verified = TraceragMiddleware(
                    n_samples=n,
                    escalation=_KeepTickets(),
                    audit=records.append,
                    tracer_provider=TracerProvider(),
                    **({"min_samples": first} if first is not None else {}),
                )
                agent = _agent(model_of(seed * 1000 + i), [verified])
                result = agent.invoke({"messages": [{"role": "user", "content": question}]})
                usage = result["messages"][1].usage_metadata or {}  # the tool-calling call
                tool_rounds.append((usage.get("input_tokens", 0), usage.get("output_tokens", 0)))
        wall = time.perf_counter() - started
        rows = [
            {
                "question": r["question"],
                "decision": r["decision"],
                "model_calls": 1 + r["usage"]["calls"],
                "samples_drawn": len(r["samples"]),
                "input_tokens": tool_in + r["usage"]["input_tokens"],
                "output_tokens": tool_out + r["usage"]["output_tokens"],
                "heuristic_confidence": r["confidence"],
                "correct": r["decision"] == "pass",  # no labels here: AUROC not reported
            }
            for r, (tool_in, tool_out) in zip(records, tool_rounds, strict=True)
        ]
        out[mode] = {**_summary(rows, wall), "auroc": None}
        out[f"{mode}_rows"] = rows
    out.update(_agreement(out.pop("fixed_rows"), out.pop("adaptive_rows")))
    return out


class _OnePerCall(ReplyChatModel):
    """The extractive model behind a chat model that answers once per call (no ``n``), as
    most providers' LangChain models do: every sample is a call of its own."""

    base: ExtractiveChatModel
    model_name: str = MODEL
    temperature: float = 0.7

    @property
    def _llm_type(self) -> str:
        return "one-per-call"

    def _reply(self, messages: list[Any], **kwargs: Any) -> Any:
        kwargs.pop("n", None)
        return self.base._reply(messages, **{"temperature": self.temperature, **kwargs})


class _OnePerCallTools(_OnePerCall):
    """``_OnePerCall`` for an agent: it binds the agent's tools as the extractive model does."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)


def one_per_call_pairs(questions: list[str], seeds: list[int], n: int) -> dict[str, Any]:
    """The pipeline at fixed N and adaptively with a model that answers once per call."""
    out: dict[str, Any] = {}
    retriever = build_retriever(k=4)
    for mode, first in (("fixed", n), ("adaptive", None)):
        records: list[dict[str, Any]] = []
        started = time.perf_counter()
        for seed in seeds:
            for i, question in enumerate(questions):
                pipeline = RAGPipeline(
                    retriever,
                    _OnePerCall(base=ExtractiveChatModel(seed=seed * 1000 + i)),
                    prompt_version=DEFAULT_PROMPT.version,
                    model_version=MODEL,
                    n_samples=n,
                    escalation=_KeepTickets(),
                    audit=records.append,
                    tracer_provider=TracerProvider(),
                    **({"min_samples": first} if first is not None else {}),
                )
                pipeline.invoke(question)
        wall = time.perf_counter() - started
        out[f"{mode}_rows"] = [
            {
                "question": r["question"],
                "decision": r["decision"],
                "model_calls": r["usage"]["calls"],
                "samples_drawn": len(r["samples"]),
                "input_tokens": r["usage"]["input_tokens"],
                "output_tokens": r["usage"]["output_tokens"],
                "heuristic_confidence": r["confidence"],
                "correct": r["decision"] == "pass",
            }
            for r in records
        ]
        out[mode] = {**_summary(out[f"{mode}_rows"], wall), "auroc": None}
    out.update(_agreement(out.pop("fixed_rows"), out.pop("adaptive_rows")))
    return out


#: the front doors ``--adaptive`` compares (``--doors`` picks some)
DOORS = ("pipeline", "wrap", "middleware")


def adaptive_report(seeds: list[int], n: int, doors: tuple[str, ...] = DOORS) -> dict[str, Any]:
    """Every comparison of the section, in one run (those of ``doors``)."""
    from tracerag.demo.kb import load_questions

    bundled = [q["question"] for q in load_questions()]
    report: dict[str, Any] = {"n": n, "seeds": seeds}
    if "pipeline" in doors:
        report["pipeline, demo questions"] = labelled_pairs(seeds, [], n)
        report["pipeline (one answer per call), demo questions"] = one_per_call_pairs(
            demo_questions(), seeds, n
        )
        report["pipeline, labelled calibration set"] = labelled_pairs(seeds, None, n)
    if "wrap" in doors:
        report["wrap(agent), bundled demo questions"] = wrap_pairs(bundled, seeds, n)
    if "middleware" in doors:
        report["middleware(agent), bundled demo questions"] = middleware_pairs(bundled, seeds, n)
        report["middleware(agent, one answer per call), bundled demo questions"] = middleware_pairs(
            bundled, seeds, n, one_per_call=True
        )
    return report


def render_adaptive(report: dict[str, Any]) -> str:
    n = report["n"]
    lines = [
        f"fixed N={n} against adaptive sampling (seeds {','.join(map(str, report['seeds']))}, "
        "paired requests, extractive model at temperature 0.7)",
        "",
        "| front door, questions | mode | requests | model calls | calls when pass | samples "
        "| tokens in | tokens out | s / request | pass | AUROC | route agreement |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, part in report.items():
        if not isinstance(part, dict):
            continue
        for mode in ("fixed", "adaptive"):
            r = part[mode]
            agree = _f(part["route_agreement"], ".1%") if mode == "adaptive" else ""
            lines.append(
                f"| {name} | {mode} | {r['requests']} | {r['calls']:.2f} "
                f"| {_f(r['calls_when_pass'], '.2f')} | {r['samples']:.2f} "
                f"| {r['input_tokens']:.0f} | {r['output_tokens']:.0f} "
                f"| {_f(r['seconds_per_request'], '.3f')} | {r['pass']:.0%} "
                f"| {_f(r['auroc'], '.3f')} | {agree} |"
            )
    lines.append("")
    for name, part in report.items():
        if isinstance(part, dict):
            ratio = part["adaptive"]["calls"] / part["fixed"]["calls"]
            lines.append(f"{name}: adaptive makes {ratio:.2f}x the calls of fixed N={n}")
            for d in part["differ"]:
                lines.append(
                    f"  route differs: {d['question']!r} ({d.get('mutation') or 'clean'}): "
                    f"fixed {d['fixed']}, adaptive {d['adaptive']} after {d['samples']} samples"
                )
        else:
            lines.append(f"{name}: {part}")
    return "\n".join(lines)


def calibration_transfer(seeds: list[int], n: int) -> dict[str, dict[str, dict[str, float]]]:
    """Does a calibration stay calibrated with fewer samples? Logistic calibrations fitted on
    the labelled set answered at fixed N and adaptively (every seed but the last), each measured
    on the last seed's requests answered both ways (ECE, Brier, AUROC), beside heuristic-v1."""
    from tracerag.signals._confidence import HeuristicCombiner
    from tracerag.signals.calibrated import CalibratedCombiner
    from tracerag.tools.calibration import (
        Example,
        compare,
        demo_calibration_rows,
        fit_calibration,
        signals_from_row,
    )

    held = seeds[-1]
    rows = {
        mode: demo_calibration_rows(seeds, n_samples=n, min_samples=first, paired=True)
        for mode, first in (("fixed", n), ("adaptive", None))
    }

    def examples(found: list[dict[str, Any]]) -> list[Example]:
        return [Example(signals_from_row(r), bool(r["correct"])) for r in found]

    combiners: dict[str, Any] = {"heuristic-v1": HeuristicCombiner()}
    for mode, found in rows.items():
        fitted = fit_calibration(examples([r for r in found if r["seed"] != held]))
        combiners[f"logistic fitted at {mode}"] = CalibratedCombiner(fitted)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for mode, found in rows.items():
        measured = compare(examples([r for r in found if r["seed"] == held]), combiners)
        out[f"seed {held} answered {mode}"] = {
            name: {k: round(float(m[k]), 4) for k in ("ece", "brier", "auroc")}
            for name, m in measured.items()
        }
    return out


def fit_prior(seeds: list[int], n: int) -> dict[str, Any]:
    """The agreement prior by retrieval shape, and the verify prior, fitted on the labelled set
    at fixed N (see docs/confidence.md)."""
    from collections import defaultdict

    from tracerag._adaptive import fit_agreement_prior
    from tracerag.tools.calibration import demo_calibration_rows

    rows = demo_calibration_rows(seeds, n_samples=n, min_samples=n)
    by_shape: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for r in rows:
        agreeing = round((r["signals"]["self_consistency"] or 0.0) * n)
        key = "clustered" if r["retrieval_shape"] == "clustered" else "*"
        by_shape[key].append((agreeing, n))
    groups = [(r["group_verified"], n) for r in rows if r["group_size"] == n]
    return {
        "requests": len(rows),
        "agreement_prior": {
            shape: fit_agreement_prior(counts) for shape, counts in sorted(by_shape.items())
        },
        "verify_prior": fit_agreement_prior(groups),
        "groups": len(groups),
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
    parser.add_argument("--adaptive", action="store_true", help="fixed N against adaptive")
    parser.add_argument("--fit-prior", action="store_true", help="refit the agreement prior")
    parser.add_argument(
        "--calibration",
        action="store_true",
        help="calibrations fitted at fixed N and adaptively, measured both ways",
    )
    parser.add_argument("--samples", type=int, default=5, help="N for --adaptive (default 5)")
    parser.add_argument(
        "--doors", default=",".join(DOORS), help="front doors for --adaptive (default: all)"
    )
    args = parser.parse_args(argv)
    if args.calibration:
        seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
        for held, table in calibration_transfer(seeds, args.samples).items():
            print(f"held out: {held}")
            for name, m in table.items():
                print(
                    f"  {name:28} ECE {m['ece']:.3f}  Brier {m['brier']:.3f}  "
                    f"AUROC {m['auroc']:.3f}"
                )
        return 0
    if args.fit_prior:
        seeds = [int(x) for x in (args.seeds or "1,2,3").split(",") if x.strip()]
        print(json.dumps(fit_prior(seeds, args.samples)))
        return 0
    if args.adaptive:
        seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
        doors = tuple(d.strip() for d in args.doors.split(",") if d.strip())
        unknown = sorted(set(doors) - set(DOORS))
        if unknown:
            parser.error(f"unknown front doors {unknown}; choose from {', '.join(DOORS)}")
        report = adaptive_report(seeds, args.samples, doors)
        if args.json:
            json.dump(report, sys.stdout, indent=2, ensure_ascii=False)
            print()
        else:
            print(render_adaptive(report))
        return 0
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
