"""A conversation's follow-up is verified as the standalone question it asks.

The defect: "How long is the warranty on a laptop?" then "And for a phone?", answered
correctly ("All new devices carry a 12-month warranty … [warranty]"), went to review at
confidence 1.0: relevance saw only "And for a phone?", and the answer never says "phone".
These tests reproduce it (the turn on its own), then show the follow-up passing when the
request carries its conversation: RAGPipeline's ``chat_history``, wrap() of a ``create_agent``
agent over two turns with a checkpointer (the thread's earlier turns) and without (the whole
conversation in ``messages``), and a ``RunnableWithMessageHistory`` session; in English and
Chinese. An off-topic answer to a follow-up still loses relevance, a standalone follow-up is
left as it is, and the record and the spans keep both the raw turn and the standalone question.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.tools import tool
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import RunnableLambda
from langchain_core.runnables.history import RunnableWithMessageHistory
from langchain_core.vectorstores import InMemoryVectorStore
from langgraph.checkpoint.memory import InMemorySaver
from pipeline_fixtures import FAST_RETRY

from tracerag import RAGPipeline, TraceragMiddleware, wrap
from tracerag import _semconv as sc
from tracerag.demo.kb import HashingEmbeddings
from tracerag.errors import ConfigurationError, InputError
from tracerag.testing import ScriptCall, ScriptedChatModel, ToolCallingChatModel

N = 3
PLAN = '{"material_ids": ["warranty"], "key_facts": []}'

# Each language: the two documents, the two turns, the correct answers and an off-topic one.
TALKS: dict[str, dict[str, Any]] = {
    "en": {
        "documents": [
            Document(
                page_content=(
                    "All new devices carry a 12-month warranty from the date of delivery. "
                    "Laptops and tablets are covered by an extended 24-month warranty."
                ),
                metadata={"id": "warranty", "title": "Standard warranty"},
            ),
            Document(
                page_content="Standard shipping costs $5 for orders under $50.",
                metadata={"id": "shipping", "title": "Shipping fees"},
            ),
        ],
        "first": "How long is the warranty on a laptop?",
        "follow_up": "And for a phone?",
        "standalone": "How long is the warranty for a phone?",
        "first_answer": (
            "Laptops and tablets are covered by an extended 24-month warranty. [warranty]"
        ),
        "answer": "All new devices carry a 12-month warranty from the date of delivery. [warranty]",
        "off_topic": "Standard shipping costs $5 for orders under $50. [shipping]",
    },
    "zh": {
        "documents": [
            Document(
                page_content="所有新设备自签收之日起享受12个月保修。笔记本电脑和平板电脑享受24个月延长保修。",
                metadata={"id": "warranty", "title": "保修政策"},
            ),
            Document(
                page_content="订单满50元包邮，不满50元收取运费5元。",
                metadata={"id": "shipping", "title": "运费"},
            ),
        ],
        "first": "笔记本电脑的保修期是多久？",
        "follow_up": "那手机呢？",
        "standalone": "手机的保修期是多久？",
        "first_answer": "笔记本电脑和平板电脑享受24个月延长保修。[warranty]",
        "answer": "所有新设备自签收之日起享受12个月保修。[warranty]",
        "off_topic": "订单满50元包邮，不满50元收取运费5元。[shipping]",
    },
}


def keep(records: list[dict[str, Any]]):
    return lambda record: records.append(record) or True


def store_of(talk: dict[str, Any]) -> InMemoryVectorStore:
    docs = talk["documents"]
    return InMemoryVectorStore.from_documents(
        docs, embedding=HashingEmbeddings.fit(d.page_content for d in docs)
    )


def replies(talk: dict[str, Any], follow_up_answer: str):
    """A responder that answers the first turn, then the follow-up, as the prompt shows."""

    def respond(call: ScriptCall) -> str:
        # the pipeline shows the model the standalone question, an app the turn itself
        asked = talk["follow_up"] in call.prompt or talk["standalone"] in call.prompt
        return follow_up_answer if asked else talk["first_answer"]

    return respond


def pipeline_for(talk: dict[str, Any], answer: str, spans, records) -> RAGPipeline:
    llm = ScriptedChatModel(responder=replies(talk, answer), plan_responses=[PLAN])
    return RAGPipeline(
        store_of(talk).as_retriever(search_kwargs={"k": 2}),
        llm,
        prompt_version="conversation-v1",
        model_version=llm.model_name,
        n_samples=N,
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
        audit=keep(records),
    )


def llm_calls(pipeline: RAGPipeline) -> list[ScriptCall]:
    llm = pipeline.settings.llm
    assert isinstance(llm, ScriptedChatModel)
    return llm.calls


def history_of(talk: dict[str, Any]) -> list[Any]:
    return [("human", talk["first"]), ("ai", talk["first_answer"])]


# -- RAGPipeline: chat_history -----------------------------------------------------------------


@pytest.mark.parametrize("lang", list(TALKS))
def test_the_follow_up_on_its_own_goes_to_review_as_before(lang, spans):
    talk = TALKS[lang]
    records: list[dict[str, Any]] = []
    response = pipeline_for(talk, talk["answer"], spans, records).invoke(talk["follow_up"])
    assert response.decision == "review" and response.confidence >= 0.85  # the defect
    assert response.signal_detail.answers_question is False
    assert records[-1]["standalone_question"] is None and records[-1]["conversation"] is None


@pytest.mark.parametrize("lang", list(TALKS))
def test_a_correct_follow_up_with_its_history_passes(lang, spans):
    talk = TALKS[lang]
    records: list[dict[str, Any]] = []
    pipeline = pipeline_for(talk, talk["answer"], spans, records)
    response = pipeline.invoke({"question": talk["follow_up"], "chat_history": history_of(talk)})
    assert response.decision == "pass", response.signal_detail.relevance
    assert response.signal_detail.answers_question is True
    assert "12" in (response.answer or "")  # the phone's answer, not the laptop's
    record = records[-1]
    assert record["question"] == talk["follow_up"]  # the raw turn
    assert record["standalone_question"] == talk["standalone"]
    assert record["conversation"] == {
        "source": "chat_history",
        "resolution": "substituted",
        "earlier_turns": 1,
        "earlier_questions": [talk["first"]],
    }
    # the model was asked the standalone question (the pipeline shows it no history)
    assert talk["standalone"] in llm_calls(pipeline)[-1].prompt
    register = spans.named(sc.SPAN_REGISTER, response.request_id)[0]
    assert register.attributes[sc.OI_INPUT_VALUE] == talk["follow_up"]
    assert register.attributes[sc.QUESTION_STANDALONE] == talk["standalone"]
    assert register.attributes[sc.QUESTION_RESOLUTION] == "substituted"
    assert register.attributes[sc.CONVERSATION_TURNS] == 1
    root = spans.root(response.request_id)
    assert root.attributes[sc.QUESTION_STANDALONE] == talk["standalone"]
    assert root.attributes[sc.OI_INPUT_VALUE] == talk["follow_up"]


@pytest.mark.parametrize("lang", list(TALKS))
def test_an_off_topic_answer_to_a_follow_up_still_loses_relevance(lang, spans):
    talk = TALKS[lang]
    records: list[dict[str, Any]] = []
    pipeline = pipeline_for(talk, talk["off_topic"], spans, records)
    response = pipeline.invoke({"question": talk["follow_up"], "chat_history": history_of(talk)})
    assert response.decision == "review"
    assert response.signal_detail.answers_question is False
    assert response.signal_detail.relevance["reason"].startswith(
        "the answer does not address the question"
    )
    assert records[-1]["standalone_question"] == talk["standalone"]
    # the reviewer's ticket asks the question the turn asks
    assert pipeline.escalation.tickets[-1].question == talk["standalone"]


STANDALONE_FOLLOW_UPS = {"en": "How much does standard shipping cost?", "zh": "运费是多少？"}


@pytest.mark.parametrize("lang", list(TALKS))
def test_a_standalone_follow_up_is_left_as_it_is(lang, spans):
    talk = TALKS[lang]
    turn = STANDALONE_FOLLOW_UPS[lang]
    records: list[dict[str, Any]] = []
    llm = ScriptedChatModel(responses=[talk["off_topic"]], plan_responses=[PLAN])
    pipeline = RAGPipeline(
        store_of(talk).as_retriever(search_kwargs={"k": 2}),
        llm,
        prompt_version="conversation-v1",
        model_version=llm.model_name,
        n_samples=N,
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
        audit=keep(records),
    )
    response = pipeline.invoke({"question": turn, "chat_history": history_of(talk)})
    assert response.decision == "pass"
    assert records[-1]["question"] == records[-1]["standalone_question"] == turn
    assert records[-1]["conversation"]["resolution"] == "standalone"


@pytest.mark.parametrize(
    ("history", "message"),
    [
        ("How long is the warranty?", "chat_history must be a list of chat messages"),
        ([{"role": "wizard", "content": "hi"}], "not a list of chat messages LangChain can read"),
        ([("human", "\ud800 hi")], "not valid Unicode"),
    ],
)
def test_a_chat_history_that_cannot_be_read_is_refused(history, message, spans):
    talk = TALKS["en"]
    pipeline = pipeline_for(talk, talk["answer"], spans, [])
    with pytest.raises(InputError, match=message):
        pipeline.invoke({"question": talk["follow_up"], "chat_history": history})


# -- a configured rewriter (LangChain's history-aware pattern) -----------------------------------

CONTEXTUALIZE = ChatPromptTemplate.from_messages(
    [
        ("system", "Rewrite the latest user question as a standalone question."),
        MessagesPlaceholder("chat_history"),
        ("human", "{input}"),
    ]
)


def test_a_configured_rewriter_gives_the_standalone_question(spans):
    talk = TALKS["en"]
    rewriter_model = ScriptedChatModel(responses=["What is the warranty period of a phone?"])
    records: list[dict[str, Any]] = []
    llm = ScriptedChatModel(responder=replies(talk, talk["answer"]), plan_responses=[PLAN])
    pipeline = RAGPipeline(
        store_of(talk).as_retriever(search_kwargs={"k": 2}),
        llm,
        prompt_version="conversation-v1",
        model_version=llm.model_name,
        n_samples=N,
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
        audit=keep(records),
        question_rewriter=CONTEXTUALIZE | rewriter_model | StrOutputParser(),
    )
    on_its_own = pipeline.invoke(talk["follow_up"])
    assert on_its_own.decision == "review"
    assert rewriter_model.calls == []  # a request on its own needs no rewriting
    response = pipeline.invoke({"question": talk["follow_up"], "chat_history": history_of(talk)})
    assert response.decision == "pass", response.signal_detail.relevance
    [call] = rewriter_model.calls
    # the rewriter saw the earlier turn and the turn, as a history-aware chain does
    assert talk["first"] in call.prompt and talk["follow_up"] in call.prompt
    record = records[-1]
    assert record["question"] == talk["follow_up"]
    assert record["standalone_question"] == "What is the warranty period of a phone?"
    assert record["conversation"]["resolution"] == "rewriter"


def test_a_failing_rewriter_is_recorded_and_the_turn_resolved_without_it(spans, caplog):
    talk = TALKS["zh"]

    def broken(_: dict[str, Any]) -> str:
        raise RuntimeError("rewriter model unavailable")

    records: list[dict[str, Any]] = []
    llm = ScriptedChatModel(responder=replies(talk, talk["answer"]), plan_responses=[PLAN])
    pipeline = RAGPipeline(
        store_of(talk).as_retriever(search_kwargs={"k": 2}),
        llm,
        prompt_version="conversation-v1",
        model_version=llm.model_name,
        n_samples=N,
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
        audit=keep(records),
        question_rewriter=RunnableLambda(broken),
    )
    response = pipeline.invoke({"question": talk["follow_up"], "chat_history": history_of(talk)})
    assert response.decision == "pass"
    conversation = records[-1]["conversation"]
    assert conversation["resolution"] == "substituted"
    assert conversation["rewriter_error"] == "RuntimeError: rewriter model unavailable"
    assert records[-1]["standalone_question"] == talk["standalone"]
    assert "question rewriter failed" in caplog.text


def test_a_rewriter_that_answers_no_text_is_recorded(spans):
    talk = TALKS["en"]
    records: list[dict[str, Any]] = []
    llm = ScriptedChatModel(responder=replies(talk, talk["answer"]), plan_responses=[PLAN])
    pipeline = RAGPipeline(
        store_of(talk).as_retriever(search_kwargs={"k": 2}),
        llm,
        prompt_version="conversation-v1",
        model_version=llm.model_name,
        n_samples=N,
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
        audit=keep(records),
        question_rewriter=RunnableLambda(lambda _: {"not": "text"}),
    )
    response = pipeline.invoke({"question": talk["follow_up"], "chat_history": history_of(talk)})
    assert response.decision == "pass"
    conversation = records[-1]["conversation"]
    assert conversation["resolution"] == "substituted"
    assert conversation["rewriter_error"] == (
        "UnreadableOutputError: the rewriter returned no question text (dict)"
    )


def test_a_rewriter_that_is_not_a_runnable_is_refused():
    with pytest.raises(ConfigurationError, match="question_rewriter must be a LangChain Runnable"):
        RAGPipeline(
            store_of(TALKS["en"]).as_retriever(),
            ScriptedChatModel(responses=["x"]),
            prompt_version="conversation-v1",
            model_version="scripted-chat-model",
            question_rewriter=lambda turn: turn,  # type: ignore[typeddict-item]
        )


# -- wrap(): an agent over two turns, with a checkpointer and without --------------------------


def agent_for(talk: dict[str, Any], **kwargs: Any):
    """LangChain's RAG agent over the talk's documents (a ``content_and_artifact`` tool)."""
    store = store_of(talk)

    @tool(response_format="content_and_artifact")
    def retrieve_context(query: str):
        """Retrieve information to help answer a query."""
        docs = store.similarity_search(query, k=2)
        serialized = "\n\n".join(f"Source: {d.metadata}\nContent: {d.page_content}" for d in docs)
        return serialized, docs

    model = ToolCallingChatModel(
        responder=replies(talk, talk["answer"]), model_name="tool-model-1", temperature=0.7
    )
    return create_agent(
        model,
        [retrieve_context],
        system_prompt="Use the tool to answer; cite each source you use by its id.",
        **kwargs,
    )


@pytest.mark.parametrize("lang", list(TALKS))
def test_a_checkpointed_agent_s_follow_up_passes(lang, spans):
    talk = TALKS[lang]
    records: list[dict[str, Any]] = []
    agent = agent_for(talk, checkpointer=InMemorySaver())
    wrapped = wrap(
        agent, n_samples=N, retry=FAST_RETRY, tracer_provider=spans.provider, audit=keep(records)
    )
    config = {"configurable": {"thread_id": f"customer-{lang}"}}
    first = wrapped.invoke({"messages": [("user", talk["first"])]}, config)
    assert first.decision == "pass"
    assert records[-1]["conversation"] is None  # nothing before the first turn
    second = wrapped.invoke({"messages": [("user", talk["follow_up"])]}, config)
    assert second.decision == "pass", second.signal_detail.relevance
    assert second.signal_detail.answers_question is True
    assert "12" in (second.answer or "")
    record = records[-1]
    assert record["question"] == talk["follow_up"]
    assert record["standalone_question"] == talk["standalone"]
    assert record["conversation"]["source"] == "thread"
    assert record["conversation"]["earlier_questions"] == [talk["first"]]
    register = spans.named(sc.SPAN_REGISTER, second.request_id)[0]
    assert register.attributes[sc.OI_INPUT_VALUE] == talk["follow_up"]
    assert register.attributes[sc.QUESTION_STANDALONE] == talk["standalone"]
    assert register.attributes[sc.CONVERSATION_SOURCE] == "thread"


@pytest.mark.parametrize("lang", list(TALKS))
def test_an_agent_given_the_whole_conversation_passes_the_follow_up(lang, spans):
    talk = TALKS[lang]
    records: list[dict[str, Any]] = []
    wrapped = wrap(
        agent_for(talk),
        n_samples=N,
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
        audit=keep(records),
    )
    messages = [
        HumanMessage(talk["first"]),
        AIMessage(talk["first_answer"]),
        HumanMessage(talk["follow_up"]),
    ]
    response = wrapped.invoke({"messages": messages})
    assert response.decision == "pass", response.signal_detail.relevance
    record = records[-1]
    assert record["question"] == talk["follow_up"]
    assert record["standalone_question"] == talk["standalone"]
    assert record["conversation"]["source"] == "messages"


def test_an_agent_s_off_topic_follow_up_goes_to_review(spans):
    talk = dict(TALKS["en"])
    talk["answer"] = talk["off_topic"]
    agent = agent_for(talk, checkpointer=InMemorySaver())
    wrapped = wrap(agent, n_samples=N, retry=FAST_RETRY, tracer_provider=spans.provider)
    config = {"configurable": {"thread_id": "off-topic"}}
    assert wrapped.invoke({"messages": [("user", talk["first"])]}, config).decision == "pass"
    second = wrapped.invoke({"messages": [("user", talk["follow_up"])]}, config)
    assert second.decision == "review"
    assert second.signal_detail.answers_question is False


@pytest.mark.parametrize("lang", list(TALKS))
def test_a_follow_up_through_the_middleware_on_a_checkpointed_thread_passes(lang, spans):
    talk = TALKS[lang]
    records: list[dict[str, Any]] = []
    guard = TraceragMiddleware(
        n_samples=N, retry=FAST_RETRY, tracer_provider=spans.provider, audit=keep(records)
    )
    agent = agent_for(talk, checkpointer=InMemorySaver(), middleware=[guard])
    config = {"configurable": {"thread_id": f"middleware-{lang}"}}
    first = agent.invoke({"messages": [("user", talk["first"])]}, config)
    assert first["tracerag"]["decision"] == "pass"
    assert records[-1]["conversation"] is None
    second = agent.invoke({"messages": [("user", talk["follow_up"])]}, config)
    response = second["tracerag"]
    assert response["decision"] == "pass", response["signal_detail"]["relevance"]
    assert "12" in (response["answer"] or "")
    record = records[-1]
    assert record["question"] == talk["follow_up"]
    assert record["standalone_question"] == talk["standalone"]
    assert record["conversation"]["source"] == "messages"
    assert record["conversation"]["earlier_questions"] == [talk["first"]]


def test_an_off_topic_follow_up_through_the_middleware_goes_to_review(spans):
    talk = dict(TALKS["en"])
    talk["answer"] = talk["off_topic"]
    guard = TraceragMiddleware(n_samples=N, retry=FAST_RETRY, tracer_provider=spans.provider)
    agent = agent_for(talk, checkpointer=InMemorySaver(), middleware=[guard])
    config = {"configurable": {"thread_id": "middleware-off-topic"}}
    first = agent.invoke({"messages": [("user", talk["first"])]}, config)["tracerag"]
    assert first["decision"] == "pass"
    second = agent.invoke({"messages": [("user", talk["follow_up"])]}, config)["tracerag"]
    assert second["decision"] == "review"
    assert second["signal_detail"]["answers_question"] is False


# -- wrap(): RunnableWithMessageHistory ---------------------------------------------------------


def history_app(talk: dict[str, Any], get_session_history: Any) -> RunnableWithMessageHistory:
    """An LCEL RAG chain with its history, as LangChain's message-history guide writes it."""
    retriever = store_of(talk).as_retriever(search_kwargs={"k": 2})
    prompt = ChatPromptTemplate.from_messages(
        [
            ("system", "Answer from the context; cite each passage by its [id].\n\n{context}"),
            MessagesPlaceholder("history"),
            ("human", "{input}"),
        ]
    )

    def cited(docs: list[Document]) -> str:
        return "\n\n".join(f"[{d.metadata['id']}] {d.page_content}" for d in docs)

    llm = ScriptedChatModel(responder=replies(talk, talk["answer"]), temperature=0.7)
    chain = (
        {
            "context": itemgetter("input") | retriever | cited,
            "input": itemgetter("input"),
            "history": itemgetter("history"),
        }
        | prompt
        | llm
        | StrOutputParser()
    )
    return RunnableWithMessageHistory(
        chain, get_session_history, input_messages_key="input", history_messages_key="history"
    )


