"""Inspecting a wrapped app once: its prompt templates, chat models, retrievers and stores.

``inspect_chain`` reads the parts a chain's graph draws (LangChain's own compositions): the
prompt templates give the prompt version, the chat models the model version and temperature, the
retrievers are called once in the retrieve stage. ``retrieval_parts`` looks further, for the
retrievers and vector stores the app reaches from its graph nodes, tools and middleware (the
objects their functions close over or name as globals), so ``_hooks`` can see and share what
they return.
"""

from __future__ import annotations

import functools
import sys
import threading
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from langchain_core.language_models import BaseLanguageModel
from langchain_core.prompts import BasePromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnableLambda, RunnableParallel, RunnableSequence
from langchain_core.runnables.base import RunnableBindingBase, RunnableEachBase
from langchain_core.runnables.configurable import DynamicRunnable
from langchain_core.runnables.passthrough import RunnableAssign
from langchain_core.vectorstores import VectorStore

from tracerag._llm import model_name
from tracerag.prompts import fingerprint
from tracerag.wrapping._capture import prompt_text


@dataclass
class ChainInfo:
    """What inspecting a chain found: prompt texts, models, retrievers."""

    prompt_texts: list[str] = field(default_factory=list)
    models: list[BaseLanguageModel[Any]] = field(default_factory=list)
    retrievers: list[BaseRetriever] = field(default_factory=list)
    #: retrievers and vector stores reached from anywhere in the app (``retrieval_parts``)
    reached_retrievers: list[BaseRetriever] = field(default_factory=list)
    stores: list[VectorStore] = field(default_factory=list)

    @property
    def prompt_version(self) -> str | None:
        return fingerprint(*self.prompt_texts) if self.prompt_texts else None

    @property
    def model_version(self) -> str | None:
        names = [n for n in (model_name(m) for m in self.models) if n]
        return "+".join(dict.fromkeys(names)) or None

    @property
    def temperature(self) -> float | None:
        for m in self.models:
            value = getattr(m, "temperature", None)
            if isinstance(value, (int, float)):
                return float(value)
        return None


def graph_nodes(runnable: Runnable[Any, Any]) -> Iterator[Any]:
    """The runnables ``runnable.get_graph()`` draws as its nodes, in its order.

    Schema nodes may be left out; a runnable drawn by code other than LangChain's own
    composition (a LangGraph app, for one) gives the nodes of its ``get_graph()``.
    """
    # walking LangChain's compositions directly builds no input or output schema; for a chain
    # with a branch, get_graph() spends tens of milliseconds on those
    draw = type(runnable).get_graph
    if draw is Runnable.get_graph:
        yield runnable
    elif draw is RunnableSequence.get_graph:
        for step in runnable.steps:  # type: ignore[attr-defined]
            yield from graph_nodes(step)
    elif draw is RunnableParallel.get_graph:
        for step in runnable.steps__.values():  # type: ignore[attr-defined]
            yield from graph_nodes(step)
    elif draw is RunnableAssign.get_graph:
        yield from graph_nodes(runnable.mapper)  # type: ignore[attr-defined]
    elif draw is RunnableBindingBase.get_graph or draw is RunnableEachBase.get_graph:
        yield from graph_nodes(runnable.bound)  # type: ignore[attr-defined]
    elif draw is DynamicRunnable.get_graph:
        yield from graph_nodes(runnable.prepare()[0])  # type: ignore[attr-defined]
    elif draw is RunnableLambda.get_graph:
        deps = runnable.deps  # type: ignore[attr-defined]
        if deps:
            for dep in deps:
                yield from graph_nodes(dep)
        else:
            yield runnable
    else:
        for node in runnable.get_graph().nodes.values():
            yield node.data


def inspect_chain(chain: Runnable[Any, Any]) -> ChainInfo:
    """Find the prompts, models and retrievers inside a chain's graph."""
    info = ChainInfo()
    for data in graph_nodes(chain):
        if isinstance(data, BasePromptTemplate):
            info.prompt_texts.append(prompt_text(data))
        elif isinstance(data, BaseLanguageModel):
            info.models.append(data)
        elif isinstance(data, BaseRetriever):
            info.retrievers.append(data)
    return info


# -- the retrievers and stores an app reaches ---------------------------------------------------

