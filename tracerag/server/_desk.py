"""What the desk knows of its items beyond the queue rows: who holds, who is assigned, the
reviews so far, the comments; which item a reviewer should take next. Blocking store reads:
call them off the event loop.

An item's desk status is ``claimed`` while the store's queue claims it or a reviewer's claim
on the desk is live, ``pending`` otherwise, ``decided`` once settled — the counts, the filters
and the rows of the queue all use this one rule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tracerag.server._review_claims import Claim
from tracerag.store._base import (
    KIND_REVIEW_ASSIGNED,
    KIND_REVIEW_COMMENT,
    KIND_REVIEW_VOTE,
    AuditStore,
    Entry,
    QueueItem,
)

NOTE_KINDS = (KIND_REVIEW_VOTE, KIND_REVIEW_ASSIGNED, KIND_REVIEW_COMMENT)


@dataclass
class ItemNotes:
    """The chained desk activity of one item: its assignee, votes and comments."""

    assignee: str | None = None
    votes: list[Entry] = field(default_factory=list)
    comments: list[Entry] = field(default_factory=list)

    def voters(self) -> set[str]:
        return {v.actor for v in self.votes}


def fold_notes(entries: Iterable[Entry]) -> dict[str, ItemNotes]:
    """Item notes by request id, from votes, assignments and comments in seq order."""
    notes: dict[str, ItemNotes] = {}
    for e in entries:
        n = notes.setdefault(e.request_id, ItemNotes())
        if e.kind == KIND_REVIEW_VOTE:
            n.votes.append(e)
        elif e.kind == KIND_REVIEW_ASSIGNED:
            assignee = e.payload.get("assignee")
            n.assignee = str(assignee) if assignee else None
        elif e.kind == KIND_REVIEW_COMMENT:
            n.comments.append(e)
    return notes


def notes_for(
    store: AuditStore, request_ids: Sequence[str] | None = None, open_only: bool = False
) -> dict[str, ItemNotes]:
    """The notes of some items (one query), or of every (undecided) item."""
    if request_ids is not None and not request_ids:
        return {}
    return fold_notes(store.review_entries(NOTE_KINDS, request_ids, open_only=open_only))


def holder(item: QueueItem, claims: Mapping[str, Claim]) -> str | None:
    """Who holds an undecided item: the desk claim's reviewer, else the store claim's."""
    if item.status == "decided":
        return None
    claim = claims.get(item.request_id)
    if claim is not None:
        return claim.reviewer
    return item.claimed_by if item.status == "claimed" else None


def desk_status(item: QueueItem, claims: Mapping[str, Claim]) -> str:
    """``decided``, ``claimed`` (held by someone) or ``pending``."""
    if item.status == "decided":
        return "decided"
    return "claimed" if holder(item, claims) else "pending"


@dataclass(frozen=True)
class RowView:
    """What a queue row shows beside the item."""

    status: str
    holder: str | None
    assignee: str | None
    reviews: int
    required: int
    disputed: bool
    comments: int
    skipped: bool = False


def row_view(
    item: QueueItem,
    claims: Mapping[str, Claim],
    notes: ItemNotes | None,
    required: int,
    skipped: bool = False,
) -> RowView:
    notes = notes or ItemNotes()
    votes = len(notes.votes)
    return RowView(
        status=desk_status(item, claims),
        holder=holder(item, claims),
        assignee=notes.assignee if item.status != "decided" else None,
        reviews=votes,
        required=required,
        disputed=item.status != "decided" and votes >= required > 1,
        comments=len(notes.comments),
        skipped=skipped,
    )


def next_item(
    open_items: Sequence[QueueItem],
    claims: Mapping[str, Claim],
    notes: Mapping[str, ItemNotes],
    skipped: set[str],
    me: str,
    required_of: Callable[[str], int],
    after: str | None = None,
) -> str | None:
    """The item ``me`` should take next: one held by nobody else, assigned to nobody else, not
    already reviewed by ``me`` (unless disputed), not ``after``; those assigned to ``me`` first,
    those ``me`` skipped last, otherwise in queue order (escalations first, then the oldest)."""
    best: tuple[int, int, int] | None = None
    chosen = None
    for order, item in enumerate(open_items):
        rid = item.request_id
        if rid == after or item.status == "decided":
            continue
        who = holder(item, claims)
        if who is not None and who != me:
            continue
        n = notes.get(rid) or ItemNotes()
        if n.assignee is not None and n.assignee != me:
            continue
        required = int(required_of(item.route))
        if me in n.voters() and len(n.votes) < required:
            continue
        key = (0 if n.assignee == me else 1, 1 if rid in skipped else 0, order)
        if best is None or key < best:
            best, chosen = key, rid
    return chosen


__all__ = [
    "ItemNotes",
    "RowView",
    "desk_status",
    "fold_notes",
    "holder",
    "next_item",
    "notes_for",
    "row_view",
]
