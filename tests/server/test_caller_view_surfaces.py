"""Nothing computed from a withheld answer reaches a caller, on any surface.

Two withheld answers to one question, made to differ in everything an answer's text decides —
their words (English, Chinese), their cited ids, their number of sentences, their lengths — are
asked through every surface a caller meets: ``RAGPipeline.invoke``, ``wrap(...).invoke``,
``POST /v1/answer``, the stream's ``response`` event, an Idempotency replay (from the running
request and from the stored record, by another app on the same store) and the polled request.
Every field of every view is walked: no string (nor key) holds a word, id or number planted in
the answers, nor a hash of their text; and the two views are equal but for the request's own
ids and the verdict (``confidence``) — a field computed from the text (a claim count, a length,
a score) would differ. The operator's copy (the audit record) is walked the same way and must
hold the planted words: the walk can find what it looks for.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient
from langchain_core.documents import Document
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough
from pipeline_fixtures import FAST_RETRY
from server_fixtures import documents, make_app, make_pipeline, make_store

from tracerag import validate_response, wrap
from tracerag.contract import WITHHELD_SIGNALS, WITHHELD_VERDICT, SignalDetail
from tracerag.testing import ScriptedChatModel

QUESTION = "How fast are refunds for damaged goods?"
SUPPORTED = "Refunds for damaged goods are paid within 5 business days."
# both cite a material that was never retrieved: escalated, withheld
ANSWER_A = f"{SUPPORTED} [evil] Zorbleflax pays 8675309 quatloos per damaged parcel. [zq-4711]"
ANSWER_B = (
    "损坏商品的退款在5个工作日内支付。[evil] "
    "另外 Wobbleglyph 的 Quibbleton 说明书共有 3141592 页，请保留收据。[fake-七八九] "
    "Snarkwidget customers also receive twelve vouchers. [fake-七八九]"
)
# off the question's subject too: the relevance judgement (which of the question's words the
# answer names) differs from the others'
ANSWER_C = (
    "Glimmerquark members collect 2718 stamps. [fake-glim] 另外 光年熊猫 会员卡免费。[fake-glim]"
)
PLANTED = {
    ANSWER_A: ["Zorbleflax", "8675309", "quatloos", "zq-4711", "parcel"],
    ANSWER_B: [
        "Wobbleglyph",
        "Quibbleton",
        "3141592",
        "七八九",
        "说明书",
        "Snarkwidget",
        "voucher",
    ],
    ANSWER_C: ["Glimmerquark", "2718", "stamps", "fake-glim", "光年熊猫"],
}
ANSWERS = list(PLANTED)
#: what the caller is told of a request whatever its answer: its ids ...
PER_REQUEST = {"request_id", "trace_id", "ticket_id"}
#: ... and the verdict, as contract.caller_view documents it (yes or no, and the names of the
#: caps and of the application's rules)
VERDICT = {"/confidence"} | {
    f"/signal_detail/{name}" for name in ("citation_valid", "answers_question", "rule_check")
}
VERDICT_PREFIXES = (
    "/signal_detail/confidence_caps/",
    "/signal_detail/rules/",
    # the stream's stage events: the verify stage's verdicts, the assemble stage's confidence
    "/stages/4/signals/citation_valid",
    "/stages/4/signals/answers_question",
    "/stages/5/signals/confidence",
)
MISSING = "<missing>"
STAGES = ["register", "retrieve", "plan", "sample", "verify", "assemble"]


def _hashes(text: str) -> list[str]:
    data = text.encode("utf-8")
    digests = [hashlib.sha256(data), hashlib.sha1(data), hashlib.md5(data)]
    return [d.hexdigest()[:16] for d in digests]


def leaves(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every key and scalar of a JSON value, with its path."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield f"{path}/{key}#key", key
            yield from leaves(item, f"{path}/{key}")
    elif isinstance(value, list):
        for n, item in enumerate(value):
            yield from leaves(item, f"{path}/{n}")
    else:
        yield path, value


def found(view: Any, answer: str) -> list[str]:
    """The paths of ``view`` that carry something of ``answer``'s text."""
    pieces = [p.lower() for p in PLANTED[answer]] + _hashes(answer)
    sentences = [s for s in answer.replace("。", ". ").split(". ") if len(s) > 12]
    pieces += [hashlib.sha256(s.encode()).hexdigest()[:16] for s in sentences]
    numbers = {float(p) for p in PLANTED[answer] if p.isdigit()} | {float(len(answer))}
    hits = []
    for path, leaf in leaves(view):
        text = isinstance(leaf, str) and any(p in leaf.lower() for p in pieces)
        number = isinstance(leaf, int | float) and not isinstance(leaf, bool) and leaf in numbers
        if text or number:
            hits.append(f"{path}={leaf!r}")
    return hits


def clean(view: dict[str, Any], answer: str) -> dict[str, Any]:
    """The view, checked to hold nothing of the withheld answer; its per-request fields out."""
    assert view["decision"] == "escalate" and view["answer"] is None, view
    assert found(view, answer) == [], found(view, answer)
    validate_response(view)
    # the signals: the documented allow-list, every other one at its "not measured" default
    defaults = SignalDetail().model_dump(mode="json")
    kept = {k for k, v in view["signal_detail"].items() if defaults.get(k, MISSING) != v}
    assert kept <= WITHHELD_SIGNALS | WITHHELD_VERDICT | {"rules"}, kept
    for rule in view["signal_detail"]["rules"]:
        assert rule["detail"] == "", rule
    assert view["claims"] == view["evidence"] == view["materials"] == []
    return {k: v for k, v in view.items() if k not in PER_REQUEST}


