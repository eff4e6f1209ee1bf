"""The review desk: sign-in, the queue, one item with its evidence, judgements and decisions,
comments, assignment, skipping, the labelled export; and its JSON API.

Every piece of desk state is either in the audit log (decisions, votes with rubric scores,
comments, assignments: chained) or in the desk's shared tables (sessions, claims, skips, the
sign-in lockout): nothing a second server process would need lives in this one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import secrets
import urllib.parse
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from pydantic import ValidationError
from starlette.background import BackgroundTasks

from tracerag._routing import Route
from tracerag.errors import InputError
from tracerag.server._auth import (
    COOKIE_NAME,
    NAMED,
    SIGNIN_COOKIE,
    SIGNIN_PATH,
    Session,
    valid_reviewer_name,
)
from tracerag.server._bodies import Decision, DecisionRequest, QueuePage, Vote
from tracerag.server._delivery import decision_payload
from tracerag.server._deps import (
    Reviewer,
    Services,
    ServicesDep,
    SignInRequired,
    client_of,
    credential_failed,
    desk_call,
    form_of,
    json_body,
    retry_after_header,
    store_call,
    text_problem,
    validation_detail,
)
from tracerag.server._desk import ItemNotes, next_item, notes_for, row_view
from tracerag.server._desk_config import QueueRules
from tracerag.server._error_shape import ApiError, error_responses, problem
from tracerag.server._review_claims import Claim
from tracerag.server._views import item_context, lang_of, when, why
from tracerag.store._base import (
    KIND_NOTE,
    KIND_REVIEW_COMMENT,
    KIND_REVIEW_DECISION,
    KIND_REVIEW_VOTE,
    REVIEW_ACTIONS,
    AlreadyDecided,
    AlreadyReviewed,
    ClaimedByOther,
    InvalidRecord,
    NotQueued,
    QueueItem,
    RequestNotFound,
    ReviewOutcome,
)
from tracerag.store._codec import RequestTrail

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
    assert svc.auth is not None and svc.templates is not None
    context: dict[str, Any] = {
        "reviewer": session.reviewer if session else None,
        "csrf": svc.auth.csrf_token(session) if session and session.via == "cookie" else "",
        "when": when,
        "lang_of": lang_of,
        **values,  # the sign-in form brings its own CSRF token
    }
    html = svc.templates.get_template(template).render(**context)
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
    """401 in the error shape for the review API; for people, 303 to the sign-in page, which
    comes back to this page (its path and query) afterwards."""
    assert isinstance(exc, SignInRequired)
    if exc.api:
        return problem(
            401,
            "unauthorized",
            "a reviewer token is required (Authorization: Bearer)",
            {"WWW-Authenticate": 'Bearer realm="tracerag-review"'},
        )
    target = "/review"
    if request.method in ("GET", "HEAD"):
        query = request.url.query
        target = safe_next(exc.path + (f"?{query}" if query else ""))
    location = SIGNIN_PATH + "?" + urllib.parse.urlencode({"next": target})
    return RedirectResponse(location, status_code=303)


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a desk path of this site, else the queue.

    Only ``/review`` or a path under it (``/review/...``, ``/review?...``) is taken; anything
    another site could be reached by is the queue instead: ``//host``, a scheme, a backslash
    (browsers read ``/\\host`` as ``//host``), control characters and spaces (browsers drop
    tabs and newlines from URLs), characters outside printable ASCII, and the sign-in page.
    """
    default = "/review"
    if not target or len(target) > 2000:
        return default
    if not all("!" <= c <= "~" for c in target) or "\\" in target:
        return default
    if not (target == default or target.startswith(("/review/", "/review?", "/review#"))):
        return default
    if target.startswith(SIGNIN_PATH):
        return default
    return target


# -- deciding -------------------------------------------------------------------------------


COMMENT_CHARS = 4000


def rules_of(svc: Services, queue: str | None) -> QueueRules:
    """The rubric and review count of an item's queue."""
    assert svc.desk is not None
    rules: QueueRules = svc.desk.rules(queue)
    return rules


