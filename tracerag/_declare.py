"""What a request says, declared once per part of its state; every projection derived from it.

Each part of a ``RequestState`` (the checked input, the six stage outputs, the state itself)
carries a class-level ``SIGNALS`` table. A ``Signal`` is one value read from its part and every
place that value goes:

- ``span``: an attribute of the span of the stage that made the part (the input's go on the
  register span, the stage that registers it); ``EACH`` when the value is a mapping of several;
- ``io``: a key of the stage span's OpenInference output value (JSON);
- ``stream``: a key of ``StageEvent.signals()``: what ``on_stage`` listeners, the
  ``tracerag.stage`` custom event and the server's stream carry for the stage;
- ``record``: a path in the audit record (``"tier"``, ``"retrieval.count"``);
- ``metric``: a field of ``tracerag.metrics.RequestOutcome``;
- ``root``: an attribute of the request's root span;
- ``meta``: a key of the root span's OpenInference metadata (JSON).

The projections below (and ``RequestState``'s, which walk its parts) read values only through
these tables: adding a signal is one ``Signal`` in its part's table.

Rules every projection follows:

- a getter that returns ``OMIT`` leaves the signal out everywhere;
- span, io and root attributes are set only when ``when(value)`` holds (default: the value is
  not None), after ``span_as`` (the attribute's form: ``float``, the capture policy) when
  given; a ``span_as`` that gives None leaves the attribute out;
- stream, record and meta values are JSON-able (``jsonable``; a getter whose value is JSON
  already says ``is_json=True``); metric values are as read;
- a signal with ``across=True`` reads the whole ``RequestState`` (the part is present): for
  values that combine outputs, such as the record's retrieval count, which counts the
  materials the samples' runs added. Span and io values read their own part only (a stage
  stamps its span before the state holds its output);
- when a part is missing (a stage skipped, or a request that failed before it), its signals'
  ``absent`` values go to the record, metric and meta destinations; by default nothing does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import date, datetime
from enum import Enum
from typing import Any, ClassVar, Final, NamedTuple, Protocol

from tracerag.errors import ConfigurationError
from tracerag.telemetry._spans import set_span_io

__all__ = [
    "EACH",
    "LEAVES",
    "OMIT",
    "Compiled",
    "Declared",
    "Signal",
    "compiled",
    "io_output",
    "jsonable",
    "plain",
    "span_attributes",
    "stamp",
    "stream_signals",
]


class _Omit:
    """The value of a signal that is left out (``OMIT``)."""

    _instance: _Omit | None = None

    def __new__(cls) -> _Omit:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "OMIT"

    def __bool__(self) -> bool:
        return False


#: Returned by a getter (or given as ``absent``): the signal is left out.
OMIT: Final = _Omit()

#: A ``span`` key: the value is a mapping of several span attributes (set as they are).
EACH: Final = "*"


def _given(value: Any) -> bool:
    return value is not None


@dataclass(frozen=True, slots=True, eq=False)
class Signal:
    """One value of a part of the request's state, and every place it goes (see the module)."""

    get: Callable[[Any], Any]
    span: str | None = None
    io: str | None = None
    stream: str | None = None
    record: str | None = None
    metric: str | None = None
    root: str | None = None
    meta: str | None = None
    #: whether the span, io or root attribute is set, given the value (default: not None)
    when: Callable[[Any], bool] = _given
    #: the attribute's form of the value on spans (span and root), e.g. ``float``
    span_as: Callable[[Any], Any] | None = None
    #: the getter reads the whole ``RequestState`` instead of its part
    across: bool = False
    #: the record, metric and meta value when the part is missing (``OMIT``: none)
    absent: Any = OMIT
    #: the value is JSON already: the stream, record and meta keep it as it is
    is_json: bool = False

    @property
    def destinations(self) -> dict[str, str]:
        """Where this signal goes: destination kind -> key (span, io, stream, record, …)."""
        return {
            kind: key
            for kind in ("span", "io", "stream", "record", "metric", "root", "meta")
            if (key := getattr(self, kind)) is not None
        }


class Declared(Protocol):
    """A part of a request's state: a class with a ``SIGNALS`` table."""

    SIGNALS: ClassVar[tuple[Signal, ...]]


# -- the tables, compiled once per table into one list per destination ------------------------


class _Attr(NamedTuple):
    key: str
    get: Callable[[Any], Any]
    when: Callable[[Any], bool]
    span_as: Callable[[Any], Any] | None
    across: bool


class _Value(NamedTuple):
    key: str
    get: Callable[[Any], Any]
    across: bool
    absent: Any
    is_json: bool


class _Path(NamedTuple):
    section: str | None  # the record's section ("retrieval"), None for a top-level key
    key: str
    get: Callable[[Any], Any]
    across: bool
    absent: Any
    is_json: bool


class Compiled(NamedTuple):
    """A table's signals, grouped by destination (in table order)."""

    span: tuple[_Attr, ...]
    io: tuple[_Attr, ...]
    stream: tuple[_Value, ...]
    record: tuple[_Path, ...]
    metric: tuple[_Value, ...]
    root: tuple[_Attr, ...]
    meta: tuple[_Value, ...]


_COMPILED: dict[int, tuple[tuple[Signal, ...], Compiled]] = {}


