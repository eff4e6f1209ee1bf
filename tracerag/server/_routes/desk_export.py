"""The labelled export of decided items: the desk's summary page, and the JSON lines or CSV
stream that the desk and the review API both send (``tracerag desk export`` writes the same)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from tracerag._routing import Route
from tracerag.server._deps import Reviewer, Services, ServicesDep, store_call
from tracerag.server._error_shape import ApiError
from tracerag.server._routes.desk_pages import page
from tracerag.store._base import KIND_REVIEW_DECISION, KIND_REVIEW_VOTE, RequestNotFound
from tracerag.tools._desk_dataset import (
    BATCH,
    LABELS,
    agreement,
    counted_judgements,
    csv_text,
    desk_row,
)

router = APIRouter(prefix="/review", include_in_schema=False)


EXPORT_FORMATS = {"jsonl": "application/x-ndjson", "csv": "text/csv"}


def export_summary(svc: Services) -> dict[str, Any]:
    """Counts and reviewer agreement over the decided items (blocking)."""
    counts = dict(svc.store.metrics().queue)
    entries = svc.store.review_entries((KIND_REVIEW_VOTE, KIND_REVIEW_DECISION))
    by_item: dict[str, list[Any]] = {}
    for e in entries:
        by_item.setdefault(e.request_id, []).append(e)
    rows = []
    labels = {"correct": 0, "incorrect": 0}
    for item_entries in by_item.values():
        decision = next((e for e in item_entries if e.kind == KIND_REVIEW_DECISION), None)
        if decision is None:
            continue
        label = LABELS.get(str(decision.payload.get("action")))
        if label:
            labels[label] += 1
        counted = counted_judgements(item_entries)
        rows.append(
            {
                "reviews": [
                    {"action": j.action, "scores": j.scores, "settled": False} for j in counted
                ],
                "decision": {},
            }
        )
    return {
        "decided": counts.get("decided", 0),
        "labels": labels,
        "agreement": agreement(rows),
    }


@router.get("/export")
async def export_page(request: Request, session: Reviewer, svc: ServicesDep) -> Response:
    summary = await store_call(svc, export_summary, svc)
    return page(svc, "export.html", session=session, **summary)


async def export_stream(svc: Services, fmt: str, route: str | None) -> AsyncIterator[str]:
    """The decided items as JSON lines or CSV, read from the store in batches."""
    assert svc.desk is not None
    dims = [d.name for d in svc.desk.dimensions]
    if fmt == "csv":
        # a dimension scored once but no longer configured keeps its column
        judged = await store_call(
            svc, svc.store.review_entries, (KIND_REVIEW_VOTE, KIND_REVIEW_DECISION)
        )
        found = {k for e in judged for k in (e.payload.get("scores") or {})}
        dims += sorted(found - set(dims))
    items = await store_call(svc, svc.store.list_queue, "decided", 10**9)
    if route:
        items = [i for i in items if i.route == route]
    items.sort(key=lambda i: i.decided_at or "")
    if fmt == "csv":
        yield csv_text(None, dims)

    def batch_rows(ids: list[str]) -> list[dict[str, Any]]:
        out = []
        for rid in ids:
            try:
                out.append(desk_row(svc.store.get(rid)))
            except RequestNotFound:
                continue
        return out

    ids = [i.request_id for i in items]
    for start in range(0, len(ids), BATCH):
        rows = await store_call(svc, batch_rows, ids[start : start + BATCH])
        for row in rows:
            if fmt == "csv":
                yield csv_text(row, dims)
            else:
                yield json.dumps(row, ensure_ascii=False) + "\n"


@router.get("/export.{fmt}")
async def export_file(fmt: str, request: Request, session: Reviewer, svc: ServicesDep) -> Response:
    """The labelled dataset: every decided item with its claims, evidence, decision and the
    reviewers' scores (``tracerag desk export`` writes the same)."""
    if fmt not in EXPORT_FORMATS:
        raise ApiError(404, "not_found", "export as .jsonl or .csv")
    route = request.query_params.get("route") or None
    if route is not None and route not in (Route.ESCALATE, Route.REVIEW):
        raise ApiError(422, "invalid_input", "route is escalate or review")
    return StreamingResponse(
        export_stream(svc, fmt, route),
        media_type=EXPORT_FORMATS[fmt] + "; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="desk-decisions.{fmt}"'},
    )


__all__ = ["EXPORT_FORMATS", "export_stream", "export_summary", "router"]