def _judge(
    svc: Services,
    request_id: str,
    reviewer: str,
    action: str,
    final_answer: str | None,
    reason: str | None,
    scores: dict[str, int] | None,
) -> tuple[ReviewOutcome, dict[str, Any]]:
    if action not in REVIEW_ACTIONS:
        raise InputError(f"choose one of {', '.join(REVIEW_ACTIONS)}")
    trail = svc.store.get(request_id)
    if trail.review is None:
        raise NotQueued(request_id)
    rules = rules_of(svc, trail.review.route)
    problems = rules.check_scores(scores or {})
    if problems:
        raise InputError("; ".join(problems))
    reason = (reason or "").strip() or None
    if action == "approve":
        final_answer = trail.audit.candidate_answer
        if not final_answer:
            raise InputError("there is no candidate answer to approve: edit or reject")
    elif action == "reject":
        final_answer = None
    else:
        final_answer = (final_answer or "").strip() or None
    for name, text in (("the answer", final_answer), ("the reason", reason)):
        problem = text_problem(name, text or "")
        if problem:
            raise InputError(problem)
    outcome = svc.store.review(
        request_id,
        reviewer,
        action,
        final_answer,
        reason,
        scores=scores or {},
        required=rules.reviews,
    )
    return outcome, trail.record


async def decide(
    svc: Services,
    request_id: str,
    reviewer: str,
    action: str,
    final_answer: str | None,
    reason: str | None,
    scores: dict[str, int] | None = None,
    session_key: str = "",
) -> tuple[ReviewOutcome, BackgroundTasks]:
    """Store a reviewer's judgement — the decision, or a vote when the item's queue asks for
    several reviewers — and plan the decision's delivery. 409 when decided already, held by
    another reviewer (on any server process), or already judged by this reviewer."""
    assert svc.claims is not None
    claim = await desk_call(svc, svc.claims.take, request_id, reviewer, session_key)
    if claim.reviewer != reviewer:
        raise ApiError(
            409,
            "conflict",
            f"{claim.reviewer} is working on this item (claim until {when_epoch(claim.expires)})",
        )
    try:
        outcome, record = await store_call(
            svc, _judge, svc, request_id, reviewer, action, final_answer, reason, scores
        )
    except (RequestNotFound, NotQueued) as exc:
        await desk_call(svc, svc.claims.release, request_id, reviewer)
        raise ApiError(404, "not_found", str(exc)) from None
    except (AlreadyDecided, ClaimedByOther, AlreadyReviewed) as exc:
        await desk_call(svc, svc.claims.release, request_id, reviewer)
        raise ApiError(409, "conflict", str(exc)) from None
    except (ValueError, InvalidRecord) as exc:
        raise ApiError(422, "invalid_input", str(exc)) from None
    # judged: the item is settled, or waits for another reviewer (who may now take it)
    await desk_call(svc, svc.claims.release, request_id)
    if outcome.decision is not None and svc.decisions is not None:
        svc.decisions.notify(request_id)  # streams waiting for this decision hear it now
    tasks = BackgroundTasks()
    decision = outcome.decision
    if decision is not None:
        if svc.delivery.enabled:
            tasks.add_task(svc.delivery.deliver, svc.store, decision_payload(decision, record))
        resume = getattr(svc.answerer.pipeline, "resume_decision", None)
        if callable(resume):  # a served agent's thread waits for this decision: resume it
            tasks.add_task(_resume, svc, resume, decision_payload(decision, record))
        tasks.add_task(_learn_from_decision, svc, request_id)
    return outcome, tasks


def _resume(svc: Services, resume: Any, payload: dict[str, Any]) -> None:
    """Resume the served agent's thread with the decision; a failure is logged, and the
    decision stands."""
    try:
        resume(payload)
    except Exception as exc:
        logger.warning(
            "the agent's thread of request %s was not resumed: %s: %s",
            payload.get("request_id"),
            type(exc).__name__,
            exc,
        )


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


#: how long a sign-in form (its nonce cookie) may be sent
SIGNIN_FORM_SECONDS = 3600


