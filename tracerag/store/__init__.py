"""The durable audit trail: every request's artifacts, hash-chained, with a review queue.

``open_store()`` opens the store named by its argument, else by ``TRACERAG_STORE``, else the
SQLite file ``./.tracerag/audit.sqlite``. ``AuditWriter`` writes records in the background so
that storing never slows or breaks an answer; ``render_timeline`` shows one request the way an
investigator reads it.
"""

from __future__ import annotations

import os
from typing import Any

from tracerag.errors import ConfigurationError
from tracerag.store.base import (
    ACTION_KINDS,
    RECORD_KINDS,
    REVIEW_ACTIONS,
    REVIEW_ROUTES,
    AlreadyDecided,
    AuditStore,
    ClaimedByOther,
    DuplicateRequest,
    Entry,
    InvalidRecord,
    NotQueued,
    QueueItem,
    RequestNotFound,
    RequestSummary,
    RequestTrail,
    ReviewDecision,
    SchemaTooNew,
    StoreError,
    StoreMetrics,
    entries_from_record,
    record_from_entries,
)
from tracerag.store.chain import ChainIssue, ChainReport
from tracerag.store.timeline import render_json, render_timeline
from tracerag.store.writer import AuditWriter

STORE_ENV = "TRACERAG_STORE"
DEFAULT_STORE_PATH = "./.tracerag/audit.sqlite"


def resolve_store_url(url_or_path: str | None = None) -> str:
    """The store location that ``open_store`` would use for this argument."""
    if url_or_path is None or not str(url_or_path).strip():
        url_or_path = os.environ.get(STORE_ENV, "").strip() or DEFAULT_STORE_PATH
    return str(url_or_path)


def open_store(url_or_path: str | None = None, **options: Any) -> AuditStore:
    """Open (creating and migrating if needed) the audit store at a URL or path.

    ``None`` → env ``TRACERAG_STORE`` → ``./.tracerag/audit.sqlite``.
    ``postgresql://…`` / ``postgres://…`` → PostgreSQL. ``sqlite:///relative/path``,
    ``sqlite:////absolute/path``, ``sqlite://`` or ``:memory:`` (in memory) and plain paths →
    SQLite. ``options`` go to the backend's constructor (e.g. ``auto_enqueue=False``).
    """
    target = resolve_store_url(url_or_path)
    lowered = target.lower()
    if lowered.startswith(("postgresql://", "postgres://")):
        from tracerag.store.postgres import PostgresAuditStore

        return PostgresAuditStore(target, **options)
    from tracerag.store.sqlite import SQLiteAuditStore

    if lowered.startswith("sqlite:"):
        path = target[len("sqlite:") :]
        if path in ("", "//", "///:memory:", "//:memory:"):
            path = ":memory:"
        elif path.startswith("///"):
            path = path[3:]
        else:
            raise ConfigurationError(
                f"cannot read SQLite URL {target!r}: use sqlite:///relative/path or "
                "sqlite:////absolute/path"
            )
        return SQLiteAuditStore(path, **options)
    if "://" in target:
        scheme = target.split("://", 1)[0]
        raise ConfigurationError(
            f"unknown audit store scheme {scheme!r}: use a path, sqlite:/// or postgresql://"
        )
    return SQLiteAuditStore(target, **options)


__all__ = [
    "ACTION_KINDS",
    "DEFAULT_STORE_PATH",
    "RECORD_KINDS",
    "REVIEW_ACTIONS",
    "REVIEW_ROUTES",
    "STORE_ENV",
    "AlreadyDecided",
    "AuditStore",
    "AuditWriter",
    "ChainIssue",
    "ChainReport",
    "ClaimedByOther",
    "DuplicateRequest",
    "Entry",
    "InvalidRecord",
    "NotQueued",
    "QueueItem",
    "RequestNotFound",
    "RequestSummary",
    "RequestTrail",
    "ReviewDecision",
    "SchemaTooNew",
    "StoreError",
    "StoreMetrics",
    "entries_from_record",
    "open_store",
    "record_from_entries",
    "render_json",
    "render_timeline",
    "resolve_store_url",
]
