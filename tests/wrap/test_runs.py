"""Independent sample runs: callbacks kept, run-once nodes, forked checkpointer threads."""

from __future__ import annotations

import asyncio
from typing import TypedDict

import pytest
from langchain_core.callbacks import AsyncCallbackManager, BaseCallbackHandler
from langchain_core.runnables import RunnableLambda
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph

from tracerag.errors import ConfigurationError
from tracerag.wrap._runs import Sampler, graph_nodes, run_once_nodes, with_callback


class Counter(BaseCallbackHandler):
    def __init__(self) -> None:
        self.starts = 0

    def on_chain_start(self, serialized, inputs, **kwargs):
        self.starts += 1


class State(TypedDict):
    question: str
    answer: str
    log: list[str]


def graph(checkpointer=None, sink: list | None = None):
    def answer(state: State):
        return {"answer": "A: " + state["question"]}

    def notify(state: State):
        if sink is not None:
            sink.append(state["answer"])
        return {}

    builder = StateGraph(State)
    builder.add_node("answer", answer)
    builder.add_node("notify", notify, metadata={"tracerag_run_once": True})
    builder.add_edge(START, "answer")
    builder.add_edge("answer", "notify")
    return builder.compile(checkpointer=checkpointer)


def test_with_callback_keeps_the_callers_handlers():
    mine, theirs = Counter(), Counter()
    config = with_callback({"callbacks": [theirs], "tags": ["t"]}, mine)
    assert config["callbacks"] == [theirs, mine]
    assert config["tags"] == ["t"]
    assert with_callback(None, mine)["callbacks"] == [mine]
    manager = AsyncCallbackManager(handlers=[theirs])
    merged = with_callback({"callbacks": manager}, mine)["callbacks"]
    assert merged.handlers == [theirs, mine]
    assert manager.handlers == [theirs]  # the caller's manager is not changed
    RunnableLambda(lambda x: x).invoke(1, config=with_callback({"callbacks": [theirs]}, mine))
    assert mine.starts == theirs.starts == 1


def test_graphs_are_recognised_without_importing_langgraph_types():
    assert graph_nodes(graph()) is not None
    assert graph_nodes(RunnableLambda(lambda x: x)) is None


def test_run_once_nodes_named_and_marked():
    assert run_once_nodes(graph()) == ("notify",)
    assert run_once_nodes(graph(), ["answer"]) == ("answer", "notify")
    with pytest.raises(ConfigurationError, match="does not have"):
        run_once_nodes(graph(), ["send_email"])
    with pytest.raises(ConfigurationError, match="not a LangGraph graph"):
        run_once_nodes(RunnableLambda(lambda x: x), ["notify"])
    assert run_once_nodes(RunnableLambda(lambda x: x)) == ()


def test_plain_chain_runs_are_n_plain_invocations():
    runs = asyncio.run(Sampler(RunnableLambda(lambda x: x)).prepare({"tags": ["t"]}, "r1", 3))
    assert [r.index for r in runs] == [0, 1, 2]
    assert all(r.kwargs == {} and r.forked_thread is None for r in runs)
    assert [r.config["metadata"]["tracerag_sample"] for r in runs] == [0, 1, 2]
    assert all(r.config["tags"] == ["t"] for r in runs)


def test_run_once_without_checkpointer_uses_a_stopping_copy():
    sink: list[str] = []
    app = graph(sink=sink)
    sampler = Sampler(app)

    async def go():
        runs = await sampler.prepare(None, "r1", 3)
        outputs = [await r.ainvoke({"question": "q"}, Counter()) for r in runs]
        await sampler.cleanup(runs)
        return runs, outputs

    runs, outputs = asyncio.run(go())
    assert runs[0].runnable is app
    assert runs[1].runnable is runs[2].runnable is not app
    assert runs[1].kwargs == {"interrupt_before": ["notify"]}
    assert all(o["answer"] == "A: q" for o in outputs)
    assert sink == ["A: q"]
    assert app.checkpointer is None


def test_checkpointed_graph_forks_the_callers_thread_and_deletes_the_forks():
    saver = InMemorySaver()
    app = graph(checkpointer=saver)
    config = {"configurable": {"thread_id": "t1"}}
    app.invoke({"question": "first", "log": []}, config)
    sampler = Sampler(app, run_once=())

    async def go():
        runs = await sampler.prepare(config, "r1", 3)
        forks = [r.forked_thread for r in runs]
        states = [
            (await app.aget_state({"configurable": {"thread_id": f}})).values for f in forks[1:]
        ]
        await sampler.cleanup(runs)
        return runs, forks, states

    runs, forks, states = asyncio.run(go())
    assert forks[0] is None and runs[0].config["configurable"]["thread_id"] == "t1"
    assert forks[1] == "t1/r1/sample-1" and forks[2] == "t1/r1/sample-2"
    assert all(s["question"] == "first" for s in states)  # each fork starts where t1 was
    assert {c.config["configurable"]["thread_id"] for c in saver.list(None)} == {"t1"}


def test_checkpointed_graph_without_a_thread_is_a_clear_error():
    sampler = Sampler(graph(checkpointer=InMemorySaver()))
    with pytest.raises(ConfigurationError, match="thread_id"):
        asyncio.run(sampler.prepare({}, "r1", 2))


@pytest.mark.integration  # a fresh interpreter in a subprocess: an integration test
def test_tracerag_does_not_import_langgraph():
    import subprocess
    import sys

    code = (
        "import sys, tracerag.wrap, tracerag.wrap._runs, tracerag.wrap._io, tracerag.wrap._capture;"
        "assert not [m for m in sys.modules if m.startswith(('langgraph', 'langchain_classic'))]"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
