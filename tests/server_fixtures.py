"""Shared pieces for the server tests: a store, pipelines (one fed a hostile document), an app.

Import what a test module needs: ``from server_fixtures import TOKEN, make_app, ...``.
"""

from __future__ import annotations

import os
import re
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from langchain_core.documents import Document
from pipeline_fixtures import FAST_RETRY, POLICIES
from waiting import WaitTimeout, responds, wait_until

from tracerag._pipeline import RAGPipeline
from tracerag.store._sqlite import SQLiteAuditStore
from tracerag.testing import ScriptedChatModel

TOKEN = "reviewer-token-for-tests-0123456789"
API_KEY = "frontend-key-for-tests-0123"

# A retrieved document is untrusted: this one tries to run script in a reviewer's browser.
EVIL_TEXT = (
    "This policy covers goods that arrive damaged. "
    "Refunds for damaged goods are paid within 5 business days. "
    "<script>window.__pwned = 1; alert('script ran')</script>"
    "<img src=x onerror=\"window.__pwned = 2; alert('onerror ran')\"> "
    "Keep the receipt of the damaged goods."
)
EVIL = Document(
    page_content=EVIL_TEXT,
    metadata={
        "id": "evil",
        "title": 'Damaged goods <img src=x onerror="window.__pwned = 3">',
        "source": "kb://evil",
    },
)
SUPPORTED_SENTENCE = "Refunds for damaged goods are paid within 5 business days."
# The model repeats hostile markup and cites a material that was never retrieved: escalated.
EVIL_ANSWER = (
    f"{SUPPORTED_SENTENCE} [evil] "
    "<img src=x onerror=\"window.__pwned = 4; alert('answer ran')\"> Keep the receipt. [policy-99]"
)
EVIL_QUESTION = (
    "How fast are refunds for damaged goods? <script>window.__pwned = 5; alert('q')</script>"
)
EVIL_PLAN = '{"material_ids": ["evil"], "key_facts": ["5 business days"]}'
GOOD_ANSWER = (
    "Customers may return unused items within 30 days of delivery for a full refund. [returns]"
)
GOOD_QUESTION = "How many days do I have to return an item?"


def documents() -> list[Document]:
    """The test policies plus the hostile document."""
    docs = [Document(page_content=d.page_content, metadata=dict(d.metadata)) for d in POLICIES]
    return [*docs, Document(page_content=EVIL.page_content, metadata=dict(EVIL.metadata))]


def make_pipeline(
    answers: list[str] | None = None,
    tracer_provider: Any = None,
    latency: float = 0.0,
    **options: Any,
) -> RAGPipeline:
    """A pipeline over real documents in a real vector store, with a scripted model."""
    from tracerag.demo.kb import build_vectorstore

    retriever = build_vectorstore(documents()).as_retriever(search_kwargs={"k": 4})
    llm = ScriptedChatModel(
        responses=answers or [EVIL_ANSWER],
        plan_responses=[EVIL_PLAN],
        latency=latency,
    )
    settings: dict[str, Any] = {
        "prompt_version": "test-prompt-v1",
        "model_version": llm.model_name,
        "n_samples": 3,
        "retry": FAST_RETRY,
        "tracer_provider": tracer_provider,
        "audit": None,
    }
    settings.update(options)
    return RAGPipeline(retriever, llm, **settings)


def make_store(tmp_path: Any) -> SQLiteAuditStore:
    """A fresh SQLite audit store in the test's directory."""
    return SQLiteAuditStore(str(tmp_path / "audit.sqlite"))


def make_app(store: Any, pipeline: Any = None, **options: Any) -> Any:
    """The app over a store, with the test reviewer token unless told otherwise."""
    from tracerag.server._asgi import create_app

    options.setdefault("reviewer_token", TOKEN)
    return create_app(pipeline if pipeline is not None else make_pipeline(), store, **options)


def csrf_of(html: str) -> str:
    """The CSRF token in a reviewer page's form."""
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match, "no CSRF field on the page"
    return match.group(1)


def signin_form(client: Any, **fields: str) -> dict[str, str]:
    """The sign-in form's fields as the desk's page gives them (its CSRF token; the client
    keeps the form's nonce cookie), with ``fields`` (reviewer, token, next)."""
    page = client.get("/review/signin")
    assert page.status_code == 200, page.text
    return {"csrf": csrf_of(page.text), **fields}


def signin_cookie(app: Any, nonce: str = "a-test-nonce-0123456789") -> tuple[dict[str, str], str]:
    """For a client that keeps no cookies: the sign-in form's nonce cookie (as a header) and the
    CSRF token that goes with it."""
    return {"Cookie": f"tracerag_signin={nonce}"}, app.state.services.auth.signin_csrf(nonce)


def sign_in(client: Any, name: str = "alice", token: str = TOKEN) -> None:
    """Sign a TestClient in as a reviewer (cookie), through the sign-in form."""
    form = signin_form(client, reviewer=name, token=token)
    reply = client.post("/review/signin", data=form, follow_redirects=False)
    assert reply.status_code == 303, reply.text


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running(app: Any, timeout: float = 20.0) -> Iterator[str]:
    """Serve an app with uvicorn on 127.0.0.1 in a background thread; yields its base URL."""
    import uvicorn

    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="test-uvicorn", daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if not thread.is_alive():
            raise RuntimeError("the test server did not start: its thread ended")
        return responds(base + "/healthz", timeout=1.0)

    try:
        wait_until(up, "the test server to start", timeout=timeout, interval=0.05)
    except (WaitTimeout, RuntimeError) as exc:
        server.should_exit = True
        raise RuntimeError(f"the test server did not start: {exc}") from exc
    try:
        yield base
    finally:
        server.should_exit = True
        thread.join(timeout)


BEARER_TOKEN_HEADER = {"Authorization": f"Bearer {TOKEN}"}


# -- real browsers and a real frontend toolchain ----------------------------------------------

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
FRONTEND = os.path.join(os.path.dirname(__file__), "frontend")


def skip_or_fail(problem: str) -> None:
    """Skip a test for a missing tool locally; fail it under CI (env ``CI`` set)."""
    import pytest

    if os.environ.get("CI"):
        pytest.fail(f"cannot run under CI: {problem}", pytrace=False)
    pytest.skip(problem)


def browser_missing() -> str | None:
    """Why Chromium cannot be driven here, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (bash .ci/browser.sh)"
    if not os.access(CHROMIUM, os.X_OK):
        return f"{CHROMIUM} is not installed (bash .ci/browser.sh)"
    return None


def frontend_missing() -> str | None:
    """Why the TypeScript toolchain of tests/frontend is not usable, or None."""
    for tool in ("tsc", "openapi-typescript"):
        if not os.access(os.path.join(FRONTEND, "node_modules", ".bin", tool), os.X_OK):
            return f"{tool} is not installed (bash .ci/frontend.sh)"
    return None


@contextmanager
def static_site(directory: str) -> Iterator[str]:
    """Serve a directory over HTTP on another 127.0.0.1 port (another origin); yields its URL."""
    import http.server

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=directory, **kwargs)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, name="test-static", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
