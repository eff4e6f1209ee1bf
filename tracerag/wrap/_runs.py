"""The sample runs of a wrapped app: its own run, and N-1 more answers.

Run 0 is always the app's own run, with the caller's config and callbacks: on the caller's
thread for a graph with a checkpointer (so a conversation kept there moves on exactly as it
would without tracerag). The caller's callbacks see this run only; the other runs carry
tracerag's own handler alone.

``sampling="answer"`` (the default) samples the answer, not the whole app:

- a LangGraph graph (``create_agent``, ``create_react_agent``, a ``StateGraph``) runs once, to
  its end; the checkpoint before the step that wrote its answer is found in the thread's history
  (the last checkpoint whose state does not yet hold the final answer), and each other sample is
  a fork: that checkpoint copied to a thread of its own and the graph resumed from it
  (``ainvoke(None, config)``), so retrieval, tool calls and every node before the answering step
  run once. A graph without a checkpointer runs on a copy given an in-memory one (the app is not
  changed). When no such checkpoint exists (the run failed, or its input already held the
  answer) the other samples are whole runs, as with ``sampling="app"``;
- a chain runs N times concurrently, its retrieval shared within the request (``_hooks``): the
  retrieve stage's documents, and any search repeated with the same arguments, are returned
  again instead of searched again.

``sampling="app"`` runs the whole app N times, for apps whose retrieval itself varies: for a
checkpointed graph, runs 1…N-1 go on forks of the caller's thread as it was before the request.

Nodes marked *run once* (``wrap(..., run_once=["notify"])`` or a node added with
``metadata={"tracerag_run_once": True}``) run in run 0 only: the other runs stop before them
(LangGraph ``interrupt_before``). Every thread tracerag made is deleted afterwards.

langgraph is not a dependency of tracerag: graphs are recognised by what they have
(``builder.nodes``, ``checkpointer``), and langgraph is imported only for a graph that needs an
in-memory checkpointer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Literal

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.runnables import Runnable, RunnableConfig

from tracerag.errors import ConfigurationError

RUN_ONCE_METADATA = "tracerag_run_once"
SAMPLE_METADATA = "tracerag_sample"
REQUEST_METADATA = "tracerag_request_id"

#: How a wrapped app's N samples are drawn (see the module docstring).
Sampling = Literal["answer", "app"]
SAMPLING_MODES: tuple[Sampling, ...] = ("answer", "app")
#: What one sample run was: the app's own run, a fork from its answering step, or a whole run
#: that only tracerag sees.
RunKind = Literal["app", "fork", "private"]

#: Reads the answer from an app's output or a graph state; None when it holds none.
AnswerOf = Callable[[Any], "str | None"]


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


def private(config: RunnableConfig) -> RunnableConfig:
    """The config without the caller's callbacks: a run only tracerag's handler sees."""
    new: RunnableConfig = dict(config)  # type: ignore[assignment]
    new.pop("callbacks", None)
    return new


class Sampler:
    """How one wrapped app's samples are run; ``start`` gives one request's runs."""

    def __init__(
        self,
        chain: Runnable[Any, Any],
        run_once: Sequence[str] = (),
        sampling: Sampling = "answer",
        answer_of: AnswerOf | None = None,
    ) -> None:
        if sampling not in SAMPLING_MODES:
            raise ConfigurationError(
                f"sampling must be one of {list(SAMPLING_MODES)}, got {sampling!r}"
            )
        self.chain = chain
        self.sampling: Sampling = sampling
        self.answer_of = answer_of
        self.is_graph = graph_nodes(chain) is not None
        self.run_once = run_once_nodes(chain, run_once)
        self.saver = checkpointer_of(chain)
        self._private_copy: Runnable[Any, Any] | None = None

    @property
    def forks(self) -> bool:
        """Whether the other samples fork the app's own run at its answering step."""
        return self.is_graph and self.sampling == "answer"

    def own_graph(self) -> Runnable[Any, Any]:
        """The graph runs go on: the app's own, or a copy with an in-memory checkpointer
        when it has none and the runs need checkpoints (forks, or run-once nodes)."""
        if self.saver is not None or not (self.forks or self.run_once):
            return self.chain
        if self._private_copy is None:
            from langgraph.checkpoint.memory import InMemorySaver  # only for a graph

            self._private_copy = self.chain.copy(  # type: ignore[attr-defined]
                update={"checkpointer": InMemorySaver()}
            )
        return self._private_copy

    async def start(self, config: RunnableConfig | None, request_id: str, n: int) -> RequestRuns:
        """One request's runs (the caller's thread read where samples start from it)."""
        runs = RequestRuns(self, dict(config or {}), request_id, n)  # type: ignore[arg-type]
        await runs.prepare()
        return runs


