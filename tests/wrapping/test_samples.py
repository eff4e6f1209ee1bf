"""Independent sample runs: callbacks kept, run-once nodes, forked checkpointer threads."""

from __future__ import annotations

import asyncio
import time
from typing import TypedDict

import pytest
from langchain_core.callbacks import AsyncCallbackManager, BaseCallbackHandler
from langchain_core.runnables import RunnableLambda
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph

from tracerag.contract import Response
from tracerag.errors import ConfigurationError
from tracerag.wrapping._io import ChainIO
from tracerag.wrapping._samples import Sampler, graph_nodes, run_once_nodes, with_callback


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


def answer_of(value):
    return value.get("answer") if isinstance(value, dict) else None


async def draw(sampler, value, n=3, config=None):
    """Run a request's N runs concurrently, as the sample stage does."""
    runs = await sampler.start(config, "r1", n)
    handlers = [Counter() for _ in range(n)]

    async def one(index):
        try:
            return await runs.draw(index, value, handlers[index], lambda attempt: attempt())
        finally:
            if index == 0:
                runs.app_run_done()

    try:
        outputs = await asyncio.gather(*(one(i) for i in range(n)))
        turn = await runs.turn((answer_of(outputs[0]) or "",), failed=False)
        if turn is not None:  # kept as a released answer is (``_commit``)
            await turn.commit(Response.model_construct(answer="released", decision="pass"), "")
    finally:
        threads = list(runs.threads)
        await runs.cleanup()
    return runs, list(outputs), handlers, threads


def test_plain_chain_runs_n_times_each_with_the_requests_config():
    inner = Counter()  # the request run's own handlers (the runner keeps the caller's out)
    chain = RunnableLambda(lambda x: x + "!")
    config = {"tags": ["t"], "callbacks": [inner]}
    runs, outputs, handlers, threads = asyncio.run(draw(Sampler(chain), "q", config=config))
    assert outputs == ["q!"] * 3
    assert runs.kinds == ["app", "private", "private"]
    assert inner.starts == 3  # every run is a child of the request's run
    assert [h.starts for h in handlers] == [1, 1, 1]
    assert threads == [] and runs.kept is None


def test_sampling_modes_are_checked():
    with pytest.raises(ConfigurationError, match="sampling must be one of"):
        Sampler(RunnableLambda(lambda x: x), sampling="whole")


def counting_graph(calls: list[str], checkpointer=None, sink=None):
    def prepare(state: State):
        calls.append("prepare")
        return {"log": ["prepared"]}

    def answer(state: State):
        calls.append("answer")
        return {"answer": f"A{len(calls)}: " + state["question"]}

    def notify(state: State):
        if sink is not None:
            sink.append(state["answer"])
        return {}

    builder = StateGraph(State)
    builder.add_node("prepare", prepare)
    builder.add_node("answer", answer)
    builder.add_node("notify", notify, metadata={"tracerag_run_once": True})
    builder.add_edge(START, "prepare")
    builder.add_edge("prepare", "answer")
    builder.add_edge("answer", "notify")
    return builder.compile(checkpointer=checkpointer)


def test_a_graph_runs_once_and_forks_its_answering_step():
    calls: list[str] = []
    sink: list[str] = []
    app = counting_graph(calls, sink=sink)
    sampler = Sampler(app, answer_of=answer_of)
    runs, outputs, _, threads = asyncio.run(draw(sampler, {"question": "q", "log": []}))
    # every node before the answering step ran once; the answer was drawn three times
    assert calls.count("prepare") == 1 and calls.count("answer") == 3
    assert runs.kinds == ["app", "fork", "fork"]
    assert [o["answer"].split(":")[0] for o in outputs] == ["A2", "A3", "A4"]
    assert all(o["log"] == ["prepared"] for o in outputs)  # forks start from the same state
    assert sink == [outputs[0]["answer"]]  # the run-once node ran in the app's own run only
    assert runs.kept == 0  # and it acted on that run's answer
    assert app.checkpointer is None  # the app ran on a copy with an in-memory checkpointer
    saver = sampler.own_graph().checkpointer
    assert len(threads) == 3 and not list(saver.list(None))  # every thread is deleted


