"""What tracerag costs on top of a bare LCEL chain: wall time and CPU time per request.

Same question, same retriever (the demo knowledge base in an in-memory vector store), and a chat
model that sleeps a fixed latency (default 200 ms) per call, measured side by side in one run:

- bare: the standard LCEL RAG chain, one call;
- RAGPipeline, N samples, plan="inline" (one model latency) and plan="separate" (two);
- wrap(bare chain), N samples (the chain's retrieval shared, its answer drawn N times).

Per app shape — an LCEL chain, a LangGraph StateGraph (LangChain's RAG tutorial graph) and an
agent (``create_agent`` with a ``content_and_artifact`` retrieval tool) — it reports, for one
bare run and for ``wrap()`` with ``sampling="answer"`` (the default) and ``sampling="app"`` (and,
for the agent, ``create_agent(..., middleware=[TraceragMiddleware(...)])``: the answering model
call sampled inside the agent in adaptive rounds, the tool run once, beside it at fixed N
(``min_samples=N``: all N at once); with ``speculative=False`` the extra answers are drawn only
once the first has called no tool), the model calls, tool calls and
vector store searches per request, and the wall time as a ratio to one bare run of the same shape
(``--shape-rounds`` rounds, interleaved). The calls are counted where they happen: by the model,
inside the tool, and in the store's search.

It also compares the sync entry point with the async one on the same pipeline: ``invoke()`` from
sync code, ``invoke()`` called inside a running event loop, and ``await ainvoke()``, each with
a zero-latency model; and the bridge alone (``run_sync`` on a coroutine that makes one
executor call, as a sync retriever does), which machine noise hardly moves.

Wall-time ratios are to one bare call. CPU time tracerag adds per request is measured with a
zero-latency model: process CPU per pipeline request minus the CPU of doing the same model calls
and retrieval directly with LangChain alone, both through the real OTel SDK (batch processor,
spans discarded). The chat model is defined here, not taken from tracerag, so two trees
compared call the same model and only tracerag's own work differs.

    python benchmarks/overhead.py [--latency 0.2] [--samples 5] [--rounds 10] [--cpu-only]

The CPU section shows fixed N (every sample drawn) beside adaptive sampling (the default).

Before and after, side by side in one run: ``--compare BEFORE [AFTER]`` measures two source
trees of tracerag (AFTER defaults to this one). Each tree runs in its own worker process (the
same workload, imported from that tree); the workers take turns, one at a time and in
alternating order, so machine noise falls on both alike. It prints, per tree, the median
wall ratios and the median CPU tracerag adds per request (through the OTel SDK and with a
no-op tracer), and after/before ratios:

    python benchmarks/overhead.py --compare ../before-tree [--rounds 10] [--cpu-requests 40]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from langchain_core.documents import Document
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import NoOpTracerProvider

from tracerag import RAGPipeline, TraceragMiddleware, wrap
from tracerag._sync import run_sync
from tracerag.demo.kb import DemoVectorStore, build_retriever, build_vectorstore

QUESTION = "How long is the warranty on a laptop?"
ANSWER = (
    "Under Clause 6.1, laptops and tablets are covered by an extended 24-month warranty. [warranty]"
)
PLAN = '{"material_ids": ["warranty"], "key_facts": ["24-month"]}'


class Discard(SpanExporter):
    def export(self, spans):
        return SpanExportResult.SUCCESS


TASK = re.compile(r"<task>([a-z_]+)</task>")


def respond(task: str | None) -> str:
    if task == "plan":
        return PLAN
    if task == "plan_and_answer":
        return f"PLAN: {PLAN}\nANSWER: {ANSWER}"
    return ANSWER


class SleepyChatModel(BaseChatModel):
    """The application's chat model: it sleeps ``latency`` seconds and answers by task.

    Defined here rather than taken from either tree, so both trees call the same model and
    its own cost falls out of the difference. It reports token usage, as provider models do.
    """

    latency: float = 0.0
    model_name: str = "sleepy"

    @property
    def _llm_type(self) -> str:
        return "sleepy"

    def _result(self, messages) -> ChatResult:
        prompt = "\n".join(str(m.content) for m in messages)
        match = TASK.search(prompt)
        text = respond(match.group(1) if match else None)
        inp, out = len(prompt) // 4, len(text) // 4
        message = AIMessage(
            content=text,
            response_metadata={"model_name": self.model_name},
            usage_metadata={"input_tokens": inp, "output_tokens": out, "total_tokens": inp + out},
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        if self.latency:
            time.sleep(self.latency)
        return self._result(messages)

    async def _agenerate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        if self.latency:
            await asyncio.sleep(self.latency)
        return self._result(messages)


def model(latency: float) -> SleepyChatModel:
    return SleepyChatModel(latency=latency)


def bare_chain(latency: float):
    retriever = build_retriever(k=4)
    prompt = ChatPromptTemplate.from_template("Context:\n{context}\n\nQuestion: {question}")
    return (
        {
            "context": retriever | (lambda docs: "\n\n".join(d.page_content for d in docs)),
            "question": RunnablePassthrough(),
        }
        | prompt
        | model(latency)
        | StrOutputParser()
    )


# -- app shapes: an LCEL chain, a StateGraph, an agent --------------------------------------------


class Counts:
    """Calls made per request, counted where they happen."""

    model = 0
    tool = 0
    search = 0

    @classmethod
    def reset(cls) -> None:
        cls.model = cls.tool = cls.search = 0


class CountingStore(DemoVectorStore):
    """The demo store, counting its searches (every search scores the stored vectors once)."""

    def _similarity_search_with_score_by_vector(self, *args, **kwargs):
        Counts.search += 1
        return super()._similarity_search_with_score_by_vector(*args, **kwargs)


def counting_store() -> CountingStore:
    store = build_vectorstore()
    counted = CountingStore(embedding=store.embedding)
    counted.store = store.store
    return counted


class ToolCallingSleepyModel(SleepyChatModel):
    """The sleepy model for agents: bound to tools, it first calls the first one with the
    question; given the tool's result, it answers. Every call sleeps ``latency``."""

    def bind_tools(self, tools, *, tool_choice=None, **kwargs):
        from langchain_core.utils.function_calling import convert_to_openai_tool

        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def _result(self, messages, **kwargs) -> ChatResult:
        Counts.model += 1
        tools = kwargs.get("tools")
        last = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
        if tools and not any(isinstance(m, ToolMessage) for m in messages[last:]):
            name = tools[0]["function"]["name"]
            call = {"name": name, "args": {"query": messages[last].content}, "id": "call-1"}
            message = AIMessage(content="", tool_calls=[call])
            return ChatResult(generations=[ChatGeneration(message=message)])
        return super()._result(messages)

    def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        if self.latency:
            time.sleep(self.latency)
        return self._result(messages, **kwargs)

    async def _agenerate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        if self.latency:
            await asyncio.sleep(self.latency)
        return self._result(messages, **kwargs)


