"""The audit writer's link to its store: opened lazily, and only ever the store it expects.

``StoreLink`` holds a store, or the callable that opens one (retried by the writer, so an
unreachable store at start-up does not stop the application). The store's identity
(``store_id`` and chain genesis) is remembered, in the journal directory when there is one,
and a store that vanished or was replaced by another is never written to.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from typing import Any

from tracerag.store._base import AuditStore
from tracerag.store._journal import IDENTITY_FILE, Journal
from tracerag.store._types import StoreReplaced


class StoreLink:
    """The store the writer writes to: ``store`` (None until opened) and how to reopen it."""

    def __init__(
        self, store: AuditStore | Callable[..., AuditStore], journal: Journal | None
    ) -> None:
        self._journal = journal
        if hasattr(store, "append_record"):
            self.store: Any = store
            self._open: Callable[..., AuditStore] | None = None
            self._open_takes_create = False
        else:
            self.store = None
            self._open = store
            try:
                params = inspect.signature(store).parameters
                self._open_takes_create = "create" in params or any(
                    p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
                )
            except (TypeError, ValueError):
                self._open_takes_create = False
        self.identity: dict[str, Any] | None = (
            journal.read_json(IDENTITY_FILE) if journal is not None else None
        )

    @property
    def opens(self) -> bool:
        """True when the link opened the store itself (and so closes it)."""
        return self._open is not None

    def ensure(self) -> Any:
        """The store, opened (never created once an identity is expected) and checked."""
        if self.store is None:
            assert self._open is not None
            if self.identity is not None and self._open_takes_create:
                store = self._open(create=False)
            else:
                store = self._open()
            try:
                self.check_identity(store)
            except BaseException:
                with contextlib.suppress(Exception):
                    store.close()
                raise
            self.store = store
        else:
            check = getattr(self.store, "check", None)
            if check is not None:
                check()  # raises when the store vanished under us
        return self.store

    def check_identity(self, store: Any) -> None:
        """Remember the first store's identity; raise ``StoreReplaced`` for any other store."""
        identity_of = getattr(store, "identity", None)
        if identity_of is None:
            return
        found = identity_of()
        expected = self.identity
        if expected is None:
            self.identity = found
            if self._journal is not None:
                self._journal.write_json(IDENTITY_FILE, found)
            return
        if found.get("store_id") != expected.get("store_id") or found.get(
            "genesis"
        ) != expected.get("genesis"):
            raise StoreReplaced(
                f"the audit store at {found.get('location')} is not the one written before "
                f"(store_id {found.get('store_id')}, expected {expected.get('store_id')}): "
                "it was replaced or recreated; records are kept"
                + (f" in the journal {self._journal.directory}" if self._journal else "")
                + " and not written to it"
            )

    def discard(self) -> None:
        """Forget a store that vanished or was replaced; it is reopened (never created)."""
        if self._open is None:
            return
        store, self.store = self.store, None
        if store is not None:
            with contextlib.suppress(Exception):
                store.close()

    def close(self) -> None:
        """Close the store if the link opened it (a store given is the caller's to close)."""
        with contextlib.suppress(Exception):
            if self._open is not None and self.store is not None:
                self.store.close()
