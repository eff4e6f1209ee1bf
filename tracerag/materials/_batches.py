"""Batch ids of registry writes: the writes inside ``scope()`` carry one id, per thread.

A batch is what ``rollback_batch`` restores together; a version given its own batch id keeps it.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager


class Batches:
    """The batch id the current thread's writes carry (none outside a ``scope``)."""

    def __init__(self) -> None:
        self._local = threading.local()

    @contextmanager
    def scope(self, batch_id: str | None = None) -> Iterator[str]:
        """Writes inside carry one batch id (a new one unless given), so they roll back together."""
        previous = getattr(self._local, "batch", None)
        self._local.batch = batch_id or "batch-" + uuid.uuid4().hex[:12]
        try:
            yield self._local.batch
        finally:
            self._local.batch = previous

    def current(self, batch_id: str | None = None) -> str | None:
        """``batch_id`` when given, else the id of the batch this thread is in (or None)."""
        return batch_id or getattr(self._local, "batch", None)


__all__ = ["Batches"]
