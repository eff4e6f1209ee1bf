"""``tracerag eval``: is version 2 better than version 1? A release gate for prompts and models.

``tracerag eval QUESTIONS.jsonl --baseline prompt@v1,model@extractive --candidate
prompt@v2-nocite,model@extractive`` answers every question of the set through the full pipeline
over the demo knowledge base once per configuration — same retriever, same seed, same sampling
— and compares them side by side:

- the five indicators: **citation coverage** and **citation accuracy** (means over verified
  requests, as ``tracerag metrics`` computes them), the **interception rate** of the
  adversarial self-test run on the configuration's own answers (mutated claims the verifier
  catches, all mutation kinds together), the **review rate** and the **escalation rate**;
- with expected answers or decisions in the question set: the share of answers that state the
  expected answer (the lexical support backend finds it in the answer) and the share of
  decisions as expected;
- pass / review / escalate counts, the confidence distribution, tokens and cost per request
  and per passed answer (``--prices``), latency;
- every question whose decision changed, with both request ids (``tracerag show ID``).

A configuration is ``key@value`` pairs separated by commas: ``prompt@NAME`` (a registered
prompt version, see ``tracerag.prompts``; the demo registers ``v1`` and the deliberately worse
``v2-nocite``), ``model@extractive|local``, optionally ``samples@N`` and ``tier@high|medium|low``.

The question set is JSON lines: ``{"question": ..., "id": ..., "expected_answer": ...,
"expected_decision": "pass|review|escalate"}`` (all but ``question`` optional).

Gate: the exit status is 1 when the candidate is worse than the baseline by more than the
margin (default 0.02, absolute) on any gated indicator (``--gate``, default the five), or
cannot be measured where the baseline could; 0 otherwise; 2 on a usage error. ``--json``
prints the report for CI.

Unless ``--no-store``, the run is kept in the audit store: every request, tagged with the run
(``evaluation_run`` in its record, ``channel`` ``evaluation``; these requests stay out of
``tracerag metrics`` and out of the review queue), and the run itself under its own id, whose
``evaluation`` entry holds this report — ``tracerag show RUN_ID``.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
import time
from collections.abc import Sequence

from tracerag._usage import load_prices
from tracerag.errors import InputError
from tracerag.prompts import get_prompt
from tracerag.store._open import cli_store_url
from tracerag.tools._command import (
    Subparsers,
    add_command,
    add_json_argument,
    add_store_argument,
    cli_store,
)
from tracerag.tools._eval_results import (
    DEFAULT_GATE,
    DEFAULT_MARGIN,
    INDICATORS,
    load_questions,
    parse_arm,
)
from tracerag.tools._eval_run import evaluate, store_report

__all__ = ["add_parser"]


# ---------------------------------------------------------------------------------------------
# Command line


def _margins(items: Sequence[str] | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for text in items or []:
        for item in filter(None, (p.strip() for p in text.split(","))):
            name, sep, value = item.partition("=")
            if not sep or name.strip() not in INDICATORS:
                raise InputError(
                    f"cannot read margin {item!r}: use NAME=VALUE with NAME one of "
                    f"{', '.join(INDICATORS)}"
                )
            out[name.strip()] = float(value)
    return out


def _actor() -> str:
    try:
        return getpass.getuser() or "operator"
    except Exception:
        return "operator"


def _run(args: argparse.Namespace) -> int:
    from opentelemetry.sdk.trace import TracerProvider

    try:
        questions = load_questions(args.questions)
        baseline, candidate = parse_arm(args.baseline), parse_arm(args.candidate)
        gated = [g.strip() for g in args.gate.split(",") if g.strip()]
        margins = _margins(args.margin_of)
        prices = load_prices(args.prices) if args.prices else None
        # registers the demo's prompt versions (a side effect only this run wants)
        import tracerag.demo._prompt_versions  # noqa: F401

        for arm in (baseline, candidate):
            get_prompt(arm.prompt)
        if args.store and args.no_store:
            raise InputError("--store and --no-store contradict each other")
    except (OSError, ValueError, KeyError) as exc:
        print(f"tracerag eval: {exc}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    try:
        report, records = evaluate(
            questions,
            baseline,
            candidate,
            questions_file=str(args.questions),
            seed=args.seed,
            samples=args.samples,
            temperature=args.temperature,
            tier=args.tier,
            prices=prices,
            prices_label=str(args.prices) if args.prices else None,
            gated=gated,
            margins=margins,
            default_margin=args.margin,
            tracer_provider=TracerProvider(),  # trace ids for the records; nothing exported
        )
    except ValueError as exc:
        print(f"tracerag eval: {exc}", file=sys.stderr)
        return 2
    stored = None
    if not args.no_store:
        with cli_store(args, create=True, auto_enqueue=False) as store:
            store_report(store, report, records, _actor())
            stored = cli_store_url(args.store)
    if args.json:
        out = report.to_dict()
        out["stored"] = stored
        json.dump(out, sys.stdout, ensure_ascii=False, indent=2)
        print()
    else:
        print(report.render(), end="")
        if stored:
            print(f"stored in {stored} — tracerag show {report.run_id}")
        print(f"({time.perf_counter() - started:.1f} s)")
    return 0 if report.ok else 1


def add_parser(subparsers: Subparsers) -> None:
    """Register ``tracerag eval``."""
    p = add_command(
        subparsers,
        "eval",
        _run,
        help="compare two prompt/model versions on a question set; a release gate",
        description="Answer a question set under a baseline and a candidate configuration and "
        "compare the indicators, routes, confidence, cost and latency side by side. Exit 1 when "
        "the candidate is worse by more than the margin on a gated indicator.",
    )
    p.add_argument("questions", metavar="QUESTIONS.jsonl", help="the question set (JSON lines)")
    p.add_argument(
        "--baseline",
        required=True,
        metavar="prompt@V,model@M",
        help="the configuration in use, e.g. prompt@v1,model@extractive",
    )
    p.add_argument(
        "--candidate",
        required=True,
        metavar="prompt@V,model@M",
        help="the configuration to check, e.g. prompt@v2-nocite,model@extractive",
    )
    p.add_argument(
        "--gate",
        default=",".join(DEFAULT_GATE),
        help="indicators the gate checks (default: "
        + ",".join(DEFAULT_GATE)
        + "; also: answers, decisions)",
    )
    p.add_argument(
        "--margin",
        type=float,
        default=DEFAULT_MARGIN,
        help="how much worse (absolute, 0.02 = 2 points) the candidate may be",
    )
    p.add_argument(
        "--margin-of",
        action="append",
        metavar="NAME=VALUE",
        help="a margin for one indicator (repeatable)",
    )
    p.add_argument("--samples", type=int, default=5, help="samples per question (default 5)")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--tier", default="high", choices=["high", "medium", "low"])
    p.add_argument("--seed", type=int, default=7, help="seed of the extractive model")
    p.add_argument("--prices", metavar="FILE", help="price table per model (JSON) for the cost")
    add_store_argument(p)
    p.add_argument("--no-store", action="store_true", help="do not keep the run in the store")
    add_json_argument(p, "print the report as JSON")
