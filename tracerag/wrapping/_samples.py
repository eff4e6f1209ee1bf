"""The sample runs of a wrapped app: its own run, and N-1 more answers.

Run 0 is always the app's own run, with the request's config. For a graph with a checkpointer
of its own it runs on a private thread seeded with the caller's thread as it was (its pending
writes too, so a ``Command(resume=...)`` resumes there); the turn is copied to the caller's
thread only once it is routed (``_commit``: a withheld answer never reaches the thread).
Every run is a child of the request's run, without the caller's own handlers
(``tracerag.runner``: the caller hears the request, its stages and the released answer, never
a sample).

``sampling="answer"`` (the default) samples the answer, not the whole app:

- a LangGraph graph (``create_agent``, ``create_react_agent``, a ``StateGraph``) runs once, to
  its end, and each other sample is a fork: a checkpoint of that run copied to a thread of its
  own and the graph resumed from it (``ainvoke(None, config)``), so retrieval, tool calls and
  every node before the answering step run once. The forks start as soon as the run's model is
  called for what is likely its answer (a top-level model call with no tools bound, or one given
  tool results), from the checkpoint before that step, so they answer while the app's own run
  does. If that call asks for tools instead, those forks are cancelled and the next likely
  answering call is awaited. When the run is over, the checkpoint before the step that actually
  wrote its answer is found in the thread's history (the last one whose state does not yet hold
  the final answer): forks from a checkpoint that already held the answer are discarded, and
  forks not yet started start there. A fork from an earlier checkpoint of the run is a sound
  sample too: the app continued from a state it really reached. A graph without a checkpointer
  runs on a copy given an in-memory one (the app is not changed). When no such checkpoint exists
  (the run failed, or its input already held the answer) the other samples are whole runs, as
  with ``sampling="app"``;
- a chain written as a sequence with one model step (``retriever | prompt | model | parser``)
  runs once; when its model is called, each other sample runs the model step and what follows it
  (``model | parser``) on exactly the input the model was given, so the samples differ only in
  the model's draw. Any other chain runs N times concurrently, its retrieval shared within the
  request (``_hooks``): the retrieve stage's documents, and any search repeated with the same
  arguments, are returned again instead of searched again.

``sampling="app"`` runs the whole app N times, for apps whose retrieval itself varies: for a
checkpointed graph, runs 1…N-1 go on forks of the caller's thread as it was before the request.

Nodes marked *run once* (``wrap(..., run_once=["notify"])`` or a node added with
``metadata={"tracerag_run_once": True}``) run in run 0 only: the other runs stop before them
(LangGraph ``interrupt_before``). Run 0 runs those it reaches before its answer; it stops before
those after it, which run on the kept turn once it is routed (``_commit``). A run 0 that pauses
at an interrupt the app raises ends the request's sampling: the other samples are not drawn.
Every thread tracerag made is deleted afterwards.

langgraph is not a dependency of tracerag: graphs are recognised by what they have
(``builder.nodes``, ``checkpointer``), and langgraph is imported only for a graph that needs an
in-memory checkpointer.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models import BaseLanguageModel
from langchain_core.messages import ToolMessage
from langchain_core.runnables import Runnable, RunnableConfig, RunnableSequence
from langchain_core.runnables.base import RunnableBindingBase

from tracerag.errors import ConfigurationError
from tracerag.stages._sample import NotDrawn
from tracerag.wrapping._commit import (
    ThreadTurn,
    history_runnable,
    message_ids,
    read_only_history,
)

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
#: One try of a sample run (``Attempt``) and how to run it, retries included (``Attempts``).
Attempt = Callable[[], Awaitable[Any]]
Attempts = Callable[[Attempt], Awaitable[Any]]
#: How long a fork waits, at most, for the checkpoint it starts from to be written.
CHECKPOINT_WAIT_S = 0.5
_CHECKPOINT_POLL_S = 0.002


def _interrupted(output: Any) -> bool:
    return isinstance(output, dict) and bool(output.get("__interrupt__"))


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


def _parameters(fn: Callable[..., Any]) -> tuple[str, ...]:
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return ()


def _is_model(step: Runnable[Any, Any]) -> bool:
    while isinstance(step, RunnableBindingBase):
        step = step.bound
    return isinstance(step, BaseLanguageModel)


def answering_steps(chain: Runnable[Any, Any]) -> Runnable[Any, Any] | None:
    """The model step of a sequence and the steps after it, when the sequence has exactly one
    model step of its own (not its first): what a sample runs on the model's input."""
    if not isinstance(chain, RunnableSequence):
        return None
    steps = chain.steps
    found = [i for i, step in enumerate(steps) if _is_model(step)]
    if len(found) != 1 or found[0] == 0:
        return None
    after = steps[found[0] :]
    return after[0] if len(after) == 1 else RunnableSequence(*after)


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
        # a RunnableWithMessageHistory's runs read a copy of its history; the turn is added to
        # the real one once it is routed (``_commit``)
        self.history_app = history_runnable(chain)
        if self.history_app is not None:
            chain = read_only_history(self.history_app)
        self.chain = chain
        self.sampling: Sampling = sampling
        self.answer_of = answer_of
        self.is_graph = graph_nodes(chain) is not None
        self.run_once = run_once_nodes(chain, run_once)
        self.saver = checkpointer_of(chain)
        self._private_copy: Runnable[Any, Any] | None = None
        self.exit_durability = self.is_graph and "durability" in _parameters(chain.ainvoke)
        # a chain's model step and what follows it, when the other samples can run just that
        self.answering = (
            answering_steps(chain) if sampling == "answer" and not self.is_graph else None
        )

    @property
    def forks(self) -> bool:
        """Whether the other samples fork the app's own run at its answering step."""
        return self.sampling == "answer" and (self.is_graph or self.answering is not None)

    def own_graph(self) -> Runnable[Any, Any]:
        """The graph runs go on: the app's own, or a copy with an in-memory checkpointer
        when it has none and the runs need checkpoints (forks, or run-once nodes)."""
        if self.saver is not None or not (self.is_graph and (self.forks or self.run_once)):
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


