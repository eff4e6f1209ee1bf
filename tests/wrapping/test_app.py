"""wrap() around a chain written the standard LCEL way, unchanged."""

from __future__ import annotations

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableLambda, RunnablePassthrough
from pipeline_fixtures import (
    FAST_RETRY,
    QUESTION,
    TEMPLATE,
    format_docs,
    positional_answer,
    standard_chain,
)

from tracerag import MissingVersionError, validate_response, wrap
from tracerag import _semconv as sc
from tracerag.testing import ScriptedChatModel


def test_wrap_standard_chain_learns_versions_and_verifies(retriever, spans):
    llm = ScriptedChatModel(responder=positional_answer, model_name="scripted-x", temperature=0.7)
    chain = standard_chain(retriever, llm)
    wrapped = wrap(
        chain, n_samples=3, min_samples=3, retry=FAST_RETRY, tracer_provider=spans.provider
    )
    response = wrapped.invoke(QUESTION)
    validate_response(response.model_dump(mode="json"))
    assert response.versions.model == "scripted-x"
    assert response.versions.prompt.startswith("sha256:")
    assert response.decision == "pass", response.signal_detail
    assert response.evidence[0].material_id == "returns"
    assert response.claims[0].cited_ids[0].isdigit()
    assert spans.tree_problems(response.request_id) == []
    root = spans.root(response.request_id)
    assert root.attributes[sc.MODE] == "wrap"
    generation = spans.named(sc.SPAN_SAMPLE_ONE, response.request_id)[0].attributes
    assert generation[sc.GENAI_REQUEST_TEMPERATURE] == 0.7
    assert generation[sc.OI_LLM_MODEL_NAME] == "scripted-x"
    plan = spans.named(sc.SPAN_PLAN, response.request_id)[0].attributes
    assert list(plan[sc.PLAN_MATERIAL_IDS]) == ["returns"]
    assert plan[sc.PLAN_SOURCE] == "wrap"
    # three answers; the chain's retriever was searched once, by the retrieve stage
    assert llm.call_count == 3


def test_prompt_fingerprint_is_stable_and_changes_with_the_prompt(retriever):
    llm = ScriptedChatModel(responder=positional_answer)
    a = wrap(standard_chain(retriever, llm)).settings.prompt_version
    b = wrap(standard_chain(retriever, llm)).settings.prompt_version
    other = (
        {"context": retriever | format_docs, "question": RunnablePassthrough()}
        | ChatPromptTemplate.from_template(TEMPLATE + " Be brief.")
        | llm
        | StrOutputParser()
    )
    assert a == b
    assert wrap(other).settings.prompt_version != a


def test_wrap_fabricated_position_is_escalated(retriever, spans):
    llm = ScriptedChatModel(responses=["Returns are accepted for 30 days. [42]"])
    records: list[dict] = []
    response = wrap(
        standard_chain(retriever, llm),
        n_samples=2,
        tracer_provider=spans.provider,
        audit=records.append,
    ).invoke(QUESTION)
    assert response.decision == "escalate"
    assert response.answer is None
    assert "fabricated citation" in response.signal_detail.confidence_caps
    assert response.signal_detail.fabricated_citations == []  # the withheld answer's own text
    assert records[0]["response"]["signal_detail"]["fabricated_citations"] == ["42"]


def test_wrap_temperature_zero_warns_and_is_uninformative(retriever, spans, caplog):
    llm = ScriptedChatModel(responder=positional_answer, temperature=0.0)
    with caplog.at_level("WARNING", logger="tracerag.wrapping"):
        wrapped = wrap(
            standard_chain(retriever, llm),
            n_samples=3,
            min_samples=3,
            tracer_provider=spans.provider,
        )
        response = wrapped.invoke(QUESTION)
    assert "temperature 0" in caplog.text
    assert response.signal_detail.consistency_informative is False
    assert any("temperature 0" in w for w in response.warnings)
    sample_span = spans.named(sc.SPAN_SAMPLE, response.request_id)[0]
    assert sample_span.attributes[sc.TEMPERATURE_ZERO] is True


def test_wrap_refuses_when_versions_cannot_be_determined(retriever):
    # no prompt template and no chat model inside: nothing to fingerprint or name
    chain = RunnableLambda(lambda q: "Returns within 30 days. [1]")
    with pytest.raises(MissingVersionError):
        wrap(chain).invoke(QUESTION)
    response = wrap(chain, prompt_version="p1", model_version="m1", n_samples=1).invoke(QUESTION)
    assert response.decision == "escalate"  # [1] names nothing that was retrieved


def test_wrap_retries_a_failing_chain_then_answers(retriever, spans):
    llm = ScriptedChatModel(responder=positional_answer, fail_first=2)
    response = wrap(
        standard_chain(retriever, llm),
        n_samples=1,
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
    ).invoke(QUESTION)
    assert response.signal_detail.samples_ok == 1
    assert llm.call_count == 3