def test_app_sampling_runs_the_whole_graph_each_time():
    calls: list[str] = []
    sampler = Sampler(counting_graph(calls), sampling="app", answer_of=answer_of)
    runs, _outputs, _, _ = asyncio.run(draw(sampler, {"question": "q", "log": []}))
    assert calls.count("prepare") == 3 and calls.count("answer") == 3
    assert runs.kinds == ["app", "private", "private"]


def test_without_a_step_that_wrote_the_answer_the_others_run_whole():
    calls: list[str] = []
    sampler = Sampler(counting_graph(calls), answer_of=lambda value: None)
    runs, _outputs, _, _ = asyncio.run(draw(sampler, {"question": "q", "log": []}))
    assert runs.kinds == ["app", "private", "private"]
    assert calls.count("prepare") == 3


def test_checkpointed_graph_keeps_the_conversation_and_forks_at_the_answer():
    saver = InMemorySaver()
    calls: list[str] = []
    app = counting_graph(calls, checkpointer=saver)
    config = {"configurable": {"thread_id": "t1"}}
    app.invoke({"question": "first", "log": []}, config)
    calls.clear()
    sampler = Sampler(app, answer_of=answer_of)
    runs, outputs, _, threads = asyncio.run(draw(sampler, {"question": "second"}, config=config))
    assert runs.kinds == ["app", "fork", "fork"]
    assert calls.count("prepare") == 1
    # the app's own run went on a thread of its own, committed to the caller's afterwards
    assert threads == ["t1/r1/app", "t1/r1/sample-1", "t1/r1/sample-2"]
    # the caller's thread moved on by this turn, with its own run's answer
    state = app.get_state(config).values
    assert state["answer"] == outputs[0]["answer"] and state["question"] == "second"
    assert runs.kept == 0
    assert {c.config["configurable"]["thread_id"] for c in saver.list(None)} == {"t1"}


def test_app_sampling_of_a_checkpointed_graph_starts_each_run_from_the_conversation():
    saver = InMemorySaver()
    app = graph(checkpointer=saver)
    config = {"configurable": {"thread_id": "t1"}}
    app.invoke({"question": "first", "log": []}, config)
    sampler = Sampler(app, sampling="app", answer_of=answer_of)
    _runs, outputs, _, threads = asyncio.run(draw(sampler, {"log": []}, config=config))
    # the other runs started where t1 was before this request: the earlier question
    assert all(o["answer"] == "A: first" for o in outputs)
    assert threads == ["t1/r1/app", "t1/r1/sample-1", "t1/r1/sample-2"]
    assert {c.config["configurable"]["thread_id"] for c in saver.list(None)} == {"t1"}


def test_checkpointed_graph_without_a_thread_is_a_clear_error():
    sampler = Sampler(graph(checkpointer=InMemorySaver()))
    with pytest.raises(ConfigurationError, match="thread_id"):
        asyncio.run(sampler.start({}, "r1", 2))


