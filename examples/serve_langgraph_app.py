"""Serve a wrapped LangGraph app over HTTP with ``tracerag serve --app``, offline.

The app is LangChain's RAG tutorial graph (``retrieve`` → ``generate`` over a
``{"question", "context", "answer"}`` state) on the bundled demo knowledge base, with
``ExtractiveChatModel`` (no API key, no model weights), built by ``wrap_langgraph_app.py``.
``app`` is what the server runs: the graph wrapped by ``tracerag.wrap``, the way
``uvicorn module:app`` finds an ASGI app.

    tracerag serve --app examples.serve_langgraph_app:app --no-review-desk
    curl -s localhost:8000/v1/answer -H 'Content-Type: application/json' \\
         -d '{"question": "How long is a Northwind gift card valid?"}'

``build_app`` builds the same app on each call, for ``--factory``:

    tracerag serve --app examples.serve_langgraph_app:build_app --factory --no-review-desk

Needs ``pip install langgraph`` and the demo extra (``pip install -e ".[demo,server]"``).
"""

from __future__ import annotations

import tracerag
from examples.wrap_langgraph_app import build_graph  # the tutorial graph, as wrapped there


def build_app() -> tracerag.WrappedChain:
    """The wrapped graph: five samples per question, every citation checked, then routed."""
    return tracerag.wrap(build_graph(), n_samples=5)


app = build_app()
