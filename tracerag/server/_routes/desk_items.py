"""One desk item: its page (which claims it for the person opening it) and its forms: the
decision, release, claim, skip, comments and assignment (``/review/items/{request_id}/...``).

Every form reaches its handler through ``DeskForm`` (CSRF checked, refusals audited)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from tracerag.server._auth import Session, valid_reviewer_name
from tracerag.server._deps import (
    Reviewer,
    Services,
    ServicesDep,
    desk_call,
    store_call,
    text_problem,
)
from tracerag.server._desk import ItemNotes
from tracerag.server._error_shape import ApiError
from tracerag.server._review_claims import Claim
from tracerag.server._routes.desk_form import (
    AssignForm,
    ClaimForm,
    CommentForm,
    DecisionForm,
    ReleaseForm,
    SkipForm,
)
from tracerag.server._routes.desk_pages import error_page, item_link, next_link, page, when_epoch
from tracerag.server._routes.desk_views import confirmation, judgement_views
from tracerag.server._routes.review_decisions import decide, rules_of
from tracerag.server._views import item_context
from tracerag.store._base import (
    KIND_REVIEW_COMMENT,
    KIND_REVIEW_VOTE,
    AlreadyDecided,
    InvalidRecord,
    NotQueued,
    RequestNotFound,
)

router = APIRouter(prefix="/review", include_in_schema=False)


COMMENT_CHARS = 4000


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
    judgements = judgement_views(trail, rules)
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
        confirmation=confirmation(trail, me, judgements, rules.reviews) if done else None,
        **context,
    )


NOTE_KINDS_ON_ITEM = ("review_vote", "review_assigned", "review_comment")


@router.get("/items/{request_id}")
async def item_page(
    request_id: str, request: Request, session: Reviewer, svc: ServicesDep
) -> Response:
    done = request.query_params.get("done") == "1"
    return await item_response(svc, request_id, session, done=done)


@router.post("/items/{request_id}/decision")
async def decide_form(
    request_id: str, session: Reviewer, form: DecisionForm, svc: ServicesDep
) -> Response:
    entered = {k: v for k, v in form.fields.items() if k != "csrf"}
    entered.setdefault("final_answer", "")
    entered.setdefault("reason", "")
    entered.setdefault("action", "")
    scores: dict[str, int] = {}
    try:
        trail = await store_call(svc, svc.store.get, request_id)
        queue = trail.review.route if trail.review is not None else None
    except RequestNotFound:
        queue = None
    scores, problems = rules_of(svc, queue).scores_from(form.fields)
    if problems:
        return await item_response(
            svc, request_id, session, 422, "Give: " + "; ".join(problems), entered
        )
    try:
        _, tasks = await decide(
            svc,
            request_id,
            session.reviewer,
            form.fields.get("action", ""),
            form.fields.get("final_answer"),
            form.fields.get("reason"),
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


@router.post("/items/{request_id}/release")
async def release_form(
    request_id: str, session: Reviewer, form: ReleaseForm, svc: ServicesDep
) -> Response:
    await desk_call(svc, form.claims.release, request_id, session.reviewer)
    return RedirectResponse("/review", status_code=303)


@router.post("/items/{request_id}/claim")
async def claim_form(
    request_id: str, session: Reviewer, form: ClaimForm, svc: ServicesDep
) -> Response:
    """Take an item assigned to someone else, or one whose claim ended."""
    claim = await desk_call(svc, form.claims.take, request_id, session.reviewer, session.key)
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


@router.post("/items/{request_id}/skip")
async def skip_form(
    request_id: str, session: Reviewer, form: SkipForm, svc: ServicesDep
) -> Response:
    """Put an item back for others and move on: it comes last in this reviewer's next items."""
    await desk_call(svc, form.claims.release, request_id, session.reviewer)
    await desk_call(svc, form.skips.skip, request_id, session.reviewer)
    return RedirectResponse(next_link(request_id), status_code=303)


@router.post("/items/{request_id}/comments")
async def comment_form(
    request_id: str, session: Reviewer, form: CommentForm, svc: ServicesDep
) -> Response:
    text = (form.fields.get("comment") or "").strip()
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
            {"comment": form.fields.get("comment", "")},
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


@router.post("/items/{request_id}/assign")
async def assign_form(
    request_id: str, session: Reviewer, form: AssignForm, svc: ServicesDep
) -> Response:
    raw = (form.fields.get("assignee") or "").strip()
    assignee = session.reviewer if raw == "me" else (raw or None)
    if assignee is not None:
        known = form.auth.reviewers
        if (known and not form.auth.shared_token and assignee not in known) or (
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
        await desk_call(svc, form.claims.release, request_id, session.reviewer)
    return RedirectResponse(item_link(request_id), status_code=303)


__all__ = ["COMMENT_CHARS", "item_response", "router"]
