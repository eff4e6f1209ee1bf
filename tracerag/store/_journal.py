"""A local crash-safe journal of audit records: what an answer calls persisted is on disk here.

``Journal.append`` writes one framed record to the current segment file and returns once it is
on stable storage (``fdatasync``). Concurrent appends share one sync (group commit): the first
caller to need a sync becomes the leader and syncs everything written so far; the others wait
for it. A background reader (``AuditWriter``) drains the frames into the audit store and
``release``\\s what is stored; segments fully drained are deleted. On open, the segments left by
a previous process are found again and drained first, so a crash (even ``kill -9``) loses no
record that was appended.

Layout of the directory (created ``0700``, its files ``0600``: only the owner reads them)::

    00000000000000000001.seg ...   segments, appended in order
    identity.json                  the store this journal feeds (store_id, genesis, location)
    head.json                      the newest chain head seen in that store (the default anchor)
    refused.frames                 frames refused as not authentic (kept aside, never sealed)
    lock                           held (flock) by the one process using the directory

A second process cannot open a journal directory in use (``JournalBusy``); ``open_journal``
then takes the first free numbered slot inside it (``1/``, ``2/``…), so each process of a
multi-worker server has its own journal, found again by whichever process takes that slot next.

Frame: ``b"TJ"``, a type byte (``R`` record, ``Q`` quarantined record), an authentication
byte (0: none; 1: an HMAC-SHA256 tag follows the payload), the payload length and the CRC-32
of payload and tag (both unsigned 32-bit big-endian), then the payload (UTF-8 JSON) and the
tag. A frame cut short by a crash, or whose CRC does not match, ends the segment: the torn
tail of the newest segment is cut off on open (it was never acknowledged).

**Authentication.** A journal opened with the chain key (``key=``, what the writer passes
when ``TRACERAG_CHAIN_KEY`` is set) tags every frame with HMAC-SHA256 under a key derived
from it (``journal_key``), over the frame's type and payload. Reading it back, a frame
without a tag or with a wrong one is **not authentic**: whoever wrote it did not hold the key.
The writer never seals such a frame into the chain; it moves it to ``refused.frames``, logs
it and counts it, and ``tracerag audit verify`` reports it. Without a key nothing tells a
forged frame from a real one: an unkeyed journal is protected by its file permissions only.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
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

from tracerag.store._types import StoreError

logger = logging.getLogger("tracerag.audit")

MAGIC = b"TJ"
HEADER = struct.Struct(">2sccII")
FRAME_RECORD = b"R"
FRAME_QUARANTINE = b"Q"
AUTH_NONE = b"\x00"
AUTH_HMAC = b"\x01"
TAG_BYTES = 32
SEGMENT_SUFFIX = ".seg"
IDENTITY_FILE = "identity.json"
HEAD_FILE = "head.json"
REFUSED_FILE = "refused.frames"


class JournalError(StoreError, OSError):
    """The audit journal cannot take or give back a record (full, closed, in use, corrupt)."""


class JournalBusy(JournalError):
    """Another process holds this journal directory."""


@dataclass(frozen=True)
class Frame:
    """One record read back from the journal, and where the next one starts.

    ``authentic`` is False for a frame of a keyed journal whose tag is missing or wrong (it
    was not written by a holder of the key); an unkeyed journal takes every frame as it is.
    """

    segment: int
    end: int  # offset just after this frame in its segment
    type: bytes
    payload: bytes
    authentic: bool = True
    raw: bytes = b""  # the frame's bytes as stored (to keep a refused frame aside)


def journal_key(chain_key: str | bytes | None) -> bytes | None:
    """The key journal frames are tagged with, derived from the chain key (None: no key)."""
    if not chain_key:
        return None
    key = chain_key if isinstance(chain_key, bytes) else chain_key.encode("utf-8")
    return hmac.new(key, b"tracerag-journal-key-v1", hashlib.sha256).digest()


def frame_tag(key: bytes, frame_type: bytes, payload: bytes) -> bytes:
    """The HMAC-SHA256 tag of one frame under a journal key."""
    return hmac.new(key, b"tracerag-journal-v1" + frame_type + payload, hashlib.sha256).digest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def encode_frame(frame_type: bytes, payload: bytes, key: bytes | None = None) -> bytes:
    """The bytes of one frame; tagged when ``key`` (a ``journal_key``) is given."""
    if key is None:
        return HEADER.pack(MAGIC, frame_type, AUTH_NONE, len(payload), zlib.crc32(payload)) + (
            payload
        )
    tag = frame_tag(key, frame_type, payload)
    crc = zlib.crc32(tag, zlib.crc32(payload))
    return HEADER.pack(MAGIC, frame_type, AUTH_HMAC, len(payload), crc) + payload + tag


def _decode(data: bytes, pos: int, key: bytes | None) -> tuple[int, bytes, bytes, bool] | None:
    """The frame at ``pos``: (end, type, payload, authentic); None when torn or corrupt."""
    if pos + HEADER.size > len(data):
        return None
    magic, ftype, auth, length, crc = HEADER.unpack_from(data, pos)
    if magic != MAGIC or auth not in (AUTH_NONE, AUTH_HMAC):
        return None
    start = pos + HEADER.size
    tag_end = start + length + (TAG_BYTES if auth == AUTH_HMAC else 0)
    if tag_end > len(data):
        return None
    payload = data[start : start + length]
    tag = data[start + length : tag_end]
    if zlib.crc32(tag, zlib.crc32(payload)) != crc:
        return None
    if key is None:
        authentic = True  # nothing to check it with: an unkeyed journal trusts its files
    else:
        authentic = auth == AUTH_HMAC and hmac.compare_digest(tag, frame_tag(key, ftype, payload))
    return tag_end, ftype, payload, authentic


def _scan(
    path: Path, key: bytes | None = None
) -> tuple[list[tuple[int, bytes, bytes, bool]], int, bool]:
    """The whole frames of a segment (end, type, payload, authentic), its valid length, torn?"""
    data = path.read_bytes()
    frames: list[tuple[int, bytes, bytes, bool]] = []
    pos = 0
    while (frame := _decode(data, pos, key)) is not None:
        frames.append(frame)
        pos = frame[0]
    return frames, pos, pos != len(data)


class Journal:
    """An append-only, fsynced, segmented log of framed records in one directory.

    ``max_bytes`` bounds the journal on disk: an append that would pass it raises
    ``JournalError`` (the caller then says the record is not kept). ``segment_bytes`` is the
    size at which a new segment is started. ``key``: the chain key (text or bytes); with it
    every frame is tagged and frames read back are checked (see the module docstring).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        segment_bytes: int = 8 * 1024 * 1024,
        max_bytes: int = 1024 * 1024 * 1024,
        sync: bool = True,
        key: str | bytes | None = None,
    ) -> None:
        self.directory = Path(directory).expanduser()
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._key = journal_key(key)
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
        self.refused = 0  # frames set aside as not authentic (this process)
        self.syncs = 0  # fdatasync calls made for appends (fewer than appends: group commit)
        for path in sorted(self.directory.glob("*" + SEGMENT_SUFFIX)):
            try:
                number = int(path.stem)
            except ValueError:
                continue
            frames, valid, torn = _scan(path, self._key)
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
    def keyed(self) -> bool:
        """True when frames are tagged and checked with the chain key."""
        return self._key is not None

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
        frame = encode_frame(frame_type, payload, self._key)
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
                length = HEADER.unpack_from(data, pos)[3]
                if out and total + length > max_bytes:
                    max_frames = len(out)  # full: stop here
                    break
                total += length
                frame = _decode(data, pos, self._key)
                if frame is None:
                    raise JournalError(f"corrupt frame in {self._path(number)} at {start + pos}")
                end, ftype, body, authentic = frame
                raw = data[pos:end] if not authentic else b""
                pos = end
                out.append(Frame(number, start + pos, ftype, body, authentic, raw))
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

    def close(self, drained: bool = False) -> None:
        """Sync and close the current segment; an empty one is removed, and with ``drained``
        (every frame is in the store) every segment is."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self.sync:
                os.fdatasync(self._fd)
            os.close(self._fd)
            for number in [n for n, size in self._sizes.items() if drained or size == 0]:
                del self._sizes[number]
                with contextlib.suppress(FileNotFoundError):
                    self._path(number).unlink()
            os.close(self._lock_fd)  # releases the flock

    def set_aside(self, frame: Frame) -> None:
        """Keep a frame that is not authentic in ``refused.frames`` (durably), never sealed."""
        path = self.directory / REFUSED_FILE
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            data = frame.raw or encode_frame(frame.type, frame.payload)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if self.sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        with self._lock:
            self.refused += 1

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
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(fd, "w", encoding="utf-8") as fh:
        json.dump(value, fh, sort_keys=True)
        fh.flush()
        if sync:
            os.fsync(fh.fileno())
    os.replace(tmp, path)
    if sync:
        _fsync_dir(path.parent)


def iter_segments(directory: str | os.PathLike[str]) -> Iterator[Path]:
    """The segment files of a journal directory, oldest first."""
    yield from sorted(p for p in Path(directory).glob("*" + SEGMENT_SUFFIX) if p.stem.isdigit())


def read_frames(directory: str | os.PathLike[str]) -> list[tuple[bytes, bytes]]:
    """Every valid frame (type, payload) in a journal directory, read only (for inspection)."""
    out = []
    for path in iter_segments(directory):
        frames, _, _ = _scan(path)
        out += [(ftype, payload) for _, ftype, payload, _ in frames]
    return out


@dataclass(frozen=True)
class JournalState:
    """What a journal directory holds, read without taking it (for ``tracerag audit verify``).

    ``pending``: frames not yet drained into the store; ``not_authentic``: those of them that
    the key does not vouch for (counted only when a key is given; they will be refused);
    ``refused``: frames already refused and kept aside in ``refused.frames``.
    """

    directory: Path
    pending: int
    not_authentic: int
    refused: int


def inspect_journal(
    directory: str | os.PathLike[str], key: str | bytes | None = None
) -> list[JournalState]:
    """The state of a journal directory and of each numbered slot in it (absent: empty)."""
    base = Path(directory).expanduser()
    jkey = journal_key(key)
    out = []
    dirs = [
        base,
        *sorted(
            (p for p in base.glob("*") if p.is_dir() and p.name.isdigit()),
            key=lambda p: int(p.name),
        ),
    ]
    for d in dirs:
        if not d.is_dir():
            continue
        pending = not_authentic = 0
        for path in iter_segments(d):
            frames, _, _ = _scan(path, jkey)
            pending += len(frames)
            not_authentic += sum(1 for f in frames if not f[3])
        refused_path = d / REFUSED_FILE
        refused = len(_scan(refused_path)[0]) if refused_path.is_file() else 0
        if pending or refused or (d / IDENTITY_FILE).exists():
            out.append(JournalState(d, pending, not_authentic if jkey else 0, refused))
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
