"""Tamper evidence for the audit log: one hash chain over every entry, and its verification.

Each entry records the version of the rule that sealed it (``chain_version``):

- **1** (entries written before RFC 8785 support): SHA-256 over
  ``json.dumps([prev_hash, seq, request_id, kind, payload_json, actor, created_at],
  sort_keys=True, separators=(",", ":"), ensure_ascii=False)`` encoded as UTF-8;
- **2**: SHA-256 over the RFC 8785 (JCS) canonical JSON of
  ``["tracerag-chain-v2", prev_hash, seq, request_id, kind, payload_json, actor, created_at]``;
- **3**: the same material with ``"tracerag-chain-v3"``, sealed with HMAC-SHA256 under a key
  kept outside the database (``TRACERAG_CHAIN_KEY``).

``payload_json`` is the payload text exactly as stored: RFC 8785 canonical JSON (non-finite
floats written as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``; integers beyond
±2^53, which JCS cannot carry, fall back to version 1's sorted-key form), so a third party
re-verifies a chain with any JCS implementation and SHA-256 without re-encoding payloads. The
first entry chains to the store's genesis (``store_meta``; ``GENESIS_HASH`` for stores created
before it existed). The chain is global, not per request, so removing a whole request breaks
it too; the one-row ``chain_head`` (last seq, hash and, when keyed, its MAC) makes removal of
the newest entries visible as well.

What this detects, and what needs an anchor or a key, is in the README ("Audit trail").
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, overload

import rfc8785

from tracerag.errors import ConfigurationError
from tracerag.store._types import InvalidRecord

GENESIS_HASH = "0" * 64
CHAIN_V1 = 1
CHAIN_V2 = 2
CHAIN_V3 = 3
#: the version new entries are sealed with (without and with a key)
CHAIN_VERSION = CHAIN_V2
CHAIN_VERSION_KEYED = CHAIN_V3

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


_JCS_SAFE = 2**53
_FAST, _SLOW, _V1 = 0, 1, 2  # how a value can be written (see jcs_json)


def _json_key(key: Any) -> str:
    """An object key as ``json.dumps`` writes it."""
    if isinstance(key, str):
        return key
    if key is True:
        return "true"
    if key is False:
        return "false"
    if key is None:
        return "null"
    if isinstance(key, float):
        return _finite(key) if not math.isfinite(key) else repr(key)
    return str(key)


def _jcs_ready(value: Any) -> tuple[Any, int]:
    """The value prepared for JCS, and how it can be written.

    ``_FAST``: Python's own sorted-key JSON writes exactly the JCS text (the usual case: floats
    in fixed notation, integral floats turned into integers, no key beyond the BMP); ``_SLOW``:
    the ``rfc8785`` package must write it; ``_V1``: JCS cannot carry it exactly (an integer
    beyond ±2^53, or an integral float that large), so version 1 text is used.
    """
    if value is None or isinstance(value, (bool, str)):
        return value, _FAST
    if isinstance(value, int):
        return value, _FAST if abs(value) < _JCS_SAFE else _V1
    if isinstance(value, float):
        if not math.isfinite(value):
            return _finite(value), _FAST
        if value.is_integer():
            if abs(value) < _JCS_SAFE:
                return int(value), _FAST
            # exactly 2^53: rfc8785 writes it from the float (not from an int); beyond: v1
            return value, _SLOW if abs(value) == _JCS_SAFE else _V1
        size = abs(value)
        return value, _FAST if 1e-4 <= size < 1e16 else _SLOW
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        mode = _FAST
        for k, v in value.items():
            key = _json_key(k)
            if mode == _FAST and any(ord(c) > 0xFFFF for c in key):
                mode = _SLOW  # JCS sorts keys by UTF-16 code units, Python by code points
            out[key], item = _jcs_ready(v)
            mode = max(mode, item)
        return out, mode
    if isinstance(value, (list, tuple)):
        items: list[Any] = []
        mode = _FAST
        for v in value:
            item, m = _jcs_ready(v)
            items.append(item)
            mode = max(mode, m)
        return items, mode
    raise InvalidRecord(f"Object of type {type(value).__name__} is not JSON serializable")


class _NotPlain(Exception):
    """Python's JSON text of this value is not its JCS text."""


