"""A local crash-safe journal of audit records: what an answer calls persisted is on disk here.

``Journal.append`` writes one framed record to the current segment file and returns once it is
on stable storage (``fdatasync``). Concurrent appends share one sync (group commit): the first
caller to need a sync becomes the leader and syncs everything written so far; the others wait
for it. A background reader (``AuditWriter``) drains the frames into the audit store and
``release``\\s what is stored; segments fully drained are deleted. On open, the segments left by
a previous process are found again and drained first, so a crash (even ``kill -9``) loses no
record that was appended.

Layout of the directory::

    00000000000000000001.seg ...   segments, appended in order
    identity.json                  the store this journal feeds (store_id, genesis, location)
    head.json                      the newest chain head seen in that store (an outside anchor)
    lock                           held (flock) by the one process using the directory

A second process cannot open a journal directory in use (``JournalBusy``); ``open_journal``
then takes the first free numbered slot inside it (``1/``, ``2/``…), so each process of a
multi-worker server has its own journal, found again by whichever process takes that slot next.

Frame: ``b"TJ"``, a type byte (``R`` record, ``Q`` quarantined record), a reserved byte, the
payload length and its CRC-32 (both unsigned 32-bit big-endian), then the payload (UTF-8
JSON). A frame cut short by a crash, or whose CRC does not match, ends the segment: the torn
tail of the newest segment is cut off on open (it was never acknowledged).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import struct
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger("tracerag.audit")

MAGIC = b"TJ"
HEADER = struct.Struct(">2scxII")
FRAME_RECORD = b"R"
FRAME_QUARANTINE = b"Q"
SEGMENT_SUFFIX = ".seg"
IDENTITY_FILE = "identity.json"
HEAD_FILE = "head.json"


class JournalError(OSError):
    """The journal cannot take the record (full, closed, or the disk refused it)."""


class JournalBusy(JournalError):
    """Another process holds this journal directory."""


@dataclass(frozen=True)
class Frame:
    """One record read back from the journal, and where the next one starts."""

    segment: int
    end: int  # offset just after this frame in its segment
    type: bytes
    payload: bytes


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def encode_frame(frame_type: bytes, payload: bytes) -> bytes:
    """The bytes of one frame."""
    return HEADER.pack(MAGIC, frame_type, len(payload), zlib.crc32(payload)) + payload


def _scan(path: Path) -> tuple[list[tuple[int, bytes, bytes]], int, bool]:
    """The valid frames of a segment (end offset, type, payload), its valid length, torn?"""
    data = path.read_bytes()
    frames: list[tuple[int, bytes, bytes]] = []
    pos = 0
    while pos + HEADER.size <= len(data):
        magic, ftype, length, crc = HEADER.unpack_from(data, pos)
        start = pos + HEADER.size
        end = start + length
        if magic != MAGIC or end > len(data):
            break
        payload = data[start:end]
        if zlib.crc32(payload) != crc:
            break
        frames.append((end, ftype, payload))
        pos = end
    return frames, pos, pos != len(data)


class Journal:
    """An append-only, fsynced, segmented log of framed records in one directory.

    ``max_bytes`` bounds the journal on disk: an append that would pass it raises
    ``JournalError`` (the caller then says the record is not kept). ``segment_bytes`` is the
    size at which a new segment is started.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        segment_bytes: int = 8 * 1024 * 1024,
        max_bytes: int = 1024 * 1024 * 1024,
        sync: bool = True,
    ) -> None:
        self.directory = Path(directory).expanduser()
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.directory / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock_fd)
            raise JournalBusy(
                f"the audit journal {self.directory} is in use by another process"
            ) from None
        self.segment_bytes = segment_bytes
        self.max_bytes = max_bytes
        self.sync = sync
        self._lock = threading.Lock()  # the write side: fd, sizes, counters
        self._sync_cond = threading.Condition()
        self._syncing = False
        self._written = 0  # frames written (ever, this process)
        self._synced = 0  # frames known to be on stable storage
        self._sizes: dict[int, int] = {}  # segment -> valid length
        self.torn_bytes = 0  # bytes cut off torn tails on open
        self.recovered = 0  # frames found on open (left by an earlier process)
        self.syncs = 0  # fdatasync calls made for appends (fewer than appends: group commit)
        for path in sorted(self.directory.glob("*" + SEGMENT_SUFFIX)):
            try:
                number = int(path.stem)
            except ValueError:
                continue
            frames, valid, torn = _scan(path)
            if torn:
                self.torn_bytes += path.stat().st_size - valid
                logger.warning(
                    "audit journal %s: cut %d bytes of a torn or corrupt frame at offset %d",
                    path,
                    path.stat().st_size - valid,
                    valid,
                )
                with open(path, "r+b") as fh:
                    fh.truncate(valid)
                    os.fsync(fh.fileno())
            if valid == 0:
                path.unlink()
                continue
            self._sizes[number] = valid
            self.recovered += len(frames)
        self._current = max(self._sizes, default=0) + 1
        self._fd = self._open_segment(self._current)
        self._sizes[self._current] = 0
        self._closed = False

    # -- writing ------------------------------------------------------------------------------
    def _path(self, number: int) -> Path:
        return self.directory / f"{number:020d}{SEGMENT_SUFFIX}"

    def _open_segment(self, number: int) -> int:
        fd = os.open(self._path(number), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        if self.sync:
            _fsync_dir(self.directory)  # the new file's name is durable too
        return fd

    @property
    def size(self) -> int:
        """Bytes held in the journal's segments (written and not yet released)."""
        with self._lock:
            return sum(self._sizes.values())

    def append(self, frame_type: bytes, payload: bytes) -> None:
        """Write one frame and return once it is on stable storage (group commit)."""
        mine = self.write(frame_type, payload)
        if self.sync:
            self.sync_upto(mine)

    def write(self, frame_type: bytes, payload: bytes) -> int:
        """Write one frame, not yet synced; returns its ticket for ``sync_upto``."""
        frame = encode_frame(frame_type, payload)
        with self._lock:
            if self._closed:
                raise JournalError("the audit journal is closed")
            if sum(self._sizes.values()) + len(frame) > self.max_bytes:
                raise JournalError(
                    f"the audit journal is full ({self.max_bytes} bytes): the store is not "
                    "draining it"
                )
            if self._sizes[self._current] and self._sizes[self._current] + len(frame) > (
                self.segment_bytes
            ):
                self._rotate()
            view = memoryview(frame)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
            self._sizes[self._current] += len(frame)
            self._written += 1
            return self._written

    def _rotate(self) -> None:
        """Start a new segment (under ``_lock``); the old one is synced before it is closed."""
        old = self._fd
        if self.sync:
            os.fdatasync(old)
        os.close(old)
        self._current += 1
        self._fd = self._open_segment(self._current)
        self._sizes[self._current] = 0

    def sync_upto(self, mine: int) -> None:
        """Return once the frame with ticket ``mine`` (and all before it) is on stable storage.

        Callers waiting together share one ``fdatasync``: the first becomes the leader and
        syncs everything written so far.
        """
        if not self.sync:
            return
        with self._sync_cond:
            while self._synced < mine:
                if not self._syncing:
                    self._syncing = True
                    break
                self._sync_cond.wait()
            else:
                return
        ok = False
        try:
            with self._lock:
                target = self._written
                fd = os.dup(self._fd)
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
            self.syncs += 1
            ok = True
        finally:
            with self._sync_cond:
                self._syncing = False
                if ok:
                    # frames of rotated segments were synced by _rotate before this fd existed
                    self._synced = max(self._synced, target)
                self._sync_cond.notify_all()
        if self._synced < mine:  # pragma: no cover - a sync failed: raised above
            raise JournalError("the audit journal could not be synced")

    # -- reading ------------------------------------------------------------------------------
    def read(
        self, segment: int, offset: int, max_frames: int = 200, max_bytes: int = 1 << 62
    ) -> list[Frame]:
        """Frames after ``(segment, offset)``, crossing into later segments.

        At most ``max_frames``, and no more than ``max_bytes`` of payload (at least one frame).
        """
        out: list[Frame] = []
        total = 0
        with self._lock:
            sizes = dict(self._sizes)
        for number in sorted(n for n in sizes if n >= segment):
            start = offset if number == segment else 0
            end = sizes[number]
            if start >= end:
                continue
            with open(self._path(number), "rb") as fh:
                fh.seek(start)
                data = fh.read(end - start)
            pos = 0
            while pos + HEADER.size <= len(data) and len(out) < max_frames:
                magic, ftype, length, crc = HEADER.unpack_from(data, pos)
                if out and total + length > max_bytes:
                    max_frames = len(out)  # full: stop here
                    break
                total += length
                body = data[pos + HEADER.size : pos + HEADER.size + length]
                if magic != MAGIC or len(body) != length or zlib.crc32(body) != crc:
                    raise JournalError(f"corrupt frame in {self._path(number)} at {start + pos}")
                pos += HEADER.size + length
                out.append(Frame(number, start + pos, ftype, body))
            if len(out) >= max_frames:
                break
        return out

    def first_position(self) -> tuple[int, int]:
        """Where reading starts: the oldest segment, offset 0."""
        with self._lock:
            return (min(self._sizes), 0)

    def release(self, segment: int, offset: int) -> None:
        """Everything before ``(segment, offset)`` is stored: delete segments wholly before it."""
        with self._lock:
            done = [n for n in self._sizes if n < segment and n != self._current]
            if (
                segment in self._sizes
                and segment != self._current
                and offset >= self._sizes[segment]
            ):
                done.append(segment)
            for number in done:
                del self._sizes[number]
                with contextlib.suppress(FileNotFoundError):
                    self._path(number).unlink()

    def pending_after(self, segment: int, offset: int) -> int:
        """Bytes written after ``(segment, offset)``."""
        with self._lock:
            total = 0
            for number, size in self._sizes.items():
                if number > segment:
                    total += size
                elif number == segment:
                    total += max(0, size - offset)
            return total

    def close(self) -> None:
        """Sync and close the current segment; a drained journal leaves no segment behind."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self.sync:
                os.fdatasync(self._fd)
            os.close(self._fd)
            if self._sizes.get(self._current) == 0:
                del self._sizes[self._current]
                with contextlib.suppress(FileNotFoundError):
                    self._path(self._current).unlink()
            os.close(self._lock_fd)  # releases the flock

    # -- side files ---------------------------------------------------------------------------
    def read_json(self, name: str) -> dict[str, Any] | None:
        """A side file (identity, head) as a dict, or None when absent or unreadable."""
        try:
            value = json.loads((self.directory / name).read_text("utf-8"))
        except (OSError, ValueError):
            return None
        return value if isinstance(value, dict) else None

    def write_json(self, name: str, value: dict[str, Any]) -> None:
        """Replace a side file atomically and durably."""
        write_json_atomic(self.directory / name, value, sync=self.sync)


def write_json_atomic(path: Path, value: dict[str, Any], *, sync: bool = True) -> None:
    """Write ``value`` as JSON to ``path`` through a temporary file and a rename."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(value, fh, sort_keys=True)
        fh.flush()
        if sync:
            os.fsync(fh.fileno())
    os.replace(tmp, path)
    if sync:
        _fsync_dir(path.parent)


def iter_segments(directory: str | os.PathLike[str]) -> Iterator[Path]:
    """The segment files of a journal directory, oldest first."""
    yield from sorted(Path(directory).glob("*" + SEGMENT_SUFFIX))


def read_frames(directory: str | os.PathLike[str]) -> list[tuple[bytes, bytes]]:
    """Every valid frame (type, payload) in a journal directory, read only (for inspection)."""
    out = []
    for path in iter_segments(directory):
        frames, _, _ = _scan(path)
        out += [(ftype, payload) for _, ftype, payload in frames]
    return out


def open_journal(directory: str | os.PathLike[str], slots: int = 64, **options: Any) -> Journal:
    """The journal in ``directory``, or in its first numbered slot no other process holds."""
    base = Path(directory).expanduser()
    for slot in range(slots + 1):
        try:
            return Journal(base if slot == 0 else base / str(slot), **options)
        except JournalBusy:
            continue
    raise JournalBusy(f"all {slots} slots of the audit journal {base} are in use")
