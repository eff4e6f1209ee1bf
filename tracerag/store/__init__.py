"""The durable audit trail: every request's artifacts, hash-chained, with a review queue.

``open_store()`` opens the store named by its argument, else by ``TRACERAG_STORE``; with
neither it refuses (tracerag never picks a file location on its own); ``create=False`` never
creates one. ``AuditWriter`` writes records in the background, through a crash-safe journal
(``Journal``) when it has one, so that a store never holds up an answer and an answer never
claims more than what is durable.

Modules: ``base`` (entry kinds, errors, data types, the ``AuditStore`` protocol), ``record``
(record ↔ entries codec, ``RequestTrail``), ``chain`` (hash chain, RFC 8785, verifier),
``sql`` (the SQL both backends share), ``review_queue``, ``migrations`` (one schema for both
dialects), ``sqlite``, ``postgres``, ``journal``, ``writer``.
"""

from __future__ import annotations

from typing import Any

from tracerag.config import get_config
from tracerag.errors import ConfigurationError
from tracerag.store.base import (
    ACTION_KINDS,
    KIND_QUARANTINED,
    RECORD_KINDS,
    REVIEW_ACTIONS,
    REVIEW_ROUTES,
    AlreadyDecided,
    AlreadyReviewed,
    AuditStore,
    ClaimedByOther,
    DuplicateRequest,
    Entry,
    InvalidRecord,
    NotQueued,
    QueueItem,
    RequestNotFound,
    RequestSummary,
    ReviewDecision,
    ReviewQueue,
    SchemaTooNew,
    StoreError,
    StoreMetrics,
    StoreMissing,
    StoreReplaced,
    StoreVanished,
)
from tracerag.store.chain import ChainIssue, ChainReport
from tracerag.store.journal import Journal, JournalBusy, JournalError
from tracerag.store.record import RequestTrail, entries_from_record, record_from_entries
from tracerag.store.sql import StoreFailing
from tracerag.store.writer import AuditWriter

STORE_ENV = "TRACERAG_STORE"
#: Where the command line (``tracerag demo``, ``show``, ``audit verify``…) keeps its audit trail
#: when neither ``--store`` nor ``TRACERAG_STORE`` names one; library calls never use it.
CLI_DEFAULT_STORE = "./.tracerag/audit.sqlite"


def cli_store_url(url_or_path: str | None = None) -> str:
    """The store a command uses: ``--store``, else ``TRACERAG_STORE``, else the CLI default."""
    if url_or_path and str(url_or_path).strip():
        return str(url_or_path)
    return get_config().store or CLI_DEFAULT_STORE


def resolve_store_url(url_or_path: str | None = None) -> str:
    """The store location that ``open_store`` would use for this argument.

    ``None`` or blank: ``TRACERAG_STORE``; ``ConfigurationError`` when that is unset too.
    """
    if url_or_path is None or not str(url_or_path).strip():
        url_or_path = get_config().store
        if not url_or_path:
            raise ConfigurationError(
                f"no audit store configured: pass a store URL or path, or set {STORE_ENV}"
            )
    return str(url_or_path)


def open_store(
    url_or_path: str | None = None, *, create: bool = True, **options: Any
) -> AuditStore:
    """Open (migrating if needed) the audit store at a URL or path; create it if ``create``.

    ``None`` → env ``TRACERAG_STORE`` (``ConfigurationError`` when unset).
    ``postgresql://…`` / ``postgres://…`` → PostgreSQL. ``sqlite:///relative/path``,
    ``sqlite:////absolute/path``, ``sqlite://`` or ``:memory:`` (in memory) and plain paths →
    SQLite. ``create=False`` opens only an existing store (``StoreMissing`` otherwise): what
    reading commands use. ``options`` go to the backend's constructor (e.g.
    ``auto_enqueue=False``); ``chain_key`` defaults to ``TRACERAG_CHAIN_KEY``.
    """
    options["create"] = create
    options.setdefault("chain_key", get_config().chain_key)
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


def sqlite_path(url_or_path: str) -> str | None:
    """The file of a SQLite store URL or path; None for PostgreSQL and in-memory stores."""
    lowered = url_or_path.lower()
    if lowered.startswith(("postgresql://", "postgres://")):
        return None
    if lowered.startswith("sqlite:"):
        rest = url_or_path[len("sqlite:") :]
        if not rest.startswith("///") or rest in ("///:memory:",):
            return None
        return rest[3:]
    if url_or_path == ":memory:" or "://" in url_or_path:
        return None
    return url_or_path


def journal_dir_for(url_or_path: str) -> str | None:
    """Where the writer keeps the audit journal for a store.

    ``TRACERAG_AUDIT_JOURNAL`` when set; else ``<file>.journal`` beside a SQLite file; else
    None (PostgreSQL or in memory: no journal unless configured).
    """
    configured = get_config().audit_journal
    if configured:
        return configured
    path = sqlite_path(url_or_path)
    return f"{path}.journal" if path else None


__all__ = [
    "ACTION_KINDS",
    "CLI_DEFAULT_STORE",
    "KIND_QUARANTINED",
    "RECORD_KINDS",
    "REVIEW_ACTIONS",
    "REVIEW_ROUTES",
    "STORE_ENV",
    "AlreadyDecided",
    "AlreadyReviewed",
    "AuditStore",
    "AuditWriter",
    "ChainIssue",
    "ChainReport",
    "ClaimedByOther",
    "DuplicateRequest",
    "Entry",
    "InvalidRecord",
    "Journal",
    "JournalBusy",
    "JournalError",
    "NotQueued",
    "QueueItem",
    "RequestNotFound",
    "RequestSummary",
    "RequestTrail",
    "ReviewDecision",
    "ReviewQueue",
    "SchemaTooNew",
    "StoreError",
    "StoreFailing",
    "StoreMetrics",
    "StoreMissing",
    "StoreReplaced",
    "StoreVanished",
    "cli_store_url",
    "entries_from_record",
    "journal_dir_for",
    "open_store",
    "record_from_entries",
    "resolve_store_url",
]
