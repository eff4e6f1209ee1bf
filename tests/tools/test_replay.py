"""``tracerag replay``: stored materials and parameters, version check, link and diff."""

from __future__ import annotations

import asyncio
import json

import pytest
from langchain_core.vectorstores import VectorStoreRetriever
from pipeline_fixtures import FAST_RETRY, GOOD, PLAN, QUESTION, WRONG_NUMBER

from tracerag import cli
from tracerag._pipeline import RAGPipeline
from tracerag.stages._retrieve import fetch
from tracerag.store import RequestNotFound
from tracerag.store._sqlite import SQLiteAuditStore
from tracerag.testing import ScriptedChatModel
from tracerag.tools._replay import (
    ReplayRefused,
    ReplayRetriever,
    diff_records,
    replay,
    replay_retriever,
)

PROMPT = "test-prompt-v1"


def scripted(answers):
    return ScriptedChatModel(responses=answers, plan_responses=[PLAN])


@pytest.fixture
def store(tmp_path):
    s = SQLiteAuditStore(str(tmp_path / "audit.sqlite"), auto_enqueue=False)
    yield s
    s.close()


def answer(store, retriever, answers, **options):
    """Run a request through a pipeline that records into the store; its request_id."""
    llm = scripted(answers)
    settings = {
        "prompt_version": PROMPT,
        "model_version": llm.model_name,
        "n_samples": 3,
        "retry": FAST_RETRY,
        "audit": lambda r: store.append_record(r) or True,
    }
    settings.update(options)
    return RAGPipeline(retriever, llm, **settings).invoke(QUESTION).request_id


def run_replay(store, rid, answers, **kwargs):
    llm = scripted(answers)
    kwargs.setdefault("prompt_version", PROMPT)
    kwargs.setdefault("model_version", llm.model_name)
    kwargs.setdefault("retry", FAST_RETRY)
    return replay(store, rid, llm, **kwargs)


def test_replay_uses_exactly_the_stored_materials_and_parameters(store, retriever):
    rid = answer(
        store, retriever, [GOOD], n_samples=4, temperature=0.3, plan="inline", tier="medium"
    )
    before = store.get(rid).record
    # the knowledge base changed since: a replay must not retrieve again
    retriever.vectorstore.delete([m["id"] for m in before["materials"]][:1])
    result = run_replay(store, rid, [GOOD])
    after = store.get(result.replay_id).record
    assert after["materials"] == before["materials"]
    assert after["retrieval"] == before["retrieval"]
    assert after["params"] == before["params"]
    assert after["tier"] == "medium" and after["params"]["plan_mode"] == "inline"
    assert after["params"]["temperature"] == 0.3
    assert len(after["samples"]) == len(before["samples"]) <= 3  # medium: at most three
    assert after["question"] == before["question"]
    assert after["replay_of"] == rid
    assert not result.changed, result.render()
    assert "=> no change" in result.render()


def test_replay_is_linked_from_the_original_and_not_queued(store, retriever):
    rid = answer(store, retriever, ["Customers may return items within 30 days. [policy-99]"])
    assert store.get(rid).record["decision"] == "escalate"
    result = run_replay(store, rid, [GOOD], actor="ops-carol")
    (link,) = store.get(rid).of_kind("operator_action")
    assert link.actor == "ops-carol"
    assert link.payload["action"] == "replay"
    assert link.payload["replay_request_id"] == result.replay_id
    assert set(link.payload["changed"]) >= {"citations", "confidence", "decision"}
    assert store.list_queue() == []
    assert store.verify_chain().ok


def test_replay_reports_what_changed(store, retriever):
    rid = answer(store, retriever, [GOOD])
    result = run_replay(store, rid, [WRONG_NUMBER])
    changed = {c.aspect for c in result.changed}
    assert {"conclusions", "citations", "confidence", "decision"} <= changed
    assert "retrieved set" not in changed and "plan" not in changed
    text = result.render()
    assert "retrieved set  unchanged" in text and "decision       CHANGED" in text
    assert "pass -> escalate" in text or "pass -> review" in text
    data = result.to_dict()
    assert data["replay_id"] == result.replay_id and data["response"]["request_id"]


