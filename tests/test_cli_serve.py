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
