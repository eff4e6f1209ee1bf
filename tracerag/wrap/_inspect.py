"""Inspecting a wrapped app once: its prompt templates, chat models and retrievers."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from langchain_core.language_models import BaseLanguageModel
from langchain_core.prompts import BasePromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnableLambda, RunnableParallel, RunnableSequence
from langchain_core.runnables.base import RunnableBindingBase, RunnableEachBase
from langchain_core.runnables.configurable import DynamicRunnable
from langchain_core.runnables.passthrough import RunnableAssign

from tracerag.llm import model_name
from tracerag.prompts import fingerprint
from tracerag.wrap._capture import prompt_text


@dataclass
class ChainInfo:
    """What inspecting a chain found: prompt texts, models, retrievers."""

    prompt_texts: list[str] = field(default_factory=list)
    models: list[BaseLanguageModel[Any]] = field(default_factory=list)
    retrievers: list[BaseRetriever] = field(default_factory=list)

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


__all__ = ["ChainInfo", "graph_nodes", "inspect_chain"]
