"""How well a material supports a claim: the result type, the backend interface and a registry.

A support backend scores one claim against one material text and names the material sentence
that supports it best, synchronously (``backend(claim, text)``) or from async code
(``await backend.acheck(claim, text)``, or ``acheck_support`` for any backend). ``"lexical"``
(term overlap with number, date and negation checks) is always available; ``"embeddings"`` is
registered when its optional dependencies are installed. Other backends can be added with
``register_backend``.

``Usage`` counts what a backend spent on model calls for the requests of one ``usage_scope``.
"""

from __future__ import annotations

import asyncio
import contextvars
import importlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, runtime_checkable

from tracerag._usage import bound
from tracerag.errors import ConfigurationError, InputError

__all__ = [
    "USAGE_ATTRIBUTES",
    "Support",
    "SupportBackend",
    "SyncSupportBackend",
    "Usage",
    "acheck_support",
    "available_backends",
    "check_inputs",
    "get_backend",
    "record_usage",
    "register_backend",
    "support",
    "usage_scope",
]


@dataclass(frozen=True)
class Support:
    """How well a material supports a claim, and the material sentence that supports it best."""

    score: float  # in [0, 1]
    supported: bool  # score >= backend threshold and no hard mismatch
    sentence: str  # the material's best-supporting sentence
    start: int  # offsets of `sentence` in the material text
    end: int
    backend: str
    reason: str = ""  # why, for people (e.g. "amount 600元 not in material")
    mismatches: tuple[str, ...] = ()  # claim quantities not found in the material (raw text)
    candidates: tuple[tuple[int, int, float], ...] = ()  # top sentences (start, end, score)
    unsupported_terms: tuple[str, ...] = ()  # words of the claim the material does not back

    def __post_init__(self) -> None:
        if not 0.0 <= self.score <= 1.0:
            raise InputError(f"support score must be in [0, 1], got {self.score!r}")
        if self.start > self.end:
            raise InputError(f"support span start {self.start} is after end {self.end}")


@runtime_checkable
class SupportBackend(Protocol):
    """Scores how well ``material_text`` supports ``claim``.

    ``corpus`` is the set of retrieved material texts (for term rarity); without it the
    material's own sentences are used. ``threshold`` is the score at or above which a claim
    counts as supported. ``acheck`` is the same check for async callers: it must not block the
    event loop (backends that compute on the CPU run ``__call__`` in a worker thread).
    """

    name: str
    threshold: float

    def __call__(
        self, claim: str, material_text: str, *, corpus: Sequence[str] | None = None
    ) -> Support: ...

    async def acheck(
        self, claim: str, material_text: str, *, corpus: Sequence[str] | None = None
    ) -> Support: ...


class SyncSupportBackend:
    """Base class for backends that compute synchronously: ``acheck`` runs ``__call__`` in a
    worker thread, so the event loop keeps serving other requests meanwhile."""

    name: str
    threshold: float

    def __call__(
        self, claim: str, material_text: str, *, corpus: Sequence[str] | None = None
    ) -> Support:  # pragma: no cover - subclasses implement it
        raise NotImplementedError

    def cheap(self, checks: Sequence[tuple[str, str]], corpus: Sequence[str]) -> bool:
        """Whether scoring ``checks`` (claim, material text) against ``corpus`` costs less than
        handing the work to a worker thread, so async callers may compute it in place. Never,
        unless a backend knows its work to be quick."""
        return False

    async def acheck(
        self, claim: str, material_text: str, *, corpus: Sequence[str] | None = None
    ) -> Support:
        """``self(claim, material_text, corpus=corpus)`` in a worker thread."""
        return await asyncio.to_thread(self, claim, material_text, corpus=corpus)


async def acheck_support(
    backend: SupportBackend,
    claim: str,
    material_text: str,
    *,
    corpus: Sequence[str] | None = None,
) -> Support:
    """``backend``'s verdict from async code: its ``acheck`` when it has one, else its
    ``__call__`` in a worker thread."""
    acheck = getattr(backend, "acheck", None)
    if acheck is not None and asyncio.iscoroutinefunction(acheck):
        verdict: Support = await acheck(claim, material_text, corpus=corpus)
        return verdict
    return await asyncio.to_thread(backend, claim, material_text, corpus=corpus)


#: Span attributes that carry a ``Usage``: model calls, tokens and cache hits of verification.
USAGE_ATTRIBUTES = {
    "calls": "tracerag.verify.support.model_calls",
    "input_tokens": "tracerag.verify.support.input_tokens",
    "output_tokens": "tracerag.verify.support.output_tokens",
    "cached": "tracerag.verify.support.cached_verdicts",
}