def signin_page(
    request: Request,
    svc: Services,
    code: int,
    error: str | None,
    name: str,
    target: str,
    nonce: str | None = None,
) -> HTMLResponse:
    """The sign-in form with its CSRF token, and its nonce in a SameSite=Strict cookie: a fresh
    one, or the nonce of the form just sent when it was this desk's (a wrong token is tried
    again from the same form)."""
    assert svc.auth is not None
    nonce = nonce or secrets.token_urlsafe(24)
    response = page(
        svc,
        "signin.html",
        code,
        None,
        error=error,
        name=name,
        next=target,
        shared=bool(svc.auth.shared_token),
        csrf=svc.auth.signin_csrf(nonce),
    )
    response.set_cookie(
        SIGNIN_COOKIE,
        nonce,
        max_age=SIGNIN_FORM_SECONDS,
        path=SIGNIN_PATH,
        httponly=True,
        samesite="strict",
        secure=request.app.state.secure_cookies,
    )
    return response


def same_origin(request: Request) -> bool:
    """False when the request names another site as its origin (``Origin``, else
    ``Referer``); True when it names this one or none (a client that is not a browser)."""
    given = request.headers.get("origin") or request.headers.get("referer")
    if given is None:
        return True
    try:
        parts = urllib.parse.urlsplit(given)
        here = urllib.parse.urlsplit(f"{parts.scheme}://{request.headers.get('host', '')}")
        default = {"http": 80, "https": 443}.get(parts.scheme)
        theirs = (parts.hostname, parts.port or default)
        ours = (here.hostname, here.port or default)
    except ValueError:  # a port that is not a number
        return False
    return default is not None and parts.hostname is not None and theirs == ours


@desk.get("/signin")
async def signin_form(request: Request, svc: ServicesDep, next: str | None = None) -> Response:
    assert svc.auth is not None
    return signin_page(request, svc, 200, None, "", safe_next(next))


