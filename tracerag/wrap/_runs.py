"""Independent sample runs of a wrapped app, LangGraph graphs included.

Self-consistency needs N runs that cannot see each other. A chain or a graph without a
checkpointer is simply invoked N times concurrently, each with its own copy of the input. For a
graph with a checkpointer, run 0 is the app's own run, on the caller's thread (so a conversation
kept in the checkpointer moves on exactly as it would without tracerag); runs 1…N-1 each get a
fresh thread, forked from the caller's thread as it was before the request, and the forks are
deleted afterwards. A checkpointed graph called without a ``thread_id`` is refused up front, as
the graph itself would refuse it.

Nodes marked *run once* (``wrap(..., run_once=["notify"])`` or a node added with
``metadata={"tracerag_run_once": True}``) run in run 0 only: the other runs stop before them
(LangGraph ``interrupt_before``). A graph without a checkpointer is given an in-memory one for
those runs, on a copy; the user's graph is not changed.

langgraph is not a dependency of tracerag: graphs are recognised by what they have
(``builder.nodes``, ``checkpointer``), and langgraph is imported only for a graph that needs
an in-memory checkpointer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.runnables import Runnable, RunnableConfig

from tracerag.errors import ConfigurationError

RUN_ONCE_METADATA = "tracerag_run_once"
SAMPLE_METADATA = "tracerag_sample"
REQUEST_METADATA = "tracerag_request_id"


def graph_nodes(chain: Any) -> dict[str, Any] | None:
    """The nodes of a compiled LangGraph graph by name, or None for anything else."""
    nodes = getattr(getattr(chain, "builder", None), "nodes", None)
    if isinstance(nodes, dict) and hasattr(chain, "checkpointer"):
        return nodes
    return None


def checkpointer_of(chain: Any) -> Any:
    """The graph's checkpoint saver, or None (no checkpointer, or not a graph)."""
    saver = getattr(chain, "checkpointer", None)
    return saver if hasattr(saver, "aget_tuple") else None


def run_once_nodes(chain: Any, names: Sequence[str] = ()) -> tuple[str, ...]:
    """The nodes to run once per request: those named, and those marked in their metadata."""
    nodes = graph_nodes(chain)
    if nodes is None:
        if names:
            raise ConfigurationError(
                "run_once= names graph nodes, but the wrapped app is not a LangGraph graph"
            )
        return ()
    unknown = [n for n in names if n not in nodes]
    if unknown:
        raise ConfigurationError(
            f"run_once= names node(s) {unknown} that the graph does not have; "
            f"its nodes are {sorted(nodes)}"
        )
    marked = [
        name
        for name, node in nodes.items()
        if (getattr(node, "metadata", None) or {}).get(RUN_ONCE_METADATA)
    ]
    return tuple(dict.fromkeys([*names, *marked]))


def with_callback(config: RunnableConfig | None, handler: BaseCallbackHandler) -> RunnableConfig:
    """A copy of the config with one more callback handler; the caller's handlers are kept."""
    new: RunnableConfig = dict(config or {})  # type: ignore[assignment]
    callbacks = new.get("callbacks")
    if callbacks is None:
        new["callbacks"] = [handler]
    elif isinstance(callbacks, list):
        new["callbacks"] = [*callbacks, handler]
    else:  # a callback manager
        manager = callbacks.copy()
        manager.add_handler(handler, inherit=True)
        new["callbacks"] = manager
    return new


@dataclass
class SampleRun:
    """How to run one sample: the runnable, its config and extra invoke arguments."""

    index: int
    runnable: Runnable[Any, Any]
    config: RunnableConfig
    kwargs: dict[str, Any] = field(default_factory=dict)
    forked_thread: str | None = None

    async def ainvoke(self, value: Any, handler: BaseCallbackHandler) -> Any:
        """Run once with ``handler`` attached."""
        return await self.runnable.ainvoke(
            value, config=with_callback(self.config, handler), **self.kwargs
        )


