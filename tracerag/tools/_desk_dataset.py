"""The review desk's decisions as a labelled dataset, and how far reviewers agree.

Every settled review item is a labelled example: the question, the answer the pipeline chose,
its claims with the sentence each was checked against, the cited evidence, the signals and
confidence that routed it, and the people's verdict — the decision (``approve`` is a correct
answer; ``edit`` and ``reject`` are incorrect ones), every reviewer's judgement with their
rubric scores, and the comments. Everything is read from the audit log, so an export says
what the chain says.

``desk_rows(store)`` yields the examples (dicts); ``write_jsonl``/``write_csv`` write them;
``agreement(rows)`` measures how often reviewers of the same item agree (the share of items
whose judgements all chose the same action, Fleiss' kappa of the actions, and per rubric
dimension the mean absolute difference of two reviewers' scores). ``tracerag calibrate
--from-desk`` fits the confidence to these labels. Command line::

    tracerag desk export [--format jsonl|csv] [--out FILE] [--status decided|all] [--route R]
    tracerag desk agreement [--json]

A caution that belongs to every use of these labels: the desk only sees answers routed to
people (below the pass threshold), so they say nothing about answers that passed.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from tracerag.errors import InputError, TraceragError
from tracerag.store._base import (
    KIND_REVIEW_COMMENT,
    KIND_REVIEW_DECISION,
    KIND_REVIEW_VOTE,
    AuditStore,
    RequestNotFound,
)
from tracerag.store._codec import RequestTrail
from tracerag.tools._command import (
    Subparsers,
    add_command,
    add_json_argument,
    add_store_argument,
    cli_store,
    print_json,
)

__all__ = [
    "LABELS",
    "Judgement",
    "add_parser",
    "agreement",
    "counted_judgements",
    "csv_text",
    "desk_row",
    "desk_rows",
    "judgements",
    "write_csv",
    "write_jsonl",
]

#: the label each decision gives the pipeline's answer
LABELS = {"approve": "correct", "edit": "incorrect", "reject": "incorrect"}
#: queue items read per batch while exporting
BATCH = 200
ALL = 10**9


@dataclass(frozen=True)
class Judgement:
    """One reviewer's verdict on an item: a vote, or the decision that settled it."""

    reviewer: str
    action: str
    scores: dict[str, float]
    at: str
    seq: int
    settled: bool  # the decision itself

    def to_dict(self) -> dict[str, Any]:
        return {
            "reviewer": self.reviewer,
            "action": self.action,
            "scores": self.scores,
            "at": self.at,
            "settled": self.settled,
        }


