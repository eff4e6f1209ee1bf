"""Opening an audit store: its location from an argument or ``TRACERAG_STORE``, and its backend."""

from __future__ import annotations

from typing import Any

from tracerag.config import get_config
from tracerag.errors import ConfigurationError
from tracerag.store._base import AuditStore

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
        from tracerag.store._postgres import PostgresAuditStore

        return PostgresAuditStore(target, **options)
    from tracerag.store._sqlite import SQLiteAuditStore

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
