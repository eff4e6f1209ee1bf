"""The tracerag HTTP server (extra ``server``): answer API, streaming, and the review desk.

``create_app(pipeline=None, store=None, reviewer_token=None, api_key=None, ...)`` builds the
FastAPI app (``_asgi.py``); ``tracerag serve`` runs it with uvicorn (``_serve.py``). The
frontend API lives in ``_routes/api.py`` and ``_routes/sse.py``, the desk in
``_routes/desk_*.py`` and its JSON API in ``_routes/review_api.py``; what they share (the
app's services, the API key, JSON bodies, the signed-in reviewer) is in ``_deps.py``;
``_answerer.py`` runs the pipeline and stores each record; ``_error_shape.py`` holds the one
error shape; ``_desk_db.py`` the desk's state in the shared store.
``uvicorn_options()`` is how ``tracerag serve`` runs uvicorn (forwarded headers believed only from
configured proxies; requests uvicorn's parser refuses answered in the JSON error shape): pass it
to ``uvicorn.run(app, **uvicorn_options())`` when serving your own app.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - for type checkers and the API reference
    from tracerag.server._asgi import create_app
    from tracerag.server._uvicorn import uvicorn_options

__all__ = ["create_app", "uvicorn_options"]


def __getattr__(name: str) -> Any:
    # lazy: importing tracerag.server costs nothing until the app is built, and FastAPI (the
    # optional ``server`` extra) is needed only then
    if name == "create_app":
        from tracerag.server._asgi import create_app

        return create_app
    if name == "uvicorn_options":
        from tracerag.server._uvicorn import uvicorn_options

        return uvicorn_options
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
