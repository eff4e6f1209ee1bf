"""The materials command line on both backends, and time to locate: one command from a
complained-about request to the write that caused it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.documents import Document
from store_fixtures import Backend, PostgresBackend

from tracerag import RAGPipeline
from tracerag.cli import main
from tracerag.materials import MaterialRegistry
from tracerag.materials._rerank import CredibilityRetriever
from tracerag.materials.feedback import record_usage
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
        ScriptedChatModel(
            responses=[BAD + " [memo-60]"], plan_responses=['{"material_ids": [], "key_facts": []}']
        ),
        prompt_version="p1",
        model_version="scripted",
        n_samples=2,
        audit=sink,
    )
    rids = [rag.invoke("How many days do I have to return an item?").request_id for _ in range(3)]
    reg.close()
    return {"url": url, "rids": rids, "batch": batch}


#: each operator's own token (the operators file holds only their hashes)
TOKENS = {name: f"{name}-token-{name[::-1]}-0123456789" for name in ("lead", "lead2", "x")}


@pytest.fixture(autouse=True)
def operators(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An operators file naming lead, lead2 and x; no operator token in the environment."""
    from tracerag._identity import hash_token
    from tracerag.config import reset_config

    path = tmp_path / "operators"
    path.write_text("".join(f"{n}:{hash_token(t)}\n" for n, t in TOKENS.items()), "utf-8")
    monkeypatch.setenv("TRACERAG_OPERATORS_FILE", str(path))
    monkeypatch.delenv("TRACERAG_OPERATOR_TOKEN", raising=False)
    reset_config()
    yield str(path)
    reset_config()


def run(
    capsys: pytest.CaptureFixture[str], *argv: str, token: str | None = None
) -> tuple[int, str]:
    """Run the CLI; a change ``--operator NAME`` is made with NAME's token unless told."""
    from tracerag.config import reset_config

    args = list(argv)
    if token is None and "--operator" in args and args[0] == "materials":
        token = TOKENS.get(args[args.index("--operator") + 1])
    with pytest.MonkeyPatch.context() as mp:
        if token:
            mp.setenv("TRACERAG_OPERATOR_TOKEN", token)
        reset_config()
        try:
            code = main(args)
        finally:
            reset_config()
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


def test_changes_need_an_authenticated_operator(
    scene: dict[str, Any], capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    """Free text is not an identity: no token, an unknown token, or a name that is not the
    token's are refused; a change is recorded under the token's name, with how it was proved."""
    url = scene["url"]
    change = ("materials", "quarantine", "memo-60", "--reason", "wrong window", "--store", url)
    with pytest.raises(SystemExit) as no_token:
        run(capsys, *change, "--operator", "mallory")  # no token for mallory
    assert no_token.value.code == 2
    assert "authenticated operator" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run(capsys, *change, token="not-anyone's-token-0123456789")
    assert "belongs to no configured operator" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run(capsys, *change, "--operator", "lead2", token=TOKENS["lead"])
    assert "belongs to 'lead'" in capsys.readouterr().err
    reg = MaterialRegistry.open(url)
    try:
        assert reg.get("memo-60").status == "active"  # nothing was changed
    finally:
        reg.close()

    # the token alone names the operator; a token file works like the variable
    file = tmp_path / "token"
    file.write_text(TOKENS["lead"] + "\n", "utf-8")
    code, out = run(capsys, *change, "--operator-token-file", str(file))
    assert code == 0 and "(by lead)" in out
    reg = MaterialRegistry.open(url)
    try:
        identity = reg.identities("memo-60")[2]
        (entry,) = [
            e for e in reg.store.material_changes("memo-60") if e.seq == identity["audit_seq"]
        ]
    finally:
        reg.close()
    assert identity["name"] == "lead" and identity["method"] == "operator-token"
    assert identity["authenticated"] is True and identity["credential"].startswith("sha256:")
    assert TOKENS["lead"] not in json.dumps(entry.payload)
    assert entry.actor == "lead" and entry.payload["identity"] == {
        k: v for k, v in identity.items() if k != "audit_seq"
    }
    shown = json.loads(run(capsys, "materials", "show", "memo-60", "--json", "--store", url)[1])
    assert [h["identity"]["method"] for h in shown["history"]] == ["declared", "operator-token"]
    # the write through the Python API with a bare name is recorded as declared
    assert reg_identity_of_first_write(url) == {
        "name": "agent-9",
        "method": "declared",
        "authenticated": False,
        "credential": None,
    }


def reg_identity_of_first_write(url: str) -> dict[str, Any]:
    reg = MaterialRegistry.open(url)
    try:
        found = reg.identities("memo-60")[1]
    finally:
        reg.close()
    return {k: v for k, v in found.items() if k != "audit_seq"}
