"""Every Runnable surface honours the route, for both front doors.

``RAGPipeline`` and ``wrap()`` of an LCEL chain and of a LangGraph ``StateGraph``, each with a
model that gets a number wrong (escalated: the answer is withheld) and one that cites correctly
(passed), through ``invoke``, ``stream``, ``astream`` (also with every LangGraph stream mode and
``subgraphs=True``), ``astream_events`` (v3, v2 and v1), ``stream_events`` (v3),
``astream_log``, ``transform``, ``atransform``, ``batch`` and ``abatch``. Everything the caller
receives (the chunks, the events, every call to the caller's own callback handler) is
serialized and searched for the withheld text, and no LangChain callback error may be logged.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import warnings
from collections.abc import Callable
from typing import Any, TypedDict

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.language_models.chat_model_stream import (
    AsyncChatModelStream,
    ChatModelStream,
)
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda, RunnablePassthrough
from langgraph.graph import START, StateGraph
from pipeline_fixtures import FAST_RETRY, GOOD, POLICIES, QUESTION, WRONG_NUMBER, scripted

from tracerag import Response, validate_response, wrap
from tracerag.demo.kb import build_vectorstore
from tracerag.events import ANSWER_EVENT, STAGE_EVENT
from tracerag.testing import ScriptCall, ScriptedChatModel

STAGES = ["register", "retrieve", "plan", "sample", "verify", "assemble"]
#: pieces of the withheld answer (WRONG_NUMBER and the wrapped apps' wrong answer), and of
#: the support check's reason for it ("duration 60 days not in material")
WITHHELD = ["within 60 days", "60 days", "days of delivery. ["]
SURFACES = [
    "invoke",
    "stream",
    "astream",
    "stream_modes",
    "astream_modes",
    "astream_events_v3",
    "stream_events_v3",
    "astream_events_v2",
    "astream_events_v1",
    "astream_log",
    "transform",
    "atransform",
    "batch",
    "abatch",
]

PROMPT = ChatPromptTemplate.from_template(
    "Answer from the context. Cite passages by their number, like [1].\n\n"
    "Context:\n{context}\n\nQuestion: {question}"
)


def numbered(docs: list[Document]) -> str:
    return "\n\n".join(f"[{i}] {d.page_content}" for i, d in enumerate(docs, 1))


def answering(days: int) -> Callable[[ScriptCall], str]:
    """A model that cites the passage on returns by its number and says ``days`` days."""

    def answer(call: ScriptCall) -> str:
        for line in call.prompt.splitlines():
            if line.startswith("[") and "30 days" in line:
                n = line[1 : line.index("]")]
                return f"Customers may return unused items within {days} days of delivery. [{n}]"
        return "I don't know."

    return answer


@pytest.fixture
def store():
    docs = [Document(page_content=d.page_content, metadata=dict(d.metadata)) for d in POLICIES]
    return build_vectorstore(docs)


def lcel_app(store, llm):
    retriever = store.as_retriever(search_kwargs={"k": 4})
    return (
        {"context": retriever | numbered, "question": RunnablePassthrough()}
        | PROMPT
        | llm
        | StrOutputParser()
    )


class State(TypedDict):
    question: str
    context: list[Document]
    answer: str


def graph_app(store, llm):
    """LangChain's RAG tutorial graph: retrieve → generate, prompt and model called in nodes."""

    def retrieve(state: State):
        return {"context": store.similarity_search(state["question"], k=4)}

    def generate(state: State):
        messages = PROMPT.invoke(
            {"question": state["question"], "context": numbered(state["context"])}
        )
        return {"answer": llm.invoke(messages).content}

    builder = StateGraph(State).add_sequence([retrieve, generate])
    builder.add_edge(START, "retrieve")
    return builder.compile()


@pytest.fixture(params=["pipeline", "lcel", "graph"])
def front_door(request, make_pipeline, store):
    """``build(wrong, records) -> (runnable, request)`` for one front door."""
    shape = request.param

    def build(wrong: bool, records: list[dict[str, Any]] | None = None):
        audit = (lambda r: records.append(r) or True) if records is not None else None
        if shape == "pipeline":
            llm = scripted([WRONG_NUMBER if wrong else GOOD])
            return make_pipeline(llm, n_samples=3, audit=audit), QUESTION
        llm = ScriptedChatModel(
            responder=answering(60 if wrong else 30), model_name="scripted-x", temperature=0.7
        )
        if shape == "lcel":
            return wrap(lcel_app(store, llm), n_samples=3, retry=FAST_RETRY, audit=audit), QUESTION
        app = wrap(graph_app(store, llm), n_samples=3, retry=FAST_RETRY, audit=audit)
        return app, {"question": QUESTION}

    build.shape = shape  # type: ignore[attr-defined]
    return build


