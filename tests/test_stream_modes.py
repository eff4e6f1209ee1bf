"""Every stream API, for both front doors: LangGraph's stream modes and the v3 event stream.

``RAGPipeline``, ``wrap()`` of an LCEL chain and ``wrap()`` of a ``create_agent`` agent, each with
a model that answers correctly (passed) and one that plants a distinctive wrong sentence
(escalated: withheld). Through ``stream`` and ``astream`` with every ``stream_mode``, lists of
them, ``subgraphs=True`` and ``version="v2"``; ``astream_events`` v2; ``astream_events`` and
``stream_events`` with ``version="v3"``. Everything received (chunks, messages, protocol events,
the chat-model streams, the caller's callback handler) is walked recursively and searched for
the withheld sentence; a passed answer's text appears only once verified.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.language_models.chat_model_stream import (
    AsyncChatModelStream,
    ChatModelStream,
)
from langchain_core.messages import AIMessageChunk
from langchain_core.retrievers import BaseRetriever
from pipeline_fixtures import FAST_RETRY, GOOD, POLICIES, QUESTION, scripted
from pydantic import BaseModel
from waiting import await_until
from wrap_apps import AGENT_QUESTION, answering, lcel_chain, rag_agent

from tracerag import RAGPipeline, Response, wrap
from tracerag.demo.kb import build_vectorstore
from tracerag.errors import ConfigurationError, InputError, UnknownOptionError
from tracerag.events import (
    ANSWER_EVENT,
    STAGE_EVENT,
    STREAM_MODES,
    AsyncRequestStream,
    RequestStream,
)
from tracerag.testing import ScriptCall, ScriptedChatModel, ToolCallingChatModel

STAGES = ["register", "retrieve", "plan", "sample", "verify", "assemble"]
#: the planted withheld sentences: distinctive words no material, prompt or signal holds
WITHHELD_RETURNS = "Customers may return unused items within 60 days, no receipt ever needed."
WITHHELD_WARRANTY = "Laptops carry a lifetime warranty, no receipt ever needed."
MARKER = "no receipt ever needed"
#: the agent's correct answer: the warranty passage's sentence, cited by its id
SENTENCE = "Under Clause 6.1, laptops and tablets are covered by an extended 24-month warranty."
MODE_LISTS = [["updates", "messages"], list(STREAM_MODES)]


def citing_returns(wrong: bool) -> Callable[[ScriptCall], str]:
    """An LCEL app's model: cites the returns passage by its number; wrong, plants the lie."""

    def answer(call: ScriptCall) -> str:
        for line in call.prompt.splitlines():
            if line.startswith("[") and "30 days" in line:
                n = line[1 : line.index("]")]
                if wrong:
                    return f"{WITHHELD_RETURNS} [{n}]"
                return f"Customers may return unused items within 30 days of delivery. [{n}]"
        return "I don't know."

    return answer


@pytest.fixture
def store():
    docs = [Document(page_content=d.page_content, metadata=dict(d.metadata)) for d in POLICIES]
    return build_vectorstore(docs)


@pytest.fixture(params=["pipeline", "lcel", "agent"])
def front_door(request, make_pipeline, store):
    """``build(wrong) -> (runnable, request, released_text_piece)`` for one front door."""
    shape = request.param

    def build(wrong: bool, **options: Any):
        options = {"n_samples": 3, "audit": None, **options}
        if shape == "pipeline":
            llm = scripted([f"{WITHHELD_RETURNS} [returns]" if wrong else GOOD])
            return make_pipeline(llm, **options), QUESTION, "30 days"
        if shape == "lcel":
            llm = ScriptedChatModel(
                responder=citing_returns(wrong), model_name="scripted-x", temperature=0.7
            )
            app = wrap(lcel_chain(store, llm), retry=FAST_RETRY, **options)
            return app, QUESTION, "30 days"
        responder = answering("24-month", claim=WITHHELD_WARRANTY if wrong else None)
        model = ToolCallingChatModel(
            responder=responder, model_name="tool-model-1", temperature=0.7
        )
        question = {"messages": [{"role": "user", "content": AGENT_QUESTION}]}
        return wrap(rag_agent(model), retry=FAST_RETRY, **options), question, "24-month"

    return build


