"""Schema versions: one table's migrations, applied in order, each with its version row.

A ``Schema`` names its version table, its migrations and the error raised when the database
is newer than the code. A step is SQL for both dialects (``{bigint}``/``{double}`` for the types
that differ), a mapping ``{"sqlite": ..., "postgres": ...}`` (a dialect may be absent: nothing to
do there), or a function ``(cursor, dialect)``. The caller holds the lock (``_sqlite``,
``_postgres``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Union

from tracerag._db._dialect import DIALECTS, TYPES
from tracerag.errors import ConfigurationError

Step = Union[str, Mapping[str, str], Callable[[Any, str], None]]  # noqa: UP007
Migrations = Sequence[tuple[int, Sequence[Step]]]


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def create_version_table(name: str) -> str:
    """The SQL that creates a table of applied schema versions named ``name``."""
    return (
        f"CREATE TABLE IF NOT EXISTS {name} (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)"
    )


def statements(step: Step, dialect: str) -> Sequence[str]:
    """The SQL of a textual step in a dialect (empty when the step does nothing there)."""
    if isinstance(step, str):
        return [step.format(**TYPES[dialect])]
    if isinstance(step, Mapping):
        sql = step.get(dialect)
        return [sql.format(**TYPES[dialect])] if sql else []
    return []


def migrate(
    cur: Any,
    dialect: str,
    migrations: Migrations,
    *,
    version_table: str,
    schema: str,
    refuse: type[Exception],
    target: int | None = None,
) -> int:
    """Apply the pending ``migrations`` up to ``target`` (default: the last) inside the
    caller's lock, each with its row in ``version_table``.

    ``cur`` takes ``format``-style parameters. Returns the new version; raises ``refuse`` when
    the database holds a newer version of ``schema`` than ``migrations`` reach.
    """
    if dialect not in DIALECTS:
        raise ConfigurationError(f"unknown SQL dialect {dialect!r}")
    latest = migrations[-1][0]
    target = latest if target is None else target
    cur.execute(create_version_table(version_table))
    cur.execute(f"SELECT MAX(version) FROM {version_table}")
    current = int(cur.fetchone()[0] or 0)
    if current > latest:
        raise refuse(
            f"{schema} schema version {current} is newer than this tracerag "
            f"supports ({latest}); upgrade tracerag"
        )
    for version, steps in migrations:
        if current < version <= target:
            for step in steps:
                if callable(step):
                    step(cur, dialect)
                    continue
                for sql in statements(step, dialect):
                    cur.execute(sql)
            cur.execute(
                f"INSERT INTO {version_table} (version, applied_at) VALUES (%s, %s)",
                (version, _now_iso()),
            )
            current = version
    return current


@dataclass(frozen=True)
class Schema:
    """One set of tables and their migrations.

    ``lock`` names the PostgreSQL advisory lock migrations take; ``lock_per_schema`` scopes it
    to the connection's schema (each kept as the release that created the tables took it, so
    that replicas of both releases exclude each other while upgrading).
    """

    name: str
    version_table: str
    migrations: Migrations
    refuse: type[Exception]
    lock: str
    lock_per_schema: bool = True

    @property
    def latest(self) -> int:
        return self.migrations[-1][0]

    def apply(self, cur: Any, dialect: str, target: int | None = None) -> int:
        """Apply the pending migrations inside the caller's lock; the new version."""
        return migrate(
            cur,
            dialect,
            self.migrations,
            version_table=self.version_table,
            schema=self.name,
            refuse=self.refuse,
            target=target,
        )
