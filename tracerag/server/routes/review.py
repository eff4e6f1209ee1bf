"""The review desk: sign-in, the queue, one item with its evidence, decisions; and its JSON API."""

from __future__ import annotations

import dataclasses
import logging
import math
import urllib.parse
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from pydantic import ValidationError
from starlette.background import BackgroundTasks

from tracerag.server.auth import COOKIE_NAME, NAMED, Session, valid_reviewer_name
from tracerag.server.delivery import decision_payload
from tracerag.server.deps import (
    Reviewer,
    Services,
    ServicesDep,
    SignInRequired,
    client_of,
    credential_failed,
    form_of,
    json_body,
    retry_after_header,
    store_call,
    text_problem,
    validation_detail,
)
from tracerag.server.errors import ApiError, error_responses, problem
from tracerag.server.models import Decision, DecisionRequest, QueuePage
from tracerag.server.views import item_context, lang_of, when, why
from tracerag.store.base import (
    KIND_NOTE,
    REVIEW_ACTIONS,
    AlreadyDecided,
    ClaimedByOther,
    InvalidRecord,
    NotQueued,
    QueueItem,
    RequestNotFound,
    ReviewDecision,
)

logger = logging.getLogger("tracerag.server")
security_log = logging.getLogger("tracerag.server.security")

PAGE_SIZES = (25, 50, 100)
SCAN_LIMIT = 20_000  # queue items read per status to filter, sort and page
QUESTION_CHARS = 140  # a longer question is cut on the queue (in full on the item page)
SIGNALS = {
    "fabricated": "fabricated citations",
    "stale": "outdated materials cited",
    "uncited": "citation coverage",
    "unsupported": "citation accuracy",
    "rule": "rule ",
    "consistency": "self-consistency",
    "plan": "plan",
    "errors": "errors",
}
SORTS = {
    "priority": "escalations first, then oldest",
    "oldest": "oldest first",
    "newest": "newest first",
    "confidence": "lowest confidence first",
}

desk = APIRouter(prefix="/review", include_in_schema=False)
api = APIRouter(
    prefix="/review/api",
    tags=["review"],
    responses=error_responses(401, 429, 503) | {"default": error_responses(500)[500]},
)


# -- rendering ------------------------------------------------------------------------------


def page(
    svc: Services,
    template: str,
    code: int = 200,
    session: Session | None = None,
    **values: Any,
) -> HTMLResponse:
    """A desk page rendered with the reviewer's name and CSRF token."""
    assert svc.auth is not None
    html = svc.templates.get_template(template).render(
        reviewer=session.reviewer if session else None,
        csrf=svc.auth.csrf_token(session) if session and session.via == "cookie" else "",
        when=when,
        lang_of=lang_of,
        **values,
    )
    return HTMLResponse(html, status_code=code)


def error_page(
    svc: Services,
    status: int,
    heading: str,
    message: str,
    session: Session | None = None,
    back: str | None = None,
    signin: str = "/review/signin",
) -> HTMLResponse:
    """An error page (401 links to sign-in, coming back here afterwards)."""
    response = page(
        svc,
        "error.html",
        status,
        session,
        status=status,
        heading=heading,
        message=message,
        back=back,
        signin=signin,
    )
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="tracerag-review"'
    return response


