"""The audit writer's retry policy: which failures to retry, how long to wait, when to suspect.

A failure of the store (unreachable, locked, vanished) is transient and retried, in order,
with exponential backoff and jitter (tenacity's ``wait_exponential`` plus ``wait_random``); a
record the store refuses is not. A batch that keeps failing in real attempts is suspected of
holding a poisoned record (the drain then asks whether the store answers at all).
"""

from __future__ import annotations

import sqlite3

from tenacity import RetryCallState, Retrying, wait_exponential, wait_random

from tracerag.store._types import InvalidRecord, StoreError, StoreFailing

#: failed attempts on one batch before the writer asks the store whether it is the record
POISON_PROBE_AFTER = 3


def is_transient(exc: BaseException) -> bool:
    """True for failures of the store (retry later), False for problems of the record itself."""
    if isinstance(exc, InvalidRecord):
        return False
    if isinstance(exc, (sqlite3.IntegrityError, sqlite3.DataError, sqlite3.ProgrammingError)):
        return False
    try:
        import psycopg  # here: the postgres extra is optional

        if isinstance(exc, psycopg.DataError):
            return False
        if isinstance(exc, psycopg.Error):
            return True
    except ImportError:  # pragma: no cover - without the postgres extra
        pass
    return isinstance(exc, (StoreError, OSError, sqlite3.Error, TimeoutError))


def _after(attempt: int) -> RetryCallState:
    """A tenacity call state at ``attempt`` (what its wait strategies read)."""
    state = RetryCallState(Retrying(), None, (), {})
    state.attempt_number = max(1, attempt)
    return state


class RetryPolicy:
    """Backoff from ``initial`` seconds doubling up to ``maximum``, plus up to ``initial`` of
    jitter; the idle probe's backoff doubles the same way, without jitter, up to its own cap."""

    def __init__(self, initial: float, maximum: float) -> None:
        self.initial = initial
        self.maximum = maximum

    def delay(self, attempt: int) -> float:
        """Seconds to wait after the ``attempt``-th failed attempt (1-based)."""
        wait = wait_exponential(multiplier=self.initial, max=self.maximum) + wait_random(
            0, self.initial
        )
        return float(wait(_after(attempt)))

    def probe_delay(self, failures: int, cap: float) -> float:
        """Seconds to the next probe of a store that failed ``failures`` probes in a row."""
        return float(wait_exponential(multiplier=self.initial, max=cap)(_after(failures)))

    @staticmethod
    def suspect(attempt: int, exc: BaseException) -> bool:
        """Whether a batch failing ``attempt`` times with ``exc`` may hold a poisoned record.

        A store refusing without trying (``StoreFailing``: it failed moments ago) says nothing
        of the record: only failures of real attempts make it a suspect.
        """
        return attempt >= POISON_PROBE_AFTER and not isinstance(exc, StoreFailing)
