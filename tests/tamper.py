"""What an intruder with database access (and without the chain key) can do to the audit tables;
shared by the tamper tests of the store and of the material registry."""

from __future__ import annotations

from tracerag.store.chain import CHAIN_V2, entry_hash

KEY = "a secret kept outside the database"


def entry_rows(backend, after: int = 0) -> list[tuple]:
    return backend.execute(
        "SELECT seq, request_id, kind, payload, actor, created_at, prev_hash, hash "
        "FROM audit_entries WHERE seq > ? ORDER BY seq",
        (after,),
        bypass_guard=False,
    )


def genesis(backend) -> str:
    return backend.execute(
        "SELECT value FROM store_meta WHERE key = 'genesis'", bypass_guard=False
    )[0][0]


def reseal_from(backend, seq: int) -> None:
    """What an intruder without the key can do: re-hash every entry from ``seq`` on (v2)."""
    rows = entry_rows(backend, seq - 1)
    prev = entry_rows(backend, seq - 2)[0][7] if seq > 1 else genesis(backend)
    for s, rid, kind, payload, actor, created_at, _p, _h in rows:
        new = entry_hash(prev, s, rid, kind, payload, actor, created_at, CHAIN_V2)
        backend.execute(
            "UPDATE audit_entries SET prev_hash = ?, hash = ?, chain_version = ? WHERE seq = ?",
            (prev, new, CHAIN_V2, s),
        )
        prev = new
    last = rows[-1][0] if rows else seq - 1
    backend.execute(
        "UPDATE chain_head SET last_seq = ?, last_hash = ?, mac = NULL WHERE id = 1", (last, prev)
    )