class Sampler:
    """Prepares N independent runs of an app for one request, and cleans up after them."""

    def __init__(self, chain: Runnable[Any, Any], run_once: Sequence[str] = ()) -> None:
        self.chain = chain
        self.is_graph = graph_nodes(chain) is not None
        self.run_once = run_once_nodes(chain, run_once)
        self.saver = checkpointer_of(chain)
        self._stopping_copy: Runnable[Any, Any] | None = None

    def _stopping_graph(self) -> Runnable[Any, Any]:
        """The graph runs 1…N-1 use: the app's own, or a copy with an in-memory checkpointer."""
        if self.saver is not None or not self.run_once:
            return self.chain
        if self._stopping_copy is None:
            from langgraph.checkpoint.memory import InMemorySaver  # only for a graph

            self._stopping_copy = self.chain.copy(  # type: ignore[attr-defined]
                update={"checkpointer": InMemorySaver()}
            )
        return self._stopping_copy

    async def prepare(
        self, config: RunnableConfig | None, request_id: str, n: int
    ) -> list[SampleRun]:
        """N runs for a request, threads forked where the graph keeps them."""
        base: RunnableConfig = dict(config or {})  # type: ignore[assignment]
        runs: list[SampleRun] = []
        configurable = dict(base.get("configurable") or {})
        caller_thread = configurable.get("thread_id")
        if self.saver is not None and caller_thread is None:
            raise ConfigurationError(
                "the graph has a checkpointer, so it needs a thread: call the wrapped app with "
                "config={'configurable': {'thread_id': ...}} as you would call the graph"
            )
        for index in range(n):
            metadata = {
                **(base.get("metadata") or {}),
                SAMPLE_METADATA: index,
                REQUEST_METADATA: request_id,
            }
            run_config: RunnableConfig = {**base, "metadata": metadata}
            if index == 0 or not self.is_graph:
                runs.append(SampleRun(index, self.chain, run_config))
                continue
            kwargs = {"interrupt_before": list(self.run_once)} if self.run_once else {}
            runnable = self._stopping_graph()
            needs_thread = self.saver is not None or bool(self.run_once)
            thread = None
            if needs_thread:
                thread = f"{caller_thread or 'tracerag'}/{request_id}/sample-{index}"
                run_config["configurable"] = {**configurable, "thread_id": thread}
                run_config["configurable"].pop("checkpoint_id", None)
            runs.append(SampleRun(index, runnable, run_config, kwargs, forked_thread=thread))
        if self.saver is not None and caller_thread is not None:
            await self._fork(configurable, runs)
        return runs

    async def _fork(self, configurable: dict[str, Any], runs: list[SampleRun]) -> None:
        source = await self.saver.aget_tuple({"configurable": configurable})
        if source is None:
            return  # a new conversation: every fork starts empty, as the caller's thread does
        checkpoint = source.checkpoint
        for run in runs:
            if run.forked_thread is None:
                continue
            target = {
                "configurable": {
                    "thread_id": run.forked_thread,
                    "checkpoint_ns": configurable.get("checkpoint_ns", ""),
                }
            }
            await self.saver.aput(
                target, checkpoint, source.metadata, dict(checkpoint["channel_versions"])
            )

    async def cleanup(self, runs: Sequence[SampleRun]) -> None:
        """Delete the threads the forked runs wrote (the caller's thread is kept)."""
        for run in runs:
            if run.forked_thread is None:
                continue
            saver = checkpointer_of(run.runnable)
            if saver is None:
                continue
            with contextlib.suppress(NotImplementedError):
                await saver.adelete_thread(run.forked_thread)


__all__ = [
    "RUN_ONCE_METADATA",
    "SampleRun",
    "Sampler",
    "checkpointer_of",
    "graph_nodes",
    "run_once_nodes",
    "with_callback",
]
