"""Material changes are first-class entries of the hash chain (kind ``material_change``) on both
backends: kept out of the request index, checked by ``tracerag audit verify``, tampering caught;
and stores written before that kind existed (changes chained as ``operator_action`` entries of
the request ``tracerag.materials``) still verify."""

from __future__ import annotations

from typing import Any

import pytest
from store_fixtures import Backend, PostgresBackend, make_record

from tracerag._identity import OperatorIdentity
from tracerag.cli import main
from tracerag.materials import MATERIALS_LOG, MaterialRegistry, MaterialVersion
from tracerag.store import RequestNotFound

FEE = "The cancellation fee is 10% of the order value."


def store_url(b: Backend) -> str:
    if isinstance(b, PostgresBackend):
        return f"{b.dsn}?options=-csearch_path%3D{b.schema}"
    return b.path


def audit_verify(b: Backend, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["audit", "verify", "--store", store_url(b)])
    return code, capsys.readouterr().out


def test_material_changes_have_their_own_entry_kind(
    registry: MaterialRegistry, backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    store = registry.store
    store.append_record(make_record("fee", decision="pass"))  # a request id equal to a material id
    registry.register("fee", FEE, operator="alice", written_by="kb-import@2")
    lead = OperatorIdentity("lead", "operator-token", "sha256:0123456789abcdef")
    registry.quarantine("fee", operator=lead, reason="customers report the old fee")
    changes = store.material_changes("fee")
    assert [(e.kind, e.request_id, e.actor) for e in changes] == [
        ("material_change", "fee", "alice"),
        ("material_change", "fee", "lead"),
    ]
    assert changes[1].payload["identity"] == {
        "name": "lead",
        "method": "operator-token",
        "authenticated": True,
        "credential": "sha256:0123456789abcdef",
    }
    assert changes[0].payload["identity"]["method"] == "declared"
    # the request of the same id is untouched: its trail, its index row, its entry count
    trail = store.get("fee")
    assert "material_change" not in {e.kind for e in trail.entries}
    assert trail.decision == "pass"
    assert [r.request_id for r in store.list_requests()] == ["fee"]
    with pytest.raises(RequestNotFound):
        store.get(MATERIALS_LOG)  # no synthetic request any more
    assert store.verify_chain().ok and registry.verify().ok
    code, out = audit_verify(backend, capsys)
    # nothing wrong, but no anchor was exported (the registry wrote directly): not "intact"
    assert code == 3 and "audit chain consistent as far as checked" in out
    assert "materials OK: 2 versions" in out


def test_tampering_with_a_material_change_entry_is_detected(
    registry: MaterialRegistry, backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    registry.register("fee", FEE, operator="alice", written_by="kb-import@2")
    registry.delete("fee", operator="bob", reason="withdrawn")
    first = registry.store.material_changes("fee")[0]
    backend.execute(
        "UPDATE audit_entries SET payload = replace(payload, 'order value', 'order total') "
        "WHERE seq = ?",
        (first.seq,),
    )
    report = registry.store.verify_chain()
    assert [(i.kind, i.seq) for i in report.changed] == [("changed", first.seq)]
    assert "material_change entry does not match its hash" in report.changed[0].detail
    code, out = audit_verify(backend, capsys)
    assert code == 1 and "BROKEN" in out and "material_change" in out
    # the registry's check sees that its copy no longer matches the entry either
    assert any("fee@1" in i for i in registry.verify().issues)


def test_tampering_with_the_registry_copy_is_caught_by_audit_verify(
    registry: MaterialRegistry, backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    registry.register("fee", FEE, operator="alice", written_by="kb-import@2")
    backend.execute(
        "UPDATE material_versions SET body = replace(body, 'order value', 'order total'), "
        "body_hash = ? WHERE material_id = 'fee'",
        ("0" * 64,),
    )
    assert registry.store.verify_chain().ok  # the chain itself was not touched
    code, out = audit_verify(backend, capsys)
    assert code == 1 and "materials: " in out and "fee@1" in out


def test_removing_a_material_change_entry_is_detected(
    registry: MaterialRegistry, backend: Backend
) -> None:
    registry.register("a", "Shipping is free over 50 yuan.", operator="kb", written_by="i@1")
    registry.register("b", "礼品卡不可兑换现金。", operator="kb", written_by="i@1")
    registry.register("c", "Gift wrapping costs 5 yuan.", operator="kb", written_by="i@1")
    middle = registry.store.material_changes("b")[0]
    backend.execute("DELETE FROM audit_entries WHERE seq = ?", (middle.seq,))
    assert registry.store.verify_chain().removed
    assert any("b@1" in i and "missing" in i for i in registry.verify().issues)


def _registry_v1(backend: Backend) -> None:
    """The registry's tables as a tracerag before registry events were chained made them."""
    from tracerag._db import migrate
    from tracerag.materials._db import MIGRATIONS
    from tracerag.materials._db import MaterialStoreError as Refuse

    if isinstance(backend, PostgresBackend):
        conn = backend.connect()
        try:
            with conn.transaction(), conn.cursor() as cur:
                migrate(
                    cur,
                    "postgres",
                    MIGRATIONS,
                    version_table="material_schema_version",
                    schema="material registry",
                    refuse=Refuse,
                    target=1,
                )
        finally:
            conn.close()
        return
    from tracerag._db import QmarkCursor

    conn = backend.connect()
    try:
        conn.execute("BEGIN IMMEDIATE")
        migrate(
            QmarkCursor(conn.cursor()),
            "sqlite",
            MIGRATIONS,
            version_table="material_schema_version",
            schema="material registry",
            refuse=Refuse,
            target=1,
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


def _old_write(
    store: Any,
    backend: Backend,
    version: MaterialVersion,
    *,
    kind: str,
    ema: float = 0.6,
    denials: int = 0,
) -> None:
    """One change as an older tracerag wrote it: the version chained (``kind``: ``legacy`` as
    an ``operator_action`` of ``tracerag.materials``, ``change`` as a ``material_change``
    entry) without the material's columns, then the tables written beside the chain."""
    from tracerag.materials._records import CHANGE_KEY, body_digest, body_json

    body = version.body()
    digest = body_digest(body)
    payload = {
        CHANGE_KEY: {
            "material_id": version.material_id,
            "version": version.version,
            "change": version.change,
            "written_by": version.written_by,
            "batch_id": None,
            "in_service": True,
            "body_hash": digest,
            "body": body,
        },
        "before": None,
        "after": {"version": version.version, "status": version.status},
    }
    if kind == "legacy":
        try:
            store.get(MATERIALS_LOG)
        except RequestNotFound:
            store.append_record(
                {"request_id": MATERIALS_LOG, "question": "material registry change log"}
            )
        entry = store.append_action(
            MATERIALS_LOG, "operator_action", version.operator, payload, version.reason
        )
    else:
        entry = store.append_material_change(
            version.material_id, version.operator, payload, version.reason
        )
    backend.execute(
        "INSERT INTO material_versions (material_id, version, status, written_by, operator, "
        "batch_id, change, content_hash, created_at, body, body_hash, audit_seq, audit_hash) "
        "VALUES (?, ?, ?, ?, ?, NULL, ?, ?, ?, ?, ?, ?, ?)",
        (
            version.material_id,
            version.version,
            version.status,
            version.written_by,
            version.operator,
            version.change,
            version.content_hash,
            version.created_at,
            body_json(body),
            digest,
            entry.seq,
            entry.hash,
        ),
    )
    backend.execute("DELETE FROM materials WHERE material_id = ?", (version.material_id,))
    backend.execute(
        "INSERT INTO materials (material_id, current_version, status, content_hash, ema, "
        "outcomes, denials, pending_version, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, NULL, ?)",
        (
            version.material_id,
            version.version,
            version.status,
            version.content_hash,
            ema,
            denials,
            denials,
            version.created_at,
        ),
    )


def _old_store(backend: Backend, kind: str) -> None:
    """A store with the fee material as an older tracerag left it (two versions, one denial)."""
    store = backend.open()
    try:
        _registry_v1(backend)
        v1 = MaterialVersion(
            "fee",
            1,
            FEE,
            operator="alice",
            written_by="kb-import@2",
            created_at="2026-01-05T00:00:00.000000+00:00",
        )
        _old_write(store, backend, v1, kind=kind)
        v2 = v1.evolve(
            content=FEE.replace("10", "15"),
            operator="bob",
            written_by="manual",
            change="edit",
            reason="2026",
            created_at="2026-02-01T00:00:00.000000+00:00",
        )
        _old_write(store, backend, v2, kind=kind, ema=0.48, denials=1)
    finally:
        store.close()


@pytest.mark.parametrize("kind", ["legacy", "change"])
def test_a_store_written_before_registry_events_upgrades_and_verifies(
    backend: Backend, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """Changes chained the old ways (``operator_action`` entries of ``tracerag.materials``, or
    ``material_change`` entries without the material's columns) stay where they are; opening
    the registry chains a baseline of the columns as found, once, and from then on every
    column is re-derived; tampering with either old entry or with a column is still caught."""
    _old_store(backend, kind)
    store = backend.open()
    check = MaterialRegistry(store, metrics=False, baseline=False)
    try:  # verification alone does not upgrade: it says the columns are not covered yet
        assert any("not covered by the chain yet" in i for i in check.verify().issues)
    finally:
        check.close()
    registry = MaterialRegistry(store, owns_store=True, metrics=False)
    try:
        baselines = [e for e in store.material_changes("fee") if "baseline" in e.payload]
        assert len(baselines) == 1 and baselines[0].payload["row"]["ema"] == 0.48
        MaterialRegistry(store, metrics=False).close()  # a second open chains nothing more
        assert len([e for e in store.material_changes("fee") if "baseline" in e.payload]) == 1
        registry.quarantine("fee", operator="carol", reason="customers complain")
        assert [s.version.version for s in registry.history("fee")] == [1, 2, 3]
        ids = registry.identities("fee")
        assert [ids[v]["name"] for v in (1, 2, 3)] == ["alice", "bob", "carol"]
        assert ids[1]["method"] == "declared" and ids[1]["audit_seq"] < ids[3]["audit_seq"]
        assert store.verify_chain().ok and registry.verify().ok, registry.verify().issues
        assert registry.get("fee").denials == 1 and registry.get("fee").ema == 0.48
    finally:
        registry.close()
    code, out = audit_verify(backend, capsys)
    assert code == 3 and "materials OK: 3 versions" in out  # 3: intact, but no anchor

    backend.execute("UPDATE materials SET ema = 0.9 WHERE material_id = 'fee'")
    code, out = audit_verify(backend, capsys)
    assert code == 1 and "materials.ema is 0.9, the chain says 0.48" in out
    backend.execute("UPDATE materials SET ema = 0.48 WHERE material_id = 'fee'")
    assert audit_verify(backend, capsys)[0] == 3
    # tampering with an old change is still detected, by both checks
    first = min(
        e.seq for e in (store_changes(backend) if kind == "change" else legacy_actions(backend))
    )
    backend.execute(
        "UPDATE audit_entries SET payload = replace(payload, 'alice', 'mallory') WHERE seq = ?",
        (first,),
    )
    code, out = audit_verify(backend, capsys)
    assert code == 1 and "fee@1" in out


def test_an_old_store_upgrades_and_keeps_verifying(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    """A schema-3 store whose material changes are old-style entries: opened by this version it
    gains migration 4, keeps its old entries where they are, and chains new changes in their
    own kind; both checks pass."""
    _old_store(backend, "legacy")
    # back to schema 3, as a store written before migration 4 was
    backend.execute("DROP INDEX audit_entries_kind", bypass_guard=False)
    backend.execute("DELETE FROM schema_version WHERE version = 4", bypass_guard=False)

    store = backend.open()
    assert store.schema_version == 4
    registry = MaterialRegistry(store, owns_store=True, metrics=False)
    try:
        registry.delete("fee", operator="bob", reason="withdrawn")
        assert [e.kind for e in store.material_changes("fee")] == ["material_change"] * 2
        assert [a.kind for a in store.get(MATERIALS_LOG).actions] == ["operator_action"] * 2
        assert store.verify_chain().ok and registry.verify().ok
    finally:
        registry.close()
    code, out = audit_verify(backend, capsys)
    assert code == 3 and "materials OK: 3 versions" in out


def store_changes(backend: Backend) -> list[Any]:
    store = backend.open()
    try:
        return store.material_changes("fee")
    finally:
        store.close()


def legacy_actions(backend: Backend) -> list[Any]:
    store = backend.open()
    try:
        return store.get(MATERIALS_LOG).actions
    finally:
        store.close()


def test_a_material_change_entry_cannot_be_appended_as_an_action(
    registry: MaterialRegistry,
) -> None:
    from tracerag.store import InvalidRecord

    registry.store.append_record(make_record("r1"))
    with pytest.raises(InvalidRecord):
        registry.store.append_action("r1", "material_change", "mallory", {"x": 1})
    with pytest.raises(InvalidRecord):
        registry.store.append_material_change(" ", "mallory", {"x": 1})


def test_a_keyed_chain_catches_a_resealed_material_change(
    backend: Backend, capsys: pytest.CaptureFixture[str]
) -> None:
    """With the chain key, an intruder who rewrites a material change and re-hashes the chain
    after it (without the key) is caught."""
    from tamper import KEY, reseal_from

    store = backend.open(chain_key=KEY)
    registry = MaterialRegistry(store, owns_store=True, metrics=False)
    try:
        registry.register("fee", FEE, operator="alice", written_by="kb-import@2")
        registry.quarantine("fee", operator="bob", reason="old fee")
        first = store.material_changes("fee")[0]
        assert store.verify_chain().ok
    finally:
        registry.close()
    backend.execute(
        "UPDATE audit_entries SET payload = replace(payload, 'alice', 'mallory') WHERE seq = ?",
        (first.seq,),
    )
    reseal_from(backend, first.seq)
    unkeyed = backend.open()
    try:
        report = unkeyed.verify_chain(key=KEY)
    finally:
        unkeyed.close()
    assert not report.ok and report.changed
