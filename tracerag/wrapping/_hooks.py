"""Retrieval inside a wrapped app, seen and shared within one request.

An app retrieves through retrievers (whose LangChain callbacks ``_capture`` reads) and through
vector store searches called directly inside tools, graph nodes and middleware, where no
callback fires. ``wrap()`` finds the retrievers and vector stores an app uses (``_inspect``)
and instruments their classes once, here:

- a vector store's search methods report the documents they return to the sample run that
  called them (``RunCapture.saw_documents``), so what a tool's ``similarity_search`` returned is
  a material even when the tool hands the model only text;
- with ``sampling="answer"``, a search or retriever call asked again within one request with the
  same arguments returns (a copy of) the documents of the first call instead of searching
  again, so N samples retrieve once. The retrieve stage's own call seeds it (``Shared.seed``).

Outside a wrapped app's request the instrumented methods do exactly what they did: every hook
first reads a context variable that only wrap()'s own runs set, and calls the original method
when it is unset. Calls nested inside an instrumented call (a store method calling another, a
retriever calling its store) are passed through untouched.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import inspect
import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any, Protocol

from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.vectorstores import VectorStore

#: Vector store methods that return documents (``a``-prefixed async forms included).
STORE_METHODS = (
    "similarity_search",
    "similarity_search_with_score",
    "similarity_search_with_relevance_scores",
    "similarity_search_by_vector",
    "similarity_search_with_score_by_vector",
    "max_marginal_relevance_search",
    "max_marginal_relevance_search_by_vector",
    "search",
    "get_by_ids",
)
#: The methods a retriever's ``invoke`` and ``ainvoke`` call.
RETRIEVER_METHODS = ("_get_relevant_documents", "_aget_relevant_documents")

_HOOKED = "__tracerag_hook__"
_lock = threading.Lock()


class DocumentSink(Protocol):
    """Where a sample run's store searches report what they returned."""

    def saw_documents(self, found: Sequence[tuple[Document, float | None]]) -> None: ...


def _copied(value: Any) -> Any:
    """A copy no run can change another's through: documents (and their metadata) copied."""
    if isinstance(value, Document):
        return value.model_copy(update={"metadata": copy.deepcopy(value.metadata)})
    if isinstance(value, list):
        return [_copied(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_copied(v) for v in value)
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    return copy.deepcopy(value)


class Shared:
    """One request's retrieval results, shared by its runs (``sampling="answer"``)."""

    def __init__(self, share: bool) -> None:
        self.share = share
        self._results: dict[Hashable, Any] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.calls = 0

    def lookup(self, key: Hashable | None) -> tuple[bool, Any]:
        if key is None or not self.share:
            return False, None
        with self._lock:
            if key in self._results:
                self.hits += 1
                return True, _copied(self._results[key])
        return False, None

    def remember(self, key: Hashable | None, result: Any) -> None:
        with self._lock:
            self.calls += 1
            if key is not None and self.share:
                self._results.setdefault(key, _copied(result))

    def seed(self, retriever: BaseRetriever, query: str, documents: Sequence[Document]) -> None:
        """What ``retriever.invoke(query)`` returns in this request (the retrieve stage's)."""
        if self.share:
            key = call_key(retriever, "_get_relevant_documents", (query,), {})
            with self._lock:
                self._results.setdefault(key, [_copied(d) for d in documents])


class _Scope:
    __slots__ = ("shared", "sink")

    def __init__(self, shared: Shared, sink: DocumentSink | None) -> None:
        self.shared = shared
        self.sink = sink


_SCOPE: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar(
    "tracerag_retrieval_scope", default=None
)
_INSIDE: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "tracerag_inside_retrieval", default=False
)


@contextlib.contextmanager
def scope(shared: Shared, sink: DocumentSink | None = None) -> Iterator[None]:
    """Within this block (and the tasks and threads it starts), hooks share and report."""
    token = _SCOPE.set(_Scope(shared, sink))
    try:
        yield
    finally:
        _SCOPE.reset(token)