def lcel_shape(latency: float):
    store = counting_store()
    retriever = store.as_retriever(search_kwargs={"k": 4})
    prompt = ChatPromptTemplate.from_template(
        "Answer from the context, citing [id].\nContext:\n{context}\n\nQuestion: {question}"
    )
    return (
        {
            "context": retriever
            | (lambda docs: "\n\n".join(f"[{d.id}] {d.page_content}" for d in docs)),
            "question": RunnablePassthrough(),
        }
        | prompt
        | ToolCallingSleepyModel(latency=latency)
        | StrOutputParser()
    )


def graph_shape(latency: float):
    from typing import TypedDict

    from langgraph.graph import START, StateGraph

    store = counting_store()
    llm = ToolCallingSleepyModel(latency=latency)
    prompt = ChatPromptTemplate.from_template(
        "Answer from the context, citing [id].\nContext:\n{context}\n\nQuestion: {question}"
    )

    class State(TypedDict):
        question: str
        context: list[Document]
        answer: str

    def retrieve(state: State):
        return {"context": store.similarity_search(state["question"], k=4)}

    def generate(state: State):
        docs = "\n\n".join(f"[{d.id}] {d.page_content}" for d in state["context"])
        messages = prompt.invoke({"question": state["question"], "context": docs})
        return {"answer": llm.invoke(messages).content}

    builder = StateGraph(State).add_sequence([retrieve, generate])
    builder.add_edge(START, "retrieve")
    return builder.compile()


