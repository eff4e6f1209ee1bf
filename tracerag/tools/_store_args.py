"""The ``--store`` option the commands share, and opening that store with one clear line."""

from __future__ import annotations

import argparse
import re
from typing import Any

from tracerag.errors import TraceragError


def add_store_argument(parser: argparse.ArgumentParser) -> None:
    """The shared ``--store URL`` option (default: env TRACERAG_STORE, else the SQLite file)."""
    parser.add_argument(
        "--store",
        metavar="URL",
        default=None,
        help="audit store URL or path (default: $TRACERAG_STORE, else ./.tracerag/audit.sqlite)",
    )


def open_cli_store(url: str | None, *, create: bool = False, **options: Any) -> Any:
    """Open an existing audit store for a command, or exit 1 with one clear line."""
    # the store imports pydantic: imported when a command opens it, not when a parser adds
    # --store (``tracerag serve --help`` builds its parser from this module)
    from tracerag.store import open_store
    from tracerag.store._open import cli_store_url

    target = cli_store_url(url)
    try:
        return open_store(target, create=create, **options)
    except (TraceragError, OSError) as exc:
        message = _one_line(exc)
    except Exception as exc:  # a driver error the backend did not wrap
        message = f"{type(exc).__name__}: {_one_line(exc)}"
    raise SystemExit(f"tracerag: cannot open the audit store {_shown(target)}: {message}")


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _shown(target: str) -> str:
    """The store location without a password."""
    return re.sub(r"(://[^:/@]+):[^@/]*@", r"\1:***@", target)