def _base_name(name: str) -> str:
    """``asimilarity_search`` and ``_aget_relevant_documents`` share their sync form's results."""
    if name == "_aget_relevant_documents":
        return "_get_relevant_documents"
    if name.startswith("a") and name[1:] in STORE_METHODS:
        return name[1:]
    return name


class _NotShared(Exception):
    """A call argument that cannot be compared (a filter function, an array): not shared."""


def _frozen(value: Any) -> Hashable:
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), _frozen(v)) for k, v in value.items()))
    raise _NotShared(type(value).__name__)


def call_key(target: object, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Hashable:
    """The key under which a call's result is shared, or None when it cannot be compared."""
    try:
        rest = {k: v for k, v in kwargs.items() if k not in ("run_manager", "callbacks")}
        return (id(target), _base_name(name), _frozen(args), _frozen(rest))
    except (_NotShared, TypeError):  # TypeError: values under keys alike that do not compare
        return None


def _documents(result: Any) -> list[tuple[Document, float | None]]:
    """The documents (with scores, where the method gives them) of a search's result."""
    found: list[tuple[Document, float | None]] = []
    if not isinstance(result, (list, tuple)):
        return found
    for item in result:
        if isinstance(item, Document):
            found.append((item, None))
        elif (
            isinstance(item, tuple)
            and len(item) == 2
            and isinstance(item[0], Document)
            and isinstance(item[1], (int, float))
        ):
            found.append((item[0], float(item[1])))
    return found


def _enter(target: object, name: str, args: Any, kwargs: Any) -> tuple[_Scope, Hashable] | None:
    current = _SCOPE.get()
    if current is None or _INSIDE.get():
        return None
    return current, call_key(target, name, args, kwargs)


def _report(current: _Scope, result: Any, store: bool) -> None:
    if store and current.sink is not None:
        found = _documents(result)
        if found:
            current.sink.saw_documents(found)


def _hook(name: str, original: Callable[..., Any], store: bool) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def hooked_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            entered = _enter(self, name, args, kwargs)
            if entered is None:
                return await original(self, *args, **kwargs)
            current, key = entered
            hit, result = current.shared.lookup(key)
            if not hit:
                token = _INSIDE.set(True)
                try:
                    result = await original(self, *args, **kwargs)
                finally:
                    _INSIDE.reset(token)
                current.shared.remember(key, result)
            _report(current, result, store)
            return result

        setattr(hooked_async, _HOOKED, True)
        return hooked_async

    @functools.wraps(original)
    def hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        entered = _enter(self, name, args, kwargs)
        if entered is None:
            return original(self, *args, **kwargs)
        current, key = entered
        hit, result = current.shared.lookup(key)
        if not hit:
            token = _INSIDE.set(True)
            try:
                result = original(self, *args, **kwargs)
            finally:
                _INSIDE.reset(token)
            current.shared.remember(key, result)
        _report(current, result, store)
        return result

    setattr(hooked, _HOOKED, True)
    return hooked


def _instrument_class(cls: type, names: Sequence[str], store: bool) -> None:
    for name in names:
        original = getattr(cls, name, None)
        if not callable(original) or getattr(original, _HOOKED, False):
            continue
        if isinstance(inspect.getattr_static(cls, name), (staticmethod, classmethod)):
            continue
        type.__setattr__(cls, name, _hook(name, original, store))


def instrument(retrievers: Sequence[BaseRetriever], stores: Sequence[VectorStore]) -> None:
    """Instrument the classes of these retrievers and vector stores (once per class)."""
    store_names = [*STORE_METHODS, *(f"a{n}" for n in STORE_METHODS)]
    with _lock:
        for store_cls in dict.fromkeys(type(s) for s in stores):
            _instrument_class(store_cls, store_names, store=True)
        for retriever_cls in dict.fromkeys(type(r) for r in retrievers):
            _instrument_class(retriever_cls, RETRIEVER_METHODS, store=False)


def is_instrumented(cls: type, name: str) -> bool:
    return bool(getattr(getattr(cls, name, None), _HOOKED, False))


__all__ = [
    "RETRIEVER_METHODS",
    "STORE_METHODS",
    "DocumentSink",
    "Shared",
    "call_key",
    "instrument",
    "is_instrumented",
    "scope",
]
