"""The internal database layer: placeholders, SQLite and PostgreSQL connections, schema versions.

Each object is tried on a real database (a SQLite file in a temporary directory; the PostgreSQL
test server for the ``postgres`` tests, which skip with a message when there is none), and on
its failures: a migration that fails leaves nothing behind, a closed database refuses, a writer
waiting on another process gives up after its busy timeout while readers go on.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from store_fixtures import postgres_dsn

from tracerag._db import (
    FormatCursor,
    PostgresDB,
    PostgresSchema,
    QmarkCursor,
    Schema,
    SQLiteDB,
    SQLiteFile,
    locate,
    to_qmark,
    transaction,
)
from tracerag._db import _postgres as postgres
from tracerag._db import _sqlite as sqlite
from tracerag.errors import ConfigurationError, TraceragError


class Refused(TraceragError):
    """A test schema's own error."""


def _closed() -> Refused:
    return Refused("the test database is closed")


def _schema(steps_v2: list[Any] | None = None, **options: Any) -> Schema:
    migrations: list[tuple[int, list[Any]]] = [
        (1, ["CREATE TABLE items (id {bigint} PRIMARY KEY, score {double} NOT NULL)"]),
        (2, steps_v2 if steps_v2 is not None else ["ALTER TABLE items ADD COLUMN note TEXT"]),
    ]
    return Schema(
        name="test tables",
        version_table="test_schema_version",
        migrations=migrations,
        refuse=Refused,
        lock="tracerag.test.schema",
        **options,
    )


def _opener(path: str, busy_timeout_s: float = 2.0) -> Any:
    return lambda: sqlite.open_file(path, busy_timeout_s=busy_timeout_s, synchronous="NORMAL")


def _wal(path: str) -> None:
    conn = sqlite.connect(path, busy_timeout_s=1.0)
    try:
        assert sqlite.configure(conn, busy_timeout_s=1.0, wal=True) == "wal"
    finally:
        conn.close()


# -- placeholders -------------------------------------------------------------------------------


def test_format_placeholders_become_qmarks_and_a_statement_without_parameters_is_kept() -> None:
    assert to_qmark("a = %s AND b LIKE 'x%%' AND c = %s") == "a = ? AND b LIKE 'x%' AND c = ?"
    conn = sqlite3.connect(":memory:")
    cur = QmarkCursor(conn.cursor())
    cur.execute("SELECT %s, 'a%%b'", ("?",))
    assert cur.fetchone() == ("?", "a%b")
    cur.execute("SELECT 'a%%b'")  # no parameters: sent as written, as psycopg does
    assert cur.fetchone() == ("a%%b",)
    cur.execute("CREATE TABLE t (x)")
    cur.executemany("INSERT INTO t VALUES (%s)", [(1,), (2,)])
    cur.execute("SELECT x FROM t ORDER BY x")
    assert cur.fetchall() == [(1,), (2,)]


def test_qmark_sql_goes_through_a_format_cursor() -> None:
    conn = sqlite3.connect(":memory:")
    cur = FormatCursor(QmarkCursor(conn.cursor()))
    cur.execute("SELECT ?, ?", ("a", 2))
    assert cur.fetchone() == ("a", 2)
    cur.execute("SELECT 1")
    assert cur.fetchall() == [(1,)]
    with pytest.raises(sqlite3.Error):  # a parameter missing is not papered over
        cur.execute("SELECT ?", ())


# -- schema versions ----------------------------------------------------------------------------


