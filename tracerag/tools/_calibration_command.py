"""The ``tracerag calibrate`` command: its options, the rows it gathers, the file it writes.

Rows from a file and/or the review desk, the fit, the comparison printed or given as JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracerag._routing import Thresholds
from tracerag.errors import ConfigurationError, InputError
from tracerag.signals._confidence import Combined, HeuristicCombiner
from tracerag.signals.calibrated import (
    CALIBRATION_ENV,
    METHODS,
    CalibratedCombiner,
)
from tracerag.tools._command import (
    Subparsers,
    add_command,
    add_json_argument,
    add_store_argument,
    cli_store,
)
from tracerag.tools._scoring import DEFAULT_BINS

if TYPE_CHECKING:
    pass
from tracerag.tools._calibration_data import Example, desk_examples, examples_hash, read_examples
from tracerag.tools._calibration_fit import fit_calibration
from tracerag.tools._calibration_report import compare, render_comparison, split_holdout

__all__ = ["add_parser"]


# ----------------------------------------------------------------------------------------------
# Command line


def _data_hash(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def _gather(args: argparse.Namespace) -> tuple[list[Example], int, dict[str, Any], list[str]]:
    """The examples of DATA.jsonl and/or the desk; unlabelled rows; provenance; notes."""
    examples: list[Example] = []
    unlabelled = 0
    provenance: dict[str, Any] = {}
    notes: list[str] = []
    if args.data:
        found, unlabelled = read_examples(args.data)
        examples += found
        provenance["data"] = Path(args.data).name
        provenance["data_sha256"] = _data_hash(Path(args.data))
    if args.from_desk:
        with cli_store(args) as store:
            desk, skipped = desk_examples(store, args.route)
            location = getattr(store, "location", "the audit store")
        if not desk:
            raise InputError(
                f"the review desk of {location} has no decided item with recorded signals"
                + (f" ({skipped} decided without signals)" if skipped else "")
            )
        examples += desk
        provenance["desk"] = {
            "store": str(location),
            "route": args.route,
            "decisions": len(desk),
            "skipped_without_signals": skipped,
            "labels_sha256": examples_hash(desk),
        }
        confidences = [e.meta["confidence"] for e in desk if e.meta.get("confidence") is not None]
        span = f"{min(confidences):.2f}–{max(confidences):.2f}" if confidences else "unknown"
        notes.append(
            f"{len(desk)} desk decision(s) used as labels (approve = correct; edit, reject = "
            f"incorrect); their recorded confidence spans {span}. The desk only sees answers "
            "routed to people: add labelled passed answers (DATA.jsonl) to calibrate above the "
            "review line."
        )
        if skipped:
            notes.append(f"{skipped} decided item(s) had no recorded signals and were skipped")
    return examples, unlabelled, provenance, notes


def _run(args: argparse.Namespace) -> int:
    prog = "tracerag calibrate"
    source = " and ".join(
        [*([str(args.data)] if args.data else []), *(["the review desk"] if args.from_desk else [])]
    )
    try:
        if not args.data and not args.from_desk:
            raise InputError("give DATA.jsonl, --from-desk, or both")
        thresholds = Thresholds(pass_at=args.pass_at, review_at=args.review_at)
        examples, unlabelled, provenance, notes = _gather(args)
        if not examples:
            raise InputError(f"{source}: no labelled rows")
        if len({e.correct for e in examples}) < 2:
            raise InputError(f"{source}: every row has the same label; need both")
        fit_set, held = (
            split_holdout(examples, args.holdout, args.seed) if args.holdout else (examples, [])
        )
        provenance.update({"holdout": args.holdout or 0.0, "split_seed": args.seed})
        calibration = fit_calibration(
            fit_set, args.method, l2=args.l2, cap=thresholds.cap, provenance=provenance
        )
    except (InputError, ConfigurationError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    combiners: dict[str, Callable[..., Combined]] = {
        "heuristic-v1": HeuristicCombiner(),
        calibration.id: CalibratedCombiner(calibration),
    }
    results = {"fit": compare(fit_set, combiners, bins=args.bins, thresholds=thresholds)}
    if held:
        results["holdout"] = compare(held, combiners, bins=args.bins, thresholds=thresholds)
    calibration.provenance["evaluation"] = results
    out = calibration.save(args.out)
    if args.json:
        json.dump(
            {
                "calibration": calibration.to_dict(),
                "file": str(out),
                "unlabelled": unlabelled,
                "notes": notes,
            },
            sys.stdout,
            ensure_ascii=False,
            indent=2,
        )
        print()
        return 0
    print(
        f"calibration {calibration.id} ({args.method}) fitted on {len(fit_set)} rows of "
        f"{source}" + (f"; {unlabelled} unlabelled rows skipped" if unlabelled else "")
    )
    for note in notes:
        print(f"note: {note}")
    print(
        f"thresholds: pass ≥ {thresholds.pass_at}, review ≥ {thresholds.review_at}, else escalate\n"
    )
    print(render_comparison("on the data it was fitted to", results["fit"], args.bins))
    if held:
        print()
        print(
            render_comparison(f"on the held-out {args.holdout:.0%}", results["holdout"], args.bins)
        )
    if args.method == "logistic":
        print("\ncoefficients (per standard deviation of each signal):")
        for name, coef in zip(calibration.features, calibration.model["coefficients"], strict=True):
            print(f"  {name:<20}{coef:+.3f}")
    print(f"\nwrote {out}")
    print(
        f"use it: {CALIBRATION_ENV}={out}  or  "
        f"RAGPipeline(..., combiner=CalibratedCombiner.from_file({str(out)!r}))"
    )
    return 0


def add_parser(subparsers: Subparsers) -> None:
    """Register ``tracerag calibrate``."""
    p = add_command(
        subparsers,
        "calibrate",
        _run,
        help="fit a confidence calibration to labelled responses",
        description="Fit a calibration to labelled responses (JSON lines, and/or the review "
        "desk's decisions with --from-desk) and compare it with the heuristic: ECE, Brier, "
        "AUROC and the routing it gives.",
    )
    p.add_argument(
        "data",
        metavar="DATA.jsonl",
        nargs="?",
        default=None,
        help="labelled rows (see tracerag.tools.calibration); optional with --from-desk",
    )
    p.add_argument(
        "--from-desk",
        action="store_true",
        help="use the review desk's decisions in the audit store as labels (approve: correct; "
        "edit, reject: incorrect), with or without DATA.jsonl",
    )
    add_store_argument(p)
    p.add_argument("--route", default=None, help="with --from-desk: one queue (escalate, review)")
    p.add_argument("--method", choices=METHODS, default="logistic")
    p.add_argument("--out", default="calibration.json", help="file to write (calibration.json)")
    p.add_argument("--bins", type=int, default=DEFAULT_BINS, help="ECE bins (default 15)")
    p.add_argument(
        "--holdout",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="hold out this share (e.g. 0.3) to evaluate on; the fit uses the rest",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the holdout split")
    p.add_argument("--l2", type=float, default=1.0, help="L2 penalty of the logistic fit")
    p.add_argument("--pass-at", type=float, default=Thresholds().pass_at)
    p.add_argument("--review-at", type=float, default=Thresholds().review_at)
    add_json_argument(p, "print the calibration file as JSON")
