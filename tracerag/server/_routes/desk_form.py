"""The desk's posted forms, as one FastAPI dependency.

Every desk POST handler takes a ``DeskForm``: the form's fields once its CSRF token proved to be
the session's, with the desk parts the handlers use. A refused form never reaches the handler:
it is audited on the request's trail and answered with the desk's 403 page (``FormRefused``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.responses import Response

from tracerag.server._auth import ReviewerAuth, Session
from tracerag.server._deps import Reviewer, ServicesDep, form_of
from tracerag.server._review_claims import ClaimBoard, Skips
from tracerag.server._routes.desk_pages import error_page
from tracerag.server._routes.review_decisions import audit_refusal


@dataclass(frozen=True)
class DeskForm:
    """A desk form whose CSRF token is the session's, with the desk parts its handler uses."""

    fields: dict[str, str]
    session: Session
    auth: ReviewerAuth
    claims: ClaimBoard
    skips: Skips


class FormRefused(Exception):
    """A desk form refused before its handler ran; ``response`` is the page that says so."""

    def __init__(self, response: Response) -> None:
        super().__init__(f"refused form ({response.status_code})")
        self.response = response


async def form_refused(request: Request, exc: Exception) -> Response:
    """The exception handler that answers a ``FormRefused`` with its page."""
    assert isinstance(exc, FormRefused)
    return exc.response


def checked_form(what: str) -> Callable[[Request, str, Session, ServicesDep], Awaitable[DeskForm]]:
    """The dependency of a desk POST on ``/review/items/{request_id}/...``; ``what`` names the
    form in the audit note of a refusal (``"decision without CSRF token"``)."""

    async def dependency(
        request: Request, request_id: str, session: Reviewer, svc: ServicesDep
    ) -> DeskForm:
        auth, claims, skips = svc.auth, svc.claims, svc.skips
        assert auth is not None and claims is not None and skips is not None  # a desk app's
        fields = await form_of(request, svc)
        if not auth.check_csrf(session, fields.get("csrf")):
            await audit_refusal(svc, request_id, session.reviewer, f"{what} without CSRF token")
            raise FormRefused(
                error_page(svc, 403, "Forbidden", "The form was not sent from this desk.", session)
            )
        return DeskForm(fields, session, auth, claims, skips)

    return dependency


DecisionForm = Annotated[DeskForm, Depends(checked_form("decision"))]
ReleaseForm = Annotated[DeskForm, Depends(checked_form("release"))]
ClaimForm = Annotated[DeskForm, Depends(checked_form("claim"))]
SkipForm = Annotated[DeskForm, Depends(checked_form("skip"))]
CommentForm = Annotated[DeskForm, Depends(checked_form("comment"))]
AssignForm = Annotated[DeskForm, Depends(checked_form("assignment"))]

__all__ = [
    "AssignForm",
    "ClaimForm",
    "CommentForm",
    "DecisionForm",
    "DeskForm",
    "FormRefused",
    "ReleaseForm",
    "SkipForm",
    "checked_form",
    "form_refused",
]
