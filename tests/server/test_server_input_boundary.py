"""Over HTTP, text the pipeline refuses is a 422 with the project's error shape, stored nowhere."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient
from server_fixtures import GOOD_ANSWER, make_app, make_pipeline, make_store


@pytest.fixture
def store(tmp_path):
    s = make_store(tmp_path)
    yield s
    s.close()


@pytest.mark.parametrize(
    "body",
    [
        b'{"question": "How long? \\ud800"}',
        b'{"question": "q?", "session_id": "\\udfff"}',
        b'{"question": "\\u200b\\u200c\\u200d\\ufeff"}',
    ],
)
@pytest.mark.parametrize("path", ["/v1/answer", "/v1/answer/stream"])
def test_invalid_or_invisible_text_is_a_422(store, path, body):
    with TestClient(make_app(store, make_pipeline([GOOD_ANSWER]))) as client:
        reply = client.post(path, content=body, headers={"Content-Type": "application/json"})
    assert reply.status_code == 422, reply.text
    assert reply.json()["error"] == "invalid_input" and reply.json()["detail"]
    assert store.list_requests() == []
