"""What an intruder with database access (and without the chain key) can do to the audit tables;
shared by the tamper tests of the store and of the material registry."""

from __future__ import annotations

from tracerag.store._chain import CHAIN_V2, entry_hash

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


# -- the material registry's tables ------------------------------------------------------------
#
# ``registry_scene`` gives a registry a history that uses every column that changes behaviour;
# each of ``REGISTRY_ATTACKS`` then does what an intruder with database access would do to make
# the registry say something the chain does not (``detected`` lists where `tracerag audit
# verify` must catch it: plain, with an anchor taken before the attack, with the chain key).

GIFT = "Northwind gift cards are valid for 3 years from the date of purchase."


def registry_scene(registry) -> None:
    """gift-cards denied by three signed users (quarantine proposed) and confirmed by a fourth;
    returns / returns-60 in open conflict; fee-b with an edit held for review; old-promo
    quarantined by an operator."""
    from tracerag._identity import OPERATOR_TOKEN, OperatorIdentity
    from tracerag.materials._principal import signed_user
    from tracerag.materials.feedback import record_feedback

    lead = OperatorIdentity("lead", OPERATOR_TOKEN, "sha256:0123456789abcdef")
    registry.register("gift-cards", GIFT, operator=lead, written_by="kb@1")
    registry.register(
        "returns", "Opened items can be returned within 7 days.", operator=lead, written_by="kb@1"
    )
    registry.register(
        "returns-60",
        "Opened items can be returned within 60 days.",
        operator=lead,
        written_by="feed@1",
        gate=False,
    )
    registry.register(
        "fee-a", "The cancellation fee is 10% of the order value.", operator=lead, written_by="kb@1"
    )
    registry.register("fee-b", "Cancellation is possible online.", operator=lead, written_by="kb@1")
    registry.edit(
        "fee-b",
        content="The cancellation fee is 15% of the order value.",
        operator=lead,
        written_by="manual",
        reason="new fee",
    )
    registry.register("old-promo", "Free gift wrapping in May.", operator=lead, written_by="kb@1")
    registry.quarantine("old-promo", operator=lead, reason="the promotion ended")
    for n in range(1, 5):
        registry.store.append_record(
            {
                "request_id": f"r{n}",
                "materials": [{"id": "gift-cards", "text": GIFT}],
                "signals": {"citations": {"claims": [{"cited_ids": ["gift-cards"]}]}},
                "decision": "pass",
            }
        )
    for n in range(1, 4):
        record_feedback(f"r{n}", "deny", registry=registry, operator=signed_user(f"u{n}"))
    record_feedback("r4", "confirm", registry=registry, operator=signed_user("u4"))
    assert registry.get("gift-cards").proposed_quarantine
    assert registry.get("fee-b").pending is not None and registry.conflicts()


def _one(backend, sql: str, params: tuple = ()) -> tuple:
    rows = backend.execute(sql, params, bypass_guard=False)
    return tuple(rows[0]) if rows else ()


def _append_entry(backend, request_id: str, kind: str, payload_json: str, actor: str) -> None:
    """Seal a new entry on the chain as an intruder without the key can, head moved onto it."""
    head_seq, head_hash = _one(backend, "SELECT last_seq, last_hash FROM chain_head")
    seq = head_seq + 1
    created = "2030-01-01T00:00:00.000000+00:00"
    new = entry_hash(head_hash, seq, request_id, kind, payload_json, actor, created, CHAIN_V2)
    backend.execute(
        "INSERT INTO audit_entries (seq, request_id, kind, payload, actor, created_at, "
        "prev_hash, hash, chain_version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (seq, request_id, kind, payload_json, actor, created, head_hash, new, CHAIN_V2),
    )
    backend.execute(
        "UPDATE chain_head SET last_seq = ?, last_hash = ?, mac = NULL WHERE id = 1", (seq, new)
    )


def _row(backend, material_id: str) -> dict:
    from tracerag.materials._chained_rows import ROW_COLUMNS, row_of

    values = _one(
        backend,
        f"SELECT {', '.join(ROW_COLUMNS)} FROM materials WHERE material_id = ?",
        (material_id,),
    )
    return row_of(values)