@pytest.mark.integration  # a fresh interpreter in a subprocess: an integration test
def test_tracerag_does_not_import_langgraph():
    import subprocess
    import sys

    code = (
        "import sys, tracerag.wrapping, tracerag.wrapping._samples, tracerag.wrapping._io;"
        "import tracerag.wrapping._capture;"
        "assert not [m for m in sys.modules if m.startswith(('langgraph', 'langchain_classic'))]"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


class Timed(BaseCallbackHandler):
    """Records when each model call starts and ends (monotonic clock)."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float]] = []
        self._open: dict = {}

    def on_chat_model_start(self, serialized, messages, *, run_id, **kwargs):
        self._open[run_id] = time.monotonic()

    def on_llm_end(self, response, *, run_id, **kwargs):
        self.spans.append((self._open.pop(run_id), time.monotonic()))


def model_graph(llm, calls: list[str]):
    def prepare(state: State):
        calls.append("prepare")
        return {"log": ["prepared"]}

    def answer(state: State):
        return {"answer": llm.invoke(f"Answer: {state['question']}").content}

    builder = StateGraph(State).add_sequence([prepare, answer])
    builder.add_edge(START, "prepare")
    return builder.compile()


def test_forks_start_when_the_app_run_calls_its_model_for_the_answer():
    from tracerag.testing import ScriptedChatModel

    llm = ScriptedChatModel(responses=["A1", "A2", "A3"], latency=0.2)
    calls: list[str] = []
    timed = Timed()
    sampler = Sampler(model_graph(llm, calls), answer_of=answer_of)

    async def go():
        runs = await sampler.start({"callbacks": [timed]}, "r1", 3)

        async def one(index):
            handler = Counter()
            try:
                return await runs.draw(index, {"question": "q"}, handler, lambda a: a())
            finally:
                if index == 0:
                    runs.app_run_done()

        outputs = await asyncio.gather(*(one(i) for i in range(3)))
        await runs.cleanup()
        return runs, outputs

    started = time.monotonic()
    runs, outputs = asyncio.run(go())
    elapsed = time.monotonic() - started
    assert runs.kinds == ["app", "fork", "fork"]
    assert calls == ["prepare"] and llm.call_count == 3
    assert sorted(o["answer"] for o in outputs) == ["A1", "A2", "A3"]
    # the forks' answering calls ran while the app's own one did
    (first, *others) = sorted(timed.spans)
    assert all(start < first[1] for start, _ in others)
    assert elapsed < 0.55  # one model latency, not two (three would be whole runs one by one)


def test_forks_from_a_call_that_asked_for_tools_are_given_up_and_started_again():
    """An agent that calls its tool twice: the forks begun at its second call are cancelled
    when that call asks for the tool again, and begin again at its third."""
    from wrap_apps import AGENT_QUESTION, answering, rag_agent

    from tracerag.testing import ToolCallingChatModel

    model = ToolCallingChatModel(
        responder=answering("24-month"), tool_rounds=2, latency=0.05, model_name="m"
    )
    sampler = Sampler(rag_agent(model), answer_of=ChainIO().answer_or_none)
    runs, outputs, _, _ = asyncio.run(draw(sampler, {"messages": [("user", AGENT_QUESTION)]}))
    assert runs.kinds == ["app", "fork", "fork"]
    answers = [o["messages"][-1].content for o in outputs]
    assert all(a.endswith("[warranty]") for a in answers)
    # the forks resumed the app's own run: each holds its two tool rounds once
    for o in outputs:
        assert [m.type for m in o["messages"]] == ["human", "ai", "tool", "ai", "tool", "ai"]


@pytest.mark.integration  # fresh interpreters in subprocesses: an integration test
@pytest.mark.parametrize(
    "imports",
    [
        "from tracerag import WrappedChain, wrap",
        "import tracerag.wrapping; from tracerag import wrap",
        "from tracerag.wrapping import Sampling; import tracerag; wrap = tracerag.wrap",
        "import tracerag; wrap = tracerag.wrap; import tracerag.wrapping._samples",
    ],
)
def test_tracerag_wrap_is_the_function_whatever_was_imported_first(imports):
    import subprocess
    import sys

    code = f"{imports}\nimport tracerag, types\nassert isinstance(wrap, types.FunctionType)\n"
    code += "assert tracerag.wrap is wrap and wrap.__name__ == 'wrap'\n"
    code += "import tracerag.wrapping as package\n"
    code += "assert isinstance(package, types.ModuleType) and package.wrap is wrap\n"
    code += "assert tracerag.wrapping is package and type(tracerag) is types.ModuleType"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_wrap_function_is_not_a_package_and_the_package_is_wrapping():
    import types

    import tracerag
    import tracerag.wrapping

    assert isinstance(tracerag.wrap, types.FunctionType)
    assert tracerag.wrap is tracerag.wrapping.wrap
    assert type(tracerag) is types.ModuleType  # no module-class swap keeps the name
    assert tracerag.wrapping.__name__ == "tracerag.wrapping"
    assert "wrap" not in {m.name for m in __import__("pkgutil").iter_modules(tracerag.__path__)}