def test_a_schema_migrates_step_by_step_and_once(tmp_path) -> None:
    path = str(tmp_path / "db.sqlite")
    conn = sqlite.connect(path, busy_timeout_s=1.0)
    try:
        assert sqlite.migrate(conn, _schema(), target=1) == 1
        assert [r[1] for r in conn.execute("PRAGMA table_info(items)")] == ["id", "score"]
        assert sqlite.migrate(conn, _schema()) == 2
        assert sqlite.migrate(conn, _schema()) == 2  # nothing pending: nothing done
        assert [r[1] for r in conn.execute("PRAGMA table_info(items)")][-1] == "note"
        versions = [r[0] for r in conn.execute("SELECT version FROM test_schema_version")]
        assert versions == [1, 2]
        types = [r[2] for r in conn.execute("PRAGMA table_info(items)")]
        assert types[:2] == ["INTEGER", "REAL"]  # the dialect's types
    finally:
        conn.close()


def test_a_failing_migration_leaves_the_database_at_its_version(tmp_path) -> None:
    def boom(cur: Any, dialect: str) -> None:
        raise RuntimeError("a step failed")

    path = str(tmp_path / "db.sqlite")
    conn = sqlite.connect(path, busy_timeout_s=1.0)
    try:
        sqlite.migrate(conn, _schema(), target=1)
        broken = _schema(["CREATE TABLE half_done (x INTEGER)", boom])
        with pytest.raises(RuntimeError, match="a step failed"):
            sqlite.migrate(conn, broken)
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert "half_done" not in tables  # rolled back with its version row
        assert conn.execute("SELECT MAX(version) FROM test_schema_version").fetchone() == (1,)
        assert not conn.in_transaction
    finally:
        conn.close()


def test_a_database_newer_than_the_code_is_refused_with_the_schemas_error(tmp_path) -> None:
    path = str(tmp_path / "db.sqlite")
    conn = sqlite.connect(path, busy_timeout_s=1.0)
    try:
        sqlite.migrate(conn, _schema())
        conn.execute("INSERT INTO test_schema_version VALUES (7, 'later')")
        with pytest.raises(Refused, match=r"test tables schema version 7 is newer .*upgrade"):
            sqlite.migrate(conn, _schema())
    finally:
        conn.close()


def test_an_unknown_dialect_is_a_configuration_error() -> None:
    conn = sqlite3.connect(":memory:")
    with pytest.raises(ConfigurationError, match="oracle"):
        _schema().apply(QmarkCursor(conn.cursor()), "oracle")


# -- SQLite connections -------------------------------------------------------------------------


def test_configure_sets_the_pragmas_and_refuses_an_unknown_synchronous_level(tmp_path) -> None:
    conn = sqlite.connect(str(tmp_path / "db.sqlite"), busy_timeout_s=1.5)
    try:
        mode = sqlite.configure(
            conn, busy_timeout_s=1.5, synchronous="normal", wal=True, foreign_keys=True
        )
        assert mode == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone() == (1,)  # NORMAL
        assert conn.execute("PRAGMA busy_timeout").fetchone() == (1500,)
        assert conn.execute("PRAGMA foreign_keys").fetchone() == (1,)
        with pytest.raises(ConfigurationError, match="sometimes"):
            sqlite.configure(conn, busy_timeout_s=1.0, synchronous="sometimes")
    finally:
        conn.close()


def test_an_existing_file_only_mode_creates_nothing(tmp_path) -> None:
    missing = tmp_path / "missing.sqlite"
    with pytest.raises(sqlite3.OperationalError):
        sqlite.connect(str(missing), busy_timeout_s=0.1, mode="rw")
    assert not missing.exists()


def test_a_transaction_commits_or_rolls_back_as_a_whole(tmp_path) -> None:
    conn = sqlite.connect(str(tmp_path / "db.sqlite"), busy_timeout_s=1.0)
    try:
        conn.execute("CREATE TABLE t (x INTEGER)")
        with transaction(conn, "BEGIN IMMEDIATE") as cur:
            cur.execute("INSERT INTO t VALUES (1)")
        with pytest.raises(KeyError), transaction(conn) as cur:
            cur.execute("INSERT INTO t VALUES (2)")
            raise KeyError("the block failed")
        assert conn.execute("SELECT x FROM t").fetchall() == [(1,)]
        assert not conn.in_transaction
    finally:
        conn.close()


