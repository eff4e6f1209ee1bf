"""Who is working on which review item: a claim with an expiry, taken when a reviewer opens it.

A claim shows on the queue and the item page, so a second reviewer sees that someone else is
on it; it ends with that reviewer's decision, when it expires, when they release or skip it,
or when they sign out of the session that took it. While someone else's claim is live, a
decision is refused (409).

Claims are kept in the audit store's database when it has one (``SharedClaimBoard``), so a
claim taken through one server process holds on every other; otherwise in this process
(``ClaimBoard``). The store's own queue claims (``claim_next``) are honoured as well: one older
than the expiry is released, so an item nobody finished returns to the queue.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tracerag.server._desk_db import DeskDB

CLAIM_SECONDS = 15 * 60


@dataclass(frozen=True)
class Claim:
    """One reviewer's hold on one item until ``expires`` (epoch seconds)."""

    request_id: str
    reviewer: str
    expires: float
    #: the session that took it (signing out of it releases the claim); "" when none
    session: str = ""


class ClaimBoard:
    """The live claims of this server process, expiring after ``seconds``."""

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

    def take(self, request_id: str, reviewer: str, session: str = "") -> Claim:
        """Claim an item for ``reviewer`` (renewing their own claim); returns the live claim,
        which is someone else's when they hold it."""
        with self._lock:
            claim = self._live(request_id)
            if claim is not None and claim.reviewer != reviewer:
                return claim
            claim = Claim(request_id, reviewer, self.clock() + self.seconds, session)
            self._claims[request_id] = claim
            return claim

    def release(self, request_id: str, reviewer: str | None = None) -> None:
        """End a claim (only ``reviewer``'s own, when given)."""
        with self._lock:
            claim = self._claims.get(request_id)
            if claim is not None and (reviewer is None or claim.reviewer == reviewer):
                del self._claims[request_id]

    def release_session(self, session: str) -> int:
        """End every claim taken in a session (at sign-out); how many ended."""
        if not session:
            return 0
        with self._lock:
            ended = [rid for rid, c in self._claims.items() if c.session == session]
            for rid in ended:
                del self._claims[rid]
            return len(ended)

    def snapshot(self) -> dict[str, Claim]:
        """Every live claim by request id."""
        with self._lock:
            for rid in list(self._claims):
                self._live(rid)
            return dict(self._claims)


class SharedClaimBoard(ClaimBoard):
    """Claims in the desk's tables, honoured by every server process on the store.

    Taking a claim is one statement that inserts it, renews the taker's own, or replaces an
    expired one — and otherwise leaves the holder's claim in place — so two processes can never
    both hold an item. Times are wall-clock seconds: keep the machines' clocks in sync (NTP).
    """

    def __init__(
        self,
        db: DeskDB,
        seconds: float = CLAIM_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(seconds, clock)
        self.db = db

    @staticmethod
    def _claim(row: Any) -> Claim:
        return Claim(str(row[0]), str(row[1]), float(row[2]), str(row[3] or ""))

    def get(self, request_id: str) -> Claim | None:
        with self.db.read() as cur:
            cur.execute(
                "SELECT item_id, reviewer, expires_at, sid_key FROM desk_claims "
                "WHERE item_id = %s AND expires_at > %s",
                (request_id, self.clock()),
            )
            row = cur.fetchone()
        return self._claim(row) if row else None

    def take(self, request_id: str, reviewer: str, session: str = "") -> Claim:
        now = self.clock()
        with self.db.write() as cur:
            # expired claims of other items go too (the table holds live claims only)
            cur.execute(
                "DELETE FROM desk_claims WHERE expires_at <= %s AND item_id <> %s",
                (now, request_id),
            )
            cur.execute(
                "INSERT INTO desk_claims (item_id, reviewer, sid_key, taken_at, expires_at) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (item_id) DO UPDATE SET "
                "reviewer = excluded.reviewer, sid_key = excluded.sid_key, "
                "taken_at = excluded.taken_at, expires_at = excluded.expires_at "
                "WHERE desk_claims.reviewer = excluded.reviewer OR desk_claims.expires_at <= %s",
                (request_id, reviewer, session or None, now, now + self.seconds, now),
            )
            cur.execute(
                "SELECT item_id, reviewer, expires_at, sid_key FROM desk_claims WHERE item_id = %s",
                (request_id,),
            )
            return self._claim(cur.fetchone())

    def release(self, request_id: str, reviewer: str | None = None) -> None:
        with self.db.write() as cur:
            if reviewer is None:
                cur.execute("DELETE FROM desk_claims WHERE item_id = %s", (request_id,))
            else:
                cur.execute(
                    "DELETE FROM desk_claims WHERE item_id = %s AND reviewer = %s",
                    (request_id, reviewer),
                )

    def release_session(self, session: str) -> int:
        if not session:
            return 0
        with self.db.write() as cur:
            cur.execute("SELECT COUNT(*) FROM desk_claims WHERE sid_key = %s", (session,))
            n = int(cur.fetchone()[0])
            cur.execute("DELETE FROM desk_claims WHERE sid_key = %s", (session,))
        return n

    def snapshot(self) -> dict[str, Claim]:
        with self.db.read() as cur:
            cur.execute(
                "SELECT item_id, reviewer, expires_at, sid_key FROM desk_claims "
                "WHERE expires_at > %s",
                (self.clock(),),
            )
            return {str(r[0]): self._claim(r) for r in cur.fetchall()}


class Skips:
    """Items a reviewer chose to skip: they come last in that reviewer's "next item"."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._rows: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def skip(self, request_id: str, reviewer: str) -> None:
        with self._lock:
            self._rows[(request_id, reviewer)] = self.clock()

    def unskip(self, request_id: str, reviewer: str) -> None:
        with self._lock:
            self._rows.pop((request_id, reviewer), None)

    def of(self, reviewer: str) -> set[str]:
        """The items ``reviewer`` skipped."""
        with self._lock:
            return {rid for rid, who in self._rows if who == reviewer}

    def forget(self, request_ids: Iterable[str]) -> None:
        """Drop the skips of items that left the queue."""
        ids = set(request_ids)
        with self._lock:
            for key in [k for k in self._rows if k[0] in ids]:
                del self._rows[key]


class SharedSkips(Skips):
    """Skips in the desk's tables."""

    def __init__(self, db: DeskDB, clock: Callable[[], float] = time.time) -> None:
        super().__init__(clock)
        self.db = db

    def skip(self, request_id: str, reviewer: str) -> None:
        with self.db.write() as cur:
            cur.execute(
                "INSERT INTO desk_skips (item_id, reviewer, skipped_at) VALUES (%s, %s, %s) "
                "ON CONFLICT (item_id, reviewer) DO UPDATE SET skipped_at = excluded.skipped_at",
                (request_id, reviewer, self.clock()),
            )

    def unskip(self, request_id: str, reviewer: str) -> None:
        with self.db.write() as cur:
            cur.execute(
                "DELETE FROM desk_skips WHERE item_id = %s AND reviewer = %s",
                (request_id, reviewer),
            )

    def of(self, reviewer: str) -> set[str]:
        with self.db.read() as cur:
            cur.execute("SELECT item_id FROM desk_skips WHERE reviewer = %s", (reviewer,))
            return {str(r[0]) for r in cur.fetchall()}

    def forget(self, request_ids: Iterable[str]) -> None:
        ids = list(request_ids)
        if not ids:
            return
        with self.db.write() as cur:
            for rid in ids:
                cur.execute("DELETE FROM desk_skips WHERE item_id = %s", (rid,))