def _set_row(backend, material_id: str, row: dict) -> None:
    backend.execute(
        "UPDATE materials SET ema = ?, outcomes = ?, denials = ? WHERE material_id = ?",
        (row["ema"], row["outcomes"], row["denials"], material_id),
    )


def forge_outcome_appended(backend) -> None:
    """Raise gift-cards' EMA by a confirming outcome of no real verdict, appended to the chain
    (as registry code would write it) with the column updated to match."""
    from tracerag.materials._credibility import ema_update
    from tracerag.store._codec import material_change_entry

    row = _row(backend, "gift-cards")
    after = {**row, "ema": ema_update(row["ema"], 1.0, 0.2, 1.0), "outcomes": row["outcomes"] + 1}
    outcome = {"verdict": "confirm", "value": 1.0, "rate": 0.2, "weight": 1.0}
    outcome |= {"denial_counted": False, "version": row["current_version"]}
    payload = {"outcome": outcome, "identity": {"name": "tracerag"}, "row": after}
    entry = material_change_entry("gift-cards", "tracerag", payload)
    _append_entry(backend, "gift-cards", "material_change", entry.payload_json, "tracerag")
    _set_row(backend, "gift-cards", after)


def rewrite_verdict_resealed(backend) -> None:
    """Turn u3's denial of gift-cards into a confirmation everywhere — its outcome entry, its
    verdict entry, the verdict row and the material's columns — and re-hash the chain from the
    first rewritten entry (a careful intruder without the key)."""
    import json

    from tracerag.materials._credibility import ema_update
    from tracerag.store._chain import jcs_json

    (seq_f, payload_f) = _one(
        backend,
        "SELECT seq, payload FROM audit_entries WHERE request_id = 'r3' "
        "AND kind = 'operator_action'",
    )
    verdict = json.loads(payload_f)
    fid = verdict["feedback"]["feedback_id"]
    verdict["feedback"]["verdict"] = "confirm"
    events = backend.execute(
        "SELECT seq, payload FROM audit_entries WHERE request_id = 'gift-cards' "
        "AND kind = 'material_change' ORDER BY seq",
        bypass_guard=False,
    )
    prev, rows = None, {}
    for seq, payload in events:
        body = json.loads(payload)
        if body.get("outcome", {}).get("feedback_id") == fid:
            o = body["outcome"]
            o.update(verdict="confirm", value=1.0, denial_counted=False)
            body["row"] = {
                **prev,
                "ema": ema_update(prev["ema"], 1.0, o["rate"], o["weight"]),
                "outcomes": prev["outcomes"] + 1,
            }
            rows[seq] = body
        elif rows and "row" in body:  # later events of gift-cards follow from the rewrite
            last = list(rows.values())[-1]["row"]
            if "outcome" in body:
                o = body["outcome"]
                value = 1.0 if o["verdict"] == "confirm" else 0.0
                body["row"] = {
                    **last,
                    "ema": ema_update(last["ema"], value, o["rate"], o["weight"]),
                    "outcomes": last["outcomes"] + 1,
                    "denials": last["denials"] + (1 if o["denial_counted"] else 0),
                }
            else:
                body["row"] = {**body["row"], "ema": last["ema"], "denials": last["denials"]}
                body["row"]["outcomes"] = last["outcomes"]
            rows[seq] = body
        prev = body.get("row", prev)
    for seq, body in rows.items():
        backend.execute("UPDATE audit_entries SET payload = ? WHERE seq = ?", (jcs_json(body), seq))
    backend.execute(
        "UPDATE audit_entries SET payload = ? WHERE seq = ?", (jcs_json(verdict), seq_f)
    )
    backend.execute(
        "UPDATE material_feedback SET verdict = 'confirm' WHERE feedback_id = ?", (fid,)
    )
    _set_row(backend, "gift-cards", list(rows.values())[-1]["row"])
    reseal_from(backend, min(seq_f, *rows))
    # the registry keeps each version's entry hash: moved to the re-hashed entries
    for seq, digest in backend.execute(
        "SELECT seq, hash FROM audit_entries WHERE seq >= ?", (min(seq_f, *rows),)
    ):
        backend.execute(
            "UPDATE material_versions SET audit_hash = ? WHERE audit_seq = ?", (digest, seq)
        )


