"""wrap() around the RAG apps people have, each left unchanged (the apps: ``wrap_apps``).

Each passes a well-cited answer, escalates a fabricated citation, and gives the same six-stage
trace with the materials its runs retrieved.
"""

from __future__ import annotations

import operator
import sys
from typing import Annotated, TypedDict

import pytest
from langchain_core.documents import Document
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, PromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import (
    ConfigurableField,
    RunnableBranch,
    RunnableLambda,
    RunnablePassthrough,
)
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.errors import InvalidUpdateError
from langgraph.graph import START, StateGraph
from pipeline_fixtures import FAST_RETRY, POLICIES, REPO
from wrap_apps import (
    APPS,
    FOLLOW_UP,
    HISTORY,
    QUESTION,
    RAG_PROMPT,
    STANDALONE,
    K,
    State,
    cite_returns,
    conversational_chain,
    expected_ids,
    fabricate,
    lcel_chain,
    numbered,
    retrieval_chain,
    tutorial_graph,
)

from tracerag import MissingVersionError, validate_response, wrap
from tracerag import _semconv as sc
from tracerag.demo.kb import DemoVectorStore, HashingEmbeddings, build_vectorstore
from tracerag.testing import ScriptedChatModel, tracerag_name
from tracerag.wrapping._inspect import graph_nodes


@pytest.fixture
def store():
    docs = [Document(page_content=d.page_content, metadata=dict(d.metadata)) for d in POLICIES]
    return build_vectorstore(docs)


@pytest.mark.parametrize("name", list(APPS))
def test_well_cited_answer_passes(name, store, spans):
    build, request = APPS[name]
    llm = ScriptedChatModel(responder=cite_returns, model_name="scripted-x", temperature=0.7)
    wrapped = wrap(
        build(store, llm),
        n_samples=3,
        min_samples=3,
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
    )
    response = wrapped.invoke(request)
    validate_response(response.model_dump(mode="json"))
    assert response.decision == "pass", (response.signal_detail, response.warnings)
    assert response.answer.startswith("Customers may return unused items within 30 days")
    assert response.evidence[0].material_id == "returns"
    assert response.evidence[0].title == "Returns and refunds"
    assert response.versions.model == "scripted-x"
    assert response.versions.prompt.startswith("sha256:")
    assert response.signal_detail.samples_ok == 3


@pytest.mark.parametrize("name", list(APPS))
def test_fabricated_citation_escalates(name, store, spans):
    build, request = APPS[name]
    llm = ScriptedChatModel(responder=fabricate, model_name="scripted-x")
    records: list[dict] = []
    wrapped = wrap(
        build(store, llm),
        n_samples=2,
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
        audit=records.append,
    )
    response = wrapped.invoke(request)
    assert response.decision == "escalate"
    assert response.answer is None
    assert "fabricated citation" in response.signal_detail.confidence_caps
    assert response.signal_detail.fabricated_citations == []  # the withheld answer's own text
    kept = records[0]["response"]["signal_detail"]  # the operator's copy
    assert kept["fabricated_citations"] == ["policy-99"]


