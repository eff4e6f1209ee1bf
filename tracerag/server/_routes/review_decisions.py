"""A reviewer's judgement, shared by the desk's form and the review API: checked against the
item's queue rules, stored (a decision, or a vote when the queue asks for several reviewers),
then delivered, resumed and learnt from in the background. Refused forms are audited here."""

from __future__ import annotations

import logging
from typing import Any

from starlette.background import BackgroundTasks

from tracerag.errors import InputError
from tracerag.materials.feedback import record_review_outcome
from tracerag.server._delivery import decision_payload
from tracerag.server._deps import Services, desk_call, store_call, text_problem
from tracerag.server._desk_config import QueueRules
from tracerag.server._error_shape import ApiError
from tracerag.server._routes.desk_pages import when_epoch
from tracerag.store._base import (
    KIND_NOTE,
    REVIEW_ACTIONS,
    AlreadyDecided,
    AlreadyReviewed,
    ClaimedByOther,
    InvalidRecord,
    NotQueued,
    RequestNotFound,
    ReviewOutcome,
)

logger = logging.getLogger("tracerag.server")
security_log = logging.getLogger("tracerag.server.security")


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
    try:
        record_review_outcome(request_id, registry=svc.materials())
    except Exception as exc:  # the decision stands; the registry catches up on the next one
        logger.warning(
            "material credibility not updated for %s: %s: %s", request_id, type(exc).__name__, exc
        )


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


__all__ = ["audit_refusal", "decide", "rules_of"]
