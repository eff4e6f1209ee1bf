"""``tracerag serve``: refuses to run the review desk open; builds the app it is asked for."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

from tracerag import cli


@pytest.fixture
def served(monkeypatch):
    """Capture what ``tracerag serve`` would hand to uvicorn instead of serving it."""
    import uvicorn

    calls = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append((app, kw)))
    return calls


def test_serve_refuses_without_a_reviewer_token(served, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("TRACERAG_REVIEWER_TOKEN", raising=False)
    code = cli.main(["serve", "--store", str(tmp_path / "a.sqlite")])
    assert code == 2 and served == []
    err = capsys.readouterr().err
    assert "TRACERAG_REVIEWER_TOKEN" in err and "--no-review-desk" in err


def test_serve_binds_loopback_with_the_token(served, tmp_path, monkeypatch):
    monkeypatch.setenv("TRACERAG_REVIEWER_TOKEN", "a-long-enough-reviewer-token")
    assert cli.main(["serve", "--store", str(tmp_path / "a.sqlite"), "--port", "8123"]) == 0
    ((app, options),) = served
    assert options["host"] == "127.0.0.1" and options["port"] == 8123
    from tracerag.server._registry_wiring import governs

    # the served demo retrieval goes through the store's material registry
    assert governs(app.state.answerer.pipeline, app.state.services.registry)
    with TestClient(app) as client:
        signed_out = client.get("/review", follow_redirects=False)
        assert signed_out.status_code == 303  # to the sign-in page, and back
        reply = client.post("/v1/answer", json={"question": "登录密码输错几次会锁定账户？"})
        assert reply.status_code == 200 and reply.json()["decision"] == "pass"


def test_serve_without_the_desk(served, tmp_path, monkeypatch):
    monkeypatch.delenv("TRACERAG_REVIEWER_TOKEN", raising=False)
    args = ["serve", "--store", str(tmp_path / "a.sqlite"), "--no-review-desk", "--samples", "2"]
    assert cli.main(args) == 0
    ((app, _),) = served
    with TestClient(app) as client:
        assert client.get("/review").status_code == 404
        assert client.get("/healthz").json() == {"ok": True, "review_desk": False}


def test_serve_rejects_a_webhook_that_is_not_a_url(served, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRACERAG_REVIEWER_TOKEN", "a-long-enough-reviewer-token")
    args = ["serve", "--store", str(tmp_path / "a.sqlite"), "--webhook", "ftp://x"]
    assert cli.main(args) == 2
    assert "http(s) URL" in capsys.readouterr().err


def test_hash_token_prints_a_reviewers_file_line(monkeypatch, capsys, tmp_path):
    import io

    from tracerag.server._auth import read_reviewers_file

    monkeypatch.setattr("sys.stdin", io.StringIO("a-strong-token-for-李伟-0001\n"))
    assert cli.main(["serve", "--hash-token", "李伟"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("李伟:sha256:") and "a-strong-token" not in line
    path = tmp_path / "reviewers"
    path.write_text(line + "\n", encoding="utf-8")
    assert list(read_reviewers_file(path)) == ["李伟"]


def test_hash_token_refuses_a_weak_token(monkeypatch, capsys):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("a" * 16 + "\n"))
    assert cli.main(["serve", "--hash-token", "alice"]) == 2
    assert "different characters" in capsys.readouterr().err


def test_serve_logs_store_failures_at_warning_by_default(served, tmp_path, monkeypatch, capfd):
    import logging

    monkeypatch.delenv("TRACERAG_REVIEWER_TOKEN", raising=False)
    args = ["serve", "--store", str(tmp_path / "a.sqlite"), "--no-review-desk"]
    assert cli.main(args) == 0
    logger = logging.getLogger("tracerag")
    try:
        assert logger.getEffectiveLevel() == logging.WARNING
        logging.getLogger("tracerag.server").warning("audit store failed for request r1")
        logging.getLogger("tracerag.server").info("not shown")
        err = capfd.readouterr().err
        assert "WARNING tracerag.server: audit store failed for request r1" in err
        assert "not shown" not in err
    finally:
        for handler in [h for h in logger.handlers if getattr(h, "_tracerag_serve", False)]:
            logger.removeHandler(handler)
        logger.propagate = True
        logger.setLevel(logging.NOTSET)


def test_serve_takes_cors_origins_and_named_reviewers(served, tmp_path, monkeypatch):
    from tracerag.server._auth import hash_token

    monkeypatch.delenv("TRACERAG_REVIEWER_TOKEN", raising=False)
    reviewers = tmp_path / "reviewers"
    reviewers.write_text(f"alice:{hash_token('alices-own-token-0123456')}\n", encoding="utf-8")
    args = [
        "serve",
        "--store",
        str(tmp_path / "a.sqlite"),
        "--reviewers-file",
        str(reviewers),
        "--cors-origin",
        "http://127.0.0.1:5173",
    ]
    assert cli.main(args) == 0
    ((app, _),) = served
    with TestClient(app) as client:
        reply = client.options(
            "/v1/answer",
            headers={"Origin": "http://127.0.0.1:5173", "Access-Control-Request-Method": "POST"},
        )
        assert reply.headers["access-control-allow-origin"] == "http://127.0.0.1:5173"
        queue = client.get(
            "/review/api/queue", headers={"Authorization": "Bearer alices-own-token-0123456"}
        )
        assert queue.status_code == 200


def test_serve_believes_forwarded_headers_only_from_configured_proxies(
    served, tmp_path, monkeypatch
):
    """Issue 22: uvicorn believes X-Forwarded-For from 127.0.0.1 unless told otherwise."""
    store = str(tmp_path / "a.sqlite")
    monkeypatch.delenv("TRACERAG_FORWARDED_ALLOW_IPS", raising=False)
    assert cli.main(["serve", "--store", store, "--no-review-desk"]) == 0
    assert (
        cli.main(
            ["serve", "--store", store, "--no-review-desk", "--forwarded-allow-ips", "10.0.0.5"]
        )
        == 0
    )
    monkeypatch.setenv("TRACERAG_FORWARDED_ALLOW_IPS", "10.0.0.0/8, 192.168.1.1")
    assert cli.main(["serve", "--store", store, "--no-review-desk"]) == 0
    options = [kw for _, kw in served]
    assert options[0]["proxy_headers"] is False
    assert (options[1]["proxy_headers"], options[1]["forwarded_allow_ips"]) == (True, "10.0.0.5")
    assert options[2]["forwarded_allow_ips"] == "10.0.0.0/8,192.168.1.1"
    assert all(o["http"].__name__ == "JsonErrorProtocol" for o in options)


def test_serve_needs_a_journal_for_a_store_that_can_be_down(served, tmp_path, monkeypatch):
    """The check is the app's: a networked store without a journal is refused, unless told."""
    from tracerag.errors import ConfigurationError
    from tracerag.server._asgi import _journal_for
    from tracerag.store._sqlite import SQLiteAuditStore

    class Networked(SQLiteAuditStore):
        networked = True

    monkeypatch.delenv("TRACERAG_AUDIT_JOURNAL", raising=False)
    store = Networked(":memory:")
    with pytest.raises(ConfigurationError, match="TRACERAG_AUDIT_JOURNAL"):
        _journal_for(store, None)
    assert _journal_for(store, False) is None
    assert _journal_for(store, tmp_path / "j") == str(tmp_path / "j")
    monkeypatch.setenv("TRACERAG_AUDIT_JOURNAL", str(tmp_path / "env"))
    assert _journal_for(store, None) == str(tmp_path / "env")
    store.close()