def agent_shape(latency: float, middleware=()):
    from langchain.agents import create_agent
    from langchain.tools import tool

    store = counting_store()

    @tool(response_format="content_and_artifact")
    def retrieve_context(query: str):
        """Retrieve information to help answer a query."""
        Counts.tool += 1
        docs = store.similarity_search(query, k=2)
        serialized = "\n\n".join(f"Source: {d.metadata}\nContent: {d.page_content}" for d in docs)
        return serialized, docs

    return create_agent(
        ToolCallingSleepyModel(latency=latency),
        [retrieve_context],
        system_prompt="Use the tool to answer, citing each source by its id.",
        middleware=list(middleware),
    )


SHAPES = {"LCEL chain": lcel_shape, "StateGraph": graph_shape, "agent": agent_shape}


def shape_input(name: str):
    """The input the shape's own documentation gives it."""
    if name == "agent":
        return {"messages": [("user", QUESTION)]}
    return {"question": QUESTION} if name == "StateGraph" else QUESTION


async def shapes(latency: float, n: int, rounds: int, tp: TracerProvider) -> None:
    """Per shape: calls per request and wall ratio to one bare run, interleaved rounds."""
    print(
        f"\nApp shapes (model latency {latency * 1000:.0f} ms, N={n}, median of {rounds} rounds, "
        "interleaved; calls per request counted in the model, the tool and the store):"
    )
    print(
        f"  {'shape':11} {'run':20} {'model':>6} {'tool':>5} {'search':>7} {'wall':>9} "
        f"{'ratio':>7}  decision"
    )
    for name, build in SHAPES.items():
        runs = {
            "bare": build(latency),
            "wrap (answer)": wrap(build(latency), n_samples=n, tracer_provider=tp, audit=None),
            "wrap (app)": wrap(
                build(latency), n_samples=n, sampling="app", tracer_provider=tp, audit=None
            ),
        }
        if name == "agent":  # the agent's own middleware: the answering call sampled in place
            verified = TraceragMiddleware(n_samples=n, tracer_provider=tp, audit=None)
            runs["TraceragMiddleware"] = agent_shape(latency, [verified])
            fixed = TraceragMiddleware(n_samples=n, min_samples=n, tracer_provider=tp, audit=None)
            runs["middleware, fixed N"] = agent_shape(latency, [fixed])
            after = TraceragMiddleware(
                n_samples=n, tracer_provider=tp, audit=None, speculative=False
            )
            runs["middleware, after"] = agent_shape(latency, [after])
        value = shape_input(name)
        calls: dict[str, tuple[int, int, int]] = {}
        decisions: dict[str, str] = {}
        for label, runnable in runs.items():  # warm up, and count one request's calls
            Counts.reset()
            out = await runnable.ainvoke(value)
            calls[label] = (Counts.model, Counts.tool, Counts.search)
            decisions[label] = getattr(out, "decision", "")
            if isinstance(out, dict) and "tracerag" in out:  # the middleware's Response
                decisions[label] = out["tracerag"]["decision"]
        times: dict[str, list[float]] = {label: [] for label in runs}
        for _ in range(rounds):
            for label, runnable in runs.items():
                t0 = time.perf_counter()
                await runnable.ainvoke(value)
                times[label].append(time.perf_counter() - t0)
        base = statistics.median(times["bare"])
        for label in runs:
            med = statistics.median(times[label])
            model_calls, tool_calls, searches = calls[label]
            goal = (
                "  (goal <= 1.10x)"
                if (name, label)
                in {("LCEL chain", "wrap (answer)"), ("agent", "TraceragMiddleware")}
                else ""
            )
            print(
                f"  {name:11} {label:20} {model_calls:6d} {tool_calls:5d} {searches:7d} "
                f"{med * 1000:7.1f}ms {med / base:6.2f}x  {decisions[label]}{goal}"
            )