def test_sqlite_db_writes_reads_and_refuses_once_closed(tmp_path) -> None:
    db = SQLiteDB(_opener(str(tmp_path / "db.sqlite")), closed_error=_closed)
    assert db.migrate(_schema()) == 2
    with db.write() as cur:
        cur.execute("INSERT INTO items (id, score) VALUES (%s, %s)", (1, 0.5))
    with db.read() as cur:
        cur.execute("SELECT id, score FROM items WHERE id = %s", (1,))
        assert cur.fetchone() == (1, 0.5)
    db.close()
    db.close()  # twice is harmless
    assert db.closed
    with pytest.raises(Refused, match="closed"), db.read():
        pass


def test_sqlite_db_with_reopen_opens_again_after_a_close(tmp_path) -> None:
    db = SQLiteDB(_opener(str(tmp_path / "db.sqlite")), closed_error=_closed, reopen=True)
    db.migrate(_schema())
    with db.write() as cur:
        cur.execute("INSERT INTO items (id, score) VALUES (%s, %s)", (1, 1.0))
    db.close()
    assert db.closed
    with db.read() as cur:
        cur.execute("SELECT COUNT(*) FROM items")
        assert cur.fetchone() == (1,)
    assert not db.closed
    db.close()


def test_qmark_paramstyle_gives_the_raw_cursor(tmp_path) -> None:
    db = SQLiteDB(_opener(str(tmp_path / "db.sqlite")), closed_error=_closed, paramstyle="qmark")
    db.migrate(_schema())
    with db.write() as cur:
        cur.execute("INSERT INTO items (id, score) VALUES (?, ?)", (3, 2.0))
    with db.read() as cur:
        cur.execute("SELECT score FROM items WHERE id = ?", (3,))
        assert cur.fetchone() == (2.0,)
    db.close()


def _hold_write_lock(path: str) -> tuple[sqlite3.Connection, sqlite3.Cursor]:
    """Another process's writer, in the middle of its transaction."""
    other = sqlite.connect(path, busy_timeout_s=0.1)
    cur = other.cursor()
    cur.execute("BEGIN IMMEDIATE")
    cur.execute("INSERT INTO items (id, score) VALUES (99, 0.0)")
    return other, cur


def test_a_writer_gives_up_after_its_busy_timeout_while_readers_go_on(tmp_path) -> None:
    path = str(tmp_path / "db.sqlite")
    _wal(path)
    db = SQLiteDB(_opener(path, busy_timeout_s=0.3), closed_error=_closed, separate_reads=True)
    db.migrate(_schema())
    with db.write() as cur:
        cur.execute("INSERT INTO items (id, score) VALUES (%s, %s)", (1, 1.0))
    other, held = _hold_write_lock(path)
    try:
        started = time.monotonic()
        with pytest.raises(sqlite3.OperationalError, match="locked"), db.write() as cur:
            cur.execute("INSERT INTO items (id, score) VALUES (%s, %s)", (2, 2.0))
        assert time.monotonic() - started < 5.0  # bounded by the busy timeout, not forever
        with db.read() as cur:  # WAL: the committed rows, not the other writer's
            cur.execute("SELECT id FROM items ORDER BY id")
            assert cur.fetchall() == [(1,)]
    finally:
        held.execute("ROLLBACK")
        other.close()
    with db.write() as cur:  # the lock released: writing goes on
        cur.execute("INSERT INTO items (id, score) VALUES (%s, %s)", (2, 2.0))
    db.close()


