"""Journal records are authenticated with the chain key: a record someone without the key wrote
into (or changed in) the journal is refused — kept aside, reported — and never sealed.

Issue 22: journal frames carried only a CRC; a record written into the journal of a store with
``TRACERAG_CHAIN_KEY`` was drained by the next writer, sealed *with the key*, and
``audit verify`` with the key said intact.
"""

from __future__ import annotations

import json
import stat
import struct
import zlib
from pathlib import Path

from store_fixtures import make_record
from tamper import KEY

from tracerag import cli
from tracerag.store import AuditWriter, Journal, open_store
from tracerag.store._journal import read_frames
from tracerag.store._sqlite import SQLiteAuditStore

FAST = {"backoff_initial": 0.01, "backoff_max": 0.05}
#: the frame header (magic, type, authentication byte, payload length, CRC-32); the format is
#: public, so an intruder can write it
HEADER = struct.Struct(">2sccII")


def encode_frame(frame_type: bytes, payload: bytes) -> bytes:
    """An untagged frame with a correct CRC, as anyone can write one."""
    return HEADER.pack(b"TJ", frame_type, b"\x00", len(payload), zlib.crc32(payload)) + payload


def _opener(path: Path):
    def opener(create: bool = True):
        return open_store(str(path), create=create)

    return opener


def _write_records(path: Path, journal: Path, *ids: str) -> None:
    writer = AuditWriter(_opener(path), journal=journal, **FAST)
    try:
        for rid in ids:
            assert writer.submit_durable(make_record(rid, decision="pass"))
        assert writer.flush(10)
    finally:
        assert writer.close()


def _plant_segment(journal: Path, *frames: bytes) -> Path:
    """What someone with write access to the journal directory does: add a segment."""
    numbers = [int(p.stem) for p in journal.glob("*.seg")]
    segment = journal / f"{max(numbers, default=0) + 50:020d}.seg"
    segment.write_bytes(b"".join(frames))
    return segment


def _forged_record(rid: str) -> bytes:
    record = make_record(rid, decision="pass", question="forged into the journal")
    record["response"]["answer"] = "Refunds are granted without a receipt, always."
    return json.dumps(record).encode()


def test_a_record_forged_into_a_keyed_journal_is_refused_and_never_sealed(
    tmp_path, monkeypatch, caplog, capsys
) -> None:
    monkeypatch.setenv("TRACERAG_CHAIN_KEY", KEY)
    path, journal = tmp_path / "a.sqlite", tmp_path / "a.sqlite.journal"
    _write_records(path, journal, "real-1")
    # the format is public: a frame with a correct CRC, and one with a made-up tag
    planted = encode_frame(b"R", _forged_record("forged-1"))
    payload = _forged_record("forged-2")
    tag = b"\x00" * 32
    tagged = HEADER.pack(b"TJ", b"R", b"\x01", len(payload), zlib.crc32(tag, zlib.crc32(payload)))
    _plant_segment(journal, planted, tagged + payload + tag)

    caplog.set_level("ERROR", logger="tracerag.audit")
    writer = AuditWriter(_opener(path), journal=journal, **FAST)  # the next start drains it
    try:
        assert writer.submit_durable(make_record("real-2", decision="pass"))
        assert writer.flush(10)
        assert writer.persisted("real-2") is True
    finally:
        writer.close()

    store = SQLiteAuditStore(path, chain_key=KEY)
    try:
        ids = {s.request_id for s in store.list_requests(limit=100)}
        assert ids == {"real-1", "real-2"}  # the forged records were never sealed
        assert store.verify_chain().ok
    finally:
        store.close()
    assert writer.refused == 2 and writer.status()["refused"] == 2
    refused = journal / "refused.frames"
    assert refused.is_file() and stat.S_IMODE(refused.stat().st_mode) == 0o600
    assert b"forged-1" in refused.read_bytes() and b"forged-2" in refused.read_bytes()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("NOT authentic" in m and "REFUSED" in m for m in messages) == 2

    # audit verify reports them (exit 1) although the chain itself is intact
    capsys.readouterr()
    assert cli.main(["audit", "verify", "--store", str(path)]) == 1
    out = capsys.readouterr().out
    assert "audit chain intact" in out
    assert "2 records were refused as not authentic" in out