def _check_int(text: str) -> int:
    value = int(text)
    if abs(value) >= _JCS_SAFE:
        raise _NotPlain
    return value


_BEYOND_BMP = re.compile("[\U00010000-\U0010ffff]")
#: a JSON string (skipped whole) or a number, in text written by ``json.dumps``
_TOKEN = re.compile(r'"(?:[^"\\]++|\\.)*+"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?')


#: a float where ``json.dumps`` writes a value (Python writes every float with "." or "e"),
#: after the character that opens its place
_FLOAT = re.compile(r"([:\[,])(-?\d+(?:\.\d+(?:[eE][+-]?\d+)?|[eE][+-]?\d+))(?=[,\]}])")
#: an integer JCS may not carry exactly (then every token is looked at)
_LONG_DIGITS = re.compile(r"[:\[,]-?\d{16}")


def _jcs_float(match: re.Match[str]) -> str:
    token = match.group(2)
    return match.group(1) + _jcs_number(token, float(token))


def _jcs_number(token: str, value: float) -> str:
    """A float written by Python (``token``) as JCS writes it."""
    if value.is_integer():
        if abs(value) < _JCS_SAFE:
            return str(int(value))
        if abs(value) > _JCS_SAFE:
            raise _NotPlain  # JCS cannot carry it exactly: version 1 text
    elif 1e-4 <= abs(value) < 1e16:
        return token
    return rfc8785.dumps(value).decode("ascii")


def _jcs_token(match: re.Match[str]) -> str:
    """A token of Python's JSON text as JCS writes it (strings and most numbers unchanged)."""
    token = match.group(0)
    if token[0] == '"':
        return token
    if "." not in token and "e" not in token and "E" not in token:
        _check_int(token)
        return token
    return _jcs_number(token, float(token))


def jcs_json(value: Any) -> str:
    """RFC 8785 canonical JSON text of a value (see the module docstring for the exceptions).

    Raises ``TypeError``/``ValueError`` for values JSON cannot represent, including text that
    is not valid Unicode (a lone surrogate).
    """
    return jcs_parsed(value)[0]


