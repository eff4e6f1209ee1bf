"""The chain log: entries sealed onto the hash chain, and read back, inside a SQL store.

``ChainLog`` owns the ``audit_entries`` table, the chain head and the keyed-chain marker: it
seals entries inside a write transaction its store opens (``seal``), and reads them back
(``entries``). The SQL store and its review queue (``tracerag.store._review_queue``) both
append through it, so there is one door into the chain.
"""

from __future__ import annotations

import dataclasses
import hmac
import json
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from tracerag.store._chain import (
    CHAIN_VERSION,
    CHAIN_VERSION_KEYED,
    StoredRow,
    entry_hash,
    head_mac,
    jcs_json,
    keyed_since_mac,
)
from tracerag.store._codec import material_change_entry
from tracerag.store._types import KIND_MATERIAL_CHANGE, Entry, InvalidRecord, StoreError, now_iso


class Cursor(Protocol):
    """The part of a DB-API cursor the shared SQL uses (``format`` paramstyle: ``%s``)."""

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any: ...

    def executemany(self, sql: str, params_seq: Sequence[Sequence[Any]]) -> Any: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Head:
    """The chain head while a write transaction holds it."""

    def __init__(self, seq: int, hash_: str) -> None:
        self.seq, self.hash = seq, hash_
        self.appended: list[Entry] = []


#: a write transaction holding the chain head exclusively (commits on normal exit)
WriteTransaction = Callable[[], AbstractContextManager[tuple[Cursor, Head]]]
#: a cursor for reads
ReadCursor = Callable[[], AbstractContextManager[Cursor]]

ENTRY_COLUMNS = "seq, request_id, kind, payload, actor, created_at, prev_hash, hash, chain_version"
_INSERT_ENTRY = (
    f"INSERT INTO audit_entries ({ENTRY_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
)


def read_head(cur: Cursor) -> Head:
    """The chain head row (``StoreError`` when the store has none)."""
    cur.execute("SELECT last_seq, last_hash FROM chain_head WHERE id = 1")
    row = cur.fetchone()
    if row is None:
        raise StoreError("the audit store has no chain head row")
    return Head(int(row[0]), str(row[1]))


def read_meta(cur: Cursor) -> dict[str, str]:
    """The store's ``store_meta`` rows (identity, genesis, keyed-chain marker)."""
    cur.execute("SELECT key, value FROM store_meta")
    return {str(k): str(v) for k, v in cur.fetchall()}


def request_exists(cur: Cursor, request_id: str) -> bool:
    """True when the ``requests`` index holds the request."""
    cur.execute("SELECT 1 FROM requests WHERE request_id = %s", (request_id,))
    return cur.fetchone() is not None