@pytest.mark.filterwarnings("ignore::langchain_core._api.deprecation.LangChainDeprecationWarning")
def test_a_message_history_session_s_follow_up_passes(spans):
    talk = TALKS["en"]
    sessions: dict[str, InMemoryChatMessageHistory] = {}

    def get_session_history(session_id: str) -> InMemoryChatMessageHistory:
        return sessions.setdefault(session_id, InMemoryChatMessageHistory())

    records: list[dict[str, Any]] = []
    wrapped = wrap(
        history_app(talk, get_session_history),
        prompt_version="history-v1",
        n_samples=N,
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
        audit=keep(records),
    )
    config = {"configurable": {"session_id": "s-1"}}
    assert wrapped.invoke({"input": talk["first"]}, config).decision == "pass"
    second = wrapped.invoke({"input": talk["follow_up"]}, config)
    assert second.decision == "pass", second.signal_detail.relevance
    record = records[-1]
    assert record["standalone_question"] == talk["standalone"]
    assert record["conversation"]["source"] == "history"
    assert set(record["conversation"]["earlier_questions"]) == {talk["first"]}


@pytest.mark.filterwarnings("ignore::langchain_core._api.deprecation.LangChainDeprecationWarning")
def test_a_history_that_cannot_be_read_is_recorded_and_the_turn_answered(spans, caplog):
    talk = TALKS["en"]

    reads: list[int] = []

    class FlakyHistory(InMemoryChatMessageHistory):
        """A session store that fails the first read (tracerag's), then works (the app's)."""

        async def aget_messages(self):
            reads.append(1)
            if len(reads) == 1:
                raise ConnectionError("session store unavailable")
            return await super().aget_messages()

    history = FlakyHistory()
    records: list[dict[str, Any]] = []
    wrapped = wrap(
        history_app(talk, lambda session_id: history),
        prompt_version="history-v1",
        n_samples=N,
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
        audit=keep(records),
    )
    response = wrapped.invoke({"input": talk["first"]}, {"configurable": {"session_id": "s"}})
    assert response.decision == "pass"
    conversation = records[-1]["conversation"]
    assert conversation["read_error"] == "ConnectionError: session store unavailable"
    assert conversation["source"] == "history" and conversation["earlier_turns"] == 0
    assert "cannot read the app's conversation" in caplog.text


