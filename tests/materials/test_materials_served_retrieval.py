"""Served retrieval goes through the registry: every material the server answers from is known
to it (first sight, with provenance and read hits), an operator can quarantine any of them from
the command line, and a quarantined, deleted or expired material is then neither retrieved nor
cited — on every surface: the HTTP answer and its stream, the served pipeline's own invoke, and
the apps that opt in (``registry.govern(retriever)`` in a ``RAGPipeline`` or a ``wrap()``-ed
chain). The desk says whether the served retrieval consults the registry."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough
from store_fixtures import Backend, PostgresBackend

from tracerag import RAGPipeline, wrap
from tracerag._identity import hash_token
from tracerag.cli import main
from tracerag.demo.kb import build_retriever
from tracerag.demo.models.extractive import ExtractiveChatModel
from tracerag.materials import MaterialRegistry
from tracerag.server._asgi import create_app
from tracerag.testing import ScriptCall, ScriptedChatModel

GIFT = "How long is a Northwind gift card valid?"
REVIEWER = "rita-reviewer-token-0123456789"
OPERATOR = "lead-operator-token-0123456789"
CHANGES = {
    "quarantine": ["quarantine", "gift-cards", "--reason", "customers report a wrong validity"],
    "delete": ["delete", "gift-cards", "--reason", "withdrawn"],
    "expire": ["edit", "gift-cards", "--valid-until", "2020-01-01", "--reason", "ended"],
}


def url_of(backend: Backend) -> str:
    if isinstance(backend, PostgresBackend):
        return f"{backend.dsn}?options=-csearch_path%3D{backend.schema}"
    return str(backend.path)  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def operator(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from tracerag.config import reset_config

    path = tmp_path / "operators"
    path.write_text(f"lead:{hash_token(OPERATOR)}\n", "utf-8")
    monkeypatch.setenv("TRACERAG_OPERATORS_FILE", str(path))
    monkeypatch.setenv("TRACERAG_OPERATOR_TOKEN", OPERATOR)
    reset_config()
    yield
    reset_config()


def materials_cli(backend: Backend, *args: str) -> int:
    return main(["materials", *args, "--store", url_of(backend)])


def cited(response: Any) -> set[str]:
    """Every material id a Response (object or caller-view JSON) cites or gives as evidence."""
    data = response if isinstance(response, dict) else response.model_dump(mode="json")
    ids = {e["material_id"] for e in data["evidence"]}
    for claim in data.get("claims") or []:
        ids |= set(claim.get("cited_ids") or [])
        if claim.get("material_id"):
            ids.add(claim["material_id"])
    return ids


def streamed_response(client: TestClient, question: str) -> dict[str, Any]:
    reply = client.post("/v1/answer/stream", json={"question": question})
    assert reply.status_code == 200
    for block in reply.text.strip().split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if ": " in line and line[0] != ":"
        )
        if fields.get("event") == "response":
            return dict(json.loads(fields["data"]))
    raise AssertionError(f"no response event in {reply.text[:500]}")


def retrieved(registry: MaterialRegistry, request_id: str) -> list[str]:
    return [m["id"] for m in registry.store.get(request_id).materials]


def opted_in_pipeline(registry: MaterialRegistry) -> RAGPipeline:
    """An application's own RAGPipeline, opting in with one line."""
    return RAGPipeline(
        registry.govern(build_retriever(k=8), k=4),  # the one line
        ExtractiveChatModel(),
        prompt_version="app@1",
        model_version="extractive",
        n_samples=2,
        audit=None,
    )


RAG_PROMPT = ChatPromptTemplate.from_messages(
    [("human", "Answer from the numbered passages, citing them.\nQuestion: {question}\n{context}")]
)