class ChainLog:
    """Seals entries onto one store's chain and reads them back.

    ``write`` and ``read`` are the store's transactions (its backend's connections); ``key``
    seals keyed entries (None: unkeyed). A keyed chain is never written without its key.
    """

    def __init__(self, write: WriteTransaction, read: ReadCursor, key: bytes | None) -> None:
        self.write = write
        self.read = read
        self.key = key
        self._meta: dict[str, str] | None = None
        self._key_checked = False

    def _meta_cached(self, cur: Cursor) -> dict[str, str]:
        if self._meta is None:
            self._meta = read_meta(cur)
        return self._meta

    def _check_key(self, cur: Cursor, head: Head) -> None:
        """Refuse to write a keyed chain without its key, or with another key."""
        if self._key_checked:
            return
        meta = read_meta(cur)
        self._meta = meta
        since = meta.get("keyed_since")
        if since is not None:
            if self.key is None:
                raise StoreError(
                    "this audit store's chain is keyed: set TRACERAG_CHAIN_KEY to write to it"
                )
            since_seq, _, mac = since.partition(":")
            expected = keyed_since_mac(self.key, meta.get("store_id", ""), int(since_seq))
            if not hmac.compare_digest(mac, expected):
                raise StoreError("the chain key does not match this audit store's chain")
        elif self.key is not None:
            first = head.seq + 1
            value = f"{first}:{keyed_since_mac(self.key, meta.get('store_id', ''), first)}"
            cur.execute(
                "INSERT INTO store_meta (key, value) VALUES (%s, %s)", ("keyed_since", value)
            )
            meta["keyed_since"] = value
        self._key_checked = True

    def seal(self, cur: Cursor, head: Head, entries: Sequence[Entry]) -> list[Entry]:
        """Seal entries onto the chain and insert them (inside a write transaction)."""
        self._check_key(cur, head)
        key = self.key
        version = CHAIN_VERSION_KEYED if key is not None else CHAIN_VERSION
        sealed: list[Entry] = []
        rows: list[tuple[Any, ...]] = []
        for entry in entries:
            seq = head.seq + 1
            created_at = now_iso()
            payload_json = entry.payload_json or jcs_json(entry.payload)
            # the sealed fields, in the order both the hash and the row take them
            fields = (seq, entry.request_id, entry.kind, payload_json, entry.actor, created_at)
            try:
                digest = entry_hash(head.hash, *fields, version, key)
            except (ValueError, TypeError, UnicodeError) as exc:
                raise InvalidRecord(
                    f"entry of {entry.request_id!r} cannot be sealed: {exc}"
                ) from exc
            rows.append((*fields, head.hash, digest, version))
            sealed.append(
                dataclasses.replace(
                    entry,
                    seq=seq,
                    created_at=created_at,
                    prev_hash=head.hash,
                    hash=digest,
                    payload_json=payload_json,
                    chain_version=version,
                )
            )
            head.seq, head.hash = seq, digest
        if rows:
            # one statement for all of them: one round trip to a database server (psycopg
            # pipelines executemany), where the chain head's lock is held meanwhile
            cur.executemany(_INSERT_ENTRY, rows)
        head.appended += sealed
        if sealed:
            mac = None
            if key is not None:
                mac = head_mac(key, self._meta_cached(cur).get("store_id", ""), head.seq, head.hash)
            cur.execute(
                "UPDATE chain_head SET last_seq = %s, last_hash = %s, mac = %s WHERE id = 1",
                (head.seq, head.hash, mac),
            )
            counts: dict[str, int] = {}
            for e in (e for e in sealed if e.kind != KIND_MATERIAL_CHANGE):
                counts[e.request_id] = counts.get(e.request_id, 0) + 1
            for request_id, n in counts.items():
                cur.execute(
                    "UPDATE requests SET n_entries = n_entries + %s WHERE request_id = %s",
                    (n, request_id),
                )
        return sealed

    def seal_one(self, cur: Cursor, head: Head, entry: Entry) -> Entry:
        """Seal one entry (inside a write transaction); the sealed entry."""
        (sealed,) = self.seal(cur, head, [entry])
        return sealed

    def material_change(
        self,
        cur: Cursor,
        head: Head,
        material_id: str,
        actor: str,
        payload: Mapping[str, Any],
        reason: str | None = None,
    ) -> Entry:
        """Seal a ``material_change`` entry under the material's id (the only door for one)."""
        return self.seal_one(cur, head, material_change_entry(material_id, actor, payload, reason))

    def entries(self, cur: Cursor, where: str, params: Sequence[Any]) -> list[Entry]:
        """The entries matching ``where`` (SQL over ``audit_entries``), in seq order."""
        cur.execute(f"SELECT {ENTRY_COLUMNS} FROM audit_entries WHERE {where} ORDER BY seq", params)
        return [entry_from_row(r) for r in cur.fetchall()]


def entries_after(cur: Cursor, seq: int, limit: int) -> list[Any]:
    """Up to ``limit`` entry rows after ``seq``, in seq order."""
    cur.execute(
        f"SELECT {ENTRY_COLUMNS} FROM audit_entries WHERE seq > %s ORDER BY seq LIMIT %s",
        (seq, limit),
    )
    return list(cur.fetchall())


def stored_row(row: Sequence[Any]) -> StoredRow:
    """An entry row as the verifier reads it (every field as stored)."""
    r = [str(v) for v in row[1:8]]
    return StoredRow(int(row[0]), r[0], r[1], r[2], r[3], r[4], r[5], r[6], int(row[8] or 1))


def entry_from_row(row: Sequence[Any]) -> Entry:
    """An entry row as an ``Entry`` (a payload that is not a JSON object is kept, wrapped)."""
    try:
        payload = json.loads(row[3])
        if not isinstance(payload, dict):
            payload = {"_value": payload}
    except (TypeError, ValueError):
        payload = {"_unparseable": row[3]}
    return Entry(
        seq=int(row[0]),
        request_id=row[1],
        kind=row[2],
        payload=payload,
        actor=row[4],
        created_at=row[5],
        prev_hash=row[6],
        hash=row[7],
        payload_json=row[3] if isinstance(row[3], str) else "",
        chain_version=int(row[8] or 1),
    )