async def sign_in_required(request: Request, exc: Exception) -> Response:
    """401: a JSON error for the review API, the sign-in link (back to this page) for people."""
    assert isinstance(exc, SignInRequired)
    if exc.api:
        return problem(
            401,
            "unauthorized",
            "a reviewer token is required (Authorization: Bearer)",
            {"WWW-Authenticate": 'Bearer realm="tracerag-review"'},
        )
    target = exc.path if request.method == "GET" else "/review"
    return error_page(
        request.app.state.services,
        401,
        "Sign in required",
        "Reviewer pages need a reviewer token.",
        signin="/review/signin?" + urllib.parse.urlencode({"next": target}),
    )


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a desk path on this site, else the queue."""
    if not target or not target.startswith("/review") or target.startswith("//"):
        return "/review"
    if any(c in target for c in "\\\r\n") or target.startswith("/review/signin"):
        return "/review"
    return target


# -- deciding -------------------------------------------------------------------------------


def _decide(
    svc: Services,
    request_id: str,
    reviewer: str,
    action: str,
    final_answer: str | None,
    reason: str | None,
) -> tuple[ReviewDecision, dict[str, Any]]:
    if action not in REVIEW_ACTIONS:
        raise ValueError(f"choose one of {', '.join(REVIEW_ACTIONS)}")
    trail = svc.store.get(request_id)
    if trail.review is None:
        raise NotQueued(request_id)
    reason = (reason or "").strip() or None
    if action == "approve":
        final_answer = trail.audit.candidate_answer
        if not final_answer:
            raise ValueError("there is no candidate answer to approve: edit or reject")
    elif action == "reject":
        final_answer = None
    else:
        final_answer = (final_answer or "").strip() or None
    for name, text in (("the answer", final_answer), ("the reason", reason)):
        problem = text_problem(name, text or "")
        if problem:
            raise ValueError(problem)
    decision = svc.store.decide(request_id, reviewer, action, final_answer, reason)
    return decision, trail.record


async def decide(
    svc: Services,
    request_id: str,
    reviewer: str,
    action: str,
    final_answer: str | None,
    reason: str | None,
) -> tuple[ReviewDecision, BackgroundTasks]:
    """Store a decision (409 when decided already or claimed by another) and plan its delivery."""
    assert svc.claims is not None
    claim = svc.claims.get(request_id)
    if claim is not None and claim.reviewer != reviewer:
        raise ApiError(
            409,
            "conflict",
            f"{claim.reviewer} is working on this item (claim until {when_epoch(claim.expires)})",
        )
    try:
        decision, record = await store_call(
            svc, _decide, svc, request_id, reviewer, action, final_answer, reason
        )
    except (RequestNotFound, NotQueued) as exc:
        raise ApiError(404, "not_found", str(exc)) from None
    except (AlreadyDecided, ClaimedByOther) as exc:
        raise ApiError(409, "conflict", str(exc)) from None
    except (ValueError, InvalidRecord) as exc:
        raise ApiError(422, "invalid_input", str(exc)) from None
    svc.claims.release(request_id)
    if svc.decisions is not None:  # streams waiting for this decision hear it now
        svc.decisions.notify(request_id)
    tasks = BackgroundTasks()
    if svc.delivery.enabled:
        tasks.add_task(svc.delivery.deliver, svc.store, decision_payload(decision, record))
    tasks.add_task(_learn_from_decision, svc, request_id)
    return decision, tasks


def _learn_from_decision(svc: Services, request_id: str) -> None:
    """A reviewer's decision moves the credibility of the materials the answer relied on."""
    from tracerag.materials.feedback import record_review_outcome

    try:
        record_review_outcome(request_id, registry=svc.materials())
    except Exception as exc:  # the decision stands; the registry catches up on the next one
        logger.warning(
            "material credibility not updated for %s: %s: %s", request_id, type(exc).__name__, exc
        )


def when_epoch(seconds: float) -> str:
    from datetime import datetime, timezone

    return when(datetime.fromtimestamp(seconds, tz=timezone.utc).isoformat())


async def audit_refusal(svc: Services, request_id: str, actor: str, what: str) -> None:
    """Record a refused form (CSRF) on the request's trail, and in the security log."""
    security_log.warning("refused %s for %s on %s", what, actor or "?", request_id)
    try:
        await store_call(
            svc,
            svc.store.append_action,
            request_id,
            KIND_NOTE,
            actor or "unknown",
            {"refused": what},
            reason=f"refused: {what}",
        )
    except Exception:
        logger.warning("could not audit a refused %s on %s", what, request_id)


# -- sign-in --------------------------------------------------------------------------------


@desk.get("/signin")
async def signin_form(svc: ServicesDep, next: str | None = None) -> Response:
    assert svc.auth is not None
    return page(
        svc,
        "signin.html",
        session=None,
        error=None,
        name="",
        next=safe_next(next),
        shared=bool(svc.auth.shared_token),
    )