# -- serve --app ---------------------------------------------------------------------------------

APP_MODULE = """
from langchain_core.documents import Document
from pipeline_fixtures import FAST_RETRY, POLICIES
from wrap_apps import cite_returns, tutorial_graph

from tracerag import wrap
from tracerag.demo.kb import build_vectorstore
from tracerag.testing import ScriptedChatModel


def graph():
    docs = [Document(page_content=d.page_content, metadata=dict(d.metadata)) for d in POLICIES]
    llm = ScriptedChatModel(responder=cite_returns, model_name="scripted-served")
    return tutorial_graph(build_vectorstore(docs), llm)


def build_app():
    return wrap(graph(), n_samples=2, retry=FAST_RETRY)


def broken():
    raise RuntimeError("no model configured")


class Holder:
    app = None


app = build_app()
Holder.app = app
unwrapped = graph()
not_an_app = 42
"""


@pytest.fixture
def app_module(tmp_path, monkeypatch):
    """A module in its own directory holding a wrapped LangGraph app; yields its name."""
    import sys
    import uuid

    name = f"served_{uuid.uuid4().hex[:8]}"
    (tmp_path / "apps").mkdir()
    (tmp_path / "apps" / f"{name}.py").write_text(APP_MODULE, encoding="utf-8")
    monkeypatch.setenv("TRACERAG_REVIEWER_TOKEN", "a-long-enough-reviewer-token")
    yield name
    sys.modules.pop(name, None)


