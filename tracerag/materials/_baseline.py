"""The registry's upgrade to chained columns: once, the columns of every material whose changes
were chained without them are chained as found (a ``baseline`` event).

A material with no chained version at all is not taken in: verification reports it.
"""

from __future__ import annotations

import logging
from typing import Any

from tracerag.materials._chained_rows import BASELINE_KEY, ROW_KEY, event_material, table_rows
from tracerag.materials._conflict_table import open_conflicts_of
from tracerag.materials._db import ChainCursor, RegistryDB
from tracerag.materials._reconcile import chained_events
from tracerag.materials._records import SYSTEM
from tracerag.store._base import StoreError

logger = logging.getLogger("tracerag.materials")


def baseline_pending(db: RegistryDB) -> bool:
    """Whether the registry's columns still wait for their baseline."""
    with db.read() as cur:
        cur.execute("SELECT done FROM material_baseline WHERE id = 1")
        row = cur.fetchone()
    return row is not None and not int(row[0])


def chain_baseline(db: RegistryDB, store: Any) -> None:
    """Chain the columns of every material whose versions were chained without them, once
    (a keyed chain opened without its key is left for next time, with a warning)."""
    if not baseline_pending(db):
        return
    covered: set[str] = set()
    versioned: set[str] = set()
    for e in chained_events(store).values():
        mid = str(event_material(e))
        versioned.add(mid)
        if ROW_KEY in e.payload:
            covered.add(mid)

    def work(tx: Any) -> None:
        cur = ChainCursor(tx.cursor)
        cur.execute("SELECT done FROM material_baseline WHERE id = 1")
        if int(cur.fetchone()[0]):
            return  # another process did it meanwhile
        for mid, row in sorted(table_rows(cur).items()):
            if mid in covered or mid not in versioned:
                continue
            tx.material_change(
                mid,
                SYSTEM,
                {
                    BASELINE_KEY: {
                        "why": "the registry's columns as found when the registry began "
                        "chaining them (registry schema 2)"
                    },
                    "conflicts": open_conflicts_of(cur, mid),
                    ROW_KEY: row,
                },
                "registry upgrade",
            )
        cur.execute("UPDATE material_baseline SET done = 1 WHERE id = 1")

    try:
        store.chained(work)
    except StoreError as exc:  # e.g. a keyed chain opened without its key: next time
        logger.warning("the registry's columns are not chained yet: %s", exc)


__all__ = ["baseline_pending", "chain_baseline"]