def _scores(value: Any) -> dict[str, float]:
    if not isinstance(value, Mapping):
        return {}
    return {
        str(k): v
        for k, v in value.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def judgements(entries: Iterable[Any]) -> list[Judgement]:
    """Every judgement on an item, in the order given: its votes, then its decision."""
    out = []
    for e in entries:
        if e.kind not in (KIND_REVIEW_VOTE, KIND_REVIEW_DECISION):
            continue
        out.append(
            Judgement(
                reviewer=str(e.actor),
                action=str(e.payload.get("action") or ""),
                scores=_scores(e.payload.get("scores")),
                at=str(e.created_at),
                seq=int(e.seq),
                settled=e.kind == KIND_REVIEW_DECISION,
            )
        )
    return out


def counted_judgements(entries: Sequence[Any]) -> list[Judgement]:
    """The judgements that measure agreement: the independent ones the item asked for. A
    decision that settled a dispute was made knowing the others' votes and is left out."""
    found = judgements(entries)
    decision = next((j for j in found if j.settled), None)
    votes = [j for j in found if not j.settled]
    if decision is None:
        return votes
    how = None
    for e in entries:
        if e.kind == KIND_REVIEW_DECISION:
            how = e.payload.get("agreement")
    return votes if how == "adjudicated" else [*votes, decision]


def desk_row(trail: RequestTrail) -> dict[str, Any]:
    """One review item as a labelled example (see the module docstring)."""
    rec = trail.audit
    item = trail.review
    decision_entry = trail.review_decision
    decision = None
    if decision_entry is not None:
        payload = decision_entry.payload
        decision = {
            "action": payload.get("action"),
            "reviewer": decision_entry.actor,
            "final_answer": payload.get("final_answer"),
            "reason": payload.get("reason"),
            "decided_at": decision_entry.created_at,
            "agreement": payload.get("agreement") or "single",
            "required": payload.get("required") or 1,
        }
    found = judgements(trail.entries)
    dims = sorted({name for j in found for name in j.scores})
    mean_scores = {}
    for name in dims:
        values = [j.scores[name] for j in found if name in j.scores]
        mean_scores[name] = round(sum(values) / len(values), 4)
    cited = []
    seen: set[str] = set()
    for mid in rec.cited_ids:
        material = rec.material(mid)
        if material is None or mid in seen:
            continue
        seen.add(mid)
        cited.append(
            {
                "id": mid,
                "title": material.title,
                "source": material.source,
                "text": material.text,
            }
        )
    response = trail.record.get("response")
    detail = response.get("signal_detail") if isinstance(response, Mapping) else None
    return {
        "request_id": trail.request_id,
        "queue": item.route if item is not None else rec.decision,
        "status": item.status if item is not None else None,
        "question": rec.question,
        "answer": rec.candidate_answer,
        "claims": [
            {
                "text": c.text,
                "cited_ids": list(c.cited_ids),
                "verdict": c.verdict,
                "score": c.score,
                "evidence": c.support,
                "material_id": c.material_id,
            }
            for c in rec.claims
        ],
        "evidence": cited,
        "confidence": rec.confidence,
        "route": rec.decision,
        "signal_detail": detail if isinstance(detail, Mapping) else None,
        "calibration": trail.record.get("calibration"),
        "versions": rec.versions.model_dump(exclude_unset=True),
        "trace_id": rec.trace_id,
        "asked_at": rec.started_at,
        "decision": decision,
        "label": LABELS.get(str(decision["action"])) if decision else None,
        "reviews": [j.to_dict() for j in found],
        "scores": mean_scores,
        "agreement": _item_agreement(counted_judgements(trail.entries)),
        "comments": [
            {"author": e.actor, "text": e.payload.get("text"), "at": e.created_at}
            for e in trail.of_kind(KIND_REVIEW_COMMENT)
        ],
    }


def _item_agreement(counted: Sequence[Judgement]) -> dict[str, Any] | None:
    if len(counted) < 2:
        return None
    actions = [j.action for j in counted]
    return {"reviewers": len(counted), "actions": actions, "unanimous": len(set(actions)) == 1}


def desk_rows(
    store: AuditStore,
    *,
    status: str = "decided",
    route: str | None = None,
    since: str | None = None,
) -> Iterator[dict[str, Any]]:
    """The review items as labelled examples: decided ones (``status="all"``: every item,
    undecided ones without a label), oldest decision first; ``route`` keeps one queue,
    ``since`` (ISO time) decisions from then on."""
    if status not in ("decided", "all"):
        raise InputError("status is 'decided' or 'all'")
    statuses = ("decided",) if status == "decided" else ("decided", "pending", "claimed")
    items = [i for s in statuses for i in store.list_queue(s, ALL)]
    if route:
        items = [i for i in items if i.route == route]
    if since:
        items = [i for i in items if (i.decided_at or i.enqueued_at or "") >= since]
    items.sort(key=lambda i: (i.decided_at is None, i.decided_at or "", i.enqueued_at))
    for item in items:
        try:
            trail = store.get(item.request_id)
        except RequestNotFound:
            continue
        yield desk_row(trail)


def write_jsonl(rows: Iterable[Mapping[str, Any]], out: IO[str]) -> int:
    """Write rows as JSON lines; how many."""
    n = 0
    for row in rows:
        out.write(json.dumps(row, ensure_ascii=False, sort_keys=False) + "\n")
        n += 1
    return n


#: the CSV's columns before the rubric's ``score_<name>`` columns
CSV_COLUMNS = (
    "request_id",
    "queue",
    "question",
    "answer",
    "claims",
    "claim_verdicts",
    "evidence_ids",
    "confidence",
    "label",
    "action",
    "reviewer",
    "final_answer",
    "reason",
    "decided_at",
    "agreement",
    "reviewers",
    "reviewer_actions",
    "comments",
)


def csv_record(row: Mapping[str, Any], dimensions: Sequence[str]) -> list[Any]:
    """One row of the CSV (claims as JSON text; scores the mean of the reviewers')."""
    decision = row.get("decision") or {}
    reviews = row.get("reviews") or []
    values: list[Any] = [
        row.get("request_id"),
        row.get("queue"),
        row.get("question"),
        row.get("answer"),
        json.dumps(row.get("claims") or [], ensure_ascii=False),
        " ".join(str(c.get("verdict")) for c in row.get("claims") or []),
        " ".join(str(e.get("id")) for e in row.get("evidence") or []),
        row.get("confidence"),
        row.get("label"),
        decision.get("action"),
        decision.get("reviewer"),
        decision.get("final_answer"),
        decision.get("reason"),
        decision.get("decided_at"),
        decision.get("agreement"),
        " ".join(str(r.get("reviewer")) for r in reviews),
        " ".join(str(r.get("action")) for r in reviews),
        len(row.get("comments") or []),
    ]
    scores = row.get("scores") or {}
    values += [scores.get(name) for name in dimensions]
    return [_cell(v) for v in values]


def _cell(value: Any) -> Any:
    """A CSV cell that a spreadsheet will not run as a formula."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return "" if value is None else value


def csv_header(dimensions: Sequence[str]) -> list[str]:
    return [*CSV_COLUMNS, *(f"score_{name}" for name in dimensions)]


def write_csv(
    rows: Iterable[Mapping[str, Any]], out: IO[str], dimensions: Sequence[str] | None = None
) -> int:
    """Write rows as CSV; ``dimensions`` (default: every score name found) are the score
    columns. How many rows."""
    rows = list(rows)
    if dimensions is None:
        dimensions = sorted({name for r in rows for name in (r.get("scores") or {})})
    writer = csv.writer(out)
    writer.writerow(csv_header(dimensions))
    for row in rows:
        writer.writerow(csv_record(row, dimensions))
    return len(rows)


def csv_text(row: Mapping[str, Any] | None, dimensions: Sequence[str]) -> str:
    """One CSV line (the header when ``row`` is None), for streaming."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(csv_header(dimensions) if row is None else csv_record(row, dimensions))
    return buffer.getvalue()


# -- agreement ------------------------------------------------------------------------------


def fleiss_kappa(table: Sequence[Sequence[int]]) -> float | None:
    """Fleiss' kappa of a table of counts (one row per item, one column per category; every
    row sums to the same number of raters, at least 2). None when it is undefined."""
    if not table:
        return None
    n = sum(table[0])
    if n < 2 or any(sum(row) != n for row in table):
        return None
    items = len(table)
    categories = len(table[0])
    p_j = [sum(row[j] for row in table) / (items * n) for j in range(categories)]
    p_i = [(sum(c * c for c in row) - n) / (n * (n - 1)) for row in table]
    p_bar = sum(p_i) / items
    p_e = sum(p * p for p in p_j)
    if p_e >= 1.0:
        return None  # every rating in one category: agreement by chance is total
    return (p_bar - p_e) / (1.0 - p_e)


def agreement(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """How far reviewers of the same item agree, over the items judged by two or more.

    ``items``: how many; ``unanimous``: the share whose judgements all chose one action;
    ``kappa``: Fleiss' kappa of the actions over the items with the most common number of
    reviewers (``kappa_items`` of them; None when undefined); ``dimensions``: per rubric
    dimension, the pairs of scores compared, their mean absolute difference and the share
    within one point.
    """
    actions = list(LABELS)
    multi: list[list[Mapping[str, Any]]] = []
    for row in rows:
        counted = _counted_reviews(row)
        if len(counted) >= 2:
            multi.append(counted)
    if not multi:
        return {"items": 0, "unanimous": None, "kappa": None, "kappa_items": 0, "dimensions": {}}
    unanimous = sum(1 for c in multi if len({r.get("action") for r in c}) == 1) / len(multi)
    sizes: dict[int, int] = {}
    for c in multi:
        sizes[len(c)] = sizes.get(len(c), 0) + 1
    common = max(sizes, key=lambda k: (sizes[k], k))
    table = [
        [sum(1 for r in c if r.get("action") == a) for a in actions]
        for c in multi
        if len(c) == common
    ]
    dims: dict[str, dict[str, Any]] = {}
    for c in multi:
        for i in range(len(c)):
            for j in range(i + 1, len(c)):
                a, b = c[i].get("scores") or {}, c[j].get("scores") or {}
                for name in set(a) & set(b):
                    d = dims.setdefault(name, {"pairs": 0, "diff": 0.0, "within_one": 0})
                    gap = abs(float(a[name]) - float(b[name]))
                    d["pairs"] += 1
                    d["diff"] += gap
                    d["within_one"] += gap <= 1
    kappa = fleiss_kappa(table)
    return {
        "items": len(multi),
        "unanimous": round(unanimous, 4),
        "kappa": None if kappa is None else round(kappa, 4),
        "kappa_items": len(table),
        "dimensions": {
            name: {
                "pairs": d["pairs"],
                "mean_abs_diff": round(d["diff"] / d["pairs"], 4),
                "within_one": round(d["within_one"] / d["pairs"], 4),
            }
            for name, d in sorted(dims.items())
        },
    }


def _counted_reviews(row: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    reviews = [r for r in row.get("reviews") or [] if isinstance(r, Mapping)]
    decision = row.get("decision") or {}
    if decision.get("agreement") == "adjudicated":
        return [r for r in reviews if not r.get("settled")]
    return reviews


# -- command line ---------------------------------------------------------------------------


def _run_export(args: argparse.Namespace) -> int:
    with cli_store(args) as store:
        try:
            rows = desk_rows(store, status=args.status, route=args.route, since=args.since)
            with contextlib.ExitStack() as stack:
                out: IO[str] = (
                    stack.enter_context(open(args.out, "w", encoding="utf-8", newline=""))
                    if args.out
                    else sys.stdout
                )
                n = write_csv(rows, out) if args.format == "csv" else write_jsonl(rows, out)
        except TraceragError as exc:
            print(f"tracerag desk export: {exc}", file=sys.stderr)
            return 2
    where = args.out or "standard output"
    print(f"tracerag desk export: {n} review item(s) to {where}", file=sys.stderr)
    return 0


def _run_agreement(args: argparse.Namespace) -> int:
    with cli_store(args) as store:
        result = agreement(desk_rows(store, route=args.route))
    if args.json:
        print_json(result)
        return 0
    if not result["items"]:
        print("no item was judged by two or more reviewers")
        return 0
    kappa = "undefined" if result["kappa"] is None else f"{result['kappa']:.2f}"
    print(
        f"{result['items']} item(s) judged by two or more reviewers: "
        f"{result['unanimous']:.0%} unanimous; Fleiss' kappa of the actions {kappa} "
        f"(over {result['kappa_items']} items)"
    )
    for name, d in result["dimensions"].items():
        print(
            f"  {name}: {d['pairs']} pair(s) of scores, mean difference "
            f"{d['mean_abs_diff']:.2f}, {d['within_one']:.0%} within one point"
        )
    return 0


def add_parser(subparsers: Subparsers) -> None:
    """Register ``tracerag desk``."""
    p = subparsers.add_parser(
        "desk",
        help="the review desk's decisions as a labelled dataset; reviewer agreement",
        description="Export the review desk's decisions as labelled examples (JSON lines or "
        "CSV: claim, evidence, decision, reviewers' scores), or report how far reviewers agree.",
    )
    sub = p.add_subparsers(dest="desk_command", metavar="COMMAND", required=True)
    export = add_command(
        sub, "export", _run_export, help="write the decisions as a labelled dataset"
    )
    add_store_argument(export)
    export.add_argument("--format", choices=("jsonl", "csv"), default="jsonl")
    export.add_argument("--out", default=None, help="file to write (default: standard output)")
    export.add_argument(
        "--status",
        choices=("decided", "all"),
        default="decided",
        help="decided items (default) or every item (undecided ones unlabelled)",
    )
    export.add_argument("--route", default=None, help="one queue (escalate, review)")
    export.add_argument("--since", default=None, help="decisions from this ISO time on")
    agree = add_command(
        sub, "agreement", _run_agreement, help="how far reviewers of the same item agree"
    )
    add_store_argument(agree)
    agree.add_argument("--route", default=None, help="one queue (escalate, review)")
    add_json_argument(agree)