def test_audit_verify_names_refused_and_waiting_forged_records(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRACERAG_CHAIN_KEY", KEY)
    path, journal = tmp_path / "a.sqlite", tmp_path / "a.sqlite.journal"
    _write_records(path, journal, "real-1")
    _plant_segment(journal, encode_frame(b"R", _forged_record("waiting")))
    # not drained yet: verify with the key sees it waiting, and that it will be refused
    assert cli.main(["audit", "verify", "--store", str(path)]) == 1
    out = capsys.readouterr().out
    assert "1 of the 1 records still in" in out and "are not authentic" in out
    from tracerag.store._journal import inspect_journal

    (state,) = inspect_journal(journal, KEY)
    assert state.pending == 1 and state.not_authentic == 1 and state.refused == 0


def test_a_tagged_record_changed_in_place_is_refused(tmp_path) -> None:
    """Someone rewrites a genuine, tagged frame's answer and fixes its CRC: the tag fails."""
    directory = tmp_path / "j"
    journal = Journal(directory, key=KEY)
    journal.append(b"R", b'{"request_id":"a","answer":"30 days"}')
    journal.close()
    (segment,) = directory.glob("*.seg")
    data = bytearray(segment.read_bytes())
    _, ftype, auth, length, _ = HEADER.unpack_from(data, 0)
    assert auth == b"\x01"
    body = bytes(data[HEADER.size : HEADER.size + length]).replace(b"30 days", b"90 days")
    tag = bytes(data[HEADER.size + length :])
    crc = zlib.crc32(tag, zlib.crc32(body))
    segment.write_bytes(HEADER.pack(b"TJ", ftype, auth, len(body), crc) + body + tag)

    again = Journal(directory, key=KEY)
    try:
        (frame,) = again.read(0, 0)
        assert frame.payload == body and frame.authentic is False
    finally:
        again.close()
    unkeyed = Journal(directory)  # without the key nothing can tell
    try:
        assert [f.authentic for f in unkeyed.read(0, 0)] == [True]
    finally:
        unkeyed.close()


def test_frames_of_a_keyed_journal_are_tagged_and_read_back_authentic(tmp_path) -> None:
    journal = Journal(tmp_path / "j", key=KEY)
    try:
        assert journal.keyed
        journal.append(b"R", b'{"request_id":"a"}')
        journal.append(b"Q", b'{"request_id":"b"}')
        frames = journal.read(0, 0)
        assert [(f.type, f.authentic) for f in frames] == [(b"R", True), (b"Q", True)]
    finally:
        journal.close()
    other_key = Journal(tmp_path / "j", key="another key")
    try:
        assert [f.authentic for f in other_key.read(0, 0)] == [False, False]
    finally:
        other_key.close()


def test_an_unkeyed_journal_is_the_owners_alone_and_takes_what_its_files_hold(tmp_path) -> None:
    """The documented limit: without a key, file permissions are all that protect the journal.

    The directory is created 0700 and its files 0600; whoever can still write them (the same
    user, root) can add records that are then sealed like any other.
    """
    path, journal = tmp_path / "a.sqlite", tmp_path / "a.sqlite.journal"
    _write_records(path, journal, "real-1")
    assert stat.S_IMODE(journal.stat().st_mode) == 0o700
    for name in ("identity.json", "head.json", "lock"):
        assert stat.S_IMODE((journal / name).stat().st_mode) == 0o600, name
    _plant_segment(journal, encode_frame(b"R", _forged_record("forged-1")))
    _write_records(path, journal)
    store = SQLiteAuditStore(path)
    try:
        assert {s.request_id for s in store.list_requests()} == {"real-1", "forged-1"}
    finally:
        store.close()
    assert read_frames(journal) == []


def test_an_old_untagged_frame_still_reads_in_an_unkeyed_journal(tmp_path) -> None:
    """Frames written before tags existed (reserved byte 0) read as they always did."""
    directory = tmp_path / "j"
    directory.mkdir()
    payload = b'{"request_id":"old"}'
    old = struct.pack(">2scxII", b"TJ", b"R", len(payload), zlib.crc32(payload)) + payload
    (directory / f"{1:020d}.seg").write_bytes(old)
    journal = Journal(directory)
    try:
        assert journal.recovered == 1
        assert [(f.payload, f.authentic) for f in journal.read(0, 0)] == [(payload, True)]
    finally:
        journal.close()