def test_a_read_on_its_own_connection_is_not_held_up_by_a_waiting_writer(tmp_path) -> None:
    path = str(tmp_path / "db.sqlite")
    _wal(path)
    db = SQLiteDB(_opener(path, busy_timeout_s=3.0), closed_error=_closed, separate_reads=True)
    db.migrate(_schema())
    other, held = _hold_write_lock(path)
    errors: list[BaseException] = []

    def write() -> None:
        try:
            with db.write() as cur:  # BEGIN IMMEDIATE waits on the other process
                cur.execute("INSERT INTO items (id, score) VALUES (%s, %s)", (5, 5.0))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=write)
    try:
        thread.start()
        deadline = time.monotonic() + 2.0
        while db._writer.lock.acquire(blocking=False):  # until the writer thread holds it
            db._writer.lock.release()
            assert time.monotonic() < deadline, "the writer never started"
            time.sleep(0.01)
        with db.read() as cur:  # answered while the writer waits for the file's lock
            cur.execute("SELECT COUNT(*) FROM items")
            assert cur.fetchone() == (0,)
        assert thread.is_alive()
    finally:
        held.execute("ROLLBACK")
        other.close()
        thread.join(5)
    assert not errors
    with db.read() as cur:
        cur.execute("SELECT id FROM items")
        assert cur.fetchall() == [(5,)]
    db.close()


def test_a_read_only_snapshot_cannot_write(tmp_path) -> None:
    path = str(tmp_path / "db.sqlite")
    _wal(path)
    db = SQLiteDB(_opener(path), closed_error=_closed)
    db.migrate(_schema())
    with sqlite.read_only(path, busy_timeout_s=1.0) as cur:
        cur.execute("SELECT COUNT(*) FROM items")
        assert cur.fetchone() == (0,)
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            cur.execute("INSERT INTO items (id, score) VALUES (%s, %s)", (1, 1.0))
    db.close()


# -- where a store's database is ----------------------------------------------------------------


class _Store:
    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)


def test_locate_finds_the_database_a_store_uses() -> None:
    pg = locate(_Store(dsn="postgresql://h/db", schema="s1", path=None))
    assert pg == PostgresSchema("postgresql://h/db", "s1")
    assert locate(_Store(dsn="postgresql://h/db")) == PostgresSchema("postgresql://h/db", None)
    assert locate(_Store(path="/data/audit.sqlite")) == SQLiteFile("/data/audit.sqlite")
    for shared_by_nobody in (
        _Store(path=":memory:"),
        _Store(path="file::memory:?cache=shared"),
        _Store(path=""),
        _Store(dsn=""),
        object(),
    ):
        assert locate(shared_by_nobody) is None


# -- PostgreSQL ---------------------------------------------------------------------------------


@pytest.fixture
def pg_schema() -> Iterator[tuple[str, str]]:
    dsn = postgres_dsn()
    schema = "t_db_" + uuid.uuid4().hex[:10]
    yield dsn, schema
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.mark.integration
def test_postgres_db_migrates_once_when_started_together(pg_schema) -> None:
    dsn, schema = pg_schema
    dbs = [
        PostgresDB(lambda: postgres.connect(dsn, schema), max_connections=2, closed_error=_closed)
        for _ in range(4)
    ]
    versions: list[int] = []
    errors: list[BaseException] = []

    def start(db: PostgresDB) -> None:
        try:
            versions.append(db.migrate(_schema()))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(db,)) for db in dbs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and versions == [2, 2, 2, 2]
    with dbs[0].read() as cur:
        cur.execute("SELECT version FROM test_schema_version ORDER BY version")
        assert cur.fetchall() == [(1,), (2,)]  # each version applied once, under the lock
        cur.execute(
            "SELECT data_type FROM information_schema.columns WHERE table_schema = %s "
            "AND table_name = 'items' ORDER BY ordinal_position",
            (schema,),
        )
        assert [r[0] for r in cur.fetchall()][:2] == ["bigint", "double precision"]
    for db in dbs:
        db.close()