# -- the server: POST /v1/answer with chat_history ----------------------------------------------


@pytest.mark.parametrize("lang", list(TALKS))
def test_the_server_answers_a_follow_up_with_its_history(lang, spans, tmp_path):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient
    from server_fixtures import make_app, make_store

    talk = TALKS[lang]
    store = make_store(tmp_path)
    try:
        pipeline = pipeline_for(talk, talk["answer"], spans, [])
        history = [
            {"role": "user", "content": talk["first"]},
            {"role": "assistant", "content": talk["first_answer"]},
        ]
        with TestClient(make_app(store, pipeline)) as client:
            alone = client.post("/v1/answer", json={"question": talk["follow_up"]})
            reply = client.post(
                "/v1/answer", json={"question": talk["follow_up"], "chat_history": history}
            )
            bad = client.post(
                "/v1/answer",
                json={"question": talk["follow_up"], "chat_history": [{"role": "wizard"}]},
            )
        assert alone.status_code == 200 and alone.json()["decision"] == "review"
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["decision"] == "pass"
        record = store.get(body["request_id"]).record
        assert record["question"] == talk["follow_up"]
        assert record["standalone_question"] == talk["standalone"]
        assert record["conversation"]["source"] == "chat_history"
        assert bad.status_code == 422 and bad.json()["error"] == "invalid_input"
    finally:
        store.close()