@pytest.mark.parametrize("name", list(APPS))
def test_same_six_stage_trace_with_the_retrieved_materials(name, store, spans):
    build, request = APPS[name]
    llm = ScriptedChatModel(responder=cite_returns, model_name="scripted-x")
    wrapped = wrap(
        build(store, llm),
        n_samples=3,
        min_samples=3,
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
    )
    response = wrapped.invoke(request)
    rid = response.request_id
    assert spans.tree_problems(rid) == []
    root = spans.root(rid)
    assert [tracerag_name(c) for c in spans.children(root)] == [
        sc.SPAN_REGISTER,
        sc.SPAN_RETRIEVE,
        sc.SPAN_SAMPLE,
        sc.SPAN_PLAN,
        sc.SPAN_VERIFY,
        sc.SPAN_ASSEMBLE,
    ]
    retrieve = spans.named(sc.SPAN_RETRIEVE, rid)[0].attributes
    sample = spans.named(sc.SPAN_SAMPLE, rid)[0].attributes
    # what the runs retrieved is on the trace: never "0 materials" when they retrieved K
    assert sample[sc.RETRIEVAL_COUNT] == K
    assert sorted(sample[sc.RETRIEVAL_MATERIAL_IDS]) == sorted(expected_ids(store))
    if sc.RETRIEVAL_COUNT in retrieve:  # a retriever was found in the app and called up front
        assert retrieve[sc.RETRIEVAL_COUNT] == K
        assert retrieve[sc.RETRIEVAL_SCORED] is True
    else:  # the app retrieves inside its nodes: the retrieve span says where materials come from
        assert retrieve[sc.RETRIEVAL_SOURCE] == "runs"
    generations = spans.named(sc.SPAN_SAMPLE_ONE, rid)
    assert len(generations) == 3
    for g in generations:
        attrs = g.attributes
        assert attrs[sc.OI_LLM_MODEL_NAME] == "scripted-x"
        assert attrs[sc.OI_PROMPT_TEMPLATE_VERSION] == response.versions.prompt
        assert "{context}" in attrs[sc.OI_PROMPT_TEMPLATE]
        # the sample's text is on its span once, as the output message (no output.value copy)
        assert "30 days" in attrs[sc.oi_output_message(0, "content")]
        assert sc.OI_OUTPUT_VALUE not in attrs
        last = max(int(k.split(".")[2]) for k in attrs if k.startswith("llm.input_messages."))
        assert "30 days" in "".join(
            str(attrs.get(sc.oi_input_message(i, "content"), "")) for i in range(last + 1)
        )
    plan = spans.named(sc.SPAN_PLAN, rid)[0].attributes
    assert list(plan[sc.PLAN_MATERIAL_IDS]) == ["returns"]


def test_conversational_history_reaches_the_model(store, spans):
    llm = ScriptedChatModel(responder=cite_returns, model_name="scripted-x")
    wrapped = wrap(
        conversational_chain(store, llm),
        n_samples=2,
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
    )
    request = {"input": FOLLOW_UP, "chat_history": HISTORY}
    response = wrapped.invoke(request)
    assert response.decision == "pass"
    answering = [c for c in llm.calls if STANDALONE not in c.prompt]
    assert len(answering) == 2
    assert all("I bought headphones last week." in c.prompt for c in answering)
    assert request["chat_history"] == HISTORY  # the caller's input is left as it was


class Formatted(TypedDict):
    question: str
    context: str  # the documents, already formatted: the state holds no Document
    answer: str


def test_graph_retrieving_with_a_retriever_inside_a_node(store, spans):
    """Materials come from the retriever's callbacks when the state keeps no documents."""
    llm = ScriptedChatModel(responder=cite_returns, model_name="scripted-x")
    retriever = store.as_retriever(search_kwargs={"k": K})

    async def retrieve(state: Formatted):
        return {"context": numbered(await retriever.ainvoke(state["question"]))}

    async def generate(state: Formatted):
        messages = await RAG_PROMPT.ainvoke(
            {"question": state["question"], "context": state["context"]}
        )
        return {"answer": (await llm.ainvoke(messages)).content}

    builder = StateGraph(Formatted).add_sequence([retrieve, generate])
    builder.add_edge(START, "retrieve")
    wrapped = wrap(
        builder.compile(),
        n_samples=3,
        min_samples=3,
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
    )
    response = wrapped.invoke(QUESTION)
    assert response.decision == "pass", response.signal_detail
    assert response.evidence[0].material_id == "returns"
    sample = spans.named(sc.SPAN_SAMPLE, response.request_id)[0].attributes
    assert sample[sc.RETRIEVAL_COUNT] == K
    assert sorted(sample[sc.RETRIEVAL_MATERIAL_IDS]) == sorted(expected_ids(store))


def test_graph_versions_are_learned_from_the_runs(store, spans):
    llm = ScriptedChatModel(responder=cite_returns, model_name="scripted-graph")
    graph = tutorial_graph(store, llm)
    wrapped = wrap(graph, n_samples=2, retry=FAST_RETRY, tracer_provider=spans.provider)
    # inspecting the graph finds nothing: prompt and model live inside the node functions
    assert wrapped.settings.prompt_version is None
    assert wrapped.settings.model_version is None
    response = wrapped.invoke({"question": QUESTION})
    assert response.versions.model == "scripted-graph"
    # the same fingerprint wrap() gives the prompt when it is a visible part of a chain
    lcel = wrap(RAG_PROMPT | llm | StrOutputParser())
    assert response.versions.prompt == lcel.settings.prompt_version
    root = spans.root(response.request_id).attributes
    assert root[sc.VERSION_PROMPT] == response.versions.prompt
    register = spans.named(sc.SPAN_REGISTER, response.request_id)[0].attributes
    assert list(register[sc.VERSION_FROM_RUNS]) == ["prompt", "model"]


