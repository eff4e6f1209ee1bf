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
    from tracerag.server._materials import governs

    # the served demo retrieval goes through the store's material registry
    assert governs(app.state.answerer.pipeline, app.state.services.registry)
    with TestClient(app) as client:
        assert client.get("/review").status_code == 401
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

    from tracerag.server.auth import read_reviewers_file

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
    from tracerag.server.auth import hash_token

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