def test_wrap_takes_tracerag_s_own_request_with_its_chat_history(spans):
    """``{"question", "chat_history"}`` given to an app that takes messages (as the server
    gives it): the app gets the question, the history is the conversation it follows."""
    talk = TALKS["en"]
    records: list[dict[str, Any]] = []
    wrapped = wrap(
        agent_for(talk),
        n_samples=N,
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
        audit=keep(records),
    )
    response = wrapped.invoke({"question": talk["follow_up"], "chat_history": history_of(talk)})
    assert response.decision == "pass", response.signal_detail.relevance
    assert records[-1]["standalone_question"] == talk["standalone"]
    assert records[-1]["conversation"]["source"] == "chat_history"


def test_the_desk_shows_the_reviewer_the_question_a_follow_up_asks(spans, tmp_path):
    pytest.importorskip("fastapi")
    import html

    from fastapi.testclient import TestClient
    from server_fixtures import make_app, make_store, sign_in

    talk = TALKS["en"]
    store = make_store(tmp_path)
    try:
        pipeline = pipeline_for(talk, talk["off_topic"], spans, [])
        history = [{"role": "user", "content": talk["first"]}]
        with TestClient(make_app(store, pipeline)) as client:
            reply = client.post(
                "/v1/answer", json={"question": talk["follow_up"], "chat_history": history}
            )
            assert reply.json()["decision"] == "review"
            sign_in(client)
            page = client.get(f"/review/items/{reply.json()['request_id']}")
        assert page.status_code == 200
        text = html.unescape(page.text)
        assert talk["follow_up"] in text  # the turn as the user wrote it
        assert 'id="standalone-question"' in page.text
        assert talk["standalone"] in text and talk["first"] in text
    finally:
        store.close()