@dataclass(eq=False)
class _ForkPoint:
    """Where the other samples resume the app's own run — a graph's checkpoint, or the input
    a chain's model step was given — and their fork runs."""

    config: RunnableConfig | None = None
    model_input: Any = None
    speculative: bool = False
    model_run: UUID | None = None
    abandoned: bool = False
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)


class _AnsweringWatch(BaseCallbackHandler):
    """Watches the app's own run for the model call that is likely its answer."""

    run_inline = True  # it only hands events to the event loop: no worker thread per event

    def __init__(self, runs: RequestRuns, loop: asyncio.AbstractEventLoop) -> None:
        self.runs = runs
        self.loop = loop

    def on_chat_model_start(
        self, serialized: dict[str, Any], messages: list[list[Any]], *, run_id: UUID, **kwargs: Any
    ) -> None:
        metadata = kwargs.get("metadata") or {}
        step = metadata.get("langgraph_step")
        if not isinstance(step, int) or "|" in str(metadata.get("langgraph_checkpoint_ns", "")):
            return  # not a node of the graph itself (a subgraph's, or no graph at all)
        tools = (kwargs.get("invocation_params") or {}).get("tools")
        last = messages[0][-1] if messages and messages[0] else None
        if not tools or isinstance(last, ToolMessage):
            self.loop.call_soon_threadsafe(self.runs.likely_answering, run_id, step)

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        generations = getattr(response, "generations", None) or []
        first = generations[0][0] if generations and generations[0] else None
        if getattr(getattr(first, "message", None), "tool_calls", None):
            self.loop.call_soon_threadsafe(self.runs.not_answering, run_id)