@desk.post("/signin")
async def signin(request: Request, svc: ServicesDep) -> Response:
    auth = svc.auth
    assert auth is not None
    client = client_of(request)
    form = await form_of(request, svc)
    name = form.get("reviewer", "").strip()
    target = safe_next(form.get("next"))

    def again(code: int, error: str) -> Response:
        return page(
            svc,
            "signin.html",
            code,
            None,
            error=error,
            name=name,
            next=target,
            shared=bool(auth.shared_token),
        )

    wait = auth.throttle.attempt(client)
    if wait is not None:
        response = again(429, "Too many failed sign-ins from here. Try again in a while.")
        response.headers.update(retry_after_header(wait))
        return response
    found = auth.identify(form.get("token"))
    if found is None:
        credential_failed(svc, client, request.url.path, "sign-in")
        return again(401, "That token is not right.")
    kind, named = found
    if kind == NAMED:
        assert named is not None
        name = named
    elif not valid_reviewer_name(name):
        return again(422, "Give your name (up to 64 letters, digits, spaces or .@+-_).")
    auth.throttle.succeeded(client)
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        COOKIE_NAME,
        auth.issue(name, kind),
        max_age=auth.session_seconds,
        path="/review",
        httponly=True,
        samesite="strict",
        secure=request.app.state.secure_cookies,
    )
    return response


@desk.post("/signout")
async def signout(request: Request, session: Reviewer, svc: ServicesDep) -> Response:
    assert svc.auth is not None
    form = await form_of(request, svc)
    if not svc.auth.check_csrf(session, form.get("csrf")):
        security_log.warning("refused sign-out without CSRF token for %s", session.reviewer)
        return error_page(svc, 403, "Forbidden", "The form was not sent from this desk.", session)
    svc.auth.revoke(session)
    response = RedirectResponse("/review/signin", status_code=303)
    response.delete_cookie(COOKIE_NAME, path="/review")
    return response


# -- the queue ------------------------------------------------------------------------------


@dataclasses.dataclass
class QueueQuery:
    """What the queue page shows: which items, in which order, which page."""

    status: str = "open"  # open | pending | claimed | decided
    route: str = ""  # escalate | review
    action: str = ""  # approve | edit | reject (decided items)
    signal: str = ""  # a key of SIGNALS
    q: str = ""
    sort: str = "priority"
    page: int = 1
    per_page: int = PAGE_SIZES[0]

    @classmethod
    def from_request(cls, request: Request) -> QueueQuery:
        p = request.query_params

        def pick(name: str, allowed: Any, default: str = "") -> str:
            value = (p.get(name) or "").strip()
            return value if value in allowed else default

        try:
            number = max(1, int(p.get("page") or 1))
        except ValueError:
            number = 1
        try:
            size = int(p.get("per_page") or PAGE_SIZES[0])
        except ValueError:
            size = PAGE_SIZES[0]
        return cls(
            status=pick("status", ("open", "pending", "claimed", "decided"), "open"),
            route=pick("route", ("escalate", "review")),
            action=pick("action", REVIEW_ACTIONS),
            signal=pick("signal", SIGNALS),
            q=(p.get("q") or "").strip()[:200],
            sort=pick("sort", SORTS, "priority"),
            page=number,
            per_page=size if size in PAGE_SIZES else PAGE_SIZES[0],
        )

    def link(self, **changes: Any) -> str:
        """The queue URL for this query with some parameters changed."""
        values = {**dataclasses.asdict(self), **changes}
        defaults = dataclasses.asdict(QueueQuery())
        kept = {k: v for k, v in values.items() if v != defaults[k]}
        return "/review" + ("?" + urllib.parse.urlencode(kept) if kept else "")