def compiled(table: tuple[Signal, ...]) -> Compiled:
    """The table grouped by destination; computed once per table (a replaced table anew)."""
    cached = _COMPILED.get(id(table))
    if cached is not None and cached[0] is table:
        return cached[1]

    def attrs(kind: str) -> tuple[_Attr, ...]:
        return tuple(
            _Attr(getattr(s, kind), s.get, s.when, s.span_as, s.across)
            for s in table
            if getattr(s, kind) is not None
        )

    def values(kind: str) -> tuple[_Value, ...]:
        return tuple(
            _Value(getattr(s, kind), s.get, s.across, s.absent, s.is_json)
            for s in table
            if getattr(s, kind) is not None
        )

    result = Compiled(
        span=attrs("span"),
        io=attrs("io"),
        stream=values("stream"),
        record=tuple(_path(s) for s in table if s.record is not None),
        metric=values("metric"),
        root=attrs("root"),
        meta=values("meta"),
    )
    _COMPILED[id(table)] = (table, result)
    return result


def _path(s: Signal) -> _Path:
    assert s.record is not None
    section, _, key = s.record.rpartition(".")
    if "." in section:
        raise ConfigurationError(f"a record path has at most one section: {s.record!r}")
    return _Path(section or None, key, s.get, s.across, s.absent, s.is_json)


# -- projections of one part ---------------------------------------------------------------------


def span_attributes(part: Any) -> dict[str, Any]:
    """The span attributes a stage output (or the input) declares, from the part alone."""
    return attributes(compiled(type(part).SIGNALS).span, part, part)


def io_output(part: Any) -> dict[str, Any] | None:
    """The stage span's OpenInference output value a part declares (None: it declares none)."""
    entries = compiled(type(part).SIGNALS).io
    if not entries:
        return None
    out: dict[str, Any] = {}
    for entry in entries:
        value = entry.get(part)
        if value is OMIT or not entry.when(value):
            continue
        out[entry.key] = value
    return out


def stream_signals(part: Any) -> dict[str, Any]:
    """The key signals of a stage output, JSON-able, as stage events carry them."""
    out: dict[str, Any] = {}
    for key, get, _, _, is_json in compiled(type(part).SIGNALS).stream:
        value = get(part)
        if value is not OMIT:
            out[key] = value if is_json or type(value) in LEAVES else jsonable(value)
    return out


def attributes(entries: tuple[_Attr, ...], part: Any, state: Any) -> dict[str, Any]:
    """Span attributes from compiled ``span`` or ``root`` entries of a present part."""
    attrs: dict[str, Any] = {}
    # the entries' fields unpacked: this runs for every stage span and root span
    for key, get, when, span_as, across in entries:
        value = get(state if across else part)
        if value is OMIT or not (value is not None if when is _given else when(value)):
            continue
        if span_as is not None:
            value = span_as(value)
            if value is None:
                continue
        if key == EACH:
            attrs.update(value)
        else:
            attrs[key] = value if type(value) in _ATTRIBUTE_TYPES else plain(value)
    return attrs


#: the types span attributes take as they are (other values go through ``plain``)
_ATTRIBUTE_TYPES = frozenset({str, int, float, bool, list, tuple})


def plain(value: Any) -> Any:
    """A value as a span attribute takes it: a named choice as its plain string."""
    if isinstance(value, Enum):
        return value._value_
    return value


# -- JSON ------------------------------------------------------------------------------------


def jsonable(value: Any) -> Any:
    """Convert dataclasses, pydantic models, datetimes, named choices and containers to
    JSON-able values."""
    cls = type(value)
    kind = _KINDS.get(cls)
    if kind is None:
        kind = _KINDS[cls] = _kind_of(cls)
    if kind == _PLAIN:
        return value
    # most members are strings and numbers: those are kept without a call per member
    if kind == _DATACLASS:
        out: dict[str, Any] = {}
        for name in _FIELD_NAMES[cls]:
            member = getattr(value, name)
            out[name] = member if type(member) in _LEAVES else jsonable(member)
        return out
    if kind == _SEQUENCE:
        return [v if type(v) in _LEAVES else jsonable(v) for v in value]
    if kind == _MAPPING:
        return {str(k): v if type(v) in _LEAVES else jsonable(v) for k, v in value.items()}
    if kind == _CHOICE:
        return value._value_
    if kind == _TIME:
        return value.isoformat()
    if kind == _MODEL:
        return value.model_dump(mode="json")
    return str(value)


_PLAIN, _TIME, _DATACLASS, _MODEL, _MAPPING, _SEQUENCE, _CHOICE, _OTHER = range(8)
#: the types kept as they are (``_PLAIN``), tested before a call to ``jsonable``
LEAVES = frozenset({str, int, float, bool, type(None)})
_LEAVES = LEAVES
_KINDS: dict[type, int] = {}
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _kind_of(cls: type) -> int:
    """How ``jsonable`` converts values of this type (decided once per type)."""
    if issubclass(cls, Enum):
        return _CHOICE
    if cls is type(None) or issubclass(cls, (str, int, float, bool)):
        return _PLAIN
    if issubclass(cls, (datetime, date)):
        return _TIME
    if dataclasses.is_dataclass(cls):
        _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
        return _DATACLASS
    if hasattr(cls, "model_dump"):
        return _MODEL
    if issubclass(cls, Mapping):
        return _MAPPING
    if issubclass(cls, (list, tuple, set, frozenset)):
        return _SEQUENCE
    return _OTHER


def stamp(span: Any, *parts: Any) -> None:
    """Put what stage outputs declare for their span on it: attributes and OpenInference
    output value (the register span takes the input's and the registration's)."""
    if not span.is_recording():
        return
    attrs = span_attributes(parts[0])
    for part in parts[1:]:
        attrs.update(span_attributes(part))
    span.set_attributes(attrs)
    for part in parts:
        output = io_output(part)
        if output is not None:
            set_span_io(span, output=output)