@desk.post("/signin")
async def signin(request: Request, svc: ServicesDep) -> Response:
    auth = svc.auth
    assert auth is not None
    client = client_of(request)
    form = await form_of(request, svc)
    name = form.get("reviewer", "").strip()
    target = safe_next(form.get("next"))

    nonce: str | None = None  # the form's, once it proved to be this desk's

    def again(code: int, error: str) -> Response:
        return signin_page(request, svc, code, error, name, target, nonce)

    # login CSRF: a form another site makes a victim's browser send is refused, before the
    # token is looked at (and before it counts as a guess)
    if not same_origin(request):
        security_log.warning("refused a cross-site sign-in from %s", client)
        return again(403, "This sign-in was not sent from this desk's own page.")
    if not auth.check_signin_csrf(request.cookies.get(SIGNIN_COOKIE), form.get("csrf")):
        security_log.warning("refused a sign-in without this desk's form token from %s", client)
        return again(403, "The sign-in form has expired or was not this desk's: sign in again.")
    nonce = request.cookies.get(SIGNIN_COOKIE)
    wait = await desk_call(svc, auth.throttle.attempt, client)
    if wait is not None:
        response = again(429, "Too many failed sign-ins from here. Try again in a while.")
        response.headers.update(retry_after_header(wait))
        return response
    found = auth.identify(form.get("token"))
    if found is None:
        await asyncio.to_thread(credential_failed, svc, client, request.url.path, "sign-in")
        return again(401, "That token is not right.")
    kind, named = found
    if kind == NAMED:
        assert named is not None
        name = named
    elif not valid_reviewer_name(name):
        return again(422, "Give your name (up to 64 letters, digits, spaces or .@+-_).")
    await desk_call(svc, auth.throttle.succeeded, client)
    cookie = await desk_call(svc, auth.issue, name, kind)
    response = RedirectResponse(target, status_code=303)
    response.delete_cookie(SIGNIN_COOKIE, path=SIGNIN_PATH)
    response.set_cookie(
        COOKIE_NAME,
        cookie,
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
    await desk_call(svc, svc.auth.revoke, session)
    if svc.claims is not None and session.key:
        # the items this session held go back to the queue now, not in 15 minutes
        await desk_call(svc, svc.claims.release_session, session.key)
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
    assignee: str = ""  # "" (anyone) | "me" | "none" (unassigned)
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
            assignee=pick("assignee", ("me", "none")),
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


@desk.get("")
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


def item_link(request_id: str, **query: str) -> str:
    """The desk page of an item (with query parameters)."""
    path = f"/review/items/{urllib.parse.quote(request_id, safe='')}"
    return path + ("?" + urllib.parse.urlencode(query) if query else "")


def next_link(after: str | None = None) -> str:
    return "/review/next" + ("?" + urllib.parse.urlencode({"after": after}) if after else "")


@dataclasses.dataclass(frozen=True)
class JudgementView:
    reviewer: str
    action: str
    scores: list[tuple[str, Any]]
    at: str
    settled: bool


def _judgement_views(trail: RequestTrail, rules: QueueRules) -> list[JudgementView]:
    labels = {d.name: d.label for d in rules.rubric}
    order = {d.name: i for i, d in enumerate(rules.rubric)}
    out = []
    for e in trail.of_kind(KIND_REVIEW_VOTE, KIND_REVIEW_DECISION):
        scores = e.payload.get("scores") or {}
        pairs = sorted(
            scores.items() if isinstance(scores, dict) else [],
            key=lambda kv: (order.get(str(kv[0]), len(order)), str(kv[0])),
        )
        out.append(
            JudgementView(
                reviewer=e.actor,
                action=str(e.payload.get("action") or ""),
                scores=[(labels.get(str(k), str(k)), v) for k, v in pairs],
                at=e.created_at,
                settled=e.kind == KIND_REVIEW_DECISION,
            )
        )
    return out


def _confirmation(
    trail: RequestTrail, me: str, votes: list[JudgementView], required: int
) -> tuple[str, str] | None:
    """The banner after a judgement, from what the store holds: (kind, text)."""
    decision = trail.review_decision
    if decision is not None:
        payload = decision.payload
        action = payload.get("action")
        verbs = {"approve": "approved", "edit": "edited", "reject": "rejected"}
        who = "You" if decision.actor == me else decision.actor
        how = {
            "unanimous": f" All {len(votes)} reviewers agreed.",
            "adjudicated": " That settled the reviewers' disagreement.",
        }.get(str(payload.get("agreement")), "")
        delivered = (
            " The caller now gets the reviewed answer."
            if action in ("approve", "edit")
            else " The answer stays withheld from the caller."
        )
        return "done", f"Saved: {who} {verbs.get(str(action), action)} this answer.{how}" + (
            delivered
        )
    mine = [v for v in votes if v.reviewer == me and not v.settled]
    if mine:
        if len(votes) >= required:
            return "disputed", (
                f"Your review is recorded. The {len(votes)} reviews disagree: the next "
                "decision settles this item."
            )
        return "done", (
            f"Your review is recorded ({len(votes)} of {required}); the item waits for "
            "another reviewer."
        )
    return None


async def item_response(
    svc: Services,
    request_id: str,
    session: Session,
    status: int = 200,
    error: str | None = None,
    entered: dict[str, str] | None = None,
    done: bool = False,
    error_at: str = "decision",
) -> Response:
    """The item page. A person opening an undecided item claims it, unless it is assigned to
    someone else or they have already given their review."""
    assert svc.claims is not None and svc.skips is not None and svc.auth is not None
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
    me = session.reviewer
    rules = rules_of(svc, trail.review.route)
    notes = ItemNotes()
    for e in trail.of_kind(*NOTE_KINDS_ON_ITEM):
        if e.kind == KIND_REVIEW_VOTE:
            notes.votes.append(e)
        elif e.kind == KIND_REVIEW_COMMENT:
            notes.comments.append(e)
        else:
            notes.assignee = str(e.payload.get("assignee") or "") or None
    decided = trail.review.status == "decided"
    voted = me in notes.voters()
    disputed = not decided and len(notes.votes) >= rules.reviews > 1
    may_judge = not decided and (not voted or disputed)
    claim = None
    if not decided:
        # voters may settle a dispute, but opening it does not hold it against the others
        if session.via == "cookie" and may_judge and not voted and notes.assignee in (None, me):
            claim = await desk_call(svc, svc.claims.take, request_id, me, session.key)
        else:
            claim = await desk_call(svc, svc.claims.get, request_id)
    if claim is None and not decided and trail.review.status == "claimed":
        claim = Claim(request_id, trail.review.claimed_by or "?", 0.0)
    judgements = _judgement_views(trail, rules)
    # others' judgements stay hidden until one's own is given, or the item is disputed or
    # settled: each reviewer judges on the evidence, not on a colleague's verdict
    show_votes = decided or voted or disputed
    skipped = await desk_call(svc, svc.skips.of, me)
    context = item_context(trail, svc.trace_ui)
    # with a shared token reviewers name themselves: any name may be assigned, so a text field
    named = sorted(svc.auth.reviewers) if svc.auth.reviewers and not svc.auth.shared_token else []
    return page(
        svc,
        "item.html",
        status,
        session,
        error=error,
        error_at=error_at,
        claim=claim,
        claimed_by_other=claim is not None and claim.reviewer != me,
        entered=entered,
        claim_until=when_epoch(claim.expires) if claim and claim.expires else None,
        rules=rules,
        judgements=judgements if show_votes else [],
        reviews_in=len(notes.votes),
        voted=voted,
        disputed=disputed,
        may_judge=may_judge,
        assignee=notes.assignee,
        reviewer_names=named,
        comments=notes.comments,
        comment_chars=COMMENT_CHARS,
        skipped=request_id in skipped,
        next_url=next_link(request_id),
        confirmation=_confirmation(trail, me, judgements, rules.reviews) if done else None,
        **context,
    )


NOTE_KINDS_ON_ITEM = ("review_vote", "review_assigned", "review_comment")


@desk.get("/items/{request_id}")
async def item_page(
    request_id: str, request: Request, session: Reviewer, svc: ServicesDep
) -> Response:
    done = request.query_params.get("done") == "1"
    return await item_response(svc, request_id, session, done=done)


async def _checked_form(
    request: Request, request_id: str, session: Session, svc: Services, what: str
) -> dict[str, str] | Response:
    """The posted form, or the 403 page when its CSRF token is not this session's."""
    assert svc.auth is not None
    form = await form_of(request, svc)
    if not svc.auth.check_csrf(session, form.get("csrf")):
        await audit_refusal(svc, request_id, session.reviewer, f"{what} without CSRF token")
        return error_page(svc, 403, "Forbidden", "The form was not sent from this desk.", session)
    return form


@desk.post("/items/{request_id}/decision")
async def decide_form(
    request_id: str, request: Request, session: Reviewer, svc: ServicesDep
) -> Response:
    form = await _checked_form(request, request_id, session, svc, "decision")
    if isinstance(form, Response):
        return form
    entered = {k: v for k, v in form.items() if k != "csrf"}
    entered.setdefault("final_answer", "")
    entered.setdefault("reason", "")
    entered.setdefault("action", "")
    scores: dict[str, int] = {}
    try:
        trail = await store_call(svc, svc.store.get, request_id)
        queue = trail.review.route if trail.review is not None else None
    except RequestNotFound:
        queue = None
    scores, problems = rules_of(svc, queue).scores_from(form)
    if problems:
        return await item_response(
            svc, request_id, session, 422, "Give: " + "; ".join(problems), entered
        )
    try:
        _, tasks = await decide(
            svc,
            request_id,
            session.reviewer,
            form.get("action", ""),
            form.get("final_answer"),
            form.get("reason"),
            scores,
            session.key,
        )
    except ApiError as exc:
        if exc.status == 422:
            return await item_response(svc, request_id, session, 422, str(exc.detail), entered)
        if exc.status == 503:
            raise
        heading = "Not found" if exc.status == 404 else "Already taken"
        return error_page(svc, exc.status, heading, str(exc.detail), session, item_link(request_id))
    return RedirectResponse(item_link(request_id, done="1"), status_code=303, background=tasks)


@desk.post("/items/{request_id}/release")
async def release_form(
    request_id: str, request: Request, session: Reviewer, svc: ServicesDep
) -> Response:
    assert svc.claims is not None
    form = await _checked_form(request, request_id, session, svc, "release")
    if isinstance(form, Response):
        return form
    await desk_call(svc, svc.claims.release, request_id, session.reviewer)
    return RedirectResponse("/review", status_code=303)


@desk.post("/items/{request_id}/claim")
async def claim_form(
    request_id: str, request: Request, session: Reviewer, svc: ServicesDep
) -> Response:
    """Take an item assigned to someone else, or one whose claim ended."""
    assert svc.claims is not None
    form = await _checked_form(request, request_id, session, svc, "claim")
    if isinstance(form, Response):
        return form
    claim = await desk_call(svc, svc.claims.take, request_id, session.reviewer, session.key)
    if claim.reviewer != session.reviewer:
        return error_page(
            svc,
            409,
            "Already taken",
            f"{claim.reviewer} is working on this item (claim until {when_epoch(claim.expires)})",
            session,
            item_link(request_id),
        )
    return RedirectResponse(item_link(request_id), status_code=303)


@desk.post("/items/{request_id}/skip")
async def skip_form(
    request_id: str, request: Request, session: Reviewer, svc: ServicesDep
) -> Response:
    """Put an item back for others and move on: it comes last in this reviewer's next items."""
    assert svc.claims is not None and svc.skips is not None
    form = await _checked_form(request, request_id, session, svc, "skip")
    if isinstance(form, Response):
        return form
    await desk_call(svc, svc.claims.release, request_id, session.reviewer)
    await desk_call(svc, svc.skips.skip, request_id, session.reviewer)
    return RedirectResponse(next_link(request_id), status_code=303)


@desk.post("/items/{request_id}/comments")
async def comment_form(
    request_id: str, request: Request, session: Reviewer, svc: ServicesDep
) -> Response:
    form = await _checked_form(request, request_id, session, svc, "comment")
    if isinstance(form, Response):
        return form
    text = (form.get("comment") or "").strip()
    problem_ = text_problem("the comment", text)
    if not text or problem_ or len(text) > COMMENT_CHARS:
        message = problem_ or (
            f"a comment is up to {COMMENT_CHARS} characters" if text else "write a comment first"
        )
        return await item_response(
            svc,
            request_id,
            session,
            422,
            message,
            {"comment": form.get("comment", "")},
            error_at="comment",
        )
    try:
        await store_call(svc, svc.store.comment, request_id, session.reviewer, text)
    except (RequestNotFound, NotQueued) as exc:
        return error_page(svc, 404, "Not found", str(exc), session, "/review")
    except InvalidRecord as exc:
        return await item_response(
            svc, request_id, session, 422, str(exc), {"comment": text}, error_at="comment"
        )
    return RedirectResponse(item_link(request_id) + "#comments", status_code=303)


@desk.post("/items/{request_id}/assign")
async def assign_form(
    request_id: str, request: Request, session: Reviewer, svc: ServicesDep
) -> Response:
    assert svc.auth is not None
    form = await _checked_form(request, request_id, session, svc, "assignment")
    if isinstance(form, Response):
        return form
    raw = (form.get("assignee") or "").strip()
    assignee = session.reviewer if raw == "me" else (raw or None)
    if assignee is not None:
        known = svc.auth.reviewers
        if (known and not svc.auth.shared_token and assignee not in known) or (
            not valid_reviewer_name(assignee)
        ):
            return await item_response(
                svc,
                request_id,
                session,
                422,
                f"{assignee!r} is not a reviewer of this desk",
                error_at="assign",
            )
    try:
        await store_call(svc, svc.store.assign, request_id, assignee, session.reviewer)
    except (RequestNotFound, NotQueued) as exc:
        return error_page(svc, 404, "Not found", str(exc), session, "/review")
    except AlreadyDecided as exc:
        return error_page(svc, 409, "Already decided", str(exc), session, item_link(request_id))
    if assignee not in (None, session.reviewer):
        # handed over: the item is no longer this reviewer's to hold
        assert svc.claims is not None
        await desk_call(svc, svc.claims.release, request_id, session.reviewer)
    return RedirectResponse(item_link(request_id), status_code=303)


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


@desk.get("/next")
async def next_page(request: Request, session: Reviewer, svc: ServicesDep) -> Response:
    """Go to the item this reviewer should take next (assigned to them first), or to the queue
    saying that nothing is left for them."""
    after = request.query_params.get("after") or None
    found = await store_call(svc, choose_next, svc, session.reviewer, after)
    if found is None:
        return RedirectResponse("/review?empty=1", status_code=303)
    return RedirectResponse(item_link(found), status_code=303)


# -- the labelled export --------------------------------------------------------------------

EXPORT_FORMATS = {"jsonl": "application/x-ndjson", "csv": "text/csv"}


def export_summary(svc: Services) -> dict[str, Any]:
    """Counts and reviewer agreement over the decided items (blocking)."""
    from tracerag.tools._desk_dataset import LABELS, agreement, counted_judgements

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


@desk.get("/export")
async def export_page(request: Request, session: Reviewer, svc: ServicesDep) -> Response:
    summary = await store_call(svc, export_summary, svc)
    return page(svc, "export.html", session=session, **summary)


async def export_stream(svc: Services, fmt: str, route: str | None) -> AsyncIterator[str]:
    """The decided items as JSON lines or CSV, read from the store in batches."""
    import json

    from tracerag.tools._desk_dataset import BATCH, csv_text, desk_row

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


@desk.get("/export.{fmt}")
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


# -- the review API -------------------------------------------------------------------------


@api.get("/queue", summary="The review queue (newest state of each item)", response_model=QueuePage)
async def queue_api(
    request: Request,
    session: Reviewer,
    svc: ServicesDep,
    status: Literal["pending", "claimed", "decided"] | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=1_000_000_000)] = 0,
) -> JSONResponse:
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
    summary="Judge a queued item: the decision, or a vote when its queue asks for several "
    "reviewers (Bearer token only)",
    response_model=Decision,
    responses=error_responses(400, 403, 404, 409, 415, 422)
    | {
        202: {
            "description": "A vote: the item waits for more reviewers (or, disputed, for one "
            "more judgement that settles it).",
            "model": Vote,
        }
    },
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
    outcome, tasks = await decide(
        svc, request_id, name, body.action, body.final_answer, body.reason, body.scores
    )
    if outcome.decision is None:
        vote = Vote(
            request_id=request_id,
            reviewer=name,
            action=body.action,
            reviews=outcome.reviews,
            required=outcome.required,
            disputed=outcome.disputed,
        )
        return JSONResponse(vote.model_dump(), status_code=202)
    return JSONResponse(dataclasses.asdict(outcome.decision), background=tasks)


@api.get(
    "/export",
    summary="The decided items as a labelled dataset (JSON lines or CSV)",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "One labelled example per decided item: question, answer, claims "
            "with their evidence, signals, decision, label, every reviewer's scores.",
            "content": {
                "application/x-ndjson": {
                    "schema": {
                        "type": "string",
                        "description": "one JSON object per line, as `tracerag desk export` writes",
                    }
                },
                "text/csv": {"schema": {"type": "string", "description": "a header, then rows"}},
            },
        },
        **error_responses(422),
    },
)
async def export_api(
    session: Reviewer,
    svc: ServicesDep,
    format: Literal["jsonl", "csv"] = "jsonl",
    route: Literal["escalate", "review"] | None = None,
) -> Response:
    return StreamingResponse(
        export_stream(svc, format, route),
        media_type=EXPORT_FORMATS[format] + "; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="desk-decisions.{format}"'},
    )


__all__ = ["api", "desk"]