class WhyCache:
    """The routed-because signals of stored requests (records never change)."""

    def __init__(self, size: int = 50_000) -> None:
        self.size = size
        self._rows: dict[str, list[Any]] = {}

    def get(self, svc: Services, request_id: str) -> list[Any]:
        found = self._rows.get(request_id)
        if found is None:
            try:
                found = why(svc.store.get(request_id))
            except RequestNotFound:
                found = []
            if len(self._rows) >= self.size:
                self._rows.clear()
            self._rows[request_id] = found
        return found


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


def queue_listing(svc: Services, query: QueueQuery, cache: WhyCache) -> dict[str, Any]:
    """The filtered, sorted page of the queue, with real counts (blocking: run in a thread)."""
    counts = dict(svc.store.metrics().queue)
    statuses = ("pending", "claimed") if query.status == "open" else (query.status,)
    items: list[QueueItem] = []
    truncated = False
    for status in statuses:
        batch = svc.store.list_queue(status, SCAN_LIMIT)
        truncated = truncated or len(batch) >= SCAN_LIMIT
        items.extend(batch)
    if query.status == "decided" and query.sort == "priority":
        items.sort(key=lambda i: i.decided_at or "", reverse=True)
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
    return {
        "counts": {s: counts.get(s, 0) for s in ("pending", "claimed", "decided")},
        "rows": [(item, cache.get(svc, item.request_id)) for item in shown],
        "total": total,
        "pages": pages,
        "page_number": number,
        "truncated": truncated,
    }


@desk.get("")
async def queue_page(request: Request, session: Reviewer, svc: ServicesDep) -> Response:
    assert svc.claims is not None
    query = QueueQuery.from_request(request)
    cache: WhyCache = request.app.state.why_cache
    await store_call(svc, expire_store_claims, svc)
    listing = await store_call(svc, queue_listing, svc, query, cache)
    return page(
        svc,
        "queue.html",
        session=session,
        query=query,
        claims=svc.claims.snapshot(),
        signals=SIGNALS,
        sorts=SORTS,
        page_sizes=PAGE_SIZES,
        question_chars=QUESTION_CHARS,
        **listing,
    )


def expire_store_claims(svc: Services) -> int:
    """Release store-level claims older than the claim expiry; how many were released."""
    from datetime import datetime, timedelta, timezone

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


# -- one item -------------------------------------------------------------------------------


async def item_response(
    svc: Services,
    request_id: str,
    session: Session,
    status: int = 200,
    error: str | None = None,
    entered: dict[str, str] | None = None,
) -> Response:
    """The item page; opening an undecided item claims it for this reviewer."""
    assert svc.claims is not None
    try:
        trail = await store_call(svc, svc.store.get, request_id)
    except RequestNotFound:
        return error_page(svc, 404, "Not found", f"No request {request_id!r}.", session, "/review")
    if trail.review is None:
        return error_page(
            svc,
            404,
            "Not in the queue",
            f"Request {request_id!r} is not in the review queue.",
            session,
            "/review",
        )
    claim = None
    if trail.review.status != "decided":
        if session.via == "cookie":  # a person opened it
            claim = svc.claims.take(request_id, session.reviewer)
        else:
            claim = svc.claims.get(request_id)
    context = item_context(trail, svc.trace_ui)
    return page(
        svc,
        "item.html",
        status,
        session,
        error=error,
        claim=claim,
        claimed_by_other=claim is not None and claim.reviewer != session.reviewer,
        entered=entered,
        claim_until=when_epoch(claim.expires) if claim else None,
        **context,
    )


@desk.get("/items/{request_id}")
async def item_page(request_id: str, session: Reviewer, svc: ServicesDep) -> Response:
    return await item_response(svc, request_id, session)