def jcs_parsed(value: Any) -> tuple[str, Any]:
    """``jcs_json(value)`` and that text parsed back (the value as the store will return it)."""
    try:
        # The usual case, at C speed: Python's sorted-key JSON is already the JCS text when no
        # number is written differently and no key needs UTF-16 ordering.
        text = json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
        text.encode("utf-8")  # raises on lone surrogates, as JCS does
        if _BEYOND_BMP.search(text) is None:
            # only numbers can differ from JCS: rewrite the floats Python writes its own way
            if text[0] in "{[" and _LONG_DIGITS.search(text) is None:
                jcs = _FLOAT.sub(_jcs_float, text)
                parsed = json.loads(jcs)
                # a float-like run inside a string was rewritten too: the values differ
                if jcs is text or parsed == json.loads(text):
                    return jcs, parsed
            jcs = _TOKEN.sub(_jcs_token, text)
            return jcs, json.loads(jcs)
    except (_NotPlain, ValueError):
        pass  # a non-finite float, or numbers JCS writes its own way: prepare the value
    ready, mode = _jcs_ready(value)
    if mode == _V1:
        text = canonical_json(value)
    elif mode == _FAST:
        text = json.dumps(
            ready, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    else:
        try:
            text = rfc8785.dumps(ready).decode("utf-8")
        except rfc8785.CanonicalizationError as exc:
            raise InvalidRecord(str(exc)) from exc
    text.encode("utf-8")
    return text, json.loads(text)


def _material(tag: str, fields: list[Any]) -> bytes:
    """The JCS bytes of a hash's material: strings and one small integer, so Python's compact
    JSON is exactly JCS (no keys to order, no floats); lone surrogates raise."""
    return json.dumps([tag, *fields], separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def key_bytes(key: str | bytes | None) -> bytes | None:
    """A chain key as bytes (text keys are UTF-8); None or empty: no key."""
    if not key:
        return None
    return key if isinstance(key, bytes) else key.encode("utf-8")


def entry_hash(
    prev_hash: str,
    seq: int,
    request_id: str,
    kind: str,
    payload_json: str,
    actor: str,
    created_at: str,
    version: int = CHAIN_V1,
    key: bytes | None = None,
) -> str:
    """The hex digest that seals one entry and links it to the one before.

    Version 3 needs ``key``: ``ConfigurationError`` without it; ``InvalidRecord`` for a
    version this tracerag does not know.
    """
    fields: list[Any] = [prev_hash, seq, request_id, kind, payload_json, actor, created_at]
    if version == CHAIN_V1:
        material = canonical_json(fields).encode("utf-8")
        return hashlib.sha256(material).hexdigest()
    if version == CHAIN_V2:
        return hashlib.sha256(_material("tracerag-chain-v2", fields)).hexdigest()
    if version == CHAIN_V3:
        if key is None:
            raise ConfigurationError("a keyed (version 3) entry needs the chain key")
        material = _material("tracerag-chain-v3", fields)
        return hmac.new(key, material, hashlib.sha256).hexdigest()
    raise InvalidRecord(f"unknown chain version {version}")


def head_mac(key: bytes, store_id: str, seq: int, hash_: str) -> str:
    """The MAC of a chain head under the chain key (who holds no key cannot move the head)."""
    material = rfc8785.dumps(["tracerag-head", store_id, seq, hash_])
    return hmac.new(key, material, hashlib.sha256).hexdigest()


def keyed_since_mac(key: bytes, store_id: str, seq: int) -> str:
    """The MAC of the seq from which every entry of a store is keyed."""
    material = rfc8785.dumps(["tracerag-keyed-since", store_id, seq])
    return hmac.new(key, material, hashlib.sha256).hexdigest()


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
    version: int = CHAIN_V1

    def hash_at(self, seq: int, key: bytes | None = None) -> str | None:
        """The hash this row's content would have if written as ``seq`` (None: needs a key)."""
        if self.version == CHAIN_V3 and key is None:
            return None
        try:
            return entry_hash(
                self.prev_hash,
                seq,
                self.request_id,
                self.kind,
                self.payload_json,
                self.actor,
                self.created_at,
                self.version,
                key,
            )
        except (ValueError, TypeError, UnicodeError):
            return ""


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


class _IssuesOfKind:
    """A read-only report attribute: the report's issues of one kind."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    @overload
    def __get__(self, report: None, owner: type) -> _IssuesOfKind: ...

    @overload
    def __get__(self, report: ChainReport, owner: type) -> list[ChainIssue]: ...

    def __get__(self, report: ChainReport | None, owner: type) -> list[ChainIssue] | _IssuesOfKind:
        return self if report is None else report.of_kind(self.kind)


@dataclass
class ChainReport:
    """The outcome of ``verify_chain()``: ``ok`` when no issue was found."""

    checked: int = 0
    head_seq: int = 0
    head_hash: str = GENESIS_HASH
    issues: list[ChainIssue] = field(default_factory=list)
    truncated: bool = False  # more issues were found than were kept
    store_id: str | None = None
    unchecked: int = 0  # keyed entries whose content was not checked (no key given)
    keyed: bool = False  # the chain key was given and checked
    anchored: bool = False  # an outside anchor (expected head) was given and checked
    anchor_seq: int | None = None  # the newest anchored seq (when anchored)
    store_keyed: bool = False  # the store's chain is keyed (from some seq on)

    @property
    def ok(self) -> bool:
        return not self.issues

    @property
    def unanchored_tail(self) -> int:
        """Entries sealed after the newest anchor (all of them without an anchor)."""
        if not self.anchored or self.anchor_seq is None:
            return self.head_seq
        return max(0, self.head_seq - self.anchor_seq)

    @property
    def gaps(self) -> list[str]:
        """What this verification could not check (empty: it checked everything it can)."""
        out = []
        if self.unchecked or (self.store_keyed and not self.keyed):
            out.append(
                f"{self.unchecked} keyed entries and the head's MAC were not checked: the "
                "chain key was not given (TRACERAG_CHAIN_KEY)"
            )
        if not self.anchored:
            out.append(
                "no anchor (an exported chain head kept outside the database) was found or "
                "given: removing the newest entries, emptying the store"
                + (", or restoring an older copy of it" if self.keyed else " or rewriting it")
                + " would not be seen"
            )
        elif self.unanchored_tail and not self.keyed:
            out.append(
                f"the {self.unanchored_tail} newest entries (after the anchored seq "
                f"{self.anchor_seq}) are covered by neither the anchor nor a chain key: entries "
                "forged or removed there would not be seen (verify again once the writer has "
                "exported a newer head — every second while it runs, and when it stops — or "
                "use the chain key)"
            )
        return out

    @property
    def complete(self) -> bool:
        """True when nothing was left unchecked (see ``gaps``)."""
        return not self.gaps

    def of_kind(self, kind: str) -> list[ChainIssue]:
        """The issues of one kind."""
        return [i for i in self.issues if i.kind == kind]

    changed = _IssuesOfKind("changed")
    removed = _IssuesOfKind("removed")
    reordered = _IssuesOfKind("reordered")
    inserted = _IssuesOfKind("inserted")

    def summary(self) -> str:
        """A short human-readable account of the verification."""
        head = f"checked {self.checked} entries; chain head seq {self.head_seq} {self.head_hash}"
        if self.store_id:
            head += f"; store {self.store_id}"
        notes = [f"  NOT CHECKED: {gap}" for gap in self.gaps]
        if self.anchored and self.unanchored_tail and self.keyed:
            notes.append(
                f"  note: the {self.unanchored_tail} newest entries (after the anchored seq "
                f"{self.anchor_seq}) are covered by the chain key"
            )
        if self.ok:
            verdict = "intact" if self.complete else "consistent as far as checked"
            return "\n".join([f"audit chain {verdict}: {head}", *notes])
        lines = [f"audit chain BROKEN ({len(self.issues)} issues): {head}"]
        lines += [f"  {issue}" for issue in self.issues]
        if self.truncated:
            lines.append("  ... more issues not listed")
        return "\n".join(lines + notes)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form of the report."""
        return {
            "ok": self.ok,
            "checked": self.checked,
            "head_seq": self.head_seq,
            "head_hash": self.head_hash,
            "store_id": self.store_id,
            "unchecked": self.unchecked,
            "keyed": self.keyed,
            "store_keyed": self.store_keyed,
            "anchored": self.anchored,
            "anchor_seq": self.anchor_seq,
            "unanchored_tail": self.unanchored_tail,
            "complete": self.complete,
            "not_checked": self.gaps,
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
        *,
        genesis: str = GENESIS_HASH,
        key: bytes | None = None,
        keyed_since: int | None = None,
    ) -> None:
        self._find = find_by_hash
        self._max = max_issues
        self.genesis = genesis
        self.key = key
        self.keyed_since = keyed_since
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
        own = row.hash_at(row.seq, self.key)
        if own is None:  # keyed, and no key to check it with: trust its place
            return row.seq
        if own == row.hash:
            return row.seq
        for delta in range(1, REORDER_WINDOW + 1):
            for candidate in (row.seq - delta, row.seq + delta):
                if candidate >= 1 and row.hash_at(candidate, self.key) == row.hash:
                    return candidate
        return None

    def feed(self, row: StoredRow) -> None:
        """Check one row against itself and the row before it."""
        self.report.checked += 1
        if row.version == CHAIN_V3 and self.key is None:
            self.report.unchecked += 1
        if (
            self.key is not None
            and self.keyed_since is not None
            and row.seq >= self.keyed_since
            and row.version != CHAIN_V3
        ):
            self._issue(
                ChainIssue(
                    "changed",
                    row.seq,
                    row.request_id,
                    f"entry is sealed without the chain key (version {row.version}) although "
                    f"every entry from seq {self.keyed_since} is keyed: re-sealed by someone "
                    "without the key",
                )
            )
        prev = self._prev
        expected_seq = 1 if prev is None else prev.seq + 1
        expected_prev_hash = self.genesis if prev is None else prev.hash

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
        target = self._find(row.prev_hash) if row.prev_hash != self.genesis else None
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
