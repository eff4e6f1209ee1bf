
"""``POST /v1/feedback`` of ``tracerag serve``'s app over a real store on both backends."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tracerag.materials import MaterialRegistry
from tracerag.server.app import create_app

TEXT = "Unopened items can be returned within 15 days of delivery."


@pytest.fixture
def client(registry: MaterialRegistry) -> TestClient:
    app = create_app(store=registry.store, api_key="k" * 20, review_desk=False)
    app.state.services.registry = registry
    registry.store.append_record(
        {
            "request_id": "r1",
            "materials": [{"id": "ret", "text": TEXT}],
            "signals": {"citations": {"claims": [{"cited_ids": ["ret"]}]}},
            "decision": "pass",
        }
    )
    return TestClient(app)


def test_feedback_route(client: TestClient, registry: MaterialRegistry) -> None:
    headers = {"X-API-Key": "k" * 20}
    body = {"request_id": "r1", "verdict": "deny", "comment": "it is 7 days", "user": "li"}
    assert client.post("/v1/feedback", json=body).status_code == 401
    r = client.post("/v1/feedback", json=body, headers=headers)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["updates"][0]["material_id"] == "ret" and data["audit_seq"]
    assert registry.get("ret").denials == 1
    assert registry.feedback_for("r1")[0]["operator"] == "user:li"
    assert client.post("/v1/feedback", json=body, headers=headers).status_code == 409
    missing = {"request_id": "nope", "verdict": "confirm"}
    assert client.post("/v1/feedback", json=missing, headers=headers).status_code == 404
    bad = {"request_id": "r1", "verdict": "maybe"}
    assert client.post("/v1/feedback", json=bad, headers=headers).status_code == 422
    clarify = {"request_id": "r1", "verdict": "clarify", "user": "wang"}
    assert client.post("/v1/feedback", json=clarify, headers=headers).status_code == 422
