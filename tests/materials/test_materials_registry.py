"""The material registry on both store backends: versions, batches, quarantine, conflicts,
deletion, read-hit retention and hash-chain coverage."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from langchain_core.documents import Document
from store_fixtures import Backend

from tracerag.materials import (
    ConcurrentChange,
    InvalidTransition,
    MaterialNotFound,
    MaterialRegistry,
    Provenance,
    Use,
)
from tracerag.materials._records import QUARANTINE_RULE, ROLLBACK_RULE

FEE = "Opened items returned within 7 days of delivery carry a 10% restocking fee."
FEE_ZH = "已拆封商品在签收后7天内退货，收取10%的翻新费。"


def test_every_change_is_a_new_version_with_who_why_and_rule(
    registry: MaterialRegistry,
) -> None:
    prov = Provenance(
        source_type="document",
        document_id="policies/returns",
        section="4.2",
        page="3",
        origin_url="https://kb.example.com/returns#4.2",
    )
    registry.register(
        "fee",
        FEE,
        operator="alice",
        written_by="kb-import@2",
        provenance=prov,
        source_snippet="Clause 4.2 (full text): " + FEE,
        valid_from="2025-01-01",
    )
    registry.edit(
        "fee",
        content=FEE.replace("10%", "15%"),
        operator="bob",
        written_by="manual",
        reason="new fee from 2026",
    )
    registry.quarantine("fee", operator="carol", reason="customers report the old fee")
    history = registry.history("fee")
    assert [s.version.version for s in history] == [1, 2, 3]
    v1, v2, v3 = (s.version for s in history)
    assert (v1.operator, v2.operator, v3.operator) == ("alice", "bob", "carol")
    assert (v1.change, v2.change, v3.change) == ("create", "edit", "quarantine")
    assert v1.written_by == "kb-import@2" and v2.written_by == "manual"
    assert v1.provenance == prov and v3.provenance == prov
    assert v1.source_snippet.startswith("Clause 4.2 (full text)")
    assert v2.source_snippet == FEE.replace("10%", "15%")
    assert v2.based_on == 1 and v3.based_on == 2 and v2.reason == "new fee from 2026"
    assert v1.content_hash != v2.content_hash == v3.content_hash
    assert all(s.sealed for s in history)
    assert registry.get("fee").status == "quarantined"
    assert registry.verify().ok


def test_material_changes_are_in_the_hash_chain(
    registry: MaterialRegistry,
    backend: Backend,
) -> None:
    registry.register("fee", FEE, operator="alice", written_by="kb-import@2")
    registry.delete("fee", operator="bob", reason="withdrawn")
    changes = registry.store.material_changes("fee")
    assert {e.kind for e in changes} == {"material_change"}
    assert {e.request_id for e in changes} == {"fee"}
    assert [e.payload["material_change"]["version"] for e in changes] == [1, 2]
    assert changes[1].actor == "bob" and changes[1].payload["reason"] == "withdrawn"
    assert changes[1].payload["before"]["status"] == "active"
    assert changes[1].payload["after"]["status"] == "deleted"
    assert registry.store.verify_chain().ok and registry.verify().ok

    # editing the registry's copy is caught by the registry check
    backend.execute(
        "UPDATE material_versions SET body = ? WHERE material_id = 'fee' AND version = 1",
        (json.dumps({**registry.history("fee")[0].version.body(), "content": "No fee."}),),
    )
    report = registry.verify()
    assert not report.ok and any("fee@1" in i for i in report.issues)

    # editing the chained entry is caught by the chain check
    seq = changes[0].seq
    backend.execute(
        "UPDATE audit_entries SET payload = replace(payload, 'alice', 'mallory') WHERE seq = ?",
        (seq,),
    )
    assert not registry.store.verify_chain().ok


def test_batch_rollback_restores_what_the_batch_changed(
    registry: MaterialRegistry,
) -> None:
    registry.register("a", "Shipping is free over 50 yuan.", operator="kb", written_by="import@1")
    registry.register("b", "礼品卡不可兑换现金。", operator="kb", written_by="import@1")
    with registry.batch() as batch:
        registry.edit(
            "a",
            content="Shipping is free over 99 yuan.",
            operator="bulk",
            written_by="bulk-edit@4",
            reason="price update",
        )
        registry.edit(
            "b",
            content="礼品卡可兑换现金。",
            operator="bulk",
            written_by="bulk-edit@4",
            reason="price update",
        )
        registry.register("c", "Members get 5% off.", operator="bulk", written_by="bulk-edit@4")
    assert {s.version.material_id for s in registry.by_batch(batch)} == {"a", "b", "c"}
    assert len(registry.by_rule("bulk-edit@4")) == 3

    result = registry.rollback_batch(batch, operator="lead", reason="wrong price list")
    assert sorted(result.restored) == ["a", "b"] and result.deleted == ["c"]
    assert registry.get("a").current.content == "Shipping is free over 50 yuan."
    assert registry.get("b").current.content == "礼品卡不可兑换现金。"
    assert registry.get("c").status == "deleted"
    a = registry.get("a").current
    assert a.version == 3 and a.change == "rollback" and a.written_by == ROLLBACK_RULE
    assert a.batch_id == result.rollback_batch_id != batch
    assert registry.verify().ok


def test_rollback_skips_materials_changed_after_the_batch(
    registry: MaterialRegistry,
) -> None:
    registry.register("a", "Shipping is free over 50 yuan.", operator="kb", written_by="import@1")
    with registry.batch() as batch:
        registry.edit(
            "a",
            content="Shipping is free over 99 yuan.",
            operator="bulk",
            written_by="bulk@1",
            reason="x",
        )
    registry.edit(
        "a",
        content="Shipping is free over 80 yuan.",
        operator="ann",
        written_by="manual",
        reason="y",
    )
    result = registry.rollback_batch(batch, operator="lead", reason="undo")
    assert "a" in result.skipped and not result.restored
    assert registry.get("a").current.content.endswith("80 yuan.")
    forced = registry.rollback_batch(batch, operator="lead", reason="undo", force=True)
    assert forced.restored == ["a"]
    assert registry.get("a").current.content.endswith("50 yuan.")


def test_n_denials_propose_a_quarantine_a_person_confirms_or_dismisses(
    registry: MaterialRegistry,
) -> None:
    registry.register("fee", FEE_ZH, operator="kb", written_by="import@1")
    for expected in (1, 2):
        state = registry.apply_outcome("fee", "deny", weight=0.5, counter="denials")
        assert state.denials == expected and state.status == "active"
        assert state.proposed_quarantine is None
    state = registry.apply_outcome("fee", "deny", weight=0.5, counter="denials")
    # the rule proposes; the material stays active (in retrieval) until a person decides
    assert state.status == "active" and state.proposed_quarantine
    assert state.current.change == "propose_quarantine"
    assert state.current.written_by == QUARANTINE_RULE and state.current.operator == "tracerag"
    assert [s.material_id for s in registry.proposals()] == ["fee"]
    assert registry.history("fee")[0].version.version == 1
    usage = registry.usage("fee", 1)
    assert usage.denials == 3
    # EMA: three steps of rate 0.2 × weight 0.5 toward 0 from the prior 0.6
    assert state.ema == pytest.approx(0.6 * 0.9**3, abs=1e-12)
    # a fourth denial proposes nothing new
    state = registry.apply_outcome("fee", "deny", weight=0.5)
    assert state.current.version == 2 and state.denials == 4
    with pytest.raises(InvalidTransition):
        registry.approve("fee", operator="x", reason="y")
    # dismissed: stays in service, denials start again
    kept = registry.dismiss("fee", operator="lead", reason="the fee is right")
    assert kept.status == "active" and registry.get("fee").denials == 0
    assert registry.get("fee").proposed_quarantine is None and registry.proposals() == []
    with pytest.raises(InvalidTransition, match="no quarantine is proposed"):
        registry.dismiss("fee", operator="lead", reason="again")
    for _ in range(3):
        state = registry.apply_outcome("fee", "deny")
    assert state.proposed_quarantine
    # confirmed: quarantined
    confirmed = registry.quarantine("fee", operator="lead", reason="customers are right")
    assert confirmed.status == "quarantined" and registry.proposals() == []
    restored = registry.restore("fee", operator="lead", reason="fee confirmed correct")
    assert restored.status == "active" and registry.get("fee").denials == 0
    # a denial that cannot be pinned on this material moves the EMA but is not counted
    before = registry.get("fee").ema
    state = registry.apply_outcome("fee", "deny", count_denial=False)
    assert state.denials == 0 and state.ema == pytest.approx(before * 0.8, abs=1e-12)
    assert registry.store.verify_chain().ok and registry.verify().ok, registry.verify().issues


def test_conflicting_active_materials_produce_a_conflict_record(
    registry: MaterialRegistry,
) -> None:
    docs = [
        Document(page_content="已拆封商品可在签收后7天内退货。", metadata={"id": "r-new"}),
        Document(page_content="已拆封商品可在签收后30天内退货。", metadata={"id": "r-old"}),
        Document(page_content="礼品卡不可兑换现金。", metadata={"id": "gift"}),
    ]
    assert registry.observe(docs) == ["r-new", "r-old", "gift"]
    (conflict,) = registry.conflicts()
    assert {conflict.material_a, conflict.material_b} == {"r-new", "r-old"}
    assert {conflict.value_a, conflict.value_b} == {"7天", "30天"}
    from tracerag.materials import answer_conflicts

    assert answer_conflicts(["gift"], [conflict.to_dict()]) == []
    assert len(answer_conflicts(["r-old"], [conflict.to_dict()])) == 1
    registry.quarantine("r-old", operator="lead", reason="old edition")
    assert registry.conflicts() == []
    assert registry.conflicts(status="resolved")[0].resolution == "r-old is quarantined"


def test_first_sight_maps_langchain_metadata(registry: MaterialRegistry) -> None:
    doc = Document(
        page_content="Warranty: 24 months for laptops.",
        metadata={
            "id": "warranty",
            "source": "manuals/warranty.pdf",
            "page": 4,
            "title": "Warranty",
            "section": "2.1",
            "url": "https://kb.example.com/w",
            "effective_from": "2025-01-01",
            "valid_until": "2027-12-31",
            "superseded_by": None,
        },
    )
    assert registry.observe([doc]) == ["warranty"]
    assert registry.observe([doc]) == []  # seen already: nothing written
    v = registry.get("warranty").current
    assert v.provenance.document_id == "manuals/warranty.pdf" and v.provenance.page == "4"
    assert v.provenance.section == "2.1" and v.provenance.origin_url == "https://kb.example.com/w"
    assert (v.title, v.valid_from, v.valid_until) == ("Warranty", "2025-01-01", "2027-12-31")
    assert v.written_by == "rule:first-sight@1" and v.status == "active"
    changed = Document(page_content="Warranty: 12 months for laptops.", metadata=doc.metadata)
    assert registry.observe([changed]) == ["warranty"]
    assert registry.get("warranty").current.change == "source_changed"


def test_stale_base_version_is_refused(registry: MaterialRegistry) -> None:
    registry.register(
        "a", "Gift cards never expire.", operator="kb", written_by="import@1", gate=False
    )
    stale = registry.get("a").current
    registry.edit(
        "a",
        content="Gift cards expire after 3 years.",
        operator="x",
        written_by="manual",
        reason="r",
    )
    with pytest.raises(ConcurrentChange):
        registry._writer.commit(stale.evolve(status="deleted", created_at=""), expect_current=1)
    registry.edit(
        "a", content="I think gift cards expire.", operator="y", written_by="memory@1", reason="r"
    )
    state = registry.get("a")
    assert state.pending == 3 and state.current.version == 2
    with pytest.raises(ConcurrentChange):  # one proposed edit at a time
        registry.edit("a", content="Gift cards expire.", operator="z", written_by="m", reason="r")
    rejected = registry.reject("a", operator="lead", reason="hedged")
    assert rejected.version == 4 and rejected.status == "deleted" and rejected.based_on == 3
    state = registry.get("a")
    assert state.pending is None and state.current.version == 2 and state.status == "active"
    with pytest.raises(MaterialNotFound):
        registry.get("nope")


def test_read_hits_retention_keeps_complained_requests(
    registry: MaterialRegistry,
) -> None:
    registry.register(
        "a", "Gift cards cannot be exchanged for cash.", operator="kb", written_by="import@1"
    )
    old = (datetime.now(timezone.utc) - timedelta(days=40)).isoformat()
    assert registry.record_use("r-old", [Use("a", cited=True)], decision="pass", at=old) == 1
    assert registry.record_use("r-old", [Use("a", cited=True)], decision="pass") == 0
    registry.record_use("r-complained", [Use("a", cited=True)], decision="pass", at=old)
    registry.record_use("r-new", [Use("a")], decision="review")
    registry.mark_complaint("r-complained", "deny")
    usage = registry.usage("a", 1)
    assert (usage.retrievals, usage.citations, usage.passed) == (3, 2, 2)
    assert registry.purge_reads() == 1
    kept = {h.request_id: h.complained for h in registry.reads("a")}
    assert kept == {"r-complained": True, "r-new": False}


def test_concurrent_writers_lose_no_update(registry: MaterialRegistry) -> None:
    import threading

    from tracerag.materials._registry import MaterialRegistry as Registry

    registry.register("a", "Gift cards cannot be exchanged.", operator="kb", written_by="i@1")
    others = [Registry(registry.store) for _ in range(2)]
    done: list[int] = []
    errors: list[BaseException] = []

    def writer(reg: MaterialRegistry, name: str) -> None:
        written = 0
        try:
            while written < 5:
                try:
                    reg.edit(
                        "a",
                        content=f"{name} edit {written}",
                        operator=name,
                        written_by="manual",
                        reason="race",
                        gate=False,
                    )
                    written += 1
                except ConcurrentChange:
                    continue
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        done.append(written)

    threads = [threading.Thread(target=writer, args=(r, f"w{i}")) for i, r in enumerate(others)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for r in others:
        r.db.close()
    assert not errors and done == [5, 5]
    history = registry.history("a")
    assert [s.version.version for s in history] == list(range(1, 12))
    # every version is based on the one before: no write was based on a stale version
    assert [s.version.based_on for s in history[1:]] == list(range(1, 11))
    assert registry.verify().ok and registry.store.verify_chain().ok


def test_an_answer_citing_a_conflicting_material_goes_to_review(
    registry: MaterialRegistry,
) -> None:
    """Two active materials disagree on the same period: a confident answer citing either one
    is sent to a person, with the conflict named, until the conflict is resolved."""
    from langchain_core.retrievers import BaseRetriever

    from tracerag import RAGPipeline
    from tracerag.materials._rerank import CredibilityRetriever
    from tracerag.testing import ScriptedChatModel

    docs = [
        Document(page_content="已拆封商品可在签收后7天内退货。", metadata={"id": "r-new"}),
        Document(page_content="已拆封商品可在签收后30天内退货。", metadata={"id": "r-old"}),
    ]

    class Fixed(BaseRetriever):
        def _get_relevant_documents(self, query, *, run_manager):  # type: ignore[override]
            return [Document(page_content=d.page_content, metadata=dict(d.metadata)) for d in docs]

    answer = "已拆封商品可在签收后7天内退货。[r-new]"

    def ask() -> object:
        pipeline = RAGPipeline(
            CredibilityRetriever(retriever=Fixed(), registry=registry),
            ScriptedChatModel(
                responses=[answer], plan_responses=['{"material_ids": ["r-new"], "key_facts": []}']
            ),
            prompt_version="p",
            model_version="m",
            n_samples=3,
            audit=None,
        )
        return pipeline.invoke("已拆封商品多久内可以退货？")

    conflicted = ask()
    assert conflicted.decision == "review", conflicted.signal_detail
    assert conflicted.answer == answer  # flagged for a person, not withheld
    registry.quarantine("r-old", operator="lead", reason="old edition")
    settled = ask()
    assert settled.decision == "pass"
