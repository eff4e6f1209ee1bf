"""RunCapture: what one run of a real LangChain app did, from its callbacks."""

from __future__ import annotations

import asyncio

import pytest
from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder, PromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableLambda

from tracerag import _semconv as sc
from tracerag.prompts import fingerprint
from tracerag.telemetry._content_capture import set_capture_content
from tracerag.testing import ScriptedChatModel
from tracerag.wrapping._capture import (
    RunCapture,
    model_call_attributes,
    prompt_text,
    serialized_prompt_text,
)

DOCS = [
    Document(page_content="Returns within 30 days.", id="returns"),
    Document(page_content="Shipping is free over $50.", id="shipping"),
]


class ListRetriever(BaseRetriever):
    """Returns a fixed list of documents."""

    docs: list[Document]

    def _get_relevant_documents(self, query, *, run_manager):
        return list(self.docs)


class OuterRetriever(BaseRetriever):
    """A retriever that calls another one (as multi-query and compressing retrievers do)."""

    inner: BaseRetriever

    def _get_relevant_documents(self, query, *, run_manager):
        raise NotImplementedError

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ):
        docs = await self.inner.ainvoke(query, config={"callbacks": run_manager.get_child()})
        return docs[:1]


def run(chain, value):
    capture = RunCapture()
    output = asyncio.run(chain.ainvoke(value, config={"callbacks": [capture]}))
    return capture, output


def test_prompt_templates_fingerprint_as_in_the_chain():
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Context: {context}"), MessagesPlaceholder("chat_history"), ("human", "{q}")]
    )
    llm = ScriptedChatModel(responses=["30 days"], model_name="m1")
    capture, _ = run(prompt | llm, {"context": "c", "chat_history": [], "q": "How long?"})
    assert capture.prompt_texts == [prompt_text(prompt)]
    assert capture.prompt_version == fingerprint(prompt_text(prompt))
    plain = PromptTemplate.from_template("Answer {q}")
    assert serialized_prompt_text(plain._serialized) == prompt_text(plain)


def test_serialized_non_prompts_give_no_text():
    assert serialized_prompt_text(None) is None
    assert serialized_prompt_text({"lc": 1, "type": "not_implemented", "id": ["x"]}) is None
    llm = ScriptedChatModel()
    assert serialized_prompt_text(llm.to_json()) is None


def test_model_calls_name_params_messages_output_and_usage():
    prompt = ChatPromptTemplate.from_messages([("system", "Be brief."), ("human", "{q}")])
    llm = ScriptedChatModel(responses=["Thirty days."], model_name="m1", temperature=0.4)
    capture, output = run(prompt | llm | StrOutputParser(), {"q": "How long?"})
    assert output == "Thirty days."
    call = capture.last_call
    assert call.name == "m1"
    assert call.temperature == 0.4
    assert [m.type for m in call.messages] == ["system", "human"]
    assert call.output == "Thirty days."
    # the scripted model reports what it read and wrote, counted as tracerag.usage estimates
    from tracerag._usage import estimate_tokens

    read = sum(estimate_tokens(str(m.content)) for m in call.messages)
    assert call.output_tokens == estimate_tokens("Thirty days.") > 0
    assert call.input_tokens == read > 0
    assert capture.token_usage == {"input_tokens": read, "output_tokens": call.output_tokens}
    assert capture.invocation_params["ls_provider"]


def test_two_model_calls_are_both_kept_and_the_last_answers():
    rephrase = ScriptedChatModel(responses=["standalone question"], model_name="small")
    answer = ScriptedChatModel(responses=["final answer"], model_name="large")
    chain = rephrase | StrOutputParser() | answer | StrOutputParser()
    capture, _ = run(chain, "q")
    assert [c.name for c in capture.model_calls] == ["small", "large"]
    assert capture.model_names == ["small", "large"]
    assert capture.last_call.output == "final answer"
    from tracerag._usage import estimate_tokens

    written = estimate_tokens("standalone question") + estimate_tokens("final answer")
    assert capture.token_usage["output_tokens"] == written  # both calls counted


def test_retrieved_documents_nested_retrievers_counted_once():
    outer = OuterRetriever(inner=ListRetriever(docs=DOCS))
    capture, docs = run(outer, "q")
    assert docs == DOCS[:1]
    assert capture.documents == DOCS[:1]
    capture, _ = run(RunnableLambda(lambda q: q) | ListRetriever(docs=DOCS), "q")
    assert capture.documents == DOCS


def test_reset_forgets_a_failed_attempt():
    capture, _ = run(ListRetriever(docs=DOCS), "q")
    capture.reset()
    assert capture.documents == []
    assert capture.model_calls == []
    assert capture.prompt_texts == []


@pytest.fixture
def capture_policy():
    yield set_capture_content
    set_capture_content(None)


def test_model_span_attributes_follow_the_capture_policy(capture_policy):
    prompt = ChatPromptTemplate.from_messages([("system", "Be brief."), ("human", "{q}")])
    llm = ScriptedChatModel(responses=["Thirty days."], model_name="m1")
    capture, _ = run(prompt | llm, {"q": "How long?"})
    assert capture.last_prompt_text == prompt_text(prompt)
    attrs = model_call_attributes(capture.last_call, "v1", capture.last_prompt_text)
    assert attrs[sc.OI_PROMPT_TEMPLATE_VERSION] == "v1"
    assert "HumanMessagePromptTemplate:{q}" in attrs[sc.OI_PROMPT_TEMPLATE]
    assert attrs[sc.oi_input_message(1, "role")] == "human"
    assert attrs[sc.oi_input_message(1, "content")] == "How long?"
    assert attrs[sc.oi_output_message(0, "content")] == "Thirty days."
    capture_policy(False)
    hidden = model_call_attributes(capture.last_call, "v1", capture.last_prompt_text)
    assert sc.OI_PROMPT_TEMPLATE not in hidden
    assert hidden[sc.oi_input_message(1, "role")] == "human"
    assert sc.oi_input_message(1, "content") not in hidden
    assert sc.oi_output_message(0, "content") not in hidden
    assert hidden[sc.OI_PROMPT_TEMPLATE_VERSION] == "v1"
    assert model_call_attributes(None, None) == {}