def test_other_versions_are_refused_unless_forced(store, retriever):
    rid = answer(store, retriever, [GOOD])
    entries = store.verify_chain().checked
    with pytest.raises(ReplayRefused, match="prompt: recorded 'test-prompt-v1', configured 'v2'"):
        run_replay(store, rid, [GOOD], prompt_version="v2")
    with pytest.raises(ReplayRefused, match="model"):
        run_replay(store, rid, [GOOD], model_version="gpt-x")
    assert store.verify_chain().checked == entries  # nothing written
    forced = run_replay(store, rid, [GOOD], prompt_version="v2", force=True)
    assert forced.forced
    assert store.get(forced.replay_id).record["versions"]["prompt"] == "v2"
    assert store.get(rid).of_kind("operator_action")[0].payload["forced"] is True


def test_unknown_request(store):
    with pytest.raises(RequestNotFound):
        run_replay(store, "nope", [GOOD])


def test_the_replay_retriever_returns_the_materials_with_their_scores():
    materials = [
        {"id": "b", "text": "Second.", "title": "B", "score": 0.4, "rank": 2, "metadata": {}},
        {
            "id": "a",
            "text": "First.",
            "title": "A",
            "source": "kb://a",
            "score": 0.9,
            "rank": 1,
            "metadata": {"id": "a", "title": "A", "source": "kb://a", "valid_until": "2030"},
        },
    ]
    retriever = replay_retriever(materials)
    assert isinstance(retriever, VectorStoreRetriever)
    pairs = asyncio.run(fetch(retriever, "anything"))
    assert [(d.metadata.get("id"), s) for d, s in pairs] == [("a", 0.9), ("b", 0.4)]
    assert pairs[0][0].metadata["valid_until"] == "2030"
    unscored = replay_retriever([{**materials[0], "score": None}])
    assert isinstance(unscored, ReplayRetriever)
    assert [(d.page_content, s) for d, s in asyncio.run(fetch(unscored, "q"))] == [
        ("Second.", None)
    ]


def test_diff_of_a_record_with_itself_is_empty(store, retriever):
    rid = answer(store, retriever, [GOOD])
    rec = store.get(rid).record
    assert not [c for c in diff_records(rec, rec) if c.changed]


# -- the command -------------------------------------------------------------------------------


@pytest.fixture
def demo_store(tmp_path):
    """A store with a request answered by the demo pipeline with the configured model."""
    from tracerag.server._asgi import demo_pipeline

    path = str(tmp_path / "demo.sqlite")
    s = SQLiteAuditStore(path)
    pipeline = demo_pipeline("extractive", seed=7)
    response = asyncio.run(
        pipeline.arun(
            "How long is the warranty on a laptop?",
            record_sink=lambda r: s.append_record(r) or True,
        )
    )
    assert response.audit_persisted is True
    rid = response.request_id
    other = RAGPipeline(
        pipeline.settings.retriever,
        pipeline.settings.llm,
        prompt_version="an-older-prompt",
        model_version="tracerag-extractive-1",
        audit=lambda r: s.append_record(r) or True,
    )
    old = other.invoke("How long is the warranty on a laptop?").request_id
    s.close()
    return path, rid, old


def test_replay_command(demo_store, capsys, monkeypatch):
    monkeypatch.delenv("TRACERAG_MODEL", raising=False)
    path, rid, _ = demo_store
    assert cli.main(["replay", rid, "--store", path, "--actor", "ops"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"replayed {rid} as ")
    for aspect in ("retrieved set", "plan", "conclusions", "citations", "confidence", "decision"):
        assert aspect in out
    assert cli.main(["replay", rid, "--store", path, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["original_id"] == rid and data["changes"][0]["aspect"] == "retrieved set"
    assert data["changes"][0]["changed"] is False
    store = SQLiteAuditStore(path)
    try:
        links = store.get(rid).of_kind("operator_action")
        assert links[0].actor == "ops" and len(links) == 2
    finally:
        store.close()


def test_replay_command_refuses_other_versions_and_unknown_ids(demo_store, capsys, monkeypatch):
    monkeypatch.delenv("TRACERAG_MODEL", raising=False)
    path, _, old = demo_store
    assert cli.main(["replay", old, "--store", path]) == 3
    err = capsys.readouterr().err
    assert "refused" in err and "an-older-prompt" in err and "--force" in err
    assert cli.main(["replay", old, "--store", path, "--force"]) == 0
    assert "FORCED" in capsys.readouterr().out
    assert cli.main(["replay", "nope", "--store", path]) == 1


def test_replay_command_model_from_the_environment(demo_store, monkeypatch):
    path, rid, _ = demo_store
    monkeypatch.setenv("TRACERAG_MODEL", "gpt-5")
    with pytest.raises(SystemExit, match="TRACERAG_MODEL"):
        cli.main(["replay", rid, "--store", path])