def walk(value: Any) -> str:
    """Everything a value holds, as text: dicts, sequences, models, messages, chat streams."""
    if isinstance(value, (ChatModelStream, AsyncChatModelStream)):
        return walk([list(value._events), value.output_message, value.node])
    if isinstance(value, BaseModel):
        return walk(value.model_dump(mode="json"))
    if isinstance(value, dict):
        return " ".join(f"{walk(k)}: {walk(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        return " ".join(walk(v) for v in value)
    return str(value)


class Heard(BaseCallbackHandler):
    """The caller's handler: the names of the callbacks it hears and all they carried."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.carried: list[str] = []

    def _keep(self, callback: str, /, *args: Any, **kwargs: Any) -> None:
        self.names.append(callback)
        self.carried.append(walk([args, kwargs]))

    def on_chain_start(self, *a: Any, **k: Any) -> None:
        self._keep("on_chain_start", *a, **k)

    def on_chain_end(self, *a: Any, **k: Any) -> None:
        self._keep("on_chain_end", *a, **k)

    def on_custom_event(self, *a: Any, **k: Any) -> None:
        self._keep("on_custom_event", *a, **k)

    def on_llm_new_token(self, *a: Any, **k: Any) -> None:
        self._keep("on_llm_new_token", *a, **k)

    def on_chat_model_start(self, *a: Any, **k: Any) -> None:
        self._keep("on_chat_model_start", *a, **k)


def sync_stream(app: Any, request: Any, config: Any = None, **options: Any) -> list[Any]:
    return list(app.stream(request, config, **options))


def async_stream(app: Any, request: Any, config: Any = None, **options: Any) -> list[Any]:
    async def main() -> list[Any]:
        return [chunk async for chunk in app.astream(request, config, **options)]

    return asyncio.run(main())


STREAMS = {"stream": sync_stream, "astream": async_stream}


def response_of(chunks: list[tuple[str, Any]]) -> Response:
    (update,) = [c for m, c in chunks if m == "updates" and "response" in c]
    response = update["response"]
    assert isinstance(response, Response)
    return response


# -- every mode, for a passed and an escalated answer -----------------------------------------


@pytest.mark.parametrize("surface", list(STREAMS))
@pytest.mark.parametrize("wrong", [False, True], ids=["passed", "escalated"])
def test_every_mode_in_one_list(surface, wrong, front_door, caplog):
    app, request, released = front_door(wrong)
    heard = Heard()
    caplog.set_level(logging.WARNING)
    chunks = STREAMS[surface](app, request, {"callbacks": [heard]}, stream_mode=list(STREAM_MODES))

    assert all(isinstance(c, tuple) and len(c) == 2 for c in chunks)
    modes = [m for m, _ in chunks]
    assert set(modes) <= set(STREAM_MODES)
    response = response_of(chunks)
    ran = [s.name for s in app.steps if s.skip_reason is None]

    # updates: one per stage that ran, in order, then the Response
    updates = [c for m, c in chunks if m == "updates"]
    assert [next(iter(u)) for u in updates] == [*ran, "response"]
    assert all(len(u) == 1 for u in updates)
    assert updates[ran.index("assemble")]["assemble"]["decision"] == response.decision
    # values: the request's state as it grows; the last holds every stage and the Response
    values = [c for m, c in chunks if m == "values"]
    assert len(values) == len(ran) + 1
    assert [len(v) for v in values] == list(range(4, 5 + len(ran)))  # one key more each time
    assert values[-1]["response"] == response
    assert values[-1]["request_id"] == response.request_id
    assert set(values[-1]) == {"request_id", "trace_id", "question", *ran, "response"}
    # custom: the stage events, then the released answer's
    custom = [c for m, c in chunks if m == "custom"]
    names = [c["name"] for c in custom]
    assert names[: len(STAGES)] == [STAGE_EVENT] * len(STAGES)
    assert [c["data"]["stage"] for c in custom[: len(STAGES)]] == [s.name for s in app.steps]
    # debug: one task_result per stage
    debug = [c for m, c in chunks if m == "debug"]
    assert [d["type"] for d in debug] == ["task_result"] * len(STAGES)
    assert [d["payload"]["name"] for d in debug] == [s.name for s in app.steps]
    assert [d["step"] for d in debug] == list(range(1, len(STAGES) + 1))

    messages = [c for m, c in chunks if m == "messages"]
    everything = walk(chunks) + walk(heard.carried)
    if wrong:
        assert response.decision == "escalate" and response.answer is None
        assert messages == [] and names == [STAGE_EVENT] * len(STAGES)
        assert MARKER not in everything
        assert "no receipt" not in everything
    else:
        assert response.decision == "pass" and released in response.answer
        ((message, metadata),) = messages
        assert isinstance(message, AIMessageChunk)
        assert message.content == response.answer
        assert metadata["langgraph_node"] == "assemble"
        assert metadata["tracerag_decision"] == "pass"
        assert metadata["tracerag_request_id"] == response.request_id
        assert names == [STAGE_EVENT] * len(STAGES) + [ANSWER_EVENT]
        assert custom[-1]["data"]["text"] == response.answer
        # the answer comes once verified: after the verify and assemble stages' chunks
        at = chunks.index(("messages", (message, metadata)))
        assert chunks.index(("updates", {"verify": updates[ran.index("verify")]["verify"]})) < at
        assert ("updates", updates[ran.index("assemble")]) in chunks[:at]
        # and nowhere before that
        assert response.answer not in walk(chunks[:at])
    # the caller's handler heard the request's own run only, as for invoke
    assert set(heard.names) == {"on_chain_start", "on_custom_event", "on_chain_end"}
    assert [r.getMessage() for r in caplog.records if r.name.startswith("langchain_core")] == []


@pytest.mark.parametrize("mode", STREAM_MODES)
@pytest.mark.parametrize("wrong", [False, True], ids=["passed", "escalated"])
def test_each_mode_alone_streams_its_chunks_bare(mode, wrong, front_door):
    app, request, released = front_door(wrong)
    chunks = sync_stream(app, request, stream_mode=mode)
    tagged = async_stream(app, request, stream_mode=[mode])

    if mode == "messages" and wrong:  # a withheld answer is no message
        assert chunks == tagged == []
        return
    assert chunks and [m for m, _ in tagged] == [mode] * len(tagged)
    assert len(chunks) == len(tagged)
    assert MARKER not in walk(chunks) + walk(tagged)
    if mode == "updates":
        assert [next(iter(c)) for c in chunks][-1] == "response"
        assert chunks[-1]["response"].decision == ("escalate" if wrong else "pass")
    elif mode == "values":
        assert chunks[-1]["response"].decision == ("escalate" if wrong else "pass")
    elif mode == "messages":
        ((message, _),) = chunks
        assert released in message.content
    elif mode == "custom":
        assert [c["name"] for c in chunks][-1] == (STAGE_EVENT if wrong else ANSWER_EVENT)
    else:
        assert all(c["type"] == "task_result" for c in chunks)


def test_an_escalated_answer_streams_no_message(front_door):
    app, request, _ = front_door(wrong=True)
    assert sync_stream(app, request, stream_mode="messages") == []
    assert async_stream(app, request, stream_mode="messages") == []


@pytest.mark.parametrize("modes", ["updates", *map(tuple, MODE_LISTS)], ids=str)
@pytest.mark.parametrize("surface", list(STREAMS))
def test_subgraphs_prefix_the_root_namespace(modes, surface, front_door):
    app, request, _ = front_door(wrong=True)
    stream_mode = list(modes) if isinstance(modes, tuple) else modes
    parts = STREAMS[surface](app, request, stream_mode=stream_mode, subgraphs=True)
    plain = STREAMS[surface](app, request, stream_mode=stream_mode)

    assert len(parts) == len(plain)
    if isinstance(modes, tuple):
        assert all(len(p) == 3 and p[0] == () for p in parts)
        assert [p[1] for p in parts] == [p[0] for p in plain]
    else:
        assert all(len(p) == 2 and p[0] == () for p in parts)
        assert parts[-1][1]["response"].decision == "escalate"
    assert MARKER not in walk(parts)


def test_subgraphs_alone_streams_values_as_langgraph_does(front_door):
    app, request, _ = front_door(wrong=False)
    parts = sync_stream(app, request, subgraphs=True)
    assert all(ns == () for ns, _ in parts)
    assert parts[-1][1]["response"].decision == "pass"
    assert set(parts[-1][1]) >= {"request_id", "question", "response"}


@pytest.mark.parametrize("surface", list(STREAMS))
def test_version_v2_streams_typed_parts(surface, front_door):
    app, request, _ = front_door(wrong=True)
    parts = STREAMS[surface](app, request, stream_mode=list(STREAM_MODES), version="v2")
    assert parts and all(set(p) >= {"type", "ns", "data"} and p["ns"] == () for p in parts)
    assert {p["type"] for p in parts} == {"values", "updates", "custom", "debug"}
    assert all(p["interrupts"] == () for p in parts if p["type"] == "values")
    assert parts[-1]["data"]["response"].decision == "escalate"
    assert MARKER not in walk(parts)


# -- astream_events: v2 and v3 ------------------------------------------------------------------


@pytest.mark.parametrize("wrong", [False, True], ids=["passed", "escalated"])
def test_astream_events_v2(wrong, front_door):
    app, request, released = front_door(wrong)

    async def main() -> list[dict[str, Any]]:
        return [e async for e in app.astream_events(request, version="v2")]

    events = asyncio.run(main())
    response = events[-1]["data"]["output"]
    assert isinstance(response, Response)
    root = events[0]["run_id"]
    assert all(e["run_id"] == root for e in events)
    customs = [e["name"] for e in events if e["event"] == "on_custom_event"]
    if wrong:
        assert response.decision == "escalate"
        assert customs == [STAGE_EVENT] * 6
        assert MARKER not in walk(events)
    else:
        assert response.decision == "pass" and released in response.answer
        assert customs == [STAGE_EVENT] * 6 + [ANSWER_EVENT]


def check_v3_events(events: list[dict[str, Any]], response: Response, wrong: bool) -> None:
    assert all(e["type"] == "event" and e["params"]["namespace"] == [] for e in events)
    methods = [e["method"] for e in events]
    assert set(methods) <= {"values", "updates", "custom", "messages"}
    updates = [e["params"]["data"] for e in events if e["method"] == "updates"]
    assert next(iter(updates[0])) == "register"
    assert updates[-1] == {"response": response}
    blocks = [e["params"]["data"][0] for e in events if e["method"] == "messages"]
    if wrong:
        assert blocks == []
        assert MARKER not in walk(events) + walk(response)
    else:
        assert [b["event"] for b in blocks] == [
            "message-start",
            "content-block-start",
            "content-block-delta",
            "content-block-finish",
            "message-finish",
        ]
        assert blocks[2]["delta"]["text"] == response.answer
        first = methods.index("messages")
        verified = [e["params"]["data"] for e in events[:first] if e["method"] == "updates"]
        assert [next(iter(u)) for u in verified][-2:] == ["verify", "assemble"]
        assert response.answer not in walk(events[:first])


@pytest.mark.parametrize("wrong", [False, True], ids=["passed", "escalated"])
def test_astream_events_v3(wrong, front_door):
    app, request, released = front_door(wrong)
    heard = Heard()

    async def main() -> tuple[list[Any], list[Any], list[str], Response]:
        run = await app.astream_events(request, {"callbacks": [heard]}, version="v3")
        assert isinstance(run, AsyncRequestStream)
        events = [e async for e in run]
        messages = [m async for m in run.messages]  # a projection replays the run
        texts = [await m.text for m in messages]
        return events, messages, texts, await run.output()

    events, messages, texts, response = asyncio.run(main())
    check_v3_events(events, response, wrong)
    assert set(heard.names) == {"on_chain_start", "on_custom_event", "on_chain_end"}
    if wrong:
        assert response.decision == "escalate" and messages == []
        assert MARKER not in walk(heard.carried)
    else:
        assert response.decision == "pass" and texts == [response.answer]
        assert released in texts[0]
        assert messages[0].node == "assemble"


@pytest.mark.parametrize("wrong", [False, True], ids=["passed", "escalated"])
def test_stream_events_v3(wrong, front_door):
    app, request, released = front_door(wrong)
    run = app.stream_events(request, version="v3")
    assert isinstance(run, RequestStream)
    with run:
        updates = list(run.updates)  # reading a projection drives the request
        events = list(run)
        messages = list(run.messages)
        custom = list(run.custom)
        values = list(run.values)
        response = run.output
    check_v3_events(events, response, wrong)
    assert [next(iter(u)) for u in updates][-1] == "response"
    assert values[-1]["response"] == response
    assert [c["data"]["stage"] for c in custom if c["name"] == STAGE_EVENT] == [
        s.name for s in app.steps
    ]
    if wrong:
        assert messages == []
    else:
        (message,) = messages
        assert list(message.text) == [response.answer]
        assert released in str(message.text)
        assert message.output.text == response.answer


def test_v3_output_alone_runs_the_request(front_door):
    app, request, _ = front_door(wrong=False)
    assert app.stream_events(request, version="v3").output.decision == "pass"

    async def main() -> Response:
        run = await app.astream_events(request, version="v3")
        return await run.output()

    assert asyncio.run(main()).decision == "pass"


# -- the hooks, errors, early stops, sync inside a running loop --------------------------------


def test_stream_modes_keep_the_call_hooks(make_pipeline):
    records: list[dict[str, Any]] = []
    stages: list[str] = []
    app = make_pipeline(scripted([f"{WITHHELD_RETURNS} [returns]"]), n_samples=2)
    chunks = sync_stream(
        app,
        QUESTION,
        stream_mode="updates",
        on_stage=lambda e: stages.append(str(e.stage)),
        record_sink=lambda r: records.append(r) or True,
    )
    assert stages == STAGES
    response = chunks[-1]["response"]
    assert response.audit_persisted is True and response.decision == "escalate"
    # the operator's record keeps the candidate the stream withheld
    (record,) = records
    assert MARKER in json.dumps(record, ensure_ascii=False)


def test_a_failed_request_raises_from_the_stream(make_pipeline):
    app = make_pipeline(scripted([GOOD]), n_samples=2, audit=None)
    with pytest.raises(InputError, match="question"):
        sync_stream(app, {"nothing": "here"}, stream_mode="updates")
    with pytest.raises(InputError, match="question"):
        async_stream(app, {"nothing": "here"}, stream_mode=["values", "custom"])
    run = app.stream_events({"nothing": "here"}, version="v3")
    with pytest.raises(InputError, match="question"):
        list(run.updates)
    with pytest.raises(InputError, match="question"):
        run.output  # noqa: B018  # the property is what raises

    async def main() -> None:
        run = await app.astream_events({"nothing": "here"}, version="v3")
        await run.output()

    with pytest.raises(InputError, match="question"):
        asyncio.run(main())


@pytest.mark.parametrize(
    ("options", "error", "says"),
    [
        ({"stream_mode": "tokens"}, ConfigurationError, "'values', 'updates', 'messages'"),
        ({"stream_mode": ["updates", "tokens"]}, ConfigurationError, "stream_mode='tokens'"),
        ({"stream_mode": "checkpoints"}, ConfigurationError, "keeps no checkpoints"),
        ({"stream_mode": "tasks"}, ConfigurationError, "task_result per stage"),
        ({"stream_mode": []}, ConfigurationError, "at least one mode"),
        ({"stream_mode": "updates", "subgraphs": "yes"}, ConfigurationError, "True or False"),
        ({"stream_mode": "updates", "version": "v3"}, ConfigurationError, "version='v3'"),
        ({"stream_mode": "updates", "durability": "sync"}, UnknownOptionError, "durability"),
    ],
)
@pytest.mark.parametrize("surface", list(STREAMS))
def test_bad_stream_options_are_refused_by_name(options, error, says, surface, make_pipeline):
    llm = scripted([GOOD])
    app = make_pipeline(llm, n_samples=2, audit=None)
    with pytest.raises(error, match=says) as caught:
        STREAMS[surface](app, QUESTION, **options)
    assert f"{surface}()" in str(caught.value)  # the caller's own method, not invoke()
    assert llm.calls == []  # refused before any work


def test_v3_takes_the_call_hooks_only(make_pipeline):
    app = make_pipeline(scripted([GOOD]), n_samples=2, audit=None)
    with pytest.raises(UnknownOptionError, match=r"stream_events\(\).*stream_mode"):
        app.stream_events(QUESTION, version="v3", stream_mode="updates")
    with pytest.raises(UnknownOptionError, match=r"astream_events\(\).*subgraphs"):
        app.astream_events(QUESTION, version="v3", subgraphs=True)
    # LangChain has no sync v1/v2 event stream, for any Runnable
    with pytest.raises(NotImplementedError):
        app.stream_events(QUESTION, version="v2")


class StalledRetriever(BaseRetriever):
    """A retriever that does not answer for a minute: a request is stopped while it waits."""

    entered: int = 0  # calls that are waiting (or waited): what a test waits on

    def _get_relevant_documents(self, query: str, *, run_manager: Any) -> list[Document]:
        raise AssertionError("the pipeline retrieves asynchronously")

    async def _aget_relevant_documents(self, query: str, *, run_manager: Any) -> list[Document]:
        self.entered += 1
        await asyncio.sleep(60)  # sleep is the behaviour: the stall the request is stopped in
        return []


def test_stopping_early_stops_the_request(caplog):
    """A caller that stops reading after the first stage, while the retriever still works: the
    request is cancelled at once on every surface; its record says so (no Response, the
    cancellation as its final error), and nothing is logged as a failure."""
    records: list[dict[str, Any]] = []
    app = RAGPipeline(
        StalledRetriever(),
        scripted([GOOD]),
        prompt_version="p1",
        model_version="scripted",
        n_samples=2,
        audit=lambda r: records.append(r) or True,
    )
    caplog.set_level(logging.WARNING)
    started = time.monotonic()

    stream = app.stream(QUESTION, stream_mode="updates")
    assert list(next(stream)) == ["register"]
    stream.close()
    with app.stream_events(QUESTION, version="v3") as run:
        first = next(iter(run.custom))
        assert first["data"]["stage"] == "register"

    async def main() -> None:
        chunks = app.astream(QUESTION, stream_mode="custom")
        first = await chunks.__anext__()
        assert first["data"]["stage"] == "register"
        await chunks.aclose()
        async with await app.astream_events(QUESTION, version="v3") as run:
            async for update in run.updates:
                assert list(update) == ["register"]
                break

    asyncio.run(asyncio.wait_for(main(), 10))
    assert time.monotonic() - started < 10  # nobody waited for the stalled retriever
    assert len(records) == 4
    for record in records:
        assert record["response"] is None and "retrieve" in record["timings"]
        assert [(e["stage"], e["type"]) for e in record["errors"]] == [
            ("request", "CancelledError")
        ]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_aborting_a_v3_run_stops_a_reader_waiting_on_a_stage(caplog):
    """``abort()`` from another task while a reader waits on the stalled retriever: the reader's
    loop ends with what it had, the request is cancelled at once and its record says so."""
    records: list[dict[str, Any]] = []
    stalled = StalledRetriever()
    app = RAGPipeline(
        stalled,
        scripted([GOOD]),
        prompt_version="p1",
        model_version="scripted",
        n_samples=2,
        audit=lambda r: records.append(r) or True,
    )
    caplog.set_level(logging.WARNING)

    async def main() -> list[dict[str, Any]]:
        run = await app.astream_events(QUESTION, version="v3")
        got: list[dict[str, Any]] = []

        async def reader() -> None:
            async for update in run.updates:
                got.append(update)

        reading = asyncio.ensure_future(reader())
        await await_until(lambda: got, "the first update")
        await await_until(lambda: stalled.entered, "the reader to wait on the retrieve stage")
        await run.abort()
        await asyncio.wait_for(reading, 5)
        return got

    started = time.monotonic()
    got = asyncio.run(main())
    assert time.monotonic() - started < 5
    assert [list(u) for u in got] == [["register"]]
    ((error,),) = [r["errors"] for r in records]
    assert error["type"] == "CancelledError" and records[0]["response"] is None
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_sync_stream_inside_a_running_loop(make_pipeline):
    """``stream`` called from async code (a sync helper in a notebook or an async server)."""
    app = make_pipeline(scripted([GOOD]), n_samples=2, audit=None)

    async def main() -> tuple[list[Any], Response]:
        chunks = list(app.stream(QUESTION, stream_mode=["updates", "messages"]))
        return chunks, app.stream_events(QUESTION, version="v3").output

    chunks, response = asyncio.run(main())
    assert response_of(chunks).decision == "pass" and response.decision == "pass"
    assert [m for m, _ in chunks].count("messages") == 1


def test_without_stream_mode_the_stream_is_the_response(front_door):
    app, request, _ = front_door(wrong=True)
    (chunk,) = sync_stream(app, request)
    (achunk,) = async_stream(app, request, stream_mode=None)
    assert isinstance(chunk, Response) and isinstance(achunk, Response)
    assert chunk.decision == achunk.decision == "escalate"


ZH_QUESTION = "笔记本电脑的保修期是多长？"
ZH_PLAN = '{"material_ids": ["warranty-zh"], "key_facts": ["24个月"]}'
ZH_GOOD = "笔记本电脑和平板电脑享受24个月保修。[warranty-zh]"
ZH_WITHHELD = "笔记本电脑享受终身保修，无需任何收据。[warranty-zh]"


@pytest.mark.parametrize("wrong", [False, True], ids=["passed", "escalated"])
def test_a_chinese_answer_streams_whole_once_verified(wrong, make_pipeline):
    llm = ScriptedChatModel(responses=[ZH_WITHHELD if wrong else ZH_GOOD], plan_responses=[ZH_PLAN])
    app = make_pipeline(llm, n_samples=2, audit=None)
    chunks = sync_stream(app, ZH_QUESTION, stream_mode=list(STREAM_MODES))
    run = app.stream_events(ZH_QUESTION, version="v3")
    events, texts, response = list(run), [str(m.text) for m in run.messages], run.output

    assert response_of(chunks).decision == response.decision
    messages = [c for m, c in chunks if m == "messages"]
    if wrong:
        assert response.decision == "escalate" and messages == [] and texts == []
        everything = walk(chunks) + walk(events)
        assert "终身保修" not in everything and "无需任何收据" not in everything
    else:
        assert response.decision == "pass"
        assert [m.content for m, _ in messages] == [ZH_GOOD] and texts == [ZH_GOOD]
        assert values_question(chunks) == ZH_QUESTION


def values_question(chunks: list[tuple[str, Any]]) -> str:
    return [c for m, c in chunks if m == "values"][-1]["question"]


def test_a_bound_and_configured_runnable_streams_the_same(make_pipeline):
    """``bind`` and ``with_config`` wrap the runnable in a ``RunnableBinding``: it hands the
    stream options, and the v3 call, to tracerag with the bound hooks."""
    records: list[dict[str, Any]] = []
    app = make_pipeline(scripted([GOOD]), n_samples=2)
    bound = app.bind(record_sink=lambda r: records.append(r) or True).with_config(run_name="mine")
    heard = Heard()
    chunks = list(bound.stream(QUESTION, {"callbacks": [heard]}, stream_mode=["updates"]))
    assert response_of(chunks).audit_persisted is True
    assert "mine" in heard.carried[0]
    assert bound.stream_events(QUESTION, version="v3").output.decision == "pass"

    async def main() -> Response:
        run = await bound.astream_events(QUESTION, version="v3")
        assert isinstance(run, AsyncRequestStream)
        return await run.output()

    assert asyncio.run(main()).audit_persisted is True
    assert len(records) == 3


def test_tier_low_says_its_released_answer_is_unverified(make_pipeline):
    app = make_pipeline(scripted([GOOD]), n_samples=1, tier="low", audit=None)
    ((message, metadata),) = sync_stream(app, QUESTION, stream_mode="messages")
    assert message.content == GOOD
    assert metadata["tracerag_status"] == "unverified"
    assert metadata["tracerag_decision"] == "pass"


def test_astream_events_v2_with_stream_modes_streams_their_chunks(front_door):
    app, request, _ = front_door(wrong=True)

    async def main() -> list[dict[str, Any]]:
        modes = list(STREAM_MODES)
        return [e async for e in app.astream_events(request, version="v2", stream_mode=modes)]

    events = asyncio.run(main())
    chunks = [e["data"]["chunk"] for e in events if e["event"] == "on_chain_stream"]
    assert {mode for mode, _ in chunks} == {"values", "updates", "custom", "debug"}
    (end,) = [e for e in events if e["event"] == "on_chain_end"]
    assert end["data"]["output"].decision == "escalate"
    assert response_of(chunks) == end["data"]["output"]
    assert MARKER not in walk(events)


def test_a_skipped_stage_writes_no_update_but_is_told(make_pipeline):
    app = make_pipeline(scripted([GOOD]), n_samples=2, tier="medium", audit=None)
    chunks = sync_stream(app, QUESTION, stream_mode=["updates", "values", "custom", "debug"])
    updates = [next(iter(c)) for m, c in chunks if m == "updates"]
    assert updates == ["register", "retrieve", "sample", "verify", "assemble", "response"]
    assert "plan" not in [c for m, c in chunks if m == "values"][-1]
    (told,) = [c["data"] for m, c in chunks if m == "custom" and c["data"].get("stage") == "plan"]
    assert told["skipped"] is True and told["signals"] == {}
    (task,) = [c["payload"] for m, c in chunks if m == "debug" and c["payload"]["name"] == "plan"]
    assert task["skipped"] is True and task["result"] == {} and task["error"] is None