def serve_app(tmp_path, *args: str) -> int:
    argv = ["serve", "--store", str(tmp_path / "a.sqlite"), "--app-dir", str(tmp_path / "apps")]
    return cli.main([*argv, *args])


@pytest.mark.parametrize("target", ["{m}:app", "{m}:Holder.app", "{m}:build_app --factory"])
def test_serve_app_serves_a_wrapped_langgraph_app(served, tmp_path, app_module, target):
    assert serve_app(tmp_path, "--app", *target.format(m=app_module).split()) == 0
    ((app, _),) = served
    with TestClient(app) as client:
        reply = client.post("/v1/answer", json={"question": "How many days do I have to return?"})
        assert reply.status_code == 200, reply.text
        body = reply.json()
        record = client.app.state.store.get(body["request_id"]).record
    assert body["decision"] == "pass" and "30 days" in body["answer"]
    assert record["retrieval"]["source"] == "runs"  # the graph's own retrieval, not the demo's
    assert record["versions"]["model"] == "scripted-served"


@pytest.mark.parametrize(
    ("target", "said"),
    [
        ("{m}:nope", "module '{m}' has no attribute 'nope'"),
        ("no_such_module_here:app", "no module named 'no_such_module_here'"),
        ("{m}", 'is not module:attribute; give it as "module:attribute"'),
        ("{m}:app()", "is not module:attribute"),
        ("{m}:not_an_app", "{m}:not_an_app is a builtins.int, not a wrap()-ed app or a"),
        ("{m}:unwrapped", "tracerag serves it once wrapped: app = tracerag.wrap(graph)"),
        ("{m}:build_app", "add --factory to call it"),
        ("{m}:broken --factory", "calling the factory {m}:broken() failed: RuntimeError: no model"),
        ("{m}:not_an_app --factory", "--factory calls {m}:not_an_app, but it is a builtins.int"),
        ("{m}:unwrapped --factory", "is a langgraph.graph.state.CompiledStateGraph, not a"),
        ("{m}:app --samples 3", "--samples set the demo pipeline; with --app the app's own"),
    ],
)
def test_serve_app_says_what_is_wrong_with_the_target(
    served, tmp_path, app_module, capsys, target, said
):
    code = serve_app(tmp_path, "--app", *target.format(m=app_module).split())
    assert code == 2 and served == []
    err = capsys.readouterr().err
    assert err.startswith("tracerag serve: ") and said.format(m=app_module) in err, err


def test_serve_app_names_the_dependency_a_module_lacks(served, tmp_path, monkeypatch, capsys):
    import sys

    (tmp_path / "apps").mkdir()
    (tmp_path / "apps" / "needs_more.py").write_text("import not_installed_pkg_x\n", "utf-8")
    monkeypatch.setenv("TRACERAG_REVIEWER_TOKEN", "a-long-enough-reviewer-token")
    try:
        assert serve_app(tmp_path, "--app", "needs_more:app") == 2
    finally:
        sys.modules.pop("needs_more", None)
    assert "needs the module 'not_installed_pkg_x', which is not installed" in (
        capsys.readouterr().err
    )


def test_factory_needs_an_app(served, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRACERAG_REVIEWER_TOKEN", "a-long-enough-reviewer-token")
    assert cli.main(["serve", "--store", str(tmp_path / "a.sqlite"), "--factory"]) == 2
    assert "--factory goes with --app" in capsys.readouterr().err