#: How deep, and over how many objects, ``retrieval_parts`` looks (it runs once per wrap()).
MAX_DEPTH = 12
MAX_OBJECTS = 20_000
MAX_ITEMS = 256
# packages whose functions' globals are not followed (their closures still are): a user's
# function naming a vector store is followed, a library's module-level registries are not
_LIBRARY_PREFIXES = (
    "langchain",
    "langgraph",
    "langsmith",
    "pydantic",
    "typing",
    "asyncio",
    "concurrent",
    "functools",
    "tracerag",
    "opentelemetry",
    "openinference",
    "httpx",
    "openai",
    "anthropic",
)
_ATOMS = (str, bytes, bytearray, int, float, complex, bool, type(None), range, memoryview)
_OPAQUE = (
    types.ModuleType,
    type,
    types.CodeType,
    types.FrameType,
    types.GeneratorType,
    types.CoroutineType,
    threading.Thread,
)
_OPAQUE_NAMES = frozenset(
    {
        # what holds no part of an app's retrieval but may hold a great deal else
        "BaseLanguageModel",
        "Embeddings",
        "BaseCheckpointSaver",
        "BaseStore",
        "BaseCache",
        "BaseCallbackManager",
        "BaseCallbackHandler",
        "Logger",
        "ndarray",
    }
)


@dataclass
class _Walk:
    retrievers: list[BaseRetriever] = field(default_factory=list)
    stores: list[VectorStore] = field(default_factory=list)
    seen: set[int] = field(default_factory=set)


def retrieval_parts(app: object) -> tuple[list[BaseRetriever], list[VectorStore]]:
    """The retrievers and vector stores an app reaches, in the order they are found.

    It follows a Runnable's and any object's attributes, the items of containers, and a
    function's closure, defaults, ``functools.partial`` arguments, the class methods of the
    objects it meets (middleware built by a decorator keeps the user's function there) and,
    for functions outside the libraries, the module globals it names: a tool or node written
    as ``vector_store.similarity_search(...)`` is found through the global ``vector_store``.
    """
    walk = _Walk()
    _visit(app, 0, walk)
    return walk.retrievers, walk.stores


def _opaque(value: object) -> bool:
    if isinstance(value, (*_ATOMS, *_OPAQUE)):
        return True
    return any(cls.__name__ in _OPAQUE_NAMES for cls in type(value).__mro__)


def _library(module: str | None) -> bool:
    return not module or module.startswith(_LIBRARY_PREFIXES) or module in sys.stdlib_module_names


def _visit(value: object, depth: int, walk: _Walk) -> None:
    if depth > MAX_DEPTH or len(walk.seen) >= MAX_OBJECTS or _opaque(value):
        return
    if id(value) in walk.seen:
        return
    walk.seen.add(id(value))
    if isinstance(value, VectorStore):
        walk.stores.append(value)
        return
    if isinstance(value, BaseRetriever):
        walk.retrievers.append(value)
    for child in _children(value):
        _visit(child, depth + 1, walk)


def _children(value: object) -> Iterator[Any]:
    if isinstance(value, Mapping):
        for i, item in enumerate(value.values()):
            if i >= MAX_ITEMS:
                break
            yield item
        return
    if isinstance(value, (list, tuple, set, frozenset)):
        for i, item in enumerate(value):
            if i >= MAX_ITEMS:
                break
            yield item
        return
    if isinstance(value, functools.partial):
        yield value.func
        yield from value.args
        yield from value.keywords.values()
        return
    if isinstance(value, types.MethodType):
        yield value.__self__
        yield value.__func__
        return
    if isinstance(value, types.FunctionType):
        yield from _function_parts(value)
        return
    if isinstance(value, (staticmethod, classmethod)):
        yield value.__func__
        return
    attributes = getattr(value, "__dict__", None)
    if isinstance(attributes, dict):
        yield from list(attributes.values())[:MAX_ITEMS]
    # middleware and other objects built at run time keep their functions on the class
    for name, member in vars(type(value)).items():
        if not name.startswith("__") and isinstance(
            member, (types.FunctionType, staticmethod, classmethod)
        ):
            yield member


def _function_parts(fn: types.FunctionType) -> Iterator[Any]:
    for cell in fn.__closure__ or ():
        try:
            yield cell.cell_contents
        except ValueError:  # an empty cell
            continue
    yield from fn.__defaults__ or ()
    yield from (fn.__kwdefaults__ or {}).values()
    wrapped = getattr(fn, "__wrapped__", None)
    if wrapped is not None:
        yield wrapped
    if _library(getattr(fn, "__module__", None)):
        return
    names: set[str] = set()
    codes = [fn.__code__]
    while codes:
        code = codes.pop()
        names.update(code.co_names)
        codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    module_globals = fn.__globals__
    for name in sorted(names):
        if name in module_globals:
            yield module_globals[name]


__all__ = [
    "MAX_DEPTH",
    "MAX_OBJECTS",
    "ChainInfo",
    "graph_nodes",
    "inspect_chain",
    "retrieval_parts",
]