class Plain(TypedDict):
    question: str
    answer: str


def formatted_graph(llm, template: str):
    """A graph whose prompt is built with ``str.format`` inside its node: no LangChain template."""

    def generate(state: Plain):
        return {"answer": llm.invoke(template.format(question=state["question"])).content}

    builder = StateGraph(Plain).add_sequence([generate])
    builder.add_edge(START, "generate")
    return builder.compile()


def test_a_prompt_built_with_format_is_versioned_by_what_reached_the_model(store, spans):
    llm = ScriptedChatModel(responder=cite_returns, model_name="scripted-x")
    records: list[dict] = []
    wrapped = wrap(
        formatted_graph(llm, "Answer briefly: {question}"),
        n_samples=1,
        audit=records.append,
        tracer_provider=spans.provider,
    )
    first = wrapped.invoke({"question": QUESTION})
    second = wrapped.invoke({"question": "How long is the warranty on a laptop?"})
    # the question is masked out: the same prompt gives the same version for every question
    assert first.versions.prompt == second.versions.prompt
    assert first.versions.prompt.startswith("sha256:")
    assert first.versions.model == "scripted-x"
    assert records[0]["versions"]["prompt_source"] == "model-input"
    assert records[0]["versions"]["model_source"] == "run"
    sample = spans.named(sc.SPAN_SAMPLE, first.request_id)[0].attributes
    assert sample[sc.VERSION_PROMPT_SOURCE] == "model-input"
    # a changed prompt is a new version
    other = wrap(formatted_graph(llm, "Answer in one line: {question}"), n_samples=1, audit=None)
    assert other.invoke({"question": QUESTION}).versions.prompt != first.versions.prompt
    # a given version is used as it is, and the record says so
    given = wrap(
        formatted_graph(llm, "Answer briefly: {question}"),
        prompt_version="p1",
        n_samples=1,
        audit=records.append,
    ).invoke({"question": QUESTION})
    assert given.versions.prompt == "p1"
    assert records[-1]["versions"]["prompt_source"] == "argument"


def rule_graph(store):
    """A graph that answers without any model: there is no prompt to fingerprint."""

    def retrieve(state: State):
        return {"context": store.similarity_search(state["question"], k=K)}

    def generate(state: State):
        first = state["context"][0].page_content.split(".")[0]
        return {"answer": f"{first}. [1]"}

    builder = StateGraph(State).add_sequence([retrieve, generate])
    builder.add_edge(START, "retrieve")
    return builder.compile()


def test_a_graph_without_any_model_call_is_refused_naming_the_argument(store, spans):
    wrapped = wrap(rule_graph(store), n_samples=1, tracer_provider=spans.provider)
    with pytest.raises(MissingVersionError, match=r"pass prompt_version= to wrap\(\)") as info:
        wrapped.invoke({"question": QUESTION})
    assert "made no model call" in str(info.value)
    assert "pass model_version= to wrap()" in str(info.value)
    roots = spans.named(sc.SPAN_REQUEST)
    assert len(roots) == 1
    assert roots[0].attributes[sc.REQUEST_ID]  # a refused request's root carries its id
    response = wrap(
        rule_graph(store), prompt_version="p1", model_version="rule-1", n_samples=1
    ).invoke({"question": QUESTION})
    assert (response.versions.prompt, response.versions.model) == ("p1", "rule-1")


