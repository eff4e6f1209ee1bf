"""Accepted audit records waiting for the store: encoded, then held in memory or in the journal.

``encode_record`` turns a record into an ``Item`` (or its quarantine form). ``MemoryBuffer``
holds items in memory, bounded by count and bytes; ``JournalBuffer`` holds them in the
crash-safe journal and reads them back in batches. The writer's drain loop peeks a batch,
writes it, then acks it. Neither locks: the writer's condition guards the memory buffer.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import time
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tracerag.store._journal import FRAME_QUARANTINE, FRAME_RECORD, Frame, Journal
from tracerag.store._types import InvalidRecord

#: the type of an item read from a journal frame that is not authentic
FRAME_REFUSED = b"X"
#: the longest escaped copy of a poisoned record kept in its quarantined entry
MAX_QUARANTINE_RAW = 256 * 1024


def request_id_of(record: Any) -> str | None:
    """The record's request_id when it is a usable one (a non-empty string without NUL)."""
    if isinstance(record, Mapping):
        rid = record.get("request_id")
        if isinstance(rid, str) and rid.strip() and "\x00" not in rid:
            return rid
    return None


@dataclass
class Item:
    """One accepted record: its encoded form and where it sits in the journal."""

    request_id: str
    type: bytes
    payload: bytes
    position: tuple[int, int] | None = None
    record: Any = None  # the payload decoded, once read back from the journal
    accepted_at: float = 0.0  # monotonic time it was accepted (in memory)
    frame: Frame | None = None  # the journal frame, kept for a refused one

    @property
    def size(self) -> int:
        return len(self.payload)


def encode_record(record: Any) -> Item:
    """The record as journal payload, or its quarantine form when it cannot be encoded."""
    rid = request_id_of(record)
    try:
        if not isinstance(record, Mapping):
            raise InvalidRecord(f"an audit record must be a mapping, not {type(record).__name__}")
        if rid is None:
            raise InvalidRecord("an audit record needs a non-empty string request_id")
        text = json.dumps(record, ensure_ascii=False, allow_nan=True, separators=(",", ":"))
        return Item(rid, FRAME_RECORD, text.encode("utf-8"))
    except (TypeError, ValueError, UnicodeError, RecursionError, InvalidRecord) as exc:
        return quarantine_item(record, rid, f"{type(exc).__name__}: {exc}")


def quarantine_item(record: Any, request_id: str | None, reason: str) -> Item:
    """A quarantine frame for a record: the reason and an ASCII-escaped copy of it."""
    rid = request_id or f"<no request_id>-{uuid.uuid4().hex}"
    try:
        raw = json.dumps(record, ensure_ascii=True, allow_nan=True, default=repr)
    except (TypeError, ValueError, RecursionError):
        raw = ascii(record)
    truncated = len(raw) > MAX_QUARANTINE_RAW
    body = {
        "request_id": rid,
        "reason": reason[:2000],
        "raw": raw[:MAX_QUARANTINE_RAW],
        "raw_truncated": truncated,
    }
    return Item(rid, FRAME_QUARANTINE, json.dumps(body, ensure_ascii=True).encode("ascii"))


class MemoryBuffer:
    """Items in memory, in order, bounded by ``max_items`` and ``max_bytes``."""

    def __init__(self, max_items: int, max_bytes: int) -> None:
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._items: deque[Item] = deque()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def refuses(self, item: Item) -> bool:
        """True when ``item`` does not fit (by count or bytes)."""
        return len(self._items) >= self.max_items or self.bytes + item.size > self.max_bytes

    def full(self) -> bool:
        return len(self._items) >= self.max_items or self.bytes >= self.max_bytes

    def put(self, item: Item) -> None:
        item.accepted_at = time.monotonic()
        self._items.append(item)
        self.bytes += item.size

    def head(self) -> Item | None:
        """The oldest item (None: empty)."""
        return self._items[0] if self._items else None

    def has_work(self) -> bool:
        return bool(self._items)

    def peek(self, max_items: int, max_bytes: int) -> list[Item]:
        """The oldest items, up to ``max_items`` and (past the first) ``max_bytes``."""
        items: list[Item] = []
        size = 0
        for item in itertools.islice(self._items, max_items):
            if items and size + item.size > max_bytes:
                break
            items.append(item)
            size += item.size
        return items

    def ack(self, items: list[Item]) -> None:
        """Forget ``items`` (a batch ``peek`` returned), now written or given up on."""
        for item in items:
            if self._items and self._items[0] is item:
                self._items.popleft()
                self.bytes -= item.size

    def take_all(self) -> list[Item]:
        """Empty the buffer; what it held."""
        items = list(self._items)
        self._items.clear()
        self.bytes = 0
        return items


class JournalBuffer:
    """Items in the crash-safe journal, read back from a cursor that acks move forward."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._cursor = journal.first_position()

    def full(self) -> bool:
        return self.journal.size >= self.journal.max_bytes

    def put(self, item: Item, sync: bool = True) -> int:
        """Journal ``item``: synced on return (``sync``), else the ticket to sync up to."""
        if sync:
            self.journal.append(item.type, item.payload)
            return 0
        return self.journal.write(item.type, item.payload)

    def pending_bytes(self) -> int:
        """Bytes journaled after the cursor (not yet written to the store)."""
        return self.journal.pending_after(*self._cursor)

    def has_work(self) -> bool:
        return self.pending_bytes() > 0

    def peek(self, max_items: int, max_bytes: int) -> list[Item]:
        """The next journaled items (a frame not authentic is a ``FRAME_REFUSED`` item)."""
        frames = self.journal.read(*self._cursor, max_frames=max_items, max_bytes=max_bytes)
        items = []
        for f in frames:
            decoded: Any = None
            with contextlib.suppress(ValueError):
                decoded = json.loads(f.payload)
            rid = decoded.get("request_id") if isinstance(decoded, dict) else None
            if not f.authentic:
                item = Item(str(rid or ""), FRAME_REFUSED, f.payload, (f.segment, f.end))
                item.frame = f
                items.append(item)
                continue
            record = decoded if f.type == FRAME_RECORD else None
            items.append(Item(str(rid or ""), f.type, f.payload, (f.segment, f.end), record))
        return items

    def ack(self, items: list[Item]) -> None:
        """Move the cursor past ``items`` and release the journal up to there."""
        if not items:
            return
        last = items[-1].position
        assert last is not None
        self._cursor = last
        self.journal.release(*last)
