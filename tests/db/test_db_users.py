"""The four users of the database layer: the tables beside the audit store open in the store's
own database, refuse with their own error once closed, and share it across connections."""

from __future__ import annotations

import sqlite3

import pytest

from tracerag.errors import ConfigurationError
from tracerag.materials._db import MaterialStoreError, connect_like, registry_present
from tracerag.server._desk_db import desk_db_like
from tracerag.server._run_table import RunTableError, open_run_table
from tracerag.store._sqlite import SQLiteAuditStore


@pytest.fixture
def store(tmp_path):
    opened = SQLiteAuditStore(tmp_path / "audit.sqlite")
    yield opened
    opened.close()


def _tables(path: str) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    finally:
        conn.close()


def test_the_tables_beside_the_store_live_in_its_file_with_their_own_versions(store) -> None:
    assert not registry_present(store)
    registry, desk, runs = connect_like(store), desk_db_like(store), open_run_table(store)
    assert desk is not None and runs is not None
    try:
        assert registry_present(store)
        tables = _tables(store.path)
        for version_table in (
            "schema_version",
            "material_schema_version",
            "desk_schema_version",
            "answer_run_schema_version",
        ):
            assert version_table in tables
        assert {"material_versions", "desk_sessions", "answer_runs"} <= tables
    finally:
        registry.close()
        desk.close()
        runs.close()


def test_a_closed_registry_and_run_table_refuse_with_their_own_errors(store) -> None:
    registry = connect_like(store)
    registry.close()
    with pytest.raises(MaterialStoreError, match="closed"), registry.read():
        pass
    runs = open_run_table(store)
    assert runs is not None
    runs.close()
    with pytest.raises(RunTableError, match="closed"):
        runs.count()


def test_the_desk_opens_its_tables_again_after_a_close(store) -> None:
    desk = desk_db_like(store)
    assert desk is not None
    with desk.write() as cur:
        cur.execute(
            "INSERT INTO desk_skips (item_id, reviewer, skipped_at) VALUES (%s, %s, %s)",
            ("r1", "ana", 1.0),
        )
    desk.close()
    with desk.read() as cur:  # the app started again on the same store
        cur.execute("SELECT reviewer FROM desk_skips WHERE item_id = %s", ("r1",))
        assert cur.fetchone() == ("ana",)
    desk.close()


def test_a_store_without_a_shared_database_has_no_tables_beside_it() -> None:
    memory = SQLiteAuditStore(":memory:")
    try:
        assert desk_db_like(memory) is None
        assert open_run_table(memory) is None
        assert not registry_present(memory)
        with pytest.raises(ConfigurationError, match=":memory:"):
            connect_like(memory)
        with pytest.raises(ConfigurationError, match="cannot find the database"):
            connect_like(object())
    finally:
        memory.close()


def test_registry_reads_and_writes_take_qmark_parameters_on_its_own_connections(store) -> None:
    registry = connect_like(store)
    try:
        with registry.write() as cur:
            cur.execute(
                "INSERT INTO material_complaints (request_id, verdict, created_at) "
                "VALUES (?, ?, ?)",
                ("r1", "wrong", "2026-01-01"),
            )
        with registry.read() as cur:
            cur.execute("SELECT verdict FROM material_complaints WHERE request_id = ?", ("r1",))
            assert cur.fetchone() == ("wrong",)
        with pytest.raises(sqlite3.IntegrityError), registry.write() as cur:
            cur.execute(
                "INSERT INTO material_complaints (request_id, verdict, created_at) "
                "VALUES (?, ?, ?)",
                ("r1", "again", "2026-01-02"),
            )
        with registry.read() as cur:  # the failed write left nothing
            cur.execute("SELECT COUNT(*) FROM material_complaints")
            assert cur.fetchone() == (1,)
    finally:
        registry.close()
