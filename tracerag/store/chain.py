"""Tamper evidence for the audit log: one hash chain over every entry, and its verification.

Each entry's hash is SHA-256 over the canonical JSON array
``[prev_hash, seq, request_id, kind, payload_json, actor, created_at]``, where ``payload_json``
is the entry's payload as canonical JSON text (exactly the text stored). The first entry
chains to ``GENESIS_HASH``. The chain is global, not per request, so removing a whole request
breaks it too; a one-row ``chain_head`` (last seq and hash) makes removal of the newest entries
visible as well.

The chain makes changes evident; it does not prevent them. Someone able to rewrite the whole
table and the head can rebuild a consistent chain, so keep a copy of ``ChainReport.head_hash``
somewhere else (a ticket, a log line, another system) to anchor it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

GENESIS_HASH = "0" * 64

# How far from its stored seq an entry's original seq is searched when its hash does not match,
# to tell an entry that was moved (reordered) from one whose content was changed.
REORDER_WINDOW = 32


def _finite(value: Any) -> Any:
    """Replace non-finite floats (which JSON cannot carry) by their names, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def canonical_json(value: Any) -> str:
    """Deterministic JSON text: sorted keys, no whitespace, UTF-8 characters kept.

    Non-finite floats become the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``.
    Raises ``TypeError`` for values JSON cannot represent.
    """
    try:
        return json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except ValueError:
        return json.dumps(
            _finite(value),
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
        )


def entry_hash(
    prev_hash: str,
    seq: int,
    request_id: str,
    kind: str,
    payload_json: str,
    actor: str,
    created_at: str,
) -> str:
    """The SHA-256 hex digest that seals one entry and links it to the one before."""
    material = canonical_json([prev_hash, seq, request_id, kind, payload_json, actor, created_at])
    return hashlib.sha256(material.encode("utf-8")).hexdigest()


class StoredRow(NamedTuple):
    """One audit entry exactly as stored (payload as its JSON text), for verification."""

    seq: int
    request_id: str
    kind: str
    payload_json: str
    actor: str
    created_at: str
    prev_hash: str
    hash: str

    def hash_at(self, seq: int) -> str:
        """The hash this row's content would have if it had been written as ``seq``."""
        return entry_hash(
            self.prev_hash,
            seq,
            self.request_id,
            self.kind,
            self.payload_json,
            self.actor,
            self.created_at,
        )


@dataclass(frozen=True)
class ChainIssue:
    """One problem found in the chain.

    ``kind`` is ``changed`` (content no longer matches its hash, or an entry was rewritten and
    re-hashed), ``removed`` (entries missing: seq gaps, broken links, a shortened tail, or a
    request with fewer entries than were written), ``reordered`` (an entry moved to another
    seq) or ``inserted`` (entries beyond the recorded chain head).
    ``seq``..``seq_end`` is the range concerned (``seq_end`` equals ``seq`` for one entry);
    ``request_id`` is set when known.
    """

    kind: str
    seq: int | None
    request_id: str | None
    detail: str
    seq_end: int | None = None

    def __str__(self) -> str:
        where = ""
        if self.seq is not None:
            end = self.seq_end if self.seq_end is not None else self.seq
            where = f"seq {self.seq}" if end == self.seq else f"seq {self.seq}-{end}"
        if self.request_id:
            where = f"{where} request {self.request_id}".strip()
        return f"{self.kind}: {where}: {self.detail}" if where else f"{self.kind}: {self.detail}"