def provider() -> TracerProvider:
    p = TracerProvider()
    p.add_span_processor(BatchSpanProcessor(Discard()))
    return p


def pipelines(
    latency: float, n: int, tp: TracerProvider, audit=None, min_samples: int | None = None
) -> dict[str, object]:
    """The pipelines and wrap(chain) measured; ``min_samples``: adaptive sampling's first
    round (None: the default; ``n``: every sample drawn, fixed N)."""
    first = {} if min_samples is None else {"min_samples": min_samples}
    common = dict(
        prompt_version="bench",
        model_version="sleepy",
        n_samples=n,
        tracer_provider=tp,
        audit=audit,
        **first,
    )
    return {
        "pipeline inline": RAGPipeline(
            build_retriever(k=4), model(latency), plan="inline", **common
        ),
        "pipeline separate": RAGPipeline(
            build_retriever(k=4), model(latency), plan="separate", **common
        ),
        "wrap(chain)": wrap(
            bare_chain(latency), n_samples=n, tracer_provider=tp, audit=audit, **first
        ),
    }


async def wall(runnable, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        await runnable.ainvoke(QUESTION)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def direct_calls(n_calls: int):
    """The model calls and the one retrieval a request makes, made directly with LangChain
    alone (no tracerag code, so a change to tracerag cannot move the baseline)."""
    retriever = build_retriever(k=4)
    llm = model(0.0)
    prompt = ChatPromptTemplate.from_template(
        "<task>answer</task>\nContext:\n{context}\n\nQuestion: {question}"
    )

    async def once() -> None:
        docs = await retriever.ainvoke(QUESTION)
        context = "\n\n".join(f"[{d.id}] {d.page_content}" for d in docs)
        messages = prompt.format_messages(context=context, question=QUESTION)
        await asyncio.gather(*(llm.ainvoke(messages) for _ in range(n_calls)))

    return once


async def cpu_overhead(runnable, baseline, requests: int) -> tuple[float, float]:
    """Mean process CPU per request of the pipeline and of its baseline, interleaved.

    Each window starts from a fresh garbage-collector state, so a full collection owed to
    earlier windows' garbage does not land in whichever window happens to come next.
    """
    await runnable.ainvoke(QUESTION)
    await baseline()
    gc.collect()
    spent = [0.0, 0.0]
    for _ in range(requests):  # alternate, so machine noise falls on both alike
        t0 = time.process_time()
        await runnable.ainvoke(QUESTION)
        t1 = time.process_time()
        await baseline()
        t2 = time.process_time()
        spent[0] += t1 - t0
        spent[1] += t2 - t1
    return spent[0] / requests, spent[1] / requests


def _timed_sync(runnable, requests: int) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(requests):
        runnable.invoke(QUESTION)
    return (time.perf_counter() - t0) / requests, (time.process_time() - c0) / requests


async def _timed_async(runnable, requests: int) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(requests):
        await runnable.ainvoke(QUESTION)
    return (time.perf_counter() - t0) / requests, (time.process_time() - c0) / requests


async def _timed_sync_in_loop(runnable, requests: int) -> tuple[float, float]:
    return _timed_sync(runnable, requests)  # sync calls while this event loop runs


async def sync_vs_async(runnable, requests: int, rounds: int) -> dict[str, tuple[float, float]]:
    """Best-of-rounds wall and CPU per request of invoke() (from sync code and inside a running
    loop) and of ainvoke(), interleaved; the best round is the one machine noise touched least."""
    runs = {
        "invoke() from sync code": lambda: asyncio.to_thread(_timed_sync, runnable, requests),
        "invoke() inside a running loop": lambda: _timed_sync_in_loop(runnable, requests),
        "await ainvoke()": lambda: _timed_async(runnable, requests),
    }
    await runnable.ainvoke(QUESTION)
    seen: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            seen[name].append(await run())
    return {name: (min(w for w, _ in v), min(c for _, c in v)) for name, v in seen.items()}


async def _one_executor_call() -> int:
    return await asyncio.get_running_loop().run_in_executor(None, int)


def bridge_cost(calls: int, repeats: int = 7) -> tuple[float, float]:
    """Best-of-``repeats`` wall and CPU seconds per ``run_sync`` call."""
    best_wall = best_cpu = float("inf")
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(calls):
            run_sync(_one_executor_call)
        best_wall = min(best_wall, (time.perf_counter() - t0) / calls)
        best_cpu = min(best_cpu, (time.process_time() - c0) / calls)
    return best_wall, best_cpu


async def _bridge_cost_in_loop(calls: int) -> tuple[float, float]:
    return bridge_cost(calls)


def keep_nothing(record) -> bool:
    """A record sink that takes each record and keeps none: records are built, never stored."""
    return True


async def worker(latency: float, samples: int) -> None:
    """Serve the compare mode: one JSON command per stdin line, one JSON reply per stdout line.

    Runs the workload of whatever ``tracerag`` this process imports (its PYTHONPATH).
    """
    import tracerag

    out = sys.stdout
    sys.stdout = sys.stderr  # only replies go to the parent's pipe
    tp = provider()
    walls = {
        "bare LCEL chain (1 call)": bare_chain(latency),
        **pipelines(latency, samples, tp, audit=keep_nothing),
    }
    zero = {
        "sdk": pipelines(0.0, samples, tp, audit=keep_nothing),
        "noop": pipelines(0.0, samples, NoOpTracerProvider(), audit=keep_nothing),
    }
    calls = {"pipeline inline": samples, "pipeline separate": samples + 1}
    for runnable in walls.values():
        await runnable.ainvoke(QUESTION)

    def reply(value) -> None:
        out.write(json.dumps(value) + "\n")
        out.flush()

    reply({"ready": str(Path(tracerag.__file__).parent.parent)})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "wall":
            reply({name: await wall(runnable, 1) for name, runnable in walls.items()})
        elif cmd["op"] == "cpu":
            name = cmd["name"]
            total, direct = await cpu_overhead(
                zero[cmd["tracer"]][name], direct_calls(calls[name]), cmd["requests"]
            )
            reply({"total": total, "direct": direct})
        else:
            break
    tp.shutdown()


class Tree:
    """A worker process running the workload on one source tree."""

    def __init__(self, label: str, root: Path, latency: float, samples: int, cwd: str) -> None:
        self.label = label
        env = {**os.environ, "PYTHONPATH": str(root)}
        for name in [k for k in env if k.startswith(("TRACERAG_", "OTEL_"))]:
            del env[name]  # both trees see the same (empty) configuration
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "--worker",
                "--latency",
                str(latency),
                "--samples",
                str(samples),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=cwd,
        )
        ready = self.ask(None)["ready"]
        if Path(ready).resolve() != root.resolve():
            raise SystemExit(f"{label}: the worker imported tracerag from {ready}, not {root}")

    def ask(self, cmd):
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if cmd is not None:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"{self.label}: the worker exited (rc {self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def compare(args) -> None:
    """Before and after side by side: wall ratios and CPU tracerag adds per request."""
    here = Path(__file__).resolve().parent.parent
    roots = [Path(args.compare[0]), Path(args.compare[1]) if len(args.compare) > 1 else here]
    with tempfile.TemporaryDirectory() as cwd:
        trees = [
            Tree(label, root, args.latency, args.samples, cwd)
            for label, root in zip(("before", "after"), roots, strict=True)
        ]
        print(
            f"before: {roots[0]}\nafter:  {roots[1]}\nmodel latency {args.latency * 1000:.0f} ms, "
            f"N={args.samples}, {args.rounds} rounds; each round every measurement runs in both "
            f"trees, one tree at a time, alternating which goes first; audit records are built "
            f"and handed to a sink that keeps none\n"
        )
        walls: list[dict[str, list[float]]] = [{}, {}]
        cpu: list[dict[tuple[str, str], list[tuple[float, float]]]] = [{}, {}]
        cpu_keys = [
            (name, tracer)
            for name in ("pipeline inline", "pipeline separate")
            for tracer in ("sdk", "noop")
        ]
        for r in range(args.rounds):
            order = (0, 1) if r % 2 == 0 else (1, 0)
            for i in order:
                for name, seconds in trees[i].ask({"op": "wall"}).items():
                    walls[i].setdefault(name, []).append(seconds)
            for name, tracer in cpu_keys:
                for i in order:
                    got = trees[i].ask(
                        {"op": "cpu", "name": name, "tracer": tracer, "requests": args.cpu_requests}
                    )
                    cpu[i].setdefault((name, tracer), []).append((got["total"], got["direct"]))
        for tree in trees:
            tree.close()

    med = statistics.median
    bare = "bare LCEL chain (1 call)"
    print(f"{'wall, ratio to one bare call':34} {'before':>9} {'after':>9} {'after/before':>13}")
    for name in walls[0]:
        if name == bare:
            b, a = (med(walls[i][bare]) * 1000 for i in (0, 1))
            print(f"  {'bare call (ms)':32} {b:8.1f}  {a:8.1f}  {a / b:12.2f}x")
            continue
        b, a = (med(walls[i][name]) / med(walls[i][bare]) for i in (0, 1))
        print(f"  {name:32} {b:8.2f}x {a:8.2f}x {a / b:12.2f}x")
    print(
        f"\nCPU tracerag adds per request, ms (zero-latency model, median over {args.rounds} "
        f"rounds of the mean of {args.cpu_requests} requests; request CPU minus the same model "
        f"calls and retrieval made directly)"
    )
    print(
        f"  {'':32} {'before':>9} {'after':>9} {'after/before':>13}   request CPU before/after"
        "   direct before/after"
    )
    for key in cpu_keys:
        added = [med(t - d for t, d in cpu[i][key]) * 1000 for i in (0, 1)]
        total = [med(t for t, _ in cpu[i][key]) * 1000 for i in (0, 1)]
        direct = [med(d for _, d in cpu[i][key]) * 1000 for i in (0, 1)]
        label = f"{key[0]} ({'OTel SDK' if key[1] == 'sdk' else 'no-op tracer'})"
        print(
            f"  {label:32} {added[0]:9.2f} {added[1]:9.2f} {added[1] / added[0]:12.2f}x"
            f"   {total[0]:6.2f} / {total[1]:6.2f}          {direct[0]:6.2f} / {direct[1]:6.2f}"
        )


