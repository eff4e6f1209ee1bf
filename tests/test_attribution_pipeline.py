"""Tiers 1 and 2 in a real request: the record, the spans, the Response, and the route."""

from __future__ import annotations

from pipeline_fixtures import FAST_RETRY, GOOD, QUESTION, scripted

from tracerag import RAGPipeline
from tracerag import _semconv as sc
from tracerag.contract import SCHEMA_VERSION, build_schema, response_schema, validate_response
from tracerag.demo.kb import build_retriever
from tracerag.testing import ScriptCall, ScriptedChatModel

INSTALL_Q = "How much does installation cost?"
INSTALL_ANSWER = (
    "Installation of a washing machine or dishwasher costs ¥199 per appliance. "
    "[appliance-installation]"
)
WARRANTY_Q = "How long is the warranty on a laptop?"
WARRANTY_ANSWER = (
    "Under Clause 6.1, laptops and tablets are covered by an extended 24-month warranty. [warranty]"
)


def _demo_pipeline(answer: str, spans, **options) -> tuple[RAGPipeline, ScriptedChatModel]:
    def respond(call: ScriptCall) -> str:
        return '{"material_ids": [], "key_facts": []}' if call.task == "plan" else answer

    llm = ScriptedChatModel(responder=respond)
    pipeline = RAGPipeline(
        build_retriever(k=4),
        llm,
        prompt_version="p",
        model_version="m",
        n_samples=3,
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
        audit=None,
        **options,
    )
    return pipeline, llm


def test_a_request_records_tiers_one_and_two_without_an_extra_model_call(make_pipeline, spans):
    captured: list[dict] = []
    llm = scripted([GOOD])
    pipeline = make_pipeline(llm, audit=lambda rec: captured.append(rec) or True)
    response = pipeline.invoke(QUESTION)
    assert llm.call_count == 1 + 5  # the plan and five samples: attribution adds no call

    by_id = {m.material_id: m for m in response.materials}
    assert by_id["returns"].used and by_id["returns"].reason == "cited_supported"
    assert by_id["returns"].role == "key" and by_id["returns"].share == 1.0
    assert by_id["returns-2019"].reason == "stale_or_superseded"
    assert by_id["shipping"].reason == "not_cited" and by_id["shipping"].role == "irrelevant"
    assert {m.material_id for m in response.materials} == {
        m["id"] for m in captured[0]["materials"]
    }
    validate_response(response)

    record = captured[0]
    attribution = record["signals"]["attribution"]
    assert attribution["key"] == ["returns"]
    assert attribution["retrieval"]["shape"] == record["retrieval"]["shape"]
    returns = next(m for m in attribution["materials"] if m["id"] == "returns")
    assert "return" in returns["shared_terms"]
    assert returns["prompt_position"] == returns["rank"]

    rid = response.request_id
    retrieve = spans.named(sc.SPAN_RETRIEVE, rid)[0].attributes
    assert retrieve[sc.RETRIEVAL_SHAPE] == record["retrieval"]["shape"]
    assemble = spans.named(sc.SPAN_ASSEMBLE, rid)[0]
    assert list(assemble.attributes[sc.ATTRIBUTION_KEY]) == ["returns"]
    assert attribution["span"]["span_id"] == f"{assemble.context.span_id:016x}"
    assert attribution["span"]["trace_id"] == response.trace_id


def test_a_clustered_retrieval_sends_a_passing_answer_to_review_when_enabled(spans):
    off, _ = _demo_pipeline(INSTALL_ANSWER, spans)
    passed = off.invoke(INSTALL_Q)
    assert passed.decision == "pass", passed.signal_detail
    on, _ = _demo_pipeline(INSTALL_ANSWER, spans, review_clustered_retrieval=True)
    flagged = on.invoke(INSTALL_Q)
    assert flagged.decision == "review" and flagged.status == "flagged_for_review"
    assert flagged.answer == passed.answer  # reviewed, not withheld
    assert flagged.confidence == passed.confidence
    assert on.escalation.tickets[-1].reasons[0].startswith("retrieval clustered")
    assemble = spans.named(sc.SPAN_ASSEMBLE, flagged.request_id)[0]
    assert assemble.attributes[sc.ROUTE_REASON].startswith("retrieval clustered")


def test_a_clear_retrieval_still_passes_with_the_option_on(spans):
    pipeline, _ = _demo_pipeline(WARRANTY_ANSWER, spans, review_clustered_retrieval=True)
    response = pipeline.invoke(WARRANTY_Q)
    assert response.decision == "pass", response.signal_detail
    retrieve = spans.named(sc.SPAN_RETRIEVE, response.request_id)[0].attributes
    assert retrieve[sc.RETRIEVAL_SHAPE] == "clear"


def test_the_relevance_floor_is_reported_per_material(spans):
    pipeline, _ = _demo_pipeline(WARRANTY_ANSWER, spans, relevance_floor=0.15)
    response = pipeline.invoke(WARRANTY_Q)
    reasons = {m.material_id: m.reason for m in response.materials}
    assert reasons["warranty"] == "cited_supported"
    scores = {m.material_id: m.score for m in response.materials}
    for mid, reason in reasons.items():
        if mid != "warranty":
            expected = "below_relevance_floor" if scores[mid] < 0.15 else "not_cited"
            assert reason == expected, (mid, scores[mid])
    assert "below_relevance_floor" in reasons.values()


def test_the_shipped_schema_is_the_generated_one_at_the_new_version():
    shipped = response_schema()
    assert shipped == build_schema()
    assert shipped["version"] == SCHEMA_VERSION == "1.2"
    assert "materials" in shipped["properties"]
    assert "materials" not in shipped["required"]  # optional: older callers keep working


def test_low_tier_reports_no_materials_summary_because_nothing_was_verified(make_pipeline):
    response = make_pipeline(scripted([GOOD]), tier="low").invoke(QUESTION)
    assert response.materials == []


def test_wrapped_chains_resolve_positional_citations_and_prompt_positions(retriever, spans):
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnablePassthrough

    from tracerag import wrap

    def numbered(docs):
        return "\n".join(f"[{i}] {d.page_content}" for i, d in enumerate(docs, 1))

    def cite_by_position(call: ScriptCall) -> str:
        for line in call.prompt.splitlines():
            if line.startswith("[") and "30 days" in line:
                n = line[1 : line.index("]")]
                return f"Customers may return unused items within 30 days of delivery. [{n}]"
        return "I cannot tell."

    llm = ScriptedChatModel(responder=cite_by_position, model_name="scripted-w")
    chain = (
        {"context": retriever | numbered, "question": RunnablePassthrough()}
        | ChatPromptTemplate.from_template("Context:\n{context}\n\nQuestion: {question}")
        | llm
        | StrOutputParser()
    )
    wrapped = wrap(chain, n_samples=2, retry=FAST_RETRY, tracer_provider=spans.provider, audit=None)
    response = wrapped.invoke(QUESTION)
    (marker,) = response.claims[0].cited_ids
    assert marker.isdigit()  # cited as [n] ...
    by_id = {m.material_id: m for m in response.materials}
    assert by_id["returns"].used and by_id["returns"].role == "key"  # ... attributed to its id
    assert by_id["returns"].position == int(marker)  # its place in that run's prompt
    assert sorted(m.position for m in response.materials) == list(
        range(1, len(response.materials) + 1)
    )