def test_a_long_history_is_read_and_recorded_from_its_last_turns(spans):
    from tracerag._state import MAX_EARLIER_TURNS

    talk = TALKS["en"]
    records: list[dict[str, Any]] = []
    pipeline = pipeline_for(talk, talk["answer"], spans, records)
    history = [("human", f"Question number {i}?") for i in range(100)] + history_of(talk)
    response = pipeline.invoke({"question": talk["follow_up"], "chat_history": history})
    assert response.decision == "pass"
    conversation = records[-1]["conversation"]
    assert conversation["earlier_turns"] == MAX_EARLIER_TURNS
    assert conversation["earlier_questions"][-1] == talk["first"]
    assert records[-1]["standalone_question"] == talk["standalone"]


@pytest.mark.parametrize("lang", list(TALKS))
def test_the_pipeline_takes_a_chat_input_of_messages(lang, spans):
    talk = TALKS[lang]
    records: list[dict[str, Any]] = []
    pipeline = pipeline_for(talk, talk["answer"], spans, records)
    messages = [*history_of(talk), {"role": "user", "content": talk["follow_up"]}]
    response = pipeline.invoke({"messages": messages, "channel": "chat"})
    assert response.decision == "pass", response.signal_detail.relevance
    record = records[-1]
    assert record["question"] == talk["follow_up"] and record["channel"] == "chat"
    assert record["standalone_question"] == talk["standalone"]
    assert record["conversation"]["source"] == "messages"
    one = pipeline.invoke({"messages": [HumanMessage(talk["first"])]})
    assert records[-1]["question"] == talk["first"] and records[-1]["conversation"] is None
    assert one.decision == "pass"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"messages": [("ai", "Hello, how can I help?")]}, "holds no user message"),
        ({"messages": [("human", "Hi")], "question": "Hi"}, "not both"),
        ({"messages": [("human", "Hi")], "chat_history": []}, "not both"),
        ({"messages": "Hi there"}, "must be a list of chat messages"),
    ],
)
def test_a_chat_input_that_cannot_be_read_is_refused(value, message, spans):
    pipeline = pipeline_for(TALKS["en"], TALKS["en"]["answer"], spans, [])
    with pytest.raises(InputError, match=message):
        pipeline.invoke(value)