def test_a_request_refused_for_versions_keeps_what_its_runs_did(store, spans):
    """The refusal comes after the runs: the record shows their samples and materials."""
    records: list[dict] = []
    wrapped = wrap(
        rule_graph(store),
        model_version="rule-1",
        n_samples=2,
        audit=records.append,
        tracer_provider=spans.provider,
    )
    with pytest.raises(MissingVersionError, match=r"pass prompt_version= to wrap\(\)"):
        wrapped.invoke({"question": QUESTION})
    (record,) = records
    assert record["errors"][-1]["type"] == "MissingVersionError"
    assert record["params"]["versions_from_runs"] == ["prompt"]
    assert record["versions"]["model"] == "rule-1"
    assert record["versions"]["model_source"] == "argument"
    assert record["versions"]["prompt"] is None
    assert sorted(m["id"] for m in record["materials"]) == sorted(expected_ids(store))
    assert record["retrieval"]["source"] == "runs"
    assert record["retrieval"]["count"] == K
    answers = [s["answer"] for s in record["samples"]]
    assert len(answers) == 2 and all(a.endswith("[1]") for a in answers)
    sample = spans.named(sc.SPAN_SAMPLE)[0]
    assert sample.attributes[sc.RETRIEVAL_COUNT] == K
    assert sample.status.status_code.name == "ERROR"


def test_a_bare_question_goes_in_the_field_the_app_takes(store, spans):
    llm = ScriptedChatModel(responder=cite_returns, model_name="scripted-x")
    for build in (tutorial_graph, retrieval_chain):
        wrapped = wrap(
            build(store, llm), n_samples=2, retry=FAST_RETRY, tracer_provider=spans.provider
        )
        assert wrapped.invoke(QUESTION).decision == "pass"


def test_tracerags_request_dict_works_for_apps_that_take_a_string_or_another_field(store, spans):
    """``{"question", "session_id", …}`` is accepted by every app, as by RAGPipeline."""
    llm = ScriptedChatModel(responder=cite_returns, model_name="scripted-x")
    for build in (lcel_chain, retrieval_chain, tutorial_graph):
        records: list[dict] = []
        wrapped = wrap(
            build(store, llm),
            n_samples=2,
            retry=FAST_RETRY,
            audit=records.append,
            tracer_provider=spans.provider,
        )
        response = wrapped.invoke({"question": QUESTION, "session_id": "s-9"})
        assert response.decision == "pass", (build.__name__, response.signal_detail)
        assert records[0]["session_id"] == "s-9"


class Topic(TypedDict):
    topic: str
    context: list[Document]
    answer: str


def topic_graph(store, llm):
    def retrieve(state: Topic):
        return {"context": store.similarity_search(state["topic"], k=K)}

    def generate(state: Topic):
        messages = RAG_PROMPT.invoke(
            {"question": state["topic"], "context": numbered(state["context"])}
        )
        return {"answer": llm.invoke(messages).content}

    builder = StateGraph(Topic).add_sequence([retrieve, generate])
    builder.add_edge(START, "retrieve")
    return builder.compile()


def test_graph_given_the_wrong_input_fails_once_not_three_times(store, spans):
    """A deterministic graph error is not retried: one attempt per sample, error kept."""
    llm = ScriptedChatModel(responder=cite_returns, model_name="scripted-x")
    wrapped = wrap(
        topic_graph(store, llm),
        prompt_version="p1",
        model_version="m1",
        n_samples=2,
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
    )
    response = wrapped.invoke(QUESTION)  # a bare string, and no field tracerag knows to put it in
    assert response.decision == "escalate"
    assert response.signal_detail.samples_ok == 0
    assert llm.call_count == 0
    generations = spans.named(sc.SPAN_SAMPLE_ONE, response.request_id)
    assert [g.attributes[sc.SAMPLE_ATTEMPTS] for g in generations] == [1, 1]
    assert all(InvalidUpdateError.__name__ in g.attributes[sc.SAMPLE_ERROR] for g in generations)
    # naming the question's field makes a bare string work, and finds it in a dict
    keyed = wrap(
        topic_graph(store, llm),
        input_key="topic",
        n_samples=2,
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
    )
    assert keyed.invoke(QUESTION).decision == "pass"
    assert keyed.invoke({"topic": QUESTION}).decision == "pass"


def test_document_ids_and_titles_come_from_the_store(spans):
    """Documents without a metadata id are known by their ``Document.id``; titles by metadata."""
    docs = [
        Document(page_content=d.page_content, metadata={"title": d.metadata["title"]})
        for d in POLICIES
    ]
    store = DemoVectorStore(embedding=HashingEmbeddings.fit(d.page_content for d in docs))
    store.add_documents(docs)  # the store gives each document an id (a UUID)
    llm = ScriptedChatModel(responder=cite_returns, model_name="scripted-x")
    response = wrap(
        tutorial_graph(store, llm), n_samples=2, retry=FAST_RETRY, tracer_provider=spans.provider
    ).invoke({"question": QUESTION})
    assert response.decision == "pass"
    retrieved = store.similarity_search(QUESTION, k=K)
    returns_id = next(d.id for d in retrieved if "30 days" in d.page_content)
    assert response.evidence[0].material_id == returns_id
    assert len(returns_id) == 36
    assert response.evidence[0].title == "Returns and refunds"
    sample = spans.named(sc.SPAN_SAMPLE, response.request_id)[0].attributes
    assert sc.oi_document(0, "id") in sample
    assert "doc-" not in " ".join(sample[sc.RETRIEVAL_MATERIAL_IDS])


