"""The desk's pages: a template rendered with the reviewer's name and CSRF token, the error
page, and the links and times the pages show."""

from __future__ import annotations

import urllib.parse
from datetime import datetime, timezone
from typing import Any

from fastapi.responses import HTMLResponse

from tracerag.server._auth import Session
from tracerag.server._deps import Services
from tracerag.server._views import lang_of, when


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


def when_epoch(seconds: float) -> str:
    return when(datetime.fromtimestamp(seconds, tz=timezone.utc).isoformat())


def item_link(request_id: str, **query: str) -> str:
    """The desk page of an item (with query parameters)."""
    path = f"/review/items/{urllib.parse.quote(request_id, safe='')}"
    return path + ("?" + urllib.parse.urlencode(query) if query else "")


def next_link(after: str | None = None) -> str:
    return "/review/next" + ("?" + urllib.parse.urlencode({"after": after}) if after else "")


__all__ = ["error_page", "item_link", "next_link", "page", "when_epoch"]
