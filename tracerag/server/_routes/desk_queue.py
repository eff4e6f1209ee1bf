"""The desk's queue: the filtered, sorted, counted page of items (``GET /review``), the expiry
of stale store claims, and the next item for a reviewer (``GET /review/next``)."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from tracerag.server._deps import Reviewer, Services, ServicesDep, store_call
from tracerag.server._desk import ItemNotes, next_item, notes_for, row_view
from tracerag.server._error_shape import ApiError
from tracerag.server._routes.desk_pages import item_link, page
from tracerag.server._routes.desk_views import PAGE_SIZES, SIGNALS, SORTS, QueueQuery, WhyCache
from tracerag.server._routes.review_decisions import rules_of
from tracerag.store._base import AlreadyDecided, NotQueued, QueueItem, RequestNotFound

router = APIRouter(prefix="/review", include_in_schema=False)


SCAN_LIMIT = 20_000  # queue items read per status to filter, sort and page


QUESTION_CHARS = 140  # a longer question is cut on the queue (in full on the item page)


def _matches(item: QueueItem, query: QueueQuery) -> bool:
    if query.route and item.route != query.route:
        return False
    if query.action and item.action != query.action:
        return False
    if query.q:
        needle = query.q.casefold()
        hay = " ".join(filter(None, [item.question, item.request_id, item.reason]))
        if needle not in hay.casefold():
            return False
    return True


def _sorted(items: list[QueueItem], sort: str) -> list[QueueItem]:
    if sort == "oldest":
        return sorted(items, key=lambda i: i.enqueued_at)
    if sort == "newest":
        key = (
            (lambda i: i.decided_at or i.enqueued_at)
            if items and items[0].decided_at
            else (lambda i: i.enqueued_at)
        )
        return sorted(items, key=key, reverse=True)
    if sort == "confidence":
        return sorted(items, key=lambda i: (i.confidence is None, i.confidence or 0.0))
    return items  # the store's order: escalations first, then the oldest


def queue_listing(
    svc: Services, query: QueueQuery, cache: WhyCache, me: str = ""
) -> dict[str, Any]:
    """The filtered, sorted page of the queue, with real counts (blocking: run in a thread).

    An item counts, filters and shows as claimed while the store's queue or a reviewer's live
    desk claim holds it (``tracerag.server._desk``): the three always agree.
    """
    assert svc.claims is not None and svc.skips is not None
    store_counts = dict(svc.store.metrics().queue)
    claims = svc.claims.snapshot()
    open_items = svc.store.list_queue("open", SCAN_LIMIT)
    truncated = len(open_items) >= SCAN_LIMIT
    held = {i.request_id for i in open_items if i.status == "pending" and i.request_id in claims}
    counts = {
        "pending": store_counts.get("pending", 0) - len(held),
        "claimed": store_counts.get("claimed", 0) + len(held),
        "decided": store_counts.get("decided", 0),
    }
    open_notes = notes_for(svc.store, open_only=True)
    mine = sum(1 for n in open_notes.values() if n.assignee == me) if me else 0

    def status_of(item: QueueItem) -> str:
        if item.status == "decided":
            return "decided"
        return "claimed" if item.status == "claimed" or item.request_id in claims else "pending"

    if query.status == "decided":
        items = svc.store.list_queue("decided", SCAN_LIMIT)
        truncated = truncated or len(items) >= SCAN_LIMIT
        if query.sort == "priority":
            items.sort(key=lambda i: i.decided_at or "", reverse=True)
    elif query.status == "open":
        items = list(open_items)
    else:
        items = [i for i in open_items if status_of(i) == query.status]
    if query.assignee:
        wanted = me if query.assignee == "me" else None
        items = [
            i for i in items if (open_notes.get(i.request_id) or ItemNotes()).assignee == wanted
        ]
    items = [i for i in items if _matches(i, query)]
    if query.signal:
        row = SIGNALS[query.signal]
        items = [
            i for i in items if any(w.row.startswith(row) for w in cache.get(svc, i.request_id))
        ]
    items = _sorted(items, query.sort)
    total = len(items)
    pages = max(1, math.ceil(total / query.per_page))
    number = min(query.page, pages)
    shown = items[(number - 1) * query.per_page : number * query.per_page]
    notes = notes_for(svc.store, [i.request_id for i in shown])
    skipped = svc.skips.of(me) if me else set()
    return {
        "counts": counts,
        "mine": mine,
        "rows": [
            (
                item,
                cache.get(svc, item.request_id),
                row_view(
                    item,
                    claims,
                    notes.get(item.request_id),
                    rules_of(svc, item.route).reviews,
                    item.request_id in skipped,
                ),
            )
            for item in shown
        ],
        "total": total,
        "pages": pages,
        "page_number": number,
        "truncated": truncated,
    }


@router.get("")
async def queue_page(request: Request, session: Reviewer, svc: ServicesDep) -> Response:
    query = QueueQuery.from_request(request)
    cache: WhyCache = request.app.state.why_cache
    await store_call(svc, expire_store_claims, svc)
    try:
        listing = await store_call(svc, queue_listing, svc, query, cache, session.reviewer)
    except ApiError:
        raise
    return page(
        svc,
        "queue.html",
        session=session,
        query=query,
        signals=SIGNALS,
        sorts=SORTS,
        page_sizes=PAGE_SIZES,
        question_chars=QUESTION_CHARS,
        empty_next=request.query_params.get("empty") == "1",
        **listing,
    )


def expire_store_claims(svc: Services) -> int:
    """Release store-level claims older than the claim expiry; how many were released."""
    assert svc.claims is not None
    cutoff = datetime.now(timezone.utc) - timedelta(seconds=svc.claims.seconds)
    released = 0
    for item in svc.store.list_queue("claimed", SCAN_LIMIT):
        try:
            at = datetime.fromisoformat(str(item.claimed_at).replace("Z", "+00:00"))
        except ValueError:
            continue
        if at.tzinfo is None:
            at = at.replace(tzinfo=timezone.utc)
        if at < cutoff:
            try:
                svc.store.release(item.request_id, "tracerag-server", "claim expired")
                released += 1
            except (AlreadyDecided, NotQueued, RequestNotFound):
                pass
    return released


def choose_next(svc: Services, me: str, after: str | None) -> str | None:
    """The next item for a reviewer (blocking: run in a thread)."""
    assert svc.claims is not None and svc.skips is not None
    open_items = svc.store.list_queue("open", SCAN_LIMIT)
    return next_item(
        open_items,
        svc.claims.snapshot(),
        notes_for(svc.store, open_only=True),
        svc.skips.of(me),
        me,
        lambda queue: rules_of(svc, queue).reviews,
        after,
    )


@router.get("/next")
async def next_page(request: Request, session: Reviewer, svc: ServicesDep) -> Response:
    """Go to the item this reviewer should take next (assigned to them first), or to the queue
    saying that nothing is left for them."""
    after = request.query_params.get("after") or None
    found = await store_call(svc, choose_next, svc, session.reviewer, after)
    if found is None:
        return RedirectResponse("/review?empty=1", status_code=303)
    return RedirectResponse(item_link(found), status_code=303)


__all__ = ["choose_next", "expire_store_claims", "queue_listing", "router"]
