"""The ``tracerag explain`` command: its options, the cost announcement and the run.

One request by id, a sample of a window, or the queue; the reports printed as text or JSON.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel

from tracerag.demo._run import configure_traces
from tracerag.demo.kb import build_retriever
from tracerag.store import RequestNotFound
from tracerag.store._base import AuditStore
from tracerag.telemetry._providers import force_flush
from tracerag.tools._command import (
    Subparsers,
    add_command,
    add_json_argument,
    add_store_argument,
    cli_store,
    print_json,
)
from tracerag.tools._explain_plan import (
    DEFAULT_MAX_CALLS,
    CostTooHigh,
    ExperimentPlan,
    light_paraphrases,
)
from tracerag.tools._explain_runs import Explanation, explain, explain_queued, explain_window
from tracerag.tools._replay import (
    ReplayRefused,
    add_rerun_arguments,
    configured_model,
)

__all__ = ["add_parser", "run"]

# -- the command ----------------------------------------------------------------------------------


def _announce(plan: ExperimentPlan, cap: int) -> None:
    print(
        f"model calls: {plan.model_calls} planned ({plan.runs} runs × {plan.calls_per_run}: "
        f"baseline, {len(plan.occlude)} occlusion, {len(plan.counterfactuals)} counterfactual, "
        f"{len(plan.paraphrases)} paraphrase); cap {cap}",
        flush=True,
    )


def _explain_chosen(
    args: argparse.Namespace,
    store: AuditStore,
    llm: BaseChatModel,
    paraphrases: list[str],
    options: dict[str, Any],
) -> list[Explanation]:
    """The reports of the requests the command names: the queue, a sample, or one id."""
    if args.queued:
        reports, skipped = explain_queued(
            store,
            llm,
            since=args.since,
            max_calls=args.max_calls,
            announce=lambda ids, total: print(
                f"{len(ids)} request(s) queued; model calls: {total} planned; cap {args.max_calls}",
                flush=True,
            ),
            **options,
        )
        for line in skipped:
            print(f"skipped {line}", file=sys.stderr)
    elif args.sample is not None:
        reports, skipped = explain_window(
            store,
            llm,
            rate=args.sample,
            since=args.since,
            until=args.until,
            max_calls=args.max_calls,
            announce=lambda ids, total: print(
                f"{len(ids)} request(s) sampled; model calls: {total} planned; "
                f"cap {args.max_calls}",
                flush=True,
            ),
            **options,
        )
        for line in skipped:
            print(f"skipped {line}", file=sys.stderr)
    else:
        record = store.get(args.request_id).record
        if args.paraphrase_auto:
            paraphrases += light_paraphrases(str(record.get("question") or ""))
        reports = [
            explain(
                store,
                args.request_id,
                llm,
                paraphrases=paraphrases,
                max_calls=args.max_calls,
                announce=lambda plan: _announce(plan, args.max_calls),
                **options,
            )
        ]
    return reports


def run(args: argparse.Namespace) -> int:
    """Explain one stored request, or a sample of a window of them."""
    chosen = [args.request_id is not None, args.sample is not None, bool(args.queued)]
    if sum(chosen) != 1:
        print(
            "tracerag explain: give a REQUEST_ID, --sample RATE --since TIME, or --queued",
            file=sys.stderr,
        )
        return 2
    if args.sample is not None and (args.since is None or not 0 < args.sample <= 1):
        print("tracerag explain: --sample needs a RATE in (0, 1] and --since", file=sys.stderr)
        return 2
    if args.request_id is None and (args.paraphrase or args.paraphrase_auto):
        print("tracerag explain: paraphrases are for one REQUEST_ID, not --sample", file=sys.stderr)
        return 2
    if args.traces:
        configure_traces(Path(args.traces))
    llm, prompt_version, model_version = configured_model(args.model, args.seed)
    retriever = None
    paraphrases: list[str] = []
    if args.paraphrase or args.paraphrase_auto:
        retriever = build_retriever(k=args.k)
        paraphrases = list(args.paraphrase or [])
    options: dict[str, Any] = {
        "prompt_version": prompt_version,
        "model_version": model_version,
        "force": args.force,
        "counterfactuals": args.counterfactuals,
        "retriever": retriever,
        "actor": args.actor,
    }
    try:
        with cli_store(args, auto_enqueue=False) as store:
            reports = _explain_chosen(args, store, llm, paraphrases, options)
    except RequestNotFound as exc:
        print(f"tracerag explain: {exc}", file=sys.stderr)
        return 1
    except ReplayRefused as exc:
        print(f"tracerag explain: refused: {exc}", file=sys.stderr)
        return 3
    except CostTooHigh as exc:
        print(f"tracerag explain: refused: {exc}; raise --max-calls", file=sys.stderr)
        return 4
    finally:
        force_flush()
    if args.json:
        print_json([r.to_dict() for r in reports])
    else:
        for r in reports:
            print(r.render(), end="")
    return 0


def add_parser(subparsers: Subparsers) -> None:
    """Register ``tracerag explain``."""
    p = add_command(
        subparsers,
        "explain",
        run,
        help="why this answer: occlusion and counterfactual experiments on a stored request",
        description="Re-run a stored request with its recorded materials and versions, masking "
        "each used material in turn (occlusion) and changing a value the answer states "
        "(counterfactual); optionally reword the question and retrieve again. The report is "
        "stored in the request's audit trail and shown by tracerag show.",
    )
    p.add_argument("request_id", metavar="REQUEST_ID", nargs="?")
    add_store_argument(p)
    p.add_argument("--sample", type=float, metavar="RATE", help="explain this share of a window")
    p.add_argument(
        "--queued",
        action="store_true",
        help="explain the requests a reviewer rejected or a user complained about since "
        "their last explanation",
    )
    p.add_argument("--since", metavar="TIME", help="window start (ISO 8601), with --sample")
    p.add_argument("--until", metavar="TIME", help="window end (ISO 8601, exclusive)")
    p.add_argument(
        "--max-calls",
        type=int,
        default=DEFAULT_MAX_CALLS,
        help=f"refuse plans needing more model calls (default {DEFAULT_MAX_CALLS})",
    )
    p.add_argument(
        "--counterfactuals", type=int, default=2, help="values to change, at most (default 2)"
    )
    p.add_argument(
        "--paraphrase",
        action="append",
        metavar="QUESTION",
        help="also answer this rewording from a fresh retrieval of the demo knowledge base",
    )
    p.add_argument(
        "--paraphrase-auto",
        action="store_true",
        help="also answer a light rewording of the question (polite opening added or removed)",
    )
    p.add_argument("--k", type=int, default=4, help="materials a fresh retrieval returns")
    add_rerun_arguments(p, "explain")
    p.add_argument("--traces", metavar="FILE", help="also write the spans to this JSON-lines file")
    add_json_argument(p, "print the reports as JSON")