def test_graph_retriever_argument_scores_the_materials(store, spans):
    llm = ScriptedChatModel(responder=cite_returns, model_name="scripted-x")
    wrapped = wrap(
        tutorial_graph(store, llm),
        retriever=store.as_retriever(search_kwargs={"k": K}),
        n_samples=2,
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
    )
    response = wrapped.invoke({"question": QUESTION})
    assert response.decision == "pass"
    retrieve = spans.named(sc.SPAN_RETRIEVE, response.request_id)[0].attributes
    assert retrieve[sc.RETRIEVAL_SCORED] is True
    assert retrieve[sc.RETRIEVAL_COUNT] == K
    assert retrieve[sc.RETRIEVAL_TOP_SCORE] > 0


# -- sampling a graph: independent runs, run-once nodes, checkpointed conversations -------------


class Notes(TypedDict):
    question: str
    context: list[Document]
    answer: str
    turns: Annotated[list[str], operator.add]


def test_run_once_node_runs_in_one_sample_only(store, spans):
    llm = ScriptedChatModel(responder=cite_returns, model_name="scripted-x")
    sent: list[str] = []

    def notify(state: State):
        sent.append(state["answer"])
        return {}

    wrapped = wrap(
        tutorial_graph(store, llm, extra_nodes=[notify]),
        run_once=["notify"],
        n_samples=3,
        min_samples=3,
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
    )
    response = wrapped.invoke({"question": QUESTION})
    assert response.decision == "pass"
    assert response.signal_detail.samples_ok == 3
    assert llm.call_count == 3
    assert len(sent) == 1


def test_run_once_by_node_metadata(store, spans):
    llm = ScriptedChatModel(responder=cite_returns, model_name="scripted-x")
    sent: list[str] = []

    def retrieve(state: State):
        return {"context": store.similarity_search(state["question"], k=K)}

    def generate(state: State):
        messages = RAG_PROMPT.invoke(
            {"question": state["question"], "context": numbered(state["context"])}
        )
        return {"answer": llm.invoke(messages).content}

    def notify(state: State):
        sent.append(state["answer"])
        return {}

    builder = StateGraph(State)
    builder.add_node("retrieve", retrieve)
    builder.add_node("generate", generate)
    builder.add_node("notify", notify, metadata={"tracerag_run_once": True})
    builder.add_edge(START, "retrieve")
    builder.add_edge("retrieve", "generate")
    builder.add_edge("generate", "notify")
    graph = builder.compile()
    response = wrap(
        graph, n_samples=3, min_samples=3, retry=FAST_RETRY, tracer_provider=spans.provider
    ).invoke({"question": QUESTION})
    assert response.decision == "pass"
    assert len(sent) == 1
    assert graph.checkpointer is None  # the user's graph is left as it was


def test_checkpointed_graph_samples_on_forks_and_keeps_the_conversation(store, spans):
    llm = ScriptedChatModel(responder=cite_returns, model_name="scripted-x")

    def remember(state: Notes):
        return {"turns": [state["question"]]}

    saver = InMemorySaver()

    def retrieve(state: Notes):
        return {"context": store.similarity_search(state["question"], k=K)}

    def generate(state: Notes):
        messages = RAG_PROMPT.invoke(
            {"question": state["question"], "context": numbered(state["context"])}
        )
        return {"answer": llm.invoke(messages).content}

    builder = StateGraph(Notes).add_sequence([remember, retrieve, generate])
    builder.add_edge(START, "remember")
    graph = builder.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "customer-7"}}
    graph.invoke({"question": "Hello"}, config)  # an earlier turn, without tracerag

    wrapped = wrap(
        graph, n_samples=3, min_samples=3, retry=FAST_RETRY, tracer_provider=spans.provider
    )
    response = wrapped.invoke({"question": QUESTION}, config)
    assert response.decision == "pass"
    assert response.signal_detail.samples_ok == 3
    # the caller's thread moved on by one turn, as it would without tracerag
    assert graph.get_state(config).values["turns"] == ["Hello", QUESTION]
    # the forks saw the earlier turn, and are gone afterwards
    threads = {c.config["configurable"]["thread_id"] for c in saver.list(None)}
    assert threads == {"customer-7"}