class FlakyRetriever(BaseRetriever):
    """Fails on its first call (the retrieve stage's), then answers like the store behind it."""

    inner: BaseRetriever
    calls: int = 0

    def _get_relevant_documents(self, query, *, run_manager):
        self.calls += 1
        if self.calls == 1:
            raise ConnectionError("vector store down")
        return self.inner.invoke(query)


async def test_wrap_keeps_a_sample_that_fails_for_good_with_its_error(retriever, spans):
    records: list[dict] = []
    llm = ScriptedChatModel(responder=positional_answer, always_fail=True)
    wrapped = wrap(
        standard_chain(retriever, llm),
        n_samples=2,
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
        audit=records.append,
    )
    response = await wrapped.ainvoke(QUESTION)
    assert response.decision == "escalate" and response.answer is None
    assert response.signal_detail.samples_failed == 2
    samples = spans.named(sc.SPAN_SAMPLE_ONE, response.request_id)
    assert len(samples) == 2
    for span in samples:
        assert span.attributes[sc.SAMPLE_OK] is False
        assert "ScriptedModelError" in span.attributes[sc.SAMPLE_ERROR]
        assert span.attributes[sc.SAMPLE_ATTEMPTS] == FAST_RETRY.attempts
    (record,) = records
    final = [e for e in record["errors"] if e.get("final")]
    assert sorted(e["sample"] for e in final) == [0, 1]
    assert all(e["stage"] == "sample" for e in final)
    retried = [e for e in record["errors"] if e.get("retried")]
    assert len(retried) == 2 * (FAST_RETRY.attempts - 1)


async def test_wrap_a_failing_retrieval_is_kept_and_the_runs_materials_are_cited(retriever, spans):
    records: list[dict] = []
    flaky = FlakyRetriever(inner=retriever)
    llm = ScriptedChatModel(responder=positional_answer, temperature=0.7)
    wrapped = wrap(
        standard_chain(flaky, llm),
        n_samples=2,
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
        audit=records.append,
    )
    response = await wrapped.ainvoke(QUESTION)
    (record,) = records
    retrieve_errors = [e for e in record["errors"] if e["stage"] == "retrieve"]
    assert [e["type"] for e in retrieve_errors] == ["ConnectionError"]
    # the retrieve stage found nothing; what the chain's own runs retrieved can be cited
    assert record["retrieval"]["count"] == 0
    assert "returns" in record["retrieval"]["added_from_runs"]
    assert [m["rank"] for m in record["materials"]] == list(range(1, len(record["materials"]) + 1))
    assert response.decision == "pass" and response.evidence[0].material_id == "returns"
    sample_stage = spans.named(sc.SPAN_SAMPLE, response.request_id)[0]
    assert "returns" in sample_stage.attributes[sc.RETRIEVAL_MATERIAL_IDS]


class CountingRetriever(BaseRetriever):
    """A retriever that counts its searches (it has no vector store of its own to score by)."""

    inner: BaseRetriever
    calls: int = 0

    def _get_relevant_documents(self, query, *, run_manager):
        self.calls += 1
        return self.inner.invoke(query)


@pytest.mark.parametrize(
    ("sampling", "searches", "runs"),
    [("answer", 1, ["app", "fork", "fork"]), ("app", 4, ["app", "private", "private"])],
)
def test_a_chain_retrieves_once_and_samples_its_answer(retriever, spans, sampling, searches, runs):
    counting = CountingRetriever(inner=retriever)
    llm = ScriptedChatModel(responder=positional_answer, model_name="scripted-x", temperature=0.7)
    seen = []

    class Roots(BaseCallbackHandler):
        def on_chain_start(self, serialized, inputs, *, parent_run_id=None, **kwargs):
            if parent_run_id is None:
                seen.append(inputs)

    wrapped = wrap(
        standard_chain(counting, llm),
        n_samples=3,
        min_samples=3,
        sampling=sampling,
        tracer_provider=spans.provider,
    )
    response = wrapped.invoke(QUESTION, config={"callbacks": [Roots()]})
    assert response.decision == "pass", response.signal_detail
    # answer: the retrieve stage's search is the one the app's run gets, and the other samples
    # run the model step on the input it was given; app: each run searches too
    assert counting.calls == searches
    assert llm.call_count == 3
    # the caller's callbacks see one run of the chain
    assert len(seen) == 1
    generations = spans.named(sc.SPAN_SAMPLE_ONE, response.request_id)
    kinds = sorted(g.attributes[sc.SAMPLE_RUN] for g in generations)
    assert kinds == runs
    for g in generations:  # every sample's prompt is on its span, forks' included
        assert "Cite passages as [n]" in g.attributes[sc.OI_PROMPT_TEMPLATE]
