"""Signing in to the desk and out of it: the sign-in form with its login-CSRF nonce, the
lockout-counted token check, the session cookie, and where a person goes afterwards.

A page that needs a reviewer sends a person here (``sign_in_required``) and the review API's
client a 401 in the error shape."""

from __future__ import annotations

import asyncio
import logging
import secrets
import urllib.parse

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from tracerag.server._auth import (
    COOKIE_NAME,
    NAMED,
    SIGNIN_COOKIE,
    SIGNIN_PATH,
    valid_reviewer_name,
)
from tracerag.server._deps import (
    Reviewer,
    Services,
    ServicesDep,
    SignInRequired,
    client_of,
    credential_failed,
    desk_call,
    form_of,
    retry_after_header,
)
from tracerag.server._error_shape import problem
from tracerag.server._routes.desk_pages import error_page, page

security_log = logging.getLogger("tracerag.server.security")

router = APIRouter(prefix="/review", include_in_schema=False)


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


@router.get("/signin")
async def signin_form(request: Request, svc: ServicesDep, next: str | None = None) -> Response:
    assert svc.auth is not None
    return signin_page(request, svc, 200, None, "", safe_next(next))


@router.post("/signin")
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


@router.post("/signout")
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


__all__ = ["router", "safe_next", "same_origin", "sign_in_required", "signin_page"]