async def cpu_section(samples: int, requests: int, tp: TracerProvider) -> dict[str, object]:
    """CPU tracerag adds per request, fixed N against adaptive sampling, side by side."""
    print(
        f"\nCPU time per request outside the model (zero-latency model, {requests} requests "
        f"each); fixed N={samples} (every sample drawn) beside adaptive sampling (the default: "
        "two first, more only while the route could change; the model's answers agree, so two):"
    )
    zero = pipelines(0.0, samples, tp)
    modes = {
        f"fixed N={samples}": (pipelines(0.0, samples, tp, min_samples=samples), samples),
        "adaptive": (zero, min(2, samples)),
    }
    untraced = {
        f"fixed N={samples}": pipelines(0.0, samples, NoOpTracerProvider(), min_samples=samples),
        "adaptive": pipelines(0.0, samples, NoOpTracerProvider()),
    }
    for name, extra in (("pipeline inline", 0), ("pipeline separate", 1)):
        for mode, (runs, drawn) in modes.items():
            for label, chosen in (("", runs), (" (spans off)", untraced[mode])):
                calls = drawn + extra
                total, direct = await cpu_overhead(chosen[name], direct_calls(calls), requests)
                print(
                    f"  {name + label:30} {mode:12} total {total * 1000:6.2f} ms, its {calls} "
                    f"model calls + retrieval alone {direct * 1000:6.2f} ms, tracerag adds "
                    f"{(total - direct) * 1000:6.2f} ms"
                )
    print(
        "  (goal: < 2 ms added; 'spans off' runs the same stages with a no-op tracer, so the "
        "difference is the OpenTelemetry SDK's share)"
    )
    return zero


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--samples", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--cpu-requests", type=int, default=200)
    ap.add_argument("--sync-requests", type=int, default=50)
    ap.add_argument("--shape-rounds", type=int, default=10)
    ap.add_argument("--shapes-only", action="store_true", help="only the app shapes section")
    ap.add_argument(
        "--cpu-only", action="store_true", help="only the CPU section (fixed N against adaptive)"
    )
    ap.add_argument("--compare", nargs="+", metavar="TREE", help="BEFORE [AFTER] source trees")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        await worker(args.latency, args.samples)
        return
    if args.compare:
        await asyncio.to_thread(compare, args)
        return
    tp = provider()
    if args.cpu_only:
        await cpu_section(args.samples, args.cpu_requests, tp)
        tp.shutdown()
        return
    if args.shapes_only:
        await shapes(args.latency, args.samples, args.shape_rounds, tp)
        tp.shutdown()
        return

    print(
        f"model latency {args.latency * 1000:.0f} ms, N={args.samples}, "
        f"median of {args.rounds} rounds each, interleaved\n"
    )
    bare = bare_chain(args.latency)
    runs = {"bare LCEL chain (1 call)": bare, **pipelines(args.latency, args.samples, tp)}
    results: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.rounds):  # interleave so machine noise hits all alike
        for name, runnable in runs.items():
            results[name].append(await wall(runnable, 1))
    base = statistics.median(results["bare LCEL chain (1 call)"])
    goals = {"pipeline inline": 1.1, "pipeline separate": 2.1, "wrap(chain)": 1.1}
    print(f"{'configuration':28} {'median wall':>12} {'ratio to bare':>14}  goal")
    for name, values in results.items():
        med = statistics.median(values)
        goal = f"<= {goals[name]}x" if name in goals else ""
        print(f"{name:28} {med * 1000:10.1f}ms {med / base:13.2f}x  {goal}")
    await shapes(args.latency, args.samples, args.shape_rounds, tp)

    zero = await cpu_section(args.samples, args.cpu_requests, tp)
    print(
        f"\ninvoke() against ainvoke() (pipeline inline, zero-latency model, "
        f"{args.sync_requests} requests x {args.rounds} rounds, best round):"
    )
    timings = await sync_vs_async(zero["pipeline inline"], args.sync_requests, args.rounds)
    base_wall, base_cpu = timings["await ainvoke()"]
    for name, (w, c) in timings.items():
        print(
            f"  {name:32} wall {w * 1000:6.2f} ms ({w / base_wall:4.2f}x)  "
            f"CPU {c * 1000:6.2f} ms ({c / base_cpu:4.2f}x)"
        )
    print("  the sync bridge alone (run_sync of one executor call, best of 7):")
    for name, (w, c) in (
        ("from sync code", await asyncio.to_thread(bridge_cost, 300)),
        ("inside a running loop", await _bridge_cost_in_loop(300)),
    ):
        print(f"    {name:30} wall {w * 1e6:7.1f} us  CPU {c * 1e6:7.1f} us per call")
    tp.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
