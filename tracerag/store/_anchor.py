"""The chain-head anchor: the audit chain head exported outside the store, only ever forward."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tracerag.config import get_config
from tracerag.store._journal import HEAD_FILE, Journal, write_json_atomic

logger = logging.getLogger("tracerag.audit")


def anchor_path(anchor: str | Path | bool | None, journal: Journal | None) -> Path | None:
    """Where a writer exports the chain head: ``anchor``, else ``TRACERAG_AUDIT_ANCHOR``, else
    ``head.json`` in the journal directory; None without any (``anchor=False``: never).

    A directory (existing, or named with a trailing ``/``) means its ``head.json``.
    """
    if anchor is False:
        return None
    if anchor is None or anchor is True:
        anchor = get_config().audit_anchor
    if anchor:
        text = str(anchor)
        path = Path(text).expanduser()
        if path.is_dir() or text.endswith(("/", "\\")):
            path = path / HEAD_FILE
        return path
    return journal.directory / HEAD_FILE if journal is not None else None


def _read_anchor(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # unreadable: replaced by the next export
    return value if isinstance(value, dict) else {}


@contextlib.contextmanager
def _dir_locked(directory: Path) -> Iterator[None]:
    """Hold an exclusive lock on a directory (the anchor's), for writers sharing one anchor."""
    import fcntl
    import os

    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _untimed(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


class HeadAnchor:
    """Exports a store's chain head to the anchor file ``path`` (None: nowhere), at most every
    ``interval`` seconds unless forced, and only ever forward.

    ``head`` is the head last exported (or found already anchored); ``conflict`` says why the
    store's head was not exported (None: no conflict seen).
    """

    def __init__(self, path: Path | None, interval: float = 1.0) -> None:
        self.path = path
        self.interval = interval
        self.head: dict[str, Any] | None = None
        self.conflict: str | None = None
        self._last_export = 0.0

    def export(
        self,
        store: Any,
        timed: Callable[..., Any] = _untimed,
        force: bool = False,
    ) -> None:
        """Write the store's chain head to the anchor file, only ever forward.

        The new head must extend the one the file holds (same store, seq not lower, the
        anchored entry unchanged); otherwise the file is left as it is and the conflict is
        logged at ERROR and reported in ``conflict`` (the writer's
        ``status()["anchor_conflict"]``): the store was truncated, rewritten, restored from an
        older copy or replaced since the anchor was written, and ``tracerag audit verify`` will
        say so. ``timed`` runs each store operation (the writer's watchdog).
        """
        if self.path is None or store is None or getattr(store, "closed", False):
            return  # no anchor to write, or its owner closed the store (the last export stands)
        now = time.monotonic()
        if not force and now - self._last_export < self.interval:
            return
        self._last_export = now
        head_of = getattr(store, "head", None)
        if head_of is None:
            return
        try:
            with _dir_locked(self.path.parent):
                previous = _read_anchor(self.path)
                head = timed(head_of)
                if previous is not None:
                    if previous.get("seq") == head.get("seq") and previous.get("hash") == head.get(
                        "hash"
                    ):
                        self.head = previous
                        return  # nothing new to anchor
                    conflict = self._problem(previous, head, store, timed)
                    if conflict is not None:
                        if conflict != self.conflict:
                            logger.error(
                                "audit chain head NOT exported to %s: %s (the anchor is kept; "
                                "run tracerag audit verify)",
                                self.path,
                                conflict,
                            )
                        self.conflict = conflict
                        return
                write_json_atomic(self.path, head, sync=True)
                self.head = head
            logger.info(
                "audit chain head: store_id=%s seq=%s hash=%s",
                head.get("store_id"),
                head.get("seq"),
                head.get("hash"),
            )
        except Exception as exc:
            logger.warning("could not export the audit chain head to %s: %s", self.path, exc)

    @staticmethod
    def _problem(
        previous: dict[str, Any],
        head: dict[str, Any],
        store: Any,
        timed: Callable[..., Any],
    ) -> str | None:
        """Why ``head`` does not extend the anchored ``previous`` head (None: it does)."""
        try:
            seq, digest = int(previous["seq"]), str(previous["hash"])
        except (KeyError, TypeError, ValueError):
            return None  # not a head file: replaced by a real one
        if previous.get("store_id") and previous.get("store_id") != head.get("store_id"):
            return (
                f"the anchor belongs to store {previous.get('store_id')}, this store is "
                f"{head.get('store_id')} (move the anchor away if the store was replaced on "
                "purpose)"
            )
        if int(head["seq"]) < seq:
            return (
                f"the chain head is at seq {head['seq']} but the anchor saw seq {seq}: entries "
                "were removed or an older copy of the store was restored"
            )
        if seq == 0:
            return None  # an empty chain: any chain of the same store extends it
        hash_at = getattr(store, "hash_at", None)
        found = (
            head.get("hash")
            if int(head["seq"]) == seq
            else (timed(hash_at, seq) if hash_at is not None else digest)
        )
        if found != digest:
            return f"the entry at the anchored seq {seq} was rewritten (its hash changed)"
        return None
