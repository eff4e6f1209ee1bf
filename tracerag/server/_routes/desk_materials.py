"""The desk's materials view: pending writes to approve or reject (with the write gate's
reasons), quarantines the denial rule proposed to confirm or dismiss, open conflicts,
quarantined materials to restore, and each material's history. Whether quarantined materials
are out of this server's retrieval is said as it is (``tracerag.server._registry_wiring``).

Approve, reject and restore go through the registry's audited write path, exactly as
``tracerag materials approve|reject|restore`` do, under the signed-in reviewer's identity and
how it was established (a named token). A session signed in with the shared token sees the view
but cannot change a material: the shared token does not prove a name. Forms carry the session's
CSRF token, like every desk form.
"""

from __future__ import annotations

import logging
import urllib.parse
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from tracerag._identity import DESK_NAMED, OperatorIdentity, fingerprint
from tracerag.materials import (
    ConcurrentChange,
    InvalidTransition,
    MaterialNotFound,
)
from tracerag.server._auth import NAMED, Session
from tracerag.server._deps import Reviewer, Services, ServicesDep, form_of, store_call, text_problem
from tracerag.server._error_shape import ApiError
from tracerag.server._registry_wiring import retrieval_governed
from tracerag.server._routes.desk_pages import error_page, page
from tracerag.server._views import MATERIAL_ACTIONS, material_history, materials_overview

if TYPE_CHECKING:
    from tracerag.materials import MaterialRegistry

logger = logging.getLogger("tracerag.server")
security_log = logging.getLogger("tracerag.server.security")

materials = APIRouter(prefix="/review/materials", include_in_schema=False)


def history_link(material_id: str) -> str:
    """The history page of a material."""
    return "/review/materials/history?" + urllib.parse.urlencode({"id": material_id})


SHARED_CANNOT_CHANGE = (
    "A material change is recorded under the reviewer's authenticated identity, and the shared "
    "token does not prove a name: sign in with your own reviewer token to approve, reject, "
    "quarantine, dismiss or restore materials."
)


def desk_identity(svc: Services, session: Session) -> OperatorIdentity:
    """A named reviewer as the operator of a material change, with the token's fingerprint."""
    assert svc.auth is not None and session.kind == NAMED
    digest = svc.auth.reviewers.get(session.reviewer)
    return OperatorIdentity(session.reviewer, DESK_NAMED, fingerprint(digest) if digest else None)


async def _registry(svc: Services) -> MaterialRegistry:
    try:
        return await store_call(svc, svc.materials)
    except ApiError:
        raise
    except Exception as exc:  # e.g. an in-memory store cannot hold one
        raise ApiError(
            503, "no_registry", f"this store has no material registry ({type(exc).__name__})"
        ) from None


@materials.get("")
async def materials_page(session: Reviewer, svc: ServicesDep) -> Response:
    registry = await _registry(svc)
    overview = await store_call(svc, materials_overview, registry)
    return page(
        svc,
        "materials.html",
        session=session,
        history_link=history_link,
        may_change=session.kind == NAMED,
        governed=retrieval_governed(svc),
        **overview,
    )


async def history_response(
    svc: Services,
    session: Session,
    material_id: str,
    status: int = 200,
    error: str | None = None,
    entered: dict[str, str] | None = None,
) -> Response:
    registry = await _registry(svc)
    try:
        context = await store_call(svc, material_history, registry, material_id)
    except MaterialNotFound:
        return error_page(
            svc, 404, "Not found", f"No material {material_id!r}.", session, "/review/materials"
        )
    return page(
        svc,
        "material.html",
        status,
        session,
        error=error,
        entered=entered or {},
        history_link=history_link,
        may_change=session.kind == NAMED,
        governed=retrieval_governed(svc),
        **context,
    )


@materials.get("/history")
async def history_page(request: Request, session: Reviewer, svc: ServicesDep) -> Response:
    material_id = (request.query_params.get("id") or "").strip()
    if not material_id:
        return RedirectResponse("/review/materials", status_code=303)
    return await history_response(svc, session, material_id)


@materials.post("/action")
async def action_form(request: Request, session: Reviewer, svc: ServicesDep) -> Response:
    """Approve or reject a pending write, confirm (quarantine) or dismiss a proposed
    quarantine, or restore a quarantined material."""
    assert svc.auth is not None
    form = await form_of(request, svc)
    material_id = form.get("material_id", "").strip()
    action = form.get("action", "")
    if not svc.auth.check_csrf(session, form.get("csrf")):
        security_log.warning(
            "refused material %s without CSRF token for %s on %s",
            action or "?",
            session.reviewer,
            material_id or "?",
        )
        return error_page(svc, 403, "Forbidden", "The form was not sent from this desk.", session)
    back = history_link(material_id) if material_id else "/review/materials"
    reason = form.get("reason", "").strip()
    entered = {"reason": form.get("reason", ""), "action": action}
    problem = None
    if action not in MATERIAL_ACTIONS:
        problem = f"choose one of {', '.join(MATERIAL_ACTIONS)}"
    elif not reason:
        problem = f"say why you {action} it (the reason is recorded)"
    else:
        problem = text_problem("the reason", reason)
    if not material_id:
        return error_page(svc, 404, "Not found", "No material was named.", session, back)
    if session.kind != NAMED:
        security_log.warning(
            "refused material %s of %s for %s: signed in with the shared token",
            action or "?",
            material_id,
            session.reviewer,
        )
        return error_page(svc, 403, "Forbidden", SHARED_CANNOT_CHANGE, session, back)
    if problem:
        return await history_response(svc, session, material_id, 422, problem, entered)
    registry = await _registry(svc)
    who = desk_identity(svc, session)
    try:
        version = await store_call(
            svc, registry.transition, material_id, action, operator=who, reason=reason
        )
    except MaterialNotFound:
        return error_page(svc, 404, "Not found", f"No material {material_id!r}.", session, back)
    except (InvalidTransition, ValueError) as exc:
        return await history_response(svc, session, material_id, 422, str(exc), entered)
    except ConcurrentChange as exc:
        return error_page(svc, 409, "Changed meanwhile", str(exc), session, back)
    logger.info(
        "material %s v%s: %s by %s (%s)",
        material_id,
        version.version,
        action,
        who.name,
        who.method,
    )
    target = form.get("next", "")
    if target != "/review/materials":
        target = back
    return RedirectResponse(target, status_code=303)


__all__ = ["materials"]
