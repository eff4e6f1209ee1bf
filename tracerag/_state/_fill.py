"""How one part of the state is written into the audit record: the keys its ``SIGNALS`` table
declares for the record, filled from the part (or the whole state, for a key read across it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tracerag._declare import (
    LEAVES,
    OMIT,
    compiled,
    jsonable,
)

if TYPE_CHECKING:
    pass

__all__ = [
    "fill_record",
    "record_of",
]


def fill_record(record: dict[str, Any], entries: Any, part: Any, state: Any) -> None:
    # the entries' fields unpacked: this runs for every record
    for section, key, get, across, absent, is_json in entries:
        # a part's value; its absent value when the part is missing
        value = absent if part is None else get(state if across else part)
        if value is OMIT:
            continue
        if not is_json and type(value) not in LEAVES:
            value = jsonable(value)
        if section is None:
            record[key] = value
        else:
            held = record.get(section)
            if held is None:
                held = record[section] = {}
            held[key] = value


def record_of(part: Any) -> dict[str, Any]:
    """The record keys one part declares on its own (those read across the state left out)."""
    record: dict[str, Any] = {}
    entries = [e for e in compiled(type(part).SIGNALS).record if not e.across]
    fill_record(record, entries, part, None)
    return record
