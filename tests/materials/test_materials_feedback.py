"""Closing the loop on both backends: a real pipeline over the reranking retriever, feedback
that moves credibility (by attribution share when there is one), quarantine after denials, and
trace-back from a complained-about request to the write that caused it."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.documents import Document

from tracerag import RAGPipeline
from tracerag.materials import MaterialRegistry
from tracerag.materials._investigate import impact, trace_back
from tracerag.materials._rerank import CredibilityRetriever
from tracerag.materials.feedback import (
    DuplicateFeedback,
    record_feedback,
    record_review_outcome,
    record_usage,
    relied_on,
)
from tracerag.store import RequestNotFound
from tracerag.store._audit_record import AuditRecord
from tracerag.testing import ScriptedChatModel

QUESTION = "How many days do I have to return an item?"
BAD_MEMO = "Customers may return unused items within 60 days of delivery."
ANSWER = "Customers may return unused items within 60 days of delivery. [memo-60]"
PLAN = '{"material_ids": ["memo-60"], "key_facts": ["60 days"]}'


@pytest.fixture
def kb(documents: list[Document]) -> list[Document]:
    return [*documents, Document(page_content=BAD_MEMO, metadata={"id": "memo-60"})]


def pipeline(registry: MaterialRegistry, kb: list[Document], answer: str = ANSWER) -> RAGPipeline:
    from tracerag.demo.kb import build_vectorstore

    inner = build_vectorstore(kb).as_retriever(search_kwargs={"k": 6})

    def sink(record: dict[str, Any]) -> bool:
        registry.store.append_record(record)
        record_usage(record, registry=registry)
        return True

    return RAGPipeline(
        CredibilityRetriever(retriever=inner, registry=registry),
        ScriptedChatModel(responses=[answer], plan_responses=[PLAN]),
        prompt_version="test-prompt-v1",
        model_version="scripted",
        n_samples=2,
        audit=sink,
    )


def test_trace_back_finds_the_causing_write_in_one_call(
    registry: MaterialRegistry,
    kb: list[Document],
) -> None:
    with registry.batch() as batch:
        registry.register(
            "memo-60",
            BAD_MEMO,
            operator="agent-9",
            written_by="memory-writer@2",
            source_snippet="chat 2026-05-01: agent-9 noted a 60-day window",
            gate=False,
        )
    response = pipeline(registry, kb).invoke(QUESTION)
    rid = response.request_id
    record_feedback(rid, "deny", "the window is 30 days", registry=registry, operator="cust-1")

    tb = trace_back(registry, rid)
    assert tb.suspect is not None and tb.suspect.material_id == "memo-60"
    write = tb.suspect.write
    assert write is not None and write.version.version == tb.suspect.used_version == 1
    assert (write.version.operator, write.version.written_by) == ("agent-9", "memory-writer@2")
    assert write.version.batch_id == batch and write.audit_seq is not None
    assert write.version.source_snippet.startswith("chat 2026-05-01")
    assert [f["verdict"] for f in tb.feedback] == ["deny"]
    assert tb.to_dict()["suspect"] == "memo-60"
    # and back: the impact of that version
    (hit,) = impact(registry, "memo-60", 1)
    assert hit.hit.request_id == rid and hit.hit.cited and hit.feedback == ("deny",)
    assert hit.hit.complained


def test_denials_quarantine_and_the_material_leaves_retrieval(
    registry: MaterialRegistry,
    kb: list[Document],
) -> None:
    rag = pipeline(registry, kb)
    rids = [rag.invoke(QUESTION).request_id for _ in range(3)]
    before = registry.get("memo-60").ema
    r1 = record_feedback(rids[0], "deny", "wrong", registry=registry, operator="c1")
    (update,) = r1.updates
    assert update.material_id == "memo-60" and update.share == 1.0
    assert update.ema_after == pytest.approx(before * (1 - registry.policy.rate), abs=1e-12)
    with pytest.raises(DuplicateFeedback):
        record_feedback(rids[0], "deny", "again", registry=registry, operator="c1")
    record_feedback(rids[1], "deny", None, registry=registry, operator="c2")
    r3 = record_feedback(rids[2], "deny", None, registry=registry, operator="c3")
    # the verdicts propose the quarantine; it stays in retrieval (answers citing it go to
    # review) until a person confirms it
    assert r3.proposed == ["memo-60"]
    state = registry.get("memo-60")
    assert state.status == "active" and state.proposed_quarantine
    assert registry.usage("memo-60", 1).denials == 3  # counted on the version used
    proposed = rag.invoke(QUESTION)
    assert proposed.decision != "pass"
    assert "memo-60" in [m["id"] for m in registry.store.get(proposed.request_id).materials]
    registry.quarantine("memo-60", operator="lead", reason="confirmed: the window is 30 days")
    after = rag.invoke(QUESTION)
    materials = registry.store.get(after.request_id).materials
    assert "memo-60" not in [m["id"] for m in materials]
    # the feedback is in the request's own chained trail
    trail = registry.store.get(rids[2])
    feedback = [a for a in trail.actions if a.kind == "operator_action"]
    assert feedback[-1].payload["feedback"]["proposed_quarantine"] == ["memo-60"]
    assert trail.actions[-1].kind == "explanation_requested"  # a denial queues an explanation
    assert registry.store.verify_chain().ok and registry.verify().ok
    with pytest.raises(RequestNotFound):
        record_feedback("no-such-request", "confirm", registry=registry)


def test_clarify_writes_a_held_correction(
    registry: MaterialRegistry,
    kb: list[Document],
) -> None:
    rid = pipeline(registry, kb).invoke(QUESTION).request_id
    with pytest.raises(ValueError):
        record_feedback(rid, "clarify", "no correction", registry=registry)
    result = record_feedback(
        rid, "clarify", "window", correction="退货期限为签收后30天。", registry=registry
    )
    correction = registry.get(result.correction_id)
    assert correction.status == "pending_review"
    assert correction.current.provenance.source_type == "user_input"
    assert correction.current.provenance.parents == ("memo-60",)
    assert registry.get("memo-60").ema == pytest.approx(0.6 + 0.2 * (0.5 - 0.6), abs=1e-12)


def test_attribution_shares_weight_the_update() -> None:
    record = {
        "materials": [{"id": "a", "text": "x"}, {"id": "b", "text": "y"}, {"id": "c", "text": "z"}],
        "signals": {
            # as tracerag.signals.attribution.Attribution.to_record() writes it
            "attribution": {
                "materials": [
                    {"id": "a", "share": 0.75},
                    {"id": "b", "share": 0.25},
                    {"id": "zz", "share": 1},
                ]
            },
            "citations": {"claims": [{"cited_ids": ["c"]}]},
        },
    }
    assert relied_on(record) == {"a": 0.75, "b": 0.25}
    del record["signals"]["attribution"]
    assert relied_on(record) == {"c": 1.0}
    record["signals"] = {}
    record["plan"] = {"material_ids": ["a", "b"]}
    assert relied_on(record) == {"a": 0.5, "b": 0.5}


def test_review_outcomes_update_credibility_once(
    registry: MaterialRegistry,
    kb: list[Document],
) -> None:
    response = pipeline(registry, kb).invoke(QUESTION)
    rid = response.request_id
    store = registry.store
    # the route is pinned by the data: memo-60 (60 days) conflicts with the returns policy
    # (30 days), so the answer relying on it is flagged for review whatever its confidence
    assert [(c.material_a, c.material_b) for c in registry.conflicts()] == [("returns", "memo-60")]
    assert response.decision == "review"
    assert store.get_decision(rid) is None
    assert [i.request_id for i in store.list_queue()] == [rid]
    store.decide(rid, "rev-1", "reject", reason="wrong window")
    result = record_review_outcome(rid, registry=registry)
    assert result is not None and result.updates[0].ema_after < result.updates[0].ema_before
    assert record_review_outcome(rid, registry=registry) is None
    assert registry.usage("memo-60").rejections == 1


def test_denial_of_both_sides_of_a_conflict_counts_against_the_less_trusted(
    registry: MaterialRegistry,
) -> None:
    a, b = "已拆封商品可在签收后7天内退货。", "已拆封商品可在签收后30天内退货。"
    registry.observe(
        [
            Document(page_content=a, metadata={"id": "a"}),
            Document(page_content=b, metadata={"id": "b"}),
        ]
    )
    assert len(registry.conflicts()) == 1

    def ask(rid: str) -> None:
        registry.store.append_record(
            {
                "request_id": rid,
                "materials": [{"id": "a", "text": a}, {"id": "b", "text": b}],
                "signals": {"citations": {"claims": [{"cited_ids": ["a", "b"]}]}},
                "decision": "pass",
            }
        )

    ask("r1")
    result = record_feedback("r1", "deny", registry=registry)
    assert {u.material_id: u.share for u in result.updates} == {"a": 0.5, "b": 0.5}
    # trusted alike: it counts against b, whose write made the conflict
    assert (registry.get("a").denials, registry.get("b").denials) == (0, 1)
    for _ in range(2):
        registry.apply_outcome("a", "deny", count_denial=False)  # a is now less trusted
    ask("r2")
    record_feedback("r2", "deny", registry=registry)
    assert (registry.get("a").denials, registry.get("b").denials) == (1, 1)


def test_a_real_pipeline_records_the_shares_feedback_weighs_by(kb: list[Document]) -> None:
    """The attribution the assemble stage records is the one feedback reads its shares from."""
    from tracerag import RAGPipeline
    from tracerag.demo.kb import build_vectorstore
    from tracerag.testing import ScriptedChatModel

    records: list[dict] = []
    answer = "Customers may return unused items within 30 days of delivery. [returns]"
    pipeline = RAGPipeline(
        build_vectorstore(kb).as_retriever(search_kwargs={"k": 4}),
        ScriptedChatModel(
            responses=[answer], plan_responses=['{"material_ids": ["returns"], "key_facts": []}']
        ),
        prompt_version="p",
        model_version="m",
        n_samples=2,
        audit=lambda record: records.append(record) or True,
    )
    pipeline.invoke(QUESTION)
    assert records
    shares = relied_on(records[0])
    cited = set(AuditRecord.parse(records[0]).cited_ids)
    assert shares and set(shares) <= cited | {m["id"] for m in records[0]["materials"]}
    assert sum(shares.values()) == pytest.approx(1.0)