class Recorder(BaseCallbackHandler):
    """The caller's handler: keeps every call it gets, with its arguments."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def _keep(self, event: str, /, *args: Any, **kwargs: Any) -> None:
        self.calls.append((event, serialize([args, kwargs])))

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def on_chain_start(self, *a: Any, **k: Any) -> None:
        self._keep("on_chain_start", *a, **k)

    def on_chain_end(self, *a: Any, **k: Any) -> None:
        self._keep("on_chain_end", *a, **k)

    def on_chain_error(self, *a: Any, **k: Any) -> None:
        self._keep("on_chain_error", *a, **k)

    def on_custom_event(self, *a: Any, **k: Any) -> None:
        self._keep("on_custom_event", *a, **k)

    def on_llm_start(self, *a: Any, **k: Any) -> None:
        self._keep("on_llm_start", *a, **k)

    def on_chat_model_start(self, *a: Any, **k: Any) -> None:
        self._keep("on_chat_model_start", *a, **k)

    def on_llm_new_token(self, *a: Any, **k: Any) -> None:
        self._keep("on_llm_new_token", *a, **k)

    def on_llm_end(self, *a: Any, **k: Any) -> None:
        self._keep("on_llm_end", *a, **k)

    def on_retriever_start(self, *a: Any, **k: Any) -> None:
        self._keep("on_retriever_start", *a, **k)

    def on_retriever_end(self, *a: Any, **k: Any) -> None:
        self._keep("on_retriever_end", *a, **k)

    def on_text(self, *a: Any, **k: Any) -> None:
        self._keep("on_text", *a, **k)


def serialize(value: Any) -> str:
    def default(o: Any) -> Any:
        if hasattr(o, "model_dump"):
            return o.model_dump(mode="json")
        if isinstance(o, (ChatModelStream, AsyncChatModelStream)):  # its events and message
            return [list(o._events), o.output_message]
        return repr(o)

    return json.dumps(value, default=default, ensure_ascii=False)


async def through(surface: str, app: Any, request: Any, config: dict[str, Any]) -> list[Any]:
    """What the caller receives through one surface (a batch asks twice)."""
    if surface == "invoke":
        return [await asyncio.to_thread(app.invoke, request, config)]
    if surface == "stream":
        return await asyncio.to_thread(lambda: list(app.stream(request, config)))
    if surface == "astream":
        return [chunk async for chunk in app.astream(request, config)]
    if surface == "stream_modes":
        return await asyncio.to_thread(
            lambda: list(app.stream(request, config, stream_mode=MODES, subgraphs=True))
        )
    if surface == "astream_modes":
        return [part async for part in app.astream(request, config, stream_mode=MODES)]
    if surface == "astream_events_v3":
        run = await app.astream_events(request, config, version="v3")
        events = [event async for event in run]
        return [*events, *[m async for m in run.messages], await run.output()]
    if surface == "stream_events_v3":

        def read() -> list[Any]:
            run = app.stream_events(request, config, version="v3")
            return [*run, *run.messages, run.output]

        return await asyncio.to_thread(read)
    if surface == "astream_events_v2":
        return [e async for e in app.astream_events(request, config, version="v2")]
    if surface == "astream_events_v1":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # v1 is deprecated by LangChain
            return [e async for e in app.astream_events(request, config, version="v1")]
    if surface == "astream_log":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecated by LangChain
            return [patch async for patch in app.astream_log(request, config)]
    if surface == "transform":
        return await asyncio.to_thread(lambda: list(app.transform(iter([request]), config)))
    if surface == "atransform":

        async def one():
            yield request

        return [chunk async for chunk in app.atransform(one(), config)]
    if surface == "batch":
        return await asyncio.to_thread(app.batch, [request, request], config)
    assert surface == "abatch"
    return await app.abatch([request, request], config)


MODES = ["values", "updates", "messages", "custom", "debug"]


def responses_in(surface: str, received: list[Any]) -> list[Response]:
    if surface.endswith("_modes"):
        return [part[-1]["response"] for part in received if "response" in part[-1]]
    if surface.endswith("_v3"):
        return [received[-1]]
    if surface == "astream_log":
        return [
            op["value"] for patch in received for op in patch.ops if op["path"] == "/final_output"
        ]
    if surface.startswith("astream_events"):
        ends = [e for e in received if e["event"] == "on_chain_end" and not e["parent_ids"]]
        return [e["data"]["output"] for e in ends]
    return received


def callback_errors(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("langchain_core.callbacks") and "callback" in r.getMessage()
    ]


@pytest.mark.parametrize("surface", SURFACES)
def test_a_withheld_answer_reaches_the_caller_through_no_surface(surface, front_door, caplog):
    records: list[dict[str, Any]] = []
    app, request = front_door(wrong=True, records=records)
    handler = Recorder()
    caplog.set_level(logging.WARNING)
    received = asyncio.run(through(surface, app, request, {"callbacks": [handler]}))

    responses = responses_in(surface, received)
    assert responses and all(isinstance(r, Response) for r in responses)
    assert all(r.decision == "escalate" and r.answer is None for r in responses)
    everything = serialize(received) + serialize(handler.calls)
    for piece in WITHHELD:
        assert piece not in everything, (surface, piece)
    assert callback_errors(caplog) == []
    # the operator's side keeps the candidate: the audit record has the samples and claims
    assert records and all("within 60 days" in r["samples"][0]["answer"] for r in records)
    assert all("within 60 days" in r["response"]["claims"][0]["text"] for r in records)
    # the caller's handler heard the request's own run only: no model, retriever or app run
    heard = set(handler.names())
    assert heard == {"on_chain_start", "on_custom_event", "on_chain_end"}, heard


def stage_events(received: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in received if e["event"] == "on_custom_event" and e["name"] == STAGE_EVENT]


def test_astream_events_are_the_requests_own(front_door, caplog):
    app, request = front_door(wrong=True)
    caplog.set_level(logging.WARNING)
    events = asyncio.run(through("astream_events_v2", app, request, {}))

    kinds = [e["event"] for e in events]
    assert kinds == ["on_chain_start", *["on_custom_event"] * 6, "on_chain_stream", "on_chain_end"]
    root = events[0]["run_id"]
    assert all(e["run_id"] == root for e in events)  # no inner run shows up
    assert [e["data"]["stage"] for e in stage_events(events)] == [s.name for s in app.steps]
    assert sorted(e["data"]["stage"] for e in stage_events(events)) == sorted(STAGES)
    assert events[0]["data"]["input"] == request
    assert events[-2]["data"]["chunk"] == events[-1]["data"]["output"]
    response = events[-1]["data"]["output"]
    assert response.decision == "escalate" and response.ticket_id
    assert all(e["data"]["request_id"] == response.request_id for e in stage_events(events))
    assert callback_errors(caplog) == []


def test_a_passed_answer_streams_after_it_is_verified(front_door):
    app, request = front_door(wrong=False)
    events = asyncio.run(through("astream_events_v2", app, request, {}))

    names = [e["name"] if e["event"] == "on_custom_event" else e["event"] for e in events]
    assert names == [
        "on_chain_start",
        *[STAGE_EVENT] * 6,
        ANSWER_EVENT,
        "on_chain_stream",
        "on_chain_end",
    ]
    response = events[-1]["data"]["output"]
    assert response.decision == "pass"
    answer = events[names.index(ANSWER_EVENT)]["data"]
    assert answer["text"] == response.answer
    assert "within 30 days" in answer["text"]
    assert answer["decision"] == "pass" and answer["request_id"] == response.request_id
    chunks = asyncio.run(through("astream", app, request, {}))
    assert len(chunks) == 1 and chunks[0].decision == "pass" and "30 days" in chunks[0].answer


def test_what_the_callers_handler_sees(front_door):
    """The documented view: the request's run, a custom event per stage, the released answer,
    the Response; never a model, retriever, prompt, parser or app-node run."""
    handler = Recorder()
    app, request = front_door(wrong=False)
    response = app.invoke(request, {"callbacks": [handler], "tags": ["mine"]})
    assert response.decision == "pass"
    assert handler.names() == [
        "on_chain_start",
        *["on_custom_event"] * 7,
        "on_chain_end",
    ]
    start = handler.calls[0][1]
    assert type(app).__name__ in start and "mine" in start
    customs = [json.loads(payload) for name, payload in handler.calls if name == "on_custom_event"]
    assert [c[0][0] for c in customs] == [STAGE_EVENT] * 6 + [ANSWER_EVENT]
    assert customs[-1][0][1]["text"] == response.answer
    end = json.loads(handler.calls[-1][1])
    assert end[0][0]["request_id"] == response.request_id


def test_a_failed_request_tells_the_callers_handler_once(store):
    handler = Recorder()
    llm = ScriptedChatModel(responder=answering(30), model_name="scripted-x")
    app = wrap(lcel_app(store, llm), n_samples=2, retry=FAST_RETRY, audit=None)
    with pytest.raises(Exception, match="question"):
        app.invoke({"nothing": "here"}, {"callbacks": [handler]})
    assert handler.names() == ["on_chain_start", "on_chain_error"]


def test_tokens_a_streaming_app_draws_never_reach_the_caller(store, caplog):
    """A graph node that streams its model: the tokens are the app's, not the caller's."""
    llm = GenericFakeChatModel(
        messages=itertools.cycle(
            [AIMessage("Customers may return unused items within 60 days of delivery. [1]")]
        )
    )

    def retrieve(state: State):
        return {"context": store.similarity_search(state["question"], k=4)}

    def generate(state: State):
        messages = PROMPT.invoke(
            {"question": state["question"], "context": numbered(state["context"])}
        )
        return {"answer": "".join(str(chunk.content) for chunk in llm.stream(messages))}

    builder = StateGraph(State).add_sequence([retrieve, generate])
    builder.add_edge(START, "retrieve")
    app = wrap(
        builder.compile(),
        n_samples=3,
        retry=FAST_RETRY,
        audit=None,
        prompt_version="p1",
        model_version="fake",
    )
    handler = Recorder()
    caplog.set_level(logging.WARNING)
    events = asyncio.run(
        through("astream_events_v2", app, {"question": QUESTION}, {"callbacks": [handler]})
    )
    assert events[-1]["data"]["output"].decision == "escalate"
    assert not [e for e in events if e["event"].startswith("on_chat_model")]
    assert "on_llm_new_token" not in handler.names()
    assert callback_errors(caplog) == []


@pytest.mark.parametrize("passes_config", [True, False])
def test_an_outer_graph_streaming_its_subgraphs_gets_no_sample(store, passes_config):
    """A LangGraph app calling the wrapped graph in a node, streamed as LangGraph frontends
    stream (messages, values, updates, custom; with subgraphs): nothing of a sample, and the
    samples are no subgraph steps of the caller's graph."""
    llm = ScriptedChatModel(responder=answering(60), model_name="scripted-x", temperature=0.7)
    wrapped = wrap(graph_app(store, llm), n_samples=3, retry=FAST_RETRY, audit=None)

    class Outer(TypedDict):
        question: str
        decision: str

    async def ask(state: Outer, config):
        question = {"question": state["question"]}
        response = await (
            wrapped.ainvoke(question, config) if passes_config else wrapped.ainvoke(question)
        )
        return {"decision": response.decision}

    outer = StateGraph(Outer).add_sequence([ask])
    outer.add_edge(START, "ask")
    graph = outer.compile()

    async def main() -> list[Any]:
        modes = ["messages", "values", "updates", "custom"]
        return [
            part
            async for part in graph.astream(
                {"question": QUESTION}, stream_mode=modes, subgraphs=True
            )
        ]

    parts = asyncio.run(main())
    assert {namespace for namespace, _, _ in parts} == {()}
    assert [p for _, mode, p in parts if mode == "messages"] == []
    assert parts[-1][2]["decision"] == "escalate"
    assert "60 days" not in serialize(parts)


def test_the_response_inside_an_lcel_chain_is_the_callers_view(make_pipeline):
    pipeline = make_pipeline(scripted([WRONG_NUMBER]), n_samples=2, audit=None)
    chain = pipeline | RunnableLambda(lambda r: r.model_dump(mode="json"))
    streamed = asyncio.run(through("astream_events_v2", chain, QUESTION, {}))
    assert streamed[-1]["data"]["output"]["decision"] == "escalate"
    assert "60 days" not in serialize(streamed)
    validate_response(streamed[-1]["data"]["output"])
