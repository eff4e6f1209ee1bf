"""Who is working on which review item: a claim with an expiry, taken when a reviewer opens it.

A claim shows on the queue and the item page, so a second reviewer sees that someone else is
on it; it ends with that reviewer's decision, when it expires, or when they release it. While
someone else's claim is live, a decision is refused (409).

Claims live in this server process. The store's own queue claims (``claim_next``) are honoured
as well: one older than the expiry is released, so an item nobody finished returns to the queue.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

CLAIM_SECONDS = 15 * 60


@dataclass(frozen=True)
class Claim:
    """One reviewer's hold on one item until ``expires`` (epoch seconds)."""

    request_id: str
    reviewer: str
    expires: float


class ClaimBoard:
    """The live claims of this server, expiring after ``seconds``."""

    def __init__(
        self, seconds: float = CLAIM_SECONDS, clock: Callable[[], float] = time.time
    ) -> None:
        self.seconds = seconds
        self.clock = clock
        self._claims: dict[str, Claim] = {}
        self._lock = threading.Lock()

    def _live(self, request_id: str) -> Claim | None:
        claim = self._claims.get(request_id)
        if claim is not None and claim.expires <= self.clock():
            del self._claims[request_id]
            return None
        return claim

    def get(self, request_id: str) -> Claim | None:
        """The live claim on an item, if any."""
        with self._lock:
            return self._live(request_id)

    def take(self, request_id: str, reviewer: str) -> Claim:
        """Claim an item for ``reviewer`` (renewing their own claim); returns the live claim,
        which is someone else's when they hold it."""
        with self._lock:
            claim = self._live(request_id)
            if claim is not None and claim.reviewer != reviewer:
                return claim
            claim = Claim(request_id, reviewer, self.clock() + self.seconds)
            self._claims[request_id] = claim
            return claim

    def release(self, request_id: str, reviewer: str | None = None) -> None:
        """End a claim (only ``reviewer``'s own, when given)."""
        with self._lock:
            claim = self._claims.get(request_id)
            if claim is not None and (reviewer is None or claim.reviewer == reviewer):
                del self._claims[request_id]

    def snapshot(self) -> dict[str, Claim]:
        """Every live claim by request id."""
        with self._lock:
            for rid in list(self._claims):
                self._live(rid)
            return dict(self._claims)
