
"""The materials command line on both backends, and time to locate: one command from a
complained-about request to the write that caused it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.documents import Document
from store_fixtures import Backend, PostgresBackend

from tracerag import RAGPipeline
from tracerag.cli import main
from tracerag.materials import MaterialRegistry
from tracerag.materials.feedback import record_usage
from tracerag.materials.rerank import CredibilityRetriever
from tracerag.testing import ScriptedChatModel

BAD = "Customers may return unused items within 60 days of delivery."


def store_url(b: Backend) -> str:
    b.open().close()  # creates the database (and schema)
    if isinstance(b, PostgresBackend):
        return f"{b.dsn}?options=-csearch_path%3D{b.schema}"
    return b.path


@pytest.fixture
def scene(backend: Backend, documents: list[Document]) -> dict[str, Any]:
    """A bad memory written in a batch, three answers that used it, one denial."""
    from tracerag.demo.kb import build_vectorstore

    url = store_url(backend)
    reg = MaterialRegistry.open(url)
    with reg.batch() as batch:
        reg.register(
            "memo-60",
            BAD,
            operator="agent-9",
            written_by="memory-writer@2",
            source_snippet="chat #881: customer says 60 days",
            gate=False,
        )
    kb = [*documents, Document(page_content=BAD, metadata={"id": "memo-60"})]
    inner = build_vectorstore(kb).as_retriever(search_kwargs={"k": 6})

    def sink(record: dict[str, Any]) -> bool:
        reg.store.append_record(record)
        record_usage(record, registry=reg)
        return True

    rag = RAGPipeline(
        CredibilityRetriever(retriever=inner, registry=reg),
        ScriptedChatModel(responses=[BAD + " [memo-60]"], plan_responses=['{"material_ids": []}']),
        prompt_version="p1",
        model_version="scripted",
        n_samples=2,
        audit=sink,
    )
    rids = [rag.invoke("How many days do I have to return an item?").request_id for _ in range(3)]
    reg.close()
    return {"url": url, "rids": rids, "batch": batch}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def test_trace_back_locates_the_causing_write_in_one_command(
    scene: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    url, rid = scene["url"], scene["rids"][0]
    assert (
        run(
            capsys,
            "feedback",
            rid,
            "deny",
            "--comment",
            "it is 30 days",
            "--operator",
            "cust-1",
            "--store",
            url,
        )[0]
        == 0
    )
    code, out = run(capsys, "trace-back", rid, "--store", url)
    assert code == 0
    cause = next(line for line in out.splitlines() if line.startswith("most likely cause"))
    # time to locate = 1: the one command names the write, its rule, operator, batch and entry
    assert "memo-60 v1" in cause and "agent-9" in cause and "memory-writer@2" in cause
    assert scene["batch"] in cause and "audit #" in cause
    assert "chat #881: customer says 60 days" in out and "deny by cust-1" in out
    data = json.loads(run(capsys, "trace-back", rid, "--json", "--store", url)[1])
    assert data["suspect"] == "memo-60" and data["materials"][0]["write"]["operator"] == "agent-9"
    assert run(capsys, "trace-back", "nope", "--store", url)[0] == 1


def test_show_impact_by_rule(scene: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    url = scene["url"]
    code, out = run(capsys, "materials", "show", "memo-60", "--store", url)
    assert code == 0 and "status active, version 1" in out
    assert "source snippet: chat #881" in out and "3 retrievals, 3 citations" in out
    assert scene["rids"] and all(rid in out for rid in scene["rids"])
    code, out = run(capsys, "materials", "impact", "memo-60", "--version", "1", "--store", url)
    assert code == 0 and "3 requests used memo-60 (v1)" in out
    code, out = run(capsys, "materials", "by-rule", "memory-writer@2", "--store", url)
    assert code == 0 and "memo-60 v1 create → active  by agent-9" in out
    assert run(capsys, "materials", "show", "nope", "--store", url)[0] == 1


def test_changes_with_operator_and_batch_rollback(
    scene: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    url = scene["url"]
    code, out = run(
        capsys,
        "materials",
        "quarantine",
        "memo-60",
        "--operator",
        "lead",
        "--reason",
        "wrong window",
        "--store",
        url,
    )
    assert code == 0 and "quarantine → quarantined (by lead)" in out
    assert (
        run(
            capsys,
            "materials",
            "approve",
            "memo-60",
            "--operator",
            "lead",
            "--reason",
            "x",
            "--store",
            url,
        )[0]
        == 1
    )
    with pytest.raises(SystemExit):
        main(["materials", "restore", "memo-60", "--reason", "x", "--store", url])  # no operator
    capsys.readouterr()
    code, out = run(
        capsys,
        "materials",
        "rollback-batch",
        scene["batch"],
        "--operator",
        "lead",
        "--reason",
        "bad memory batch",
        "--store",
        url,
    )
    assert code == 1 and "skipped memo-60" in out  # changed since the batch
    code, out = run(
        capsys,
        "materials",
        "rollback-batch",
        scene["batch"],
        "--operator",
        "lead",
        "--reason",
        "bad memory batch",
        "--force",
        "--store",
        url,
    )
    assert code == 0 and "deleted memo-60" in out
    code, out = run(capsys, "materials", "verify", "--store", url)
    assert code == 0 and "materials OK" in out
    assert run(capsys, "audit", "materials", "--store", url)[0] == 0
    stats = json.loads(run(capsys, "materials", "stats", "--store", url)[1])
    assert stats["by_status"]["deleted"] == 1


def test_manual_edit_is_gated(scene: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    url = scene["url"]
    code, out = run(
        capsys,
        "materials",
        "edit",
        "memo-60",
        "--content",
        "我觉得可能是30天吧？",
        "--operator",
        "lead",
        "--reason",
        "fix",
        "--store",
        url,
    )
    assert code == 0 and "edit → pending_review" in out and "waiting for review" in out
    assert "hedge" in out and "question" in out
    code, out = run(capsys, "materials", "pending", "--store", url)
    assert "v2 of memo-60 edit → pending_review  by lead" in out
    code, out = run(
        capsys,
        "materials",
        "approve",
        "memo-60",
        "--operator",
        "lead2",
        "--reason",
        "checked",
        "--store",
        url,
    )
    assert code == 0 and "memo-60 v3: approve → active" in out
    code, out = run(
        capsys,
        "materials",
        "edit",
        "memo-60",
        "--valid-until",
        "2020-01-01",
        "--operator",
        "lead",
        "--reason",
        "expired",
        "--store",
        url,
    )
    assert code == 0 and "v4: edit → active" in out
    assert (
        run(
            capsys,
            "materials",
            "edit",
            "memo-60",
            "--operator",
            "x",
            "--reason",
            "y",
            "--store",
            url,
        )[0]
        == 2
    )