@dataclass
class Usage:
    """Model calls and tokens spent by support backends within one ``usage_scope``."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached: int = 0  # verdicts answered from a cache, without a call

    def attributes(self) -> dict[str, int]:
        """The usage as span attributes (``USAGE_ATTRIBUTES``)."""
        return {key: getattr(self, field) for field, key in USAGE_ATTRIBUTES.items()}

    def add(
        self, calls: int = 0, input_tokens: int = 0, output_tokens: int = 0, cached: int = 0
    ) -> None:
        """Count more calls, tokens or cache hits."""
        with _USAGE_LOCK:
            self.calls += calls
            self.input_tokens += input_tokens
            self.output_tokens += output_tokens
            self.cached += cached


_USAGE_LOCK = threading.Lock()
_USAGE: contextvars.ContextVar[Usage | None] = contextvars.ContextVar(
    "tracerag_support_usage", default=None
)


def usage_scope() -> AbstractContextManager[Usage]:
    """Collects the model calls and tokens that support backends report inside the block
    (including from worker threads started with ``asyncio.to_thread``)."""
    return bound(_USAGE, Usage())


def record_usage(
    calls: int = 0, input_tokens: int = 0, output_tokens: int = 0, cached: int = 0
) -> None:
    """Report model calls and tokens to the enclosing ``usage_scope`` (if any)."""
    usage = _USAGE.get()
    if usage is not None:
        usage.add(calls, input_tokens, output_tokens, cached)


_FACTORIES: dict[str, Callable[[], SupportBackend]] = {}
_INSTANCES: dict[str, SupportBackend] = {}
_LOCK = threading.Lock()
# Built-in backends and the module that registers each one on import.
_BUILTIN_MODULES = {
    "lexical": "tracerag.signals._lexical",
    "embeddings": "tracerag.signals._embeddings",
    "judge": "tracerag.signals._judge",
    "checker": "tracerag.signals._checker",
    "learned": "tracerag.signals._learned",
    "learned-embeddings": "tracerag.signals._learned",
}
_EXTRA_HINTS = {
    "embeddings": "install the optional extra: from the tracerag source tree, "
    'pip install ".[embeddings]"',
    "learned-embeddings": "install the optional extra: from the tracerag source tree, "
    'pip install ".[embeddings]"',
}


def register_backend(name: str, factory: Callable[[], SupportBackend]) -> None:
    """Make a support backend available by name; ``factory`` builds it on first use."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigurationError("a support backend needs a non-empty name")
    if not callable(factory):
        raise ConfigurationError(f"the factory of support backend {name!r} is not callable")
    with _LOCK:
        _FACTORIES[name] = factory
        _INSTANCES.pop(name, None)


def _load_builtin(name: str) -> None:
    module = _BUILTIN_MODULES.get(name)
    if module is None or name in _FACTORIES:
        return
    try:
        importlib.import_module(module)
    except ImportError:
        return


def available_backends() -> list[str]:
    """Names of the support backends that can be used here (built-in and registered)."""
    for name in _BUILTIN_MODULES:
        _load_builtin(name)
    return sorted(_FACTORIES)


def get_backend(name: str | SupportBackend) -> SupportBackend:
    """The backend registered under ``name`` (built once, then reused), or ``name`` itself."""
    if not isinstance(name, str):
        if callable(name) and hasattr(name, "threshold"):
            return name
        raise ConfigurationError(
            f"support backend must be a name or a SupportBackend, got {type(name).__name__}"
        )
    instance = _INSTANCES.get(name)
    if instance is not None:
        return instance
    _load_builtin(name)
    with _LOCK:
        factory = _FACTORIES.get(name)
        if factory is None:
            known = ", ".join(sorted(set(_FACTORIES) | set(_BUILTIN_MODULES)))
            hint = _EXTRA_HINTS.get(name)
            detail = f"; {hint}" if hint else f"; known backends: {known}"
            raise ConfigurationError(f"support backend {name!r} is not available{detail}")
        instance = _INSTANCES.get(name)
        if instance is None:
            instance = factory()
            _INSTANCES[name] = instance
    return instance


def check_inputs(claim: str, material_text: str) -> None:
    """Raise ``InputError`` unless claim and material are non-empty strings."""
    for label, value in (("claim", claim), ("material text", material_text)):
        if not isinstance(value, str):
            raise InputError(f"{label} must be a string, got {type(value).__name__}")
        if not value.strip():
            raise InputError(f"{label} is empty")


def support(
    claim: str,
    material_text: str,
    *,
    backend: str | SupportBackend = "lexical",
    corpus: Sequence[str] | None = None,
) -> Support:
    """How well ``material_text`` supports ``claim``, scored by ``backend``."""
    check_inputs(claim, material_text)
    return get_backend(backend)(claim, material_text, corpus=corpus)


_K = TypeVar("_K", bound=Hashable)
_V = TypeVar("_V")


class LruCache(Generic[_K, _V]):
    """A thread-safe cache of a backend's results keeping the ``size`` most recently used
    (none when ``size`` is 0)."""

    def __init__(self, size: int) -> None:
        self.size = max(0, int(size))
        self._items: OrderedDict[_K, _V] = OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, key: object) -> bool:
        """Whether a value is kept for ``key`` (without counting as a use)."""
        with self._lock:
            return key in self._items

    def get(self, key: _K) -> _V | None:
        """The value kept for ``key`` (now the most recently used), or None."""
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def clear(self) -> None:
        """Forget every value."""
        with self._lock:
            self._items.clear()

    def put(self, key: _K, value: _V) -> _V:
        """Keep ``value`` for ``key``, dropping the least recently used beyond ``size``."""
        if self.size:
            with self._lock:
                self._items[key] = value
                while len(self._items) > self.size:
                    self._items.popitem(last=False)
        return value