@desk.post("/items/{request_id}/decision")
async def decide_form(
    request_id: str, request: Request, session: Reviewer, svc: ServicesDep
) -> Response:
    assert svc.auth is not None
    form = await form_of(request, svc)
    if not svc.auth.check_csrf(session, form.get("csrf")):
        await audit_refusal(svc, request_id, session.reviewer, "decision without CSRF token")
        return error_page(svc, 403, "Forbidden", "The form was not sent from this desk.", session)
    entered = {
        "final_answer": form.get("final_answer", ""),
        "reason": form.get("reason", ""),
        "action": form.get("action", ""),
    }
    try:
        _, tasks = await decide(
            svc,
            request_id,
            session.reviewer,
            form.get("action", ""),
            form.get("final_answer"),
            form.get("reason"),
        )
    except ApiError as exc:
        if exc.status == 422:
            return await item_response(svc, request_id, session, 422, str(exc.detail), entered)
        if exc.status == 503:
            raise
        heading = "Not found" if exc.status == 404 else "Already taken"
        back = f"/review/items/{urllib.parse.quote(request_id, safe='')}"
        return error_page(svc, exc.status, heading, str(exc.detail), session, back)
    target = f"/review/items/{urllib.parse.quote(request_id, safe='')}"
    return RedirectResponse(target, status_code=303, background=tasks)


@desk.post("/items/{request_id}/release")
async def release_form(
    request_id: str, request: Request, session: Reviewer, svc: ServicesDep
) -> Response:
    assert svc.auth is not None and svc.claims is not None
    form = await form_of(request, svc)
    if not svc.auth.check_csrf(session, form.get("csrf")):
        await audit_refusal(svc, request_id, session.reviewer, "release without CSRF token")
        return error_page(svc, 403, "Forbidden", "The form was not sent from this desk.", session)
    svc.claims.release(request_id, session.reviewer)
    return RedirectResponse("/review", status_code=303)


# -- the review API -------------------------------------------------------------------------


@api.get("/queue", summary="The review queue (newest state of each item)", response_model=QueuePage)
async def queue_api(
    request: Request,
    session: Reviewer,
    svc: ServicesDep,
    status: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> JSONResponse:
    if status is not None and status not in ("pending", "claimed", "decided"):
        raise ApiError(422, "invalid_input", "status must be pending, claimed or decided")
    if not (1 <= limit <= 1000) or offset < 0:
        raise ApiError(422, "invalid_input", "limit is 1..1000 and offset is 0 or more")
    items = await store_call(svc, svc.store.list_queue, status, offset + limit)
    counts = (await store_call(svc, svc.store.metrics)).queue
    total = counts.get(status, 0) if status else sum(counts.values())
    return JSONResponse(
        {
            "items": [i.to_dict() for i in items[offset : offset + limit]],
            "total": total,
            "offset": offset,
            "limit": limit,
        }
    )


@api.get(
    "/requests/{request_id}",
    summary="The full stored trail of a request (operators)",
    response_model=dict[str, Any],
    responses=error_responses(404),
)
async def trail_api(request_id: str, session: Reviewer, svc: ServicesDep) -> JSONResponse:
    try:
        trail = await store_call(svc, svc.store.get, request_id)
    except RequestNotFound:
        raise ApiError(404, "not_found", f"no request {request_id!r}") from None
    return JSONResponse(trail.to_dict())


@api.post(
    "/items/{request_id}/decision",
    summary="Decide a queued item (Bearer token only)",
    response_model=Decision,
    responses=error_responses(400, 403, 404, 409, 415, 422),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/DecisionRequest"}}
            },
        }
    },
)
async def decide_api(
    request_id: str, request: Request, session: Reviewer, svc: ServicesDep
) -> JSONResponse:
    if session.via != "bearer":
        raise ApiError(403, "forbidden", "the review API takes the token as a bearer header")
    raw = await json_body(request, svc)
    try:
        body = DecisionRequest.model_validate(raw)
    except ValidationError as exc:
        raise ApiError(422, "invalid_input", validation_detail(exc)) from None
    name = session.reviewer
    if session.kind != NAMED:
        name = (body.reviewer or request.headers.get("x-reviewer") or name).strip()
        if not valid_reviewer_name(name):
            raise ApiError(422, "invalid_input", "reviewer: up to 64 letters, digits, .@+-_")
    decision, tasks = await decide(
        svc, request_id, name, body.action, body.final_answer, body.reason
    )
    return JSONResponse(dataclasses.asdict(decision), background=tasks)


__all__ = ["api", "desk"]