def test_samples_of_a_graph_do_not_share_state(store, spans):
    """Each run gets its own copy of the input: a node that mutates it affects one run."""
    llm = ScriptedChatModel(responder=cite_returns, model_name="scripted-x")
    seen: list[int] = []

    class Mutable(TypedDict):
        question: str
        context: list[Document]
        answer: str
        scratch: list

    def retrieve(state: Mutable):
        state["scratch"].append("x")  # a node mutating its input in place
        seen.append(len(state["scratch"]))
        return {"context": store.similarity_search(state["question"], k=K)}

    def generate(state: Mutable):
        messages = RAG_PROMPT.invoke(
            {"question": state["question"], "context": numbered(state["context"])}
        )
        return {"answer": llm.invoke(messages).content}

    builder = StateGraph(Mutable).add_sequence([retrieve, generate])
    builder.add_edge(START, "retrieve")
    scratch: list = []
    response = wrap(
        builder.compile(),
        n_samples=3,
        min_samples=3,
        sampling="app",
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
    ).invoke({"question": QUESTION, "scratch": scratch})
    assert response.decision == "pass"
    assert seen == [1, 1, 1]  # three whole runs, each on its own copy of the input
    assert scratch == []
    seen.clear()
    response = wrap(
        builder.compile(),
        n_samples=3,
        min_samples=3,
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
    ).invoke({"question": QUESTION, "scratch": scratch})
    assert response.decision == "pass"
    assert seen == [1]  # the default: the app runs once and its answering step is forked
    assert scratch == []


def test_the_langgraph_example_runs(spans, monkeypatch):
    import importlib.util

    path = REPO / "examples" / "wrap_langgraph_app.py"
    spec = importlib.util.spec_from_file_location("wrap_langgraph_app", path)
    example = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, example)  # LangGraph reads the state's types
    spec.loader.exec_module(example)
    wrapped = wrap(
        example.build_graph(), n_samples=3, min_samples=3, tracer_provider=spans.provider
    )
    response = wrapped.invoke({"question": "How long is the warranty on a laptop?"})
    assert response.decision == "pass", response.signal_detail
    assert response.versions.model == "tracerag-extractive-1"
    assert "24" in response.answer


def drawn_parts(nodes):
    """The prompts, models and retrievers among graph node data, in order."""
    kinds = (ChatPromptTemplate, PromptTemplate, ScriptedChatModel, BaseRetriever)
    return [data for data in nodes if isinstance(data, kinds)]


def test_the_chain_walk_finds_what_get_graph_draws(store):
    llm = ScriptedChatModel(responder=cite_returns, model_name="scripted-x")
    other = ScriptedChatModel(responder=fabricate, model_name="scripted-y")
    retriever = store.as_retriever(search_kwargs={"k": K})

    def ask(question):
        return llm.invoke(RAG_PROMPT.invoke({"question": question, "context": ""}))

    apps = [build(store, llm) for build, _ in APPS.values()]
    apps += [
        RunnableLambda(ask) | StrOutputParser(),
        RAG_PROMPT | llm.bind(stop=["\n"]),
        (RAG_PROMPT | llm).with_fallbacks([RAG_PROMPT | other]),
        RunnableBranch((lambda x: bool(x), retriever), RAG_PROMPT | llm),
        RAG_PROMPT | llm.configurable_alternatives(ConfigurableField(id="m"), other=other),
        retriever.map(),
        RunnablePassthrough.assign(context=retriever) | RAG_PROMPT | llm.with_retry(),
    ]
    for app in apps:
        drawn = [node.data for node in app.get_graph().nodes.values()]
        assert drawn_parts(graph_nodes(app)) == drawn_parts(drawn), app
    assert drawn_parts(graph_nodes(apps[4])) == [RAG_PROMPT, llm]