def same_but_verdict(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Two withheld answers' views: equal field by field (a differing one was computed from the
    text); named, so a failure says which."""
    la, lb = dict(leaves(a)), dict(leaves(b))
    differing = sorted(p for p in la.keys() | lb.keys() if la.get(p, MISSING) != lb.get(p, MISSING))
    differing = [p for p in differing if p not in VERDICT and not p.startswith(VERDICT_PREFIXES)]
    assert differing == [], [(p, la.get(p, MISSING), lb.get(p, MISSING)) for p in differing]


def sse(text: str) -> list[tuple[str, Any]]:
    events = []
    for block in text.strip().split("\n\n"):
        fields = dict(
            line.split(": ", 1)
            for line in block.splitlines()
            if ": " in line and not line.startswith(":")
        )
        if "event" in fields:
            events.append((fields["event"], json.loads(fields["data"])))
    return events


def test_the_walk_finds_what_the_operator_keeps():
    records: list[dict[str, Any]] = []
    pipeline = make_pipeline([ANSWER_B], audit=lambda r: records.append(r) or True)
    response = pipeline.invoke(QUESTION)
    assert response.decision == "escalate"
    kept = records[0]["response"]
    hits = found(kept, ANSWER_B)
    for piece in ("Wobbleglyph", "七八九", "3141592", "Snarkwidget"):
        assert any(piece.lower() in hit.lower() for hit in hits), (piece, hits)
    assert len(kept["claims"]) == 3  # what the caller must not be able to count
    assert found(response.model_dump(mode="json"), ANSWER_B) == []


def test_the_library_response_of_a_withheld_answer():
    views = []
    for answer in ANSWERS:
        response = make_pipeline([answer], audit=None).invoke(QUESTION)
        views.append(clean(response.model_dump(mode="json"), answer))
    for view in views[1:]:
        same_but_verdict(views[0], view)


def _chain(llm: ScriptedChatModel) -> Any:
    from tracerag.demo.kb import build_vectorstore

    retriever = build_vectorstore(documents()).as_retriever(search_kwargs={"k": 4})
    prompt = ChatPromptTemplate.from_template("Context:\n{context}\n\nQuestion: {question}")

    def fmt(docs: list[Document]) -> str:
        return "\n\n".join(f"[{d.metadata['id']}] {d.page_content}" for d in docs)

    return (
        {"context": retriever | fmt, "question": RunnablePassthrough()}
        | prompt
        | llm
        | StrOutputParser()
    )


def test_the_wrapped_apps_response_of_a_withheld_answer():
    views = []
    for answer in ANSWERS:
        app = wrap(_chain(ScriptedChatModel(responses=[answer])), n_samples=2, retry=FAST_RETRY)
        views.append(clean(app.invoke(QUESTION).model_dump(mode="json"), answer))
    for view in views[1:]:
        same_but_verdict(views[0], view)


def _served(store: Any, answer: str) -> dict[str, dict[str, Any]]:
    """Every caller view the server gives of one withheld answer, by surface."""
    out: dict[str, dict[str, Any]] = {}
    with TestClient(make_app(store, make_pipeline([answer]))) as client:
        key = {"Idempotency-Key": f"order-{len(answer)}"}
        first = client.post("/v1/answer", json={"question": QUESTION}, headers=key)
        assert first.status_code == 200, first.text
        out["answer"] = first.json()
        again = client.post("/v1/answer", json={"question": QUESTION}, headers=key)
        assert again.headers.get("idempotency-replayed") == "true"
        out["replay"] = again.json()
        streamed = client.post("/v1/answer/stream", json={"question": QUESTION})
        events = sse(streamed.text)
        assert events[-1][0] == "response", events[-1]
        out["stream"] = events[-1][1]
        stages = [data for name, data in events if name == "stage"]
        assert [e["stage"] for e in stages] == STAGES
        assert found(stages, answer) == [], found(stages, answer)
        out["stream stages"] = {"stages": [{**e, "duration_s": None} for e in stages]}
        polled = client.get(f"/v1/requests/{out['answer']['request_id']}")
        assert polled.status_code == 200
        assert found(polled.json(), answer) == [], found(polled.json(), answer)
    # another app on the same store: the replay is read back from the stored record
    with TestClient(make_app(store, make_pipeline([answer]))) as client:
        stored = client.post("/v1/answer", json={"question": QUESTION}, headers=key)
        assert stored.headers.get("idempotency-replayed") == "true"
        out["stored replay"] = stored.json()
    return out


def test_every_server_surface_of_a_withheld_answer(tmp_path):
    by_answer = []
    for n, answer in enumerate(ANSWERS):
        (tmp_path / str(n)).mkdir()
        store = make_store(tmp_path / str(n))
        try:
            views = _served(store, answer)
        finally:
            store.close()
        stages = views.pop("stream stages")
        (verify,) = [e for e in stages["stages"] if e["stage"] == "verify"]
        assert set(verify["signals"]) == {"citation_valid", "answers_question"}, verify
        cleaned = {surface: clean(view, answer) for surface, view in views.items()}
        cleaned["stream stages"] = {
            "stages": [
                {k: v for k, v in e.items() if k not in PER_REQUEST} for e in stages["stages"]
            ]
        }
        # a replay is the answer it replays, and a stream's response the same view
        assert views["replay"]["request_id"] == views["answer"]["request_id"]
        assert views["stored replay"]["request_id"] == views["answer"]["request_id"]
        for surface in ("replay", "stream", "stored replay"):
            same_but_verdict(cleaned["answer"], cleaned[surface])
        by_answer.append(cleaned)
    for other in by_answer[1:]:
        same_but_verdict(by_answer[0]["answer"], other["answer"])
        same_but_verdict(by_answer[0]["stream stages"], other["stream stages"])
