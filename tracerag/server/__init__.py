"""The tracerag HTTP server (extra ``server``): answer API, streaming, and the review desk.

``create_app(pipeline=None, store=None, reviewer_token=None, api_key=None, ...)`` builds the
FastAPI app (see ``tracerag.server.app``); ``tracerag serve`` runs it with uvicorn.
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from tracerag.server.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