class _ModelInputWatch(BaseCallbackHandler):
    """Watches the app's own run of a chain for the input its model step is given."""

    run_inline = True  # it only hands events to the event loop: no worker thread per event

    def __init__(self, runs: RequestRuns, loop: asyncio.AbstractEventLoop) -> None:
        self.runs = runs
        self.loop = loop
        self.root: UUID | None = None

    def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        if self.root is None:
            self.root = run_id  # the first run this handler hears of is the chain itself

    def on_chat_model_start(
        self, serialized: Any, messages: list[list[Any]], *, run_id: UUID, **kwargs: Any
    ) -> None:
        if kwargs.get("parent_run_id") == self.root and messages:
            self.loop.call_soon_threadsafe(self.runs.model_input, list(messages[0]))

    def on_llm_start(
        self, serialized: Any, prompts: list[str], *, run_id: UUID, **kwargs: Any
    ) -> None:
        if kwargs.get("parent_run_id") == self.root and prompts:
            self.loop.call_soon_threadsafe(self.runs.model_input, prompts[0])


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
        self.kinds: list[RunKind] = ["app"]
        self.kinds.extend("private" for _ in range(n - 1))
        self._attempts = [0] * n
        self._before: Any = None  # the caller's thread as it was before the request
        self._forking = sampler.forks and n > 1
        # the app's own checkpointer: its run goes on a private thread, committed to the
        # caller's once the request is routed (``_commit``)
        self.private_app = sampler.is_graph and sampler.saver is not None
        self.app_thread: str | None = None
        self.interrupted = False  # the app's own run paused at an interrupt it raised
        self.deferred = False  # ... or stopped before run-once nodes after its answer
        self._point: _ForkPoint | None = None  # where the forks start now
        self._done = False  # the app's own run is over
        self._closing = False  # ... and its fork points are being settled: no new one
        self._changed = asyncio.Event()
        self._app_thread: dict[str, Any] | None = None
        self._not_answering: set[UUID] = set()
        self._pending: set[asyncio.Task[Any]] = set()
        if sampler.saver is not None and self.caller_thread is None:
            raise ConfigurationError(
                "the graph has a checkpointer, so it needs a thread: call the wrapped app with "
                "config={'configurable': {'thread_id': ...}} as you would call the graph"
            )

    @property
    def kept(self) -> int | None:
        """The run whose answer the app keeps, when it keeps one: the caller's checkpointed
        thread is given run 0's turn, and run-once nodes act on it."""
        if self.sampler.saver is not None or self.sampler.run_once:
            return 0
        return None

    @property
    def _prefix(self) -> str:
        return f"{self.caller_thread or 'tracerag'}/{self.request_id}"

    async def prepare(self) -> None:
        sampler = self.sampler
        if self.private_app:
            # every run starts from the conversation as it was before this request
            self._before = await sampler.saver.aget_tuple({"configurable": self.configurable})

    def _run_config(self, index: int) -> RunnableConfig:
        metadata = {
            **(self.config.get("metadata") or {}),
            SAMPLE_METADATA: index,
            REQUEST_METADATA: self.request_id,
        }
        run_config: RunnableConfig = {**self.config, "metadata": metadata}
        return run_config

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

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # -- run 0 ---------------------------------------------------------------------------------
    async def _app_run(self, value: Any, handler: BaseCallbackHandler) -> Any:
        run_config = self._run_config(0)
        if self.private_app:  # a thread of its own, holding the conversation so far
            self.app_thread = self._thread_name(0)
            self._thread(run_config, self.app_thread)
            await self._seed(run_config)
        elif self.sampler.is_graph and self.graph is not self.sampler.chain:
            self.app_thread = self._thread_name(0)  # the private copy's own thread
            self._thread(run_config, self.app_thread)
        config = with_callback(run_config, handler)
        loop = asyncio.get_running_loop()
        if self._forking and not self._done and not self.sampler.is_graph:
            config = with_callback(config, _ModelInputWatch(self, loop))
        elif self._forking and not self._done:
            thread = dict(run_config.get("configurable") or {})
            thread.pop("checkpoint_id", None)
            thread["checkpoint_ns"] = ""
            self._app_thread = thread
            config = with_callback(config, _AnsweringWatch(self, loop))
            if (self.graph is not self.sampler.chain or self.private_app) and (
                self.sampler.exit_durability
            ):
                # tracerag's own thread: each step's checkpoint is written before the next step
                # runs, so a fork finds it at once
                return await self._settled(value, config, durability="sync")
        output = await self._own_run(value, config)
        self.interrupted = _interrupted(output)
        if self._forking and not self._done and self.sampler.is_graph:
            await self._settle(output)
        return output

    async def _settled(self, value: Any, config: RunnableConfig, **kwargs: Any) -> Any:
        output = await self._own_run(value, config, **kwargs)
        self.interrupted = _interrupted(output)
        if not self._done:
            await self._settle(output)
        return output

    async def _own_run(self, value: Any, config: RunnableConfig, **kwargs: Any) -> Any:
        """The app's own run, through the run-once nodes before its answer; it stops before
        those after it, which run once the turn is verified and kept (``_commit``), so they
        act on the answer released or on the withheld message, never on a withheld answer."""
        once = list(self.sampler.run_once)
        answer_of = self.sampler.answer_of
        if not once or answer_of is None or self.app_thread is None:
            return await self.graph.ainvoke(value, config=config, **kwargs)
        thread: RunnableConfig = {"configurable": dict(config.get("configurable") or {})}
        output = await self.graph.ainvoke(value, config=config, interrupt_before=once, **kwargs)
        while True:
            snapshot = await self.graph.aget_state(thread)  # type: ignore[attr-defined]
            if not any(node in once for node in snapshot.next):
                return output
            if answer_of(snapshot.values):  # answered: the rest waits for the verdict
                self.deferred = True
                return output
            output = await self.graph.ainvoke(None, config=config, interrupt_before=once, **kwargs)

    async def _settle(self, output: Any) -> None:
        """The app's own run answered: keep the forks that are sound, place the others."""
        self._closing = True  # a speculation still finding its checkpoint gives up
        if self.interrupted:  # the turn waits for a person: no fork has an answer to give
            if self._point is not None:
                self._abandon(self._point)
            self._done = True
            self._notify()
            return
        answer_of = self.sampler.answer_of
        final = answer_of(output) if answer_of is not None else None
        current = self._point
        if current is not None and current.config is not None and final is not None:
            held = await checkpointer_of(self.graph).aget_tuple(current.config)
            values = held.checkpoint.get("channel_values", {}) if held is not None else {}
            if answer_of is not None and answer_of(values) == final:
                self._abandon(current)  # it already held the answer: its forks prove nothing
        if self._point is None:
            point = await self._find_fork_point(final)
            if point is not None:
                self._point = _ForkPoint(config=point.config)
        self._done = True
        self._notify()

    def app_run_done(self) -> None:
        """Run 0 is over (answered or failed for good): the forks may start, or run whole."""
        if self._forking and not self._done:
            self._done = True
            self._notify()

    async def _find_fork_point(self, final: str | None) -> Any:
        """The checkpoint before the step that wrote run 0's answer, or None."""
        answer_of = self.sampler.answer_of
        if final is None or answer_of is None or self._app_thread is None:
            return None
        after = None
        thread = {"configurable": self._app_thread}
        async for snapshot in self.graph.aget_state_history(thread):  # type: ignore[attr-defined]
            if answer_of(snapshot.values) != final:
                return snapshot if after is not None else None
            if (snapshot.metadata or {}).get("source") == "input":
                return None  # the input already held this answer: no step of the run wrote it
            after = snapshot
        return None

    # -- fork points (told by the watches, on the event loop) ---------------------------------
    def model_input(self, given: Any) -> None:
        """The chain's model step was given this: the other samples run from it."""
        if self._point is None and not self._done:
            self._point = _ForkPoint(model_input=given)
            self._notify()

    def likely_answering(self, model_run: UUID, step: int) -> None:
        if self._point is not None or self._done or self._closing:
            return
        task = asyncio.ensure_future(self._speculate(model_run, step))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def not_answering(self, model_run: UUID) -> None:
        self._not_answering.add(model_run)
        current = self._point
        if current is not None and current.model_run == model_run:
            self._abandon(current)

    async def _speculate(self, model_run: UUID, step: int) -> None:
        config = await self._checkpoint_at(step - 1)
        if config is None or self._point is not None or self._done or self._closing:
            return
        if model_run in self._not_answering:
            return  # the call asked for tools while its checkpoint was being found
        self._point = _ForkPoint(config=config, speculative=True, model_run=model_run)
        self._notify()

    async def _checkpoint_at(self, step: int) -> RunnableConfig | None:
        """The app run's checkpoint of ``step`` once it is written (writes may lag a step)."""
        saver = checkpointer_of(self.graph)
        if saver is None or self._app_thread is None:
            return None
        before = self._before.config["configurable"]["checkpoint_id"] if self._before else ""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CHECKPOINT_WAIT_S
        while loop.time() < deadline and not (self._done or self._closing):
            latest = await saver.aget_tuple({"configurable": self._app_thread})
            if latest is not None and latest.config["configurable"]["checkpoint_id"] > before:
                at = (latest.metadata or {}).get("step")
                if at == step:
                    return latest.config  # type: ignore[no-any-return]
                if isinstance(at, int) and at > step:
                    return None  # the run has moved past it
            await asyncio.sleep(_CHECKPOINT_POLL_S)
        return None

    def _abandon(self, point: _ForkPoint) -> None:
        point.abandoned = True
        for task in list(point.tasks):
            task.cancel()
        if self._point is point:
            self._point = None
        self._notify()

    async def _where_to_fork(self) -> _ForkPoint | None:
        """Where the next fork starts: a live fork point, else, once run 0 is over, none."""
        while True:
            point = self._point
            if point is not None and not point.abandoned:
                return point
            if self._done:
                return None
            await self._changed.wait()

    # -- the samples ---------------------------------------------------------------------------
    async def draw(
        self, index: int, value: Any, handler: BaseCallbackHandler, attempts: Attempts
    ) -> Any:
        """Sample ``index``: ``attempts`` runs one try of it (and retries); its kind is noted
        in ``kinds``. Forks wait untimed for their fork point and start again from a new one
        when theirs is abandoned."""
        if index == 0:
            return await attempts(lambda: self._app_run(value, handler))
        if not self._forking:
            return await attempts(lambda: self._private_run(index, value, handler))
        while True:
            point = await self._where_to_fork()
            if point is None and self.interrupted:
                raise NotDrawn(  # the turn waits for a person: no answer to sample
                    "the app's own run paused at an interrupt: this turn has no answer to sample"
                )
            if point is None:
                self.kinds[index] = "private"
                return await attempts(lambda: self._private_run(index, value, handler))
            self.kinds[index] = "fork"
            task = asyncio.ensure_future(attempts(self._forking_at(index, point, handler)))
            point.tasks.add(task)
            try:
                await asyncio.wait({task})
            finally:
                point.tasks.discard(task)
                if not task.done():  # this sample itself was cancelled
                    task.cancel()
            if task.cancelled() and point.abandoned:
                continue  # its fork point was given up: fork again from the next one
            return task.result()

    def _forking_at(self, index: int, point: _ForkPoint, handler: BaseCallbackHandler) -> Attempt:
        return lambda: self._fork(index, point, handler)

    async def _fork(self, index: int, point: _ForkPoint, handler: BaseCallbackHandler) -> Any:
        if point.config is None:  # a chain: its model step and what follows, on the same input
            answering = self.sampler.answering
            assert answering is not None
            run_config = self._run_config(index)
            return await answering.ainvoke(
                copy.deepcopy(point.model_input), config=with_callback(run_config, handler)
            )
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
        """Forks and private runs stop before run-once nodes, and write their threads (which are
        deleted afterwards) once, at the end, where LangGraph can (``durability="exit"``)."""
        kwargs: dict[str, Any] = {}
        if self.sampler.run_once:
            kwargs["interrupt_before"] = list(self.sampler.run_once)
        if self.sampler.exit_durability and checkpointer_of(self.graph) is not None:
            kwargs["durability"] = "exit"
        return kwargs

    async def _private_run(self, index: int, value: Any, handler: BaseCallbackHandler) -> Any:
        run_config = self._run_config(index)
        if not self.sampler.is_graph:
            return await self.graph.ainvoke(value, config=with_callback(run_config, handler))
        if checkpointer_of(self.graph) is not None:
            self._thread(run_config, self._thread_name(index))
            await self._seed(run_config)
        return await self.graph.ainvoke(
            value, config=with_callback(run_config, handler), **self._stop_kwargs()
        )

    async def _seed(self, run_config: RunnableConfig) -> None:
        """Put the conversation so far, as the caller's thread holds it (its pending writes
        too: an interrupted turn resumes from them), on a run's own thread."""
        before = self._before
        if before is None:
            return
        saver = checkpointer_of(self.graph)
        target = {"configurable": {**run_config["configurable"]}}
        checkpoint = before.checkpoint
        stored = await saver.aput(
            target, checkpoint, before.metadata, dict(checkpoint["channel_versions"])
        )
        by_task: dict[str, list[tuple[str, Any]]] = {}
        for task, channel, value in before.pending_writes or ():
            by_task.setdefault(task, []).append((channel, value))
        for task, writes in by_task.items():
            await saver.aput_writes(stored, writes, task)

    async def paused_in(self) -> list[str]:
        """The subgraph nodes of the graph an interrupt of run 0 was raised in (none: the
        graph's own nodes raised it, or run 0 did not pause)."""
        if not self.interrupted or self.app_thread is None:
            return []
        thread = {"configurable": {"thread_id": self.app_thread, "checkpoint_ns": ""}}
        snapshot = await self.graph.aget_state(thread, subgraphs=True)  # type: ignore[attr-defined]
        return [task.name for task in snapshot.tasks if task.state is not None and task.interrupts]

    async def turn(self, pieces: tuple[str, ...], failed: bool) -> ThreadTurn | None:
        """The app's own run as the caller's thread is to keep it (read before ``cleanup``
        deletes the private thread), or None when the app has no checkpointer of its own."""
        if not (self.private_app or self.deferred):
            return None
        saver = checkpointer_of(self.graph)
        if self.private_app:
            target = {**self.configurable}
            target.pop("checkpoint_id", None)
        else:  # tracerag's copy of the graph: the run-once nodes run on a thread of its own
            target = {"thread_id": f"{self._prefix}/run-once"}  # deleted by the turn itself
        if failed or self.app_thread is None:
            return ThreadTurn(saver, target, (), pieces, failed=True) if self.private_app else None
        seed = self._before.checkpoint["id"] if self._before is not None else None
        config = {"configurable": {"thread_id": self.app_thread, "checkpoint_ns": ""}}
        saved = [t async for t in saver.alist(config) if t.checkpoint["id"] != seed]
        saved.reverse()  # oldest first, each after its parent
        resume = self.graph if self.deferred else None
        earlier = message_ids(self._before.checkpoint["channel_values"]) if self._before else None
        return ThreadTurn(
            saver,
            target,
            saved,
            pieces,
            resume=resume,
            own=not self.private_app,
            earlier=earlier or frozenset(),
        )

    async def cleanup(self) -> None:
        """Delete the threads tracerag made (the caller's thread is kept)."""
        for task in list(self._pending):
            task.cancel()
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
    "Attempt",
    "Attempts",
    "RequestRuns",
    "RunKind",
    "Sampler",
    "Sampling",
    "answering_steps",
    "checkpointer_of",
    "graph_nodes",
    "run_once_nodes",
    "with_callback",
]