class RequestRuns:
    """One request's N runs: the app's own (run 0), and forks or whole private runs."""

    def __init__(self, sampler: Sampler, config: RunnableConfig, request_id: str, n: int) -> None:
        self.sampler = sampler
        self.config = config
        self.request_id = request_id
        self.n = n
        self.configurable: dict[str, Any] = dict(config.get("configurable") or {})
        self.caller_thread = self.configurable.get("thread_id")
        self.graph = sampler.own_graph() if sampler.is_graph else sampler.chain
        self.threads: list[str] = []  # every thread tracerag made, deleted by cleanup()
        self._before: Any = None  # the caller's thread as it was before the request
        self._fork_point: Any = None
        self._forked: asyncio.Future[Any] | None = None
        self.kinds: list[RunKind] = ["app"]
        self.kinds.extend("private" for _ in range(n - 1))
        self._attempts = [0] * n
        if sampler.saver is not None and self.caller_thread is None:
            raise ConfigurationError(
                "the graph has a checkpointer, so it needs a thread: call the wrapped app with "
                "config={'configurable': {'thread_id': ...}} as you would call the graph"
            )

    @property
    def kept(self) -> int | None:
        """The run whose answer the app keeps, when it keeps one: the caller's checkpointed
        thread holds run 0's answer, and run-once nodes acted on it."""
        if self.sampler.saver is not None or self.sampler.run_once:
            return 0
        return None

    @property
    def _prefix(self) -> str:
        return f"{self.caller_thread or 'tracerag'}/{self.request_id}"

    async def prepare(self) -> None:
        sampler = self.sampler
        if sampler.forks and self.n > 1:
            self._forked = asyncio.get_running_loop().create_future()
        if sampler.is_graph and sampler.saver is not None and self.n > 1:
            # whole private runs start from the conversation as it was before this request
            self._before = await sampler.saver.aget_tuple({"configurable": self.configurable})

    def _run_config(self, index: int) -> RunnableConfig:
        metadata = {
            **(self.config.get("metadata") or {}),
            SAMPLE_METADATA: index,
            REQUEST_METADATA: self.request_id,
        }
        run_config: RunnableConfig = {**self.config, "metadata": metadata}
        return run_config if index == 0 else private(run_config)

    def _thread_name(self, index: int) -> str:
        """A thread of its own for each attempt of a run (a retry never resumes a failed one)."""
        self._attempts[index] += 1
        name = "app" if index == 0 else f"sample-{index}"
        attempt = self._attempts[index]
        return f"{self._prefix}/{name}" + (f"-{attempt}" if attempt > 1 else "")

    def _thread(self, run_config: RunnableConfig, thread: str) -> None:
        configurable = {**self.configurable, "thread_id": thread, "checkpoint_ns": ""}
        configurable.pop("checkpoint_id", None)
        run_config["configurable"] = configurable
        self.threads.append(thread)

    # -- run 0 ---------------------------------------------------------------------------------
    async def _app_run(self, value: Any, handler: BaseCallbackHandler) -> Any:
        run_config = self._run_config(0)
        if self.sampler.is_graph and self.graph is not self.sampler.chain:
            self._thread(run_config, self._thread_name(0))  # the private copy's own thread
        output = await self.graph.ainvoke(value, config=with_callback(run_config, handler))
        if self._forked is not None and not self._forked.done():
            self._fork_point = await self._find_fork_point(run_config, output)
        return output

    def app_run_done(self) -> None:
        """Run 0 is over (answered or failed for good): the forks may start, or run whole."""
        if self._forked is not None and not self._forked.done():
            self._forked.set_result(self._fork_point)

    async def _find_fork_point(self, run_config: RunnableConfig, output: Any) -> Any:
        """The checkpoint before the step that wrote run 0's answer, or None."""
        answer_of = self.sampler.answer_of
        final = answer_of(output) if answer_of is not None else None
        if final is None:
            return None
        thread = {"configurable": dict(run_config.get("configurable") or {})}
        thread["configurable"].pop("checkpoint_id", None)
        thread["configurable"]["checkpoint_ns"] = ""
        after = None
        async for snapshot in self.graph.aget_state_history(thread):  # type: ignore[attr-defined]
            if answer_of(snapshot.values) != final:  # type: ignore[misc]
                return snapshot if after is not None else None
            if (snapshot.metadata or {}).get("source") == "input":
                return None  # the input already held this answer: no step of the run wrote it
            after = snapshot
        return None

    # -- runs 1…N-1 ----------------------------------------------------------------------------
    async def fork_ready(self) -> None:
        """Wait until run 0 has shown where the others fork (no wait without forks)."""
        if self._forked is not None:
            await asyncio.shield(self._forked)

    async def _fork(self, index: int, point: Any, handler: BaseCallbackHandler) -> Any:
        saver = checkpointer_of(self.graph)
        source = await saver.aget_tuple(point.config)
        run_config = self._run_config(index)
        self._thread(run_config, self._thread_name(index))
        target = {"configurable": {"thread_id": run_config["configurable"]["thread_id"]}}
        target["configurable"]["checkpoint_ns"] = ""
        checkpoint = source.checkpoint
        await saver.aput(target, checkpoint, source.metadata, dict(checkpoint["channel_versions"]))
        return await self.graph.ainvoke(
            None, config=with_callback(run_config, handler), **self._stop_kwargs()
        )

    def _stop_kwargs(self) -> dict[str, Any]:
        run_once = self.sampler.run_once
        return {"interrupt_before": list(run_once)} if run_once else {}

    async def _private_run(self, index: int, value: Any, handler: BaseCallbackHandler) -> Any:
        run_config = self._run_config(index)
        if not self.sampler.is_graph:
            return await self.graph.ainvoke(value, config=with_callback(run_config, handler))
        if checkpointer_of(self.graph) is not None:
            self._thread(run_config, self._thread_name(index))
            if self._before is not None:  # the conversation so far, as the caller's run saw it
                target = {"configurable": {**run_config["configurable"]}}
                checkpoint = self._before.checkpoint
                await checkpointer_of(self.graph).aput(
                    target,
                    checkpoint,
                    self._before.metadata,
                    dict(checkpoint["channel_versions"]),
                )
        return await self.graph.ainvoke(
            value, config=with_callback(run_config, handler), **self._stop_kwargs()
        )

    async def run(self, index: int, value: Any, handler: BaseCallbackHandler) -> Any:
        """Run sample ``index`` once with ``handler`` attached; its kind is in ``kinds``."""
        if index == 0:
            return await self._app_run(value, handler)
        point = self._forked.result() if self._forked is not None else None
        if point is not None:
            self.kinds[index] = "fork"
            return await self._fork(index, point, handler)
        self.kinds[index] = "private"
        return await self._private_run(index, value, handler)

    async def cleanup(self) -> None:
        """Delete the threads tracerag made (the caller's thread is kept)."""
        saver = checkpointer_of(self.graph)
        if saver is None:
            return
        for thread in dict.fromkeys(self.threads):
            with contextlib.suppress(NotImplementedError):
                await saver.adelete_thread(thread)


__all__ = [
    "REQUEST_METADATA",
    "RUN_ONCE_METADATA",
    "SAMPLE_METADATA",
    "SAMPLING_MODES",
    "AnswerOf",
    "RequestRuns",
    "RunKind",
    "Sampler",
    "Sampling",
    "checkpointer_of",
    "graph_nodes",
    "private",
    "run_once_nodes",
    "with_callback",
]