def opted_in_chain(registry: MaterialRegistry, records: list[Any] | None = None) -> Any:
    """An application's LCEL chain, wrapped, whose retriever opts in with the same line (its
    audit records into ``records`` when given: the operator's copy of a withheld answer)."""
    retriever = registry.govern(build_retriever(k=8), k=4)  # the one line

    def numbered(docs: list[Any]) -> str:
        return "\n\n".join(f"[{i}] {d.page_content}" for i, d in enumerate(docs, 1))

    def cite_gift_cards(call: ScriptCall) -> str:  # a model that quotes the passage it has
        for line in call.prompt.splitlines():
            if line.startswith("[") and "valid for 3 years" in line:
                marker = line[1 : line.index("]")]
                return f"A Northwind gift card is valid for 3 years from purchase. [{marker}]"
        return "I don't know."

    chain = (
        {"context": retriever | numbered, "question": RunnablePassthrough()}
        | RAG_PROMPT
        | ScriptedChatModel(responder=cite_gift_cards, model_name="scripted")
        | StrOutputParser()
    )
    return wrap(chain, n_samples=2, audit=records.append if records is not None else None)


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_withheld_material_is_neither_retrieved_nor_cited_on_any_surface(
    backend: Backend, change: str
) -> None:
    store = backend.open()
    app = create_app(store=store, api_key="", review_desk=False, model="extractive")
    try:
        with TestClient(app) as client:
            registry = app.state.services.registry
            served = app.state.answerer.pipeline
            # before: every surface answers from gift-cards
            first = client.post("/v1/answer", json={"question": GIFT}).json()
            assert "gift-cards" in cited(first) and first["decision"] == "pass"
            assert "gift-cards" in cited(streamed_response(client, GIFT))
            assert "gift-cards" in cited(served.invoke(GIFT))
            assert "gift-cards" in cited(opted_in_pipeline(registry).invoke(GIFT))
            records: list[Any] = []
            opted_in_chain(registry, records).invoke(GIFT)
            # what the chain's answer cited, whether it passed or was withheld from the caller
            assert "gift-cards" in cited(records[-1]["response"])

            app.state.answerer.wait_handed_on()  # the served answers' first sight
            assert materials_cli(backend, *CHANGES[change]) == 0

            answer = client.post("/v1/answer", json={"question": GIFT}).json()
            stream = streamed_response(client, GIFT)
            for response in (answer, stream):
                assert "gift-cards" not in cited(response), response
                assert "gift-cards" not in retrieved(registry, response["request_id"])
            for response in (
                served.invoke(GIFT),
                opted_in_pipeline(registry).invoke(GIFT),
                opted_in_chain(registry).invoke(GIFT),
            ):
                assert "gift-cards" not in cited(response)
                assert "gift-cards" not in {m.material_id for m in response.evidence}
            assert registry.verify().ok, registry.verify().issues
    finally:
        store.close()


def test_every_material_the_server_answers_from_is_registered_and_can_be_quarantined(
    backend: Backend,
) -> None:
    """A served pipeline that does not retrieve through the registry: its materials are still
    registered on first sight with their provenance and read hits (so an operator can
    quarantine one that never received feedback), and the desk says its retrieval does not
    withhold them."""
    store = backend.open()
    plain = RAGPipeline(
        build_retriever(k=4),
        ExtractiveChatModel(),
        prompt_version="app@1",
        model_version="extractive",
        n_samples=2,
    )
    app = create_app(plain, store=store, api_key="", reviewers={"rita": hash_token(REVIEWER)})
    bearer = {"Authorization": f"Bearer {REVIEWER}"}
    try:
        with TestClient(app) as client:
            rid = client.post("/v1/answer", json={"question": GIFT}).json()["request_id"]
            app.state.answerer.wait_handed_on()
            registry = app.state.services.registry
            state = registry.get("gift-cards")
            assert state.current.written_by == "rule:first-sight@1"
            assert state.current.provenance.document_id == "kb://products/gift-cards"
            assert rid in [h.request_id for h in registry.reads("gift-cards")]
            assert materials_cli(backend, *CHANGES["quarantine"]) == 0
            assert registry.get("gift-cards").status == "quarantined"
            page = client.get("/review/materials", headers=bearer).text
            assert 'id="not-governed"' in page and "not known</strong> to be out of" in page
            history = client.get("/review/materials/history?id=gift-cards", headers=bearer).text
            assert "not known to be out of this server's retrieval" in history
    finally:
        store.close()
    governed_store = backend.open()
    app = create_app(store=governed_store, api_key="", reviewers={"rita": hash_token(REVIEWER)})
    try:
        with TestClient(app) as client:
            page = client.get("/review/materials", headers=bearer).text
            assert 'id="not-governed"' not in page
            assert "Out of this server's retrieval" in page
    finally:
        governed_store.close()