def _forged_material(backend, with_version: bool) -> None:
    backend.execute(
        "INSERT INTO materials (material_id, current_version, status, content_hash, ema, "
        "outcomes, denials, pending_version, updated_at) VALUES "
        "('gift-cards-forever', 1, 'active', 'x', 0.99, 40, 0, NULL, '2030-01-01')"
    )
    if with_version:
        from tracerag.materials import MaterialVersion
        from tracerag.materials._records import body_digest, body_json

        v = MaterialVersion("gift-cards-forever", 1, "Gift cards never expire.", operator="lead")
        seq, digest = _one(backend, "SELECT seq, hash FROM audit_entries ORDER BY seq LIMIT 1")
        backend.execute(
            "INSERT INTO material_versions (material_id, version, status, written_by, operator, "
            "batch_id, change, content_hash, created_at, body, body_hash, audit_seq, "
            "audit_hash) VALUES (?, 1, 'active', 'manual', 'lead', NULL, 'create', ?, ?, ?, ?, "
            "?, ?)",
            (
                v.material_id,
                v.content_hash,
                "2030-01-01",
                body_json(v.body()),
                body_digest(v.body()),
                seq,
                digest,
            ),
        )


PLAIN, ANCHOR, KEY = "plain verify", "with anchor", "with key"
ALL = (PLAIN, ANCHOR, KEY)

#: attack -> (what it does, where ``tracerag audit verify`` must catch it)
REGISTRY_ATTACKS = {
    "materials.ema raised": (
        lambda b: b.execute("UPDATE materials SET ema = 0.99 WHERE material_id = 'gift-cards'"),
        ALL,
    ),
    "materials.denials reset": (
        lambda b: b.execute("UPDATE materials SET denials = 0 WHERE material_id = 'gift-cards'"),
        ALL,
    ),
    "materials.status quarantined -> active": (
        lambda b: b.execute(
            "UPDATE materials SET status = 'active' WHERE material_id = 'old-promo'"
        ),
        ALL,
    ),
    "materials.current_version moved back (proposal undone)": (
        lambda b: b.execute(
            "UPDATE materials SET current_version = current_version - 1 "
            "WHERE material_id = 'gift-cards'"
        ),
        ALL,
    ),
    "materials.pending_version cleared": (
        lambda b: b.execute(
            "UPDATE materials SET pending_version = NULL WHERE material_id = 'fee-b'"
        ),
        ALL,
    ),
    "material_versions.status edited": (
        lambda b: b.execute(
            "UPDATE material_versions SET status = 'active' WHERE material_id = 'old-promo' "
            "AND status = 'quarantined'"
        ),
        ALL,
    ),
    "material_versions.operator edited": (
        lambda b: b.execute(
            "UPDATE material_versions SET operator = 'mallory' WHERE material_id = 'old-promo'"
        ),
        ALL,
    ),
    "forged materials row inserted": (lambda b: _forged_material(b, False), ALL),
    "forged materials and material_versions rows inserted": (
        lambda b: _forged_material(b, True),
        ALL,
    ),
    "open conflict deleted": (lambda b: b.execute("DELETE FROM material_conflicts"), ALL),
    "verdict row deleted (the principal may vote again)": (
        lambda b: b.execute("DELETE FROM material_feedback WHERE request_id = 'r1'"),
        ALL,
    ),
    "verdict effect deleted (the material may be moved again)": (
        lambda b: b.execute(
            "DELETE FROM material_feedback_effects WHERE feedback_id IN "
            "(SELECT feedback_id FROM material_feedback WHERE request_id = 'r2')"
        ),
        ALL,
    ),
    "outcome of no verdict appended to the chain, column matched": (
        forge_outcome_appended,
        (KEY,),
    ),
    "a verdict rewritten in the chain and the tables, chain re-hashed": (
        rewrite_verdict_resealed,
        (ANCHOR, KEY),
    ),
}