@pytest.mark.integration
def test_postgres_db_rolls_back_refuses_once_closed_and_reopens(pg_schema) -> None:
    dsn, schema = pg_schema
    db = PostgresDB(lambda: postgres.connect(dsn, schema), max_connections=1, closed_error=_closed)
    db.migrate(_schema())
    with pytest.raises(KeyError), db.write() as cur:
        cur.execute("INSERT INTO items (id, score) VALUES (%s, %s)", (1, 1.0))
        raise KeyError("the block failed")
    with db.read() as cur:
        cur.execute("SELECT COUNT(*) FROM items")
        assert cur.fetchone() == (0,)
    db.close()
    assert db.closed
    with pytest.raises(Refused, match="closed"), db.write():
        pass
    again = PostgresDB(
        lambda: postgres.connect(dsn, schema), max_connections=1, closed_error=_closed, reopen=True
    )
    again.close()
    with again.write() as cur:  # an app started again: a new pool
        cur.execute("INSERT INTO items (id, score) VALUES (%s, %s)", (2, 2.0))
    assert not again.closed
    again.close()


@pytest.mark.integration
def test_a_broken_connection_is_dropped_from_the_pool(pg_schema) -> None:
    dsn, schema = pg_schema
    db = PostgresDB(lambda: postgres.connect(dsn, schema), max_connections=1, closed_error=_closed)
    with db.connection() as conn:
        first = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    with db.connection() as conn:  # idle and usable: handed out again
        assert conn.execute("SELECT pg_backend_pid()").fetchone()[0] == first
    with pytest.raises(Exception), db.connection() as conn:  # noqa: B017 - the server's error
        conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
    with db.connection() as conn:  # a new connection, not the dead one
        assert conn.execute("SELECT pg_backend_pid()").fetchone()[0] != first
    db.close()


@pytest.mark.integration
def test_a_full_pool_makes_the_next_caller_wait_for_a_connection(pg_schema) -> None:
    dsn, schema = pg_schema
    db = PostgresDB(lambda: postgres.connect(dsn, schema), max_connections=1, closed_error=_closed)
    got = threading.Event()

    def second_caller() -> None:
        with db.connection():
            got.set()

    with db.connection():
        waiter = threading.Thread(target=second_caller)
        waiter.start()
        assert not got.wait(0.3)  # the one connection is in use: the caller waits
    assert got.wait(5)  # released: handed to the waiting caller
    waiter.join(5)
    db.close()


@pytest.mark.integration
def test_qmark_sql_on_postgres_and_separate_reads(pg_schema) -> None:
    dsn, schema = pg_schema
    db = PostgresDB(
        lambda: postgres.connect(dsn, schema),
        max_connections=1,
        closed_error=_closed,
        separate_reads=True,
        paramstyle="qmark",
    )
    db.migrate(_schema())
    with db.write() as cur:
        cur.execute("INSERT INTO items (id, score) VALUES (?, ?)", (1, 1.5))
        with db.read() as reader:  # the one write connection is busy; reads have their own
            reader.execute("SELECT COUNT(*) FROM items")
            assert reader.fetchone() == (0,)  # not the uncommitted row
    with db.read() as cur:
        cur.execute("SELECT score FROM items WHERE id = ?", (1,))
        assert cur.fetchone() == (1.5,)
    db.close()


@pytest.mark.integration
def test_postgres_statement_timeout_bounds_a_lock_wait(pg_schema) -> None:
    dsn, schema = pg_schema
    db = PostgresDB(
        lambda: postgres.connect(dsn, schema, statement_timeout=0.5),
        max_connections=2,
        closed_error=_closed,
    )
    db.migrate(_schema())
    with db.write() as cur:
        cur.execute("INSERT INTO items (id, score) VALUES (%s, %s)", (1, 1.0))
    import psycopg

    with db.write() as holder:
        holder.execute("SELECT id FROM items WHERE id = 1 FOR UPDATE")
        started = time.monotonic()
        with (
            pytest.raises((psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled)),
            db.write() as cur,
        ):
            cur.execute("SELECT id FROM items WHERE id = 1 FOR UPDATE")
        assert time.monotonic() - started < 5.0
    db.close()