@dataclass
class ChainReport:
    """The outcome of ``verify_chain()``: ``ok`` when no issue was found."""

    checked: int = 0
    head_seq: int = 0
    head_hash: str = GENESIS_HASH
    issues: list[ChainIssue] = field(default_factory=list)
    truncated: bool = False  # more issues were found than were kept

    @property
    def ok(self) -> bool:
        return not self.issues

    def of_kind(self, kind: str) -> list[ChainIssue]:
        """The issues of one kind."""
        return [i for i in self.issues if i.kind == kind]

    @property
    def changed(self) -> list[ChainIssue]:
        return self.of_kind("changed")

    @property
    def removed(self) -> list[ChainIssue]:
        return self.of_kind("removed")

    @property
    def reordered(self) -> list[ChainIssue]:
        return self.of_kind("reordered")

    @property
    def inserted(self) -> list[ChainIssue]:
        return self.of_kind("inserted")

    def summary(self) -> str:
        """A short human-readable account of the verification."""
        head = f"checked {self.checked} entries; chain head seq {self.head_seq} {self.head_hash}"
        if self.ok:
            return f"audit chain intact: {head}"
        lines = [f"audit chain BROKEN ({len(self.issues)} issues): {head}"]
        lines += [f"  {issue}" for issue in self.issues]
        if self.truncated:
            lines.append("  ... more issues not listed")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form of the report."""
        return {
            "ok": self.ok,
            "checked": self.checked,
            "head_seq": self.head_seq,
            "head_hash": self.head_hash,
            "truncated": self.truncated,
            "issues": [
                {
                    "kind": i.kind,
                    "seq": i.seq,
                    "seq_end": i.seq_end,
                    "request_id": i.request_id,
                    "detail": i.detail,
                }
                for i in self.issues
            ],
        }


class ChainVerifier:
    """Checks stored rows fed in ascending seq order; ``finish`` adds the head and count checks.

    ``find_by_hash(h)`` returns the stored row whose hash is ``h`` (or None); it is only asked
    when a link is broken, to tell a moved entry from a missing one.
    """

    def __init__(
        self,
        find_by_hash: Callable[[str], StoredRow | None],
        max_issues: int = 1000,
    ) -> None:
        self._find = find_by_hash
        self._max = max_issues
        self._prev: StoredRow | None = None
        self._prev_orig: int = 0  # original seq of the previous row, as far as it is known
        self._reported_reordered: set[int] = set()
        self.report = ChainReport()

    def _issue(self, issue: ChainIssue) -> None:
        if len(self.report.issues) >= self._max:
            self.report.truncated = True
            return
        self.report.issues.append(issue)

    def _original_seq(self, row: StoredRow) -> int | None:
        """The seq under which this row's content was sealed, searched near its stored seq."""
        if row.hash_at(row.seq) == row.hash:
            return row.seq
        for delta in range(1, REORDER_WINDOW + 1):
            for candidate in (row.seq - delta, row.seq + delta):
                if candidate >= 1 and row.hash_at(candidate) == row.hash:
                    return candidate
        return None

    def feed(self, row: StoredRow) -> None:
        """Check one row against itself and the row before it."""
        self.report.checked += 1
        prev = self._prev
        expected_seq = 1 if prev is None else prev.seq + 1
        expected_prev_hash = GENESIS_HASH if prev is None else prev.hash

        gap = row.seq > expected_seq
        if gap:
            guess = prev.request_id if prev and prev.request_id == row.request_id else None
            self._issue(
                ChainIssue(
                    "removed",
                    expected_seq,
                    guess,
                    f"entries missing before seq {row.seq}",
                    row.seq - 1,
                )
            )

        orig = self._original_seq(row)
        if orig is None:
            self._issue(
                ChainIssue(
                    "changed",
                    row.seq,
                    row.request_id,
                    f"{row.kind} entry does not match its hash (content, actor or time changed)",
                )
            )
        elif orig != row.seq:
            self._reported_reordered.add(row.seq)
            self._issue(
                ChainIssue(
                    "reordered",
                    row.seq,
                    row.request_id,
                    f"{row.kind} entry was written as seq {orig}, now stored as seq {row.seq}",
                )
            )

        if row.prev_hash != expected_prev_hash and not gap:
            self._check_link(row, prev, orig)

        self._prev = row
        self._prev_orig = orig if orig is not None else row.seq

    def _check_link(self, row: StoredRow, prev: StoredRow | None, orig: int | None) -> None:
        """The row does not chain to the row before it: find out why."""
        if row.seq in self._reported_reordered:
            return  # already explained by the move
        target = self._find(row.prev_hash) if row.prev_hash != GENESIS_HASH else None
        if target is not None:
            target_orig = self._original_seq(target)
            if orig is not None and target_orig is not None and orig == target_orig + 1:
                return  # this row is where it was; its predecessor moved (reported there)
            self._issue(
                ChainIssue(
                    "reordered",
                    row.seq,
                    row.request_id,
                    f"entry is chained after seq {target.seq} but stored after "
                    f"seq {prev.seq if prev else 0}",
                )
            )
            return
        own = orig if orig is not None else row.seq
        if prev is None:
            self._issue(
                ChainIssue(
                    "removed",
                    1,
                    None,
                    f"first stored entry (seq {row.seq}) does not start the chain",
                    max(1, own - 1),
                )
            )
        elif own == self._prev_orig + 1:
            self._issue(
                ChainIssue(
                    "changed",
                    prev.seq,
                    prev.request_id,
                    f"{prev.kind} entry was rewritten: its hash is not the one seq {row.seq} "
                    "was chained to",
                )
            )
        else:
            self._issue(
                ChainIssue(
                    "removed",
                    self._prev_orig + 1,
                    None,
                    f"entries originally between seq {self._prev_orig} and {own} are missing",
                    own - 1,
                )
            )

    def finish(
        self,
        head_seq: int,
        head_hash: str,
        entry_counts: Iterable[tuple[str, int, int]] = (),
    ) -> ChainReport:
        """Compare the last row with the chain head, and written with present entry counts.

        ``entry_counts`` yields ``(request_id, entries written, entries present)``.
        """
        report = self.report
        report.head_seq, report.head_hash = head_seq, head_hash
        last = self._prev
        last_seq = last.seq if last else 0
        if head_seq > last_seq:
            self._issue(
                ChainIssue(
                    "removed",
                    last_seq + 1,
                    None,
                    f"the newest entries are missing (chain head is seq {head_seq})",
                    head_seq,
                )
            )
        elif head_seq < last_seq:
            self._issue(
                ChainIssue(
                    "inserted",
                    head_seq + 1,
                    None,
                    f"entries stored beyond the chain head (seq {head_seq})",
                    last_seq,
                )
            )
        elif last is not None and last.hash != head_hash:
            self._issue(
                ChainIssue(
                    "changed",
                    last.seq,
                    last.request_id,
                    "newest entry was rewritten: its hash differs from the chain head",
                )
            )
        for request_id, written, present in entry_counts:
            if present < written:
                self._issue(
                    ChainIssue(
                        "removed",
                        None,
                        request_id,
                        f"{written - present} of its {written} entries are missing",
                    )
                )
            elif present > written:
                self._issue(
                    ChainIssue(
                        "inserted",
                        None,
                        request_id,
                        f"{present - written} entries more than the {written} written",
                    )
                )
        return report
