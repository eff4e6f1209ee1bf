"""RAGPipeline end to end: real vector store, scripted chat models, real OTel SDK spans."""

from __future__ import annotations

import asyncio

import pytest
from langchain_core.runnables import RunnableLambda
from pipeline_fixtures import (
    FABRICATED,
    GOOD,
    GOOD_ALT,
    OFF_TOPIC,
    PLAN,
    QUESTION,
    WRONG_NUMBER,
    scripted,
)

from tracerag import (
    InputError,
    MissingVersionError,
    Response,
    RuleResult,
    Thresholds,
    rule,
    validate_response,
)
from tracerag import _semconv as sc
from tracerag.testing import ScriptedChatModel, tracerag_name


def test_span_tree_has_six_stages_and_request_id_everywhere(make_pipeline, spans):
    pipeline = make_pipeline(scripted([GOOD]))
    response = pipeline.invoke(QUESTION)
    rid = response.request_id
    assert spans.tree_problems(rid) == []
    root = spans.root(rid)
    stage_names = [tracerag_name(s) for s in spans.children(root)]
    assert stage_names == [
        sc.SPAN_REGISTER,
        sc.SPAN_RETRIEVE,
        sc.SPAN_PLAN,
        sc.SPAN_SAMPLE,
        sc.SPAN_VERIFY,
        sc.SPAN_ASSEMBLE,
    ]
    assert all(s.attributes[sc.REQUEST_ID] == rid for s in spans.spans())
    sample_stage = spans.named(sc.SPAN_SAMPLE, rid)[0]
    generations = spans.children(sample_stage)
    assert sorted(s.attributes[sc.SAMPLE_INDEX] for s in generations) == [0, 1, 2, 3, 4]
    assert response.trace_id == f"{root.context.trace_id:032x}"
    retrieve = spans.named(sc.SPAN_RETRIEVE, rid)[0].attributes
    assert retrieve[sc.OI_SPAN_KIND] == "RETRIEVER"
    assert retrieve[sc.oi_document(0, "id")] in {"returns", "returns-2019"}
    assert isinstance(retrieve[sc.oi_document(0, "score")], float)
    assert retrieve[sc.RETRIEVAL_SCORED] is True
    assert root.attributes[sc.DECISION] == response.decision
    assert root.attributes[sc.CONFIDENCE] == response.confidence
    verify_span = spans.named(sc.SPAN_VERIFY, rid)[0]
    names = {e.attributes[sc.GENAI_EVALUATION_NAME] for e in verify_span.events}
    assert {"citation_validity", "self_consistency"} <= names
    gen = generations[0].attributes
    assert gen[sc.GENAI_REQUEST_TEMPERATURE] == 0.7
    assert gen[sc.OI_LLM_MODEL_NAME] == "scripted-chat-model"


def test_consistent_verified_answer_passes_with_evidence(make_pipeline):
    response = make_pipeline(scripted([GOOD, GOOD_ALT])).invoke(QUESTION)
    assert response.decision == "pass", response.signal_detail
    assert response.status == "answered"
    assert response.answer in {GOOD, GOOD_ALT}
    assert response.confidence >= 0.85
    assert response.signal_detail.citation_valid is True
    assert response.signal_detail.self_consistency == 1.0
    quote = response.evidence[0]
    assert quote.material_id == "returns"
    assert "30 days" in quote.quote
    assert response.versions.prompt == "test-prompt-v1"
    assert response.ticket_id is None


def test_fabricated_citation_is_escalated_and_withheld(make_pipeline):
    records: list[dict] = []
    pipeline = make_pipeline(scripted([FABRICATED]), audit=lambda r: records.append(r) or True)
    response = pipeline.invoke(QUESTION)
    assert response.decision == "escalate"
    assert response.answer is None
    assert response.status == "pending_human_review"
    assert response.confidence < 0.6
    assert "fabricated citation" in response.signal_detail.confidence_caps
    # the cited id is the withheld answer's own text: the operator's record keeps it
    assert response.signal_detail.fabricated_citations == []
    assert "policy-99" in records[0]["response"]["signal_detail"]["fabricated_citations"]
    tickets = pipeline.escalation.tickets
    assert [t.ticket_id for t in tickets] == [response.ticket_id]
    assert tickets[0].candidate_answer == FABRICATED


def test_wrong_number_is_not_supported(make_pipeline):
    records: list[dict] = []
    audit = lambda r: records.append(r) or True  # noqa: E731
    response = make_pipeline(scripted([WRONG_NUMBER]), audit=audit).invoke(QUESTION)
    assert response.decision == "escalate" and response.claims == []  # withheld
    assert records[0]["response"]["claims"][0]["verdict"] == "unsupported"


def test_inconsistent_samples_lower_confidence(make_pipeline):
    consistent = make_pipeline(scripted([GOOD])).invoke(QUESTION)
    mixed = make_pipeline(scripted([GOOD, OFF_TOPIC, GOOD, OFF_TOPIC, WRONG_NUMBER])).invoke(
        QUESTION
    )
    assert mixed.signal_detail.self_consistency < consistent.signal_detail.self_consistency
    assert mixed.confidence < consistent.confidence
    assert mixed.signal_detail.consistency_groups >= 2
    assert mixed.signal_detail.semantic_entropy > 0
    assert mixed.decision != "pass"


def test_model_failing_twice_then_succeeding_is_retried(make_pipeline, spans):
    llm = scripted([GOOD], fail_first=2)
    response = make_pipeline(llm, n_samples=1, plan="inline").invoke(QUESTION)
    assert llm.call_count == 3
    assert response.signal_detail.samples_ok == 1
    assert response.answer is not None
    generation = spans.named(sc.SPAN_SAMPLE_ONE, response.request_id)[0]
    assert generation.attributes[sc.SAMPLE_ATTEMPTS] == 3
    assert [e.name for e in generation.events].count(sc.EVENT_RETRY) == 2


def test_model_always_failing_escalates_with_error_recorded(make_pipeline, spans):
    llm = scripted([GOOD], always_fail=True)
    pipeline = make_pipeline(llm, n_samples=3)
    response = pipeline.invoke(QUESTION)
    assert response.decision == "escalate"
    assert response.answer is None
    assert response.confidence == 0.0
    assert response.signal_detail.samples_failed == 3
    assert response.signal_detail.plan_ok is False
    assert llm.call_count == 3 + 3 * 3  # plan and each sample: three attempts each
    errors = [s for s in spans.named(sc.SPAN_SAMPLE_ONE, response.request_id)]
    assert len(errors) == 3
    assert all("ScriptedModelError" in s.attributes[sc.SAMPLE_ERROR] for s in errors)
    assert pipeline.escalation.tickets[0].reasons == ["no successful sample"]


def test_missing_versions_refused_before_any_model_call(make_pipeline, spans):
    llm = scripted([GOOD])
    for kwargs in ({"model_version": None}, {"prompt_version": None}, {"prompt_version": ""}):
        with pytest.raises(MissingVersionError, match="version"):
            make_pipeline(llm, **kwargs).invoke(QUESTION)
    assert llm.call_count == 0
    register = spans.named(sc.SPAN_REGISTER)
    assert register and all(s.status.status_code.name == "ERROR" for s in register)


def test_malformed_plan_is_retried_then_recorded_as_failed(make_pipeline):
    llm = ScriptedChatModel(responses=[GOOD], plan_responses=["not json", '{"material_ids": 3}'])
    response = make_pipeline(llm).invoke(QUESTION)
    assert response.signal_detail.plan_ok is False
    # a failed plan lowers confidence by its factor but still answers
    assert response.confidence == pytest.approx(0.9, abs=1e-6)
    plan_calls = [c for c in llm.calls if c.task == "plan"]
    assert len(plan_calls) == 3


def test_malformed_plan_then_valid_plan(make_pipeline):
    llm = ScriptedChatModel(responses=[GOOD], plan_responses=["{oops", PLAN])
    response = make_pipeline(llm).invoke(QUESTION)
    assert response.signal_detail.plan_ok is True
    assert response.decision == "pass"


def test_stale_material_is_not_support(make_pipeline):
    stale = "Customers may return unused items within 14 days of delivery. [returns-2019]"
    records: list[dict] = []
    audit = lambda r: records.append(r) or True  # noqa: E731
    response = make_pipeline(scripted([stale]), audit=audit).invoke(QUESTION)
    assert response.decision == "escalate" and response.claims == []  # withheld
    kept = records[0]["response"]  # the operator's copy
    assert kept["claims"][0]["verdict"] == "stale"
    assert "superseded" in kept["claims"][0]["reason"]
    assert "returns-2019" in kept["signal_detail"]["stale_citations"]


def test_required_rule_failure_caps_below_escalation(make_pipeline):
    @rule("no-discount-promises", required=True)
    def no_discount(question, answer, materials):
        return RuleResult("no-discount-promises", "discount" not in answer.lower(), True)

    response = make_pipeline(scripted([GOOD]), rules=[no_discount]).invoke(QUESTION)
    assert response.decision == "pass"
    assert response.signal_detail.rule_check is True
    bad = make_pipeline(scripted([OFF_TOPIC]), rules=[no_discount]).invoke(QUESTION)
    assert bad.decision == "escalate"
    assert bad.signal_detail.rule_check is False


def test_broken_rule_is_a_failed_rule_not_a_crash(make_pipeline):
    def broken(question, answer, materials):
        raise RuntimeError("rule bug")

    response = make_pipeline(scripted([GOOD]), rules=[broken]).invoke(QUESTION)
    assert response.signal_detail.rules[0]["passed"] is False
    assert "rule bug" in response.signal_detail.rules[0]["detail"]
    assert response.confidence < 1.0


def test_every_response_validates_against_the_schema(make_pipeline):
    for answers, kwargs in [
        ([GOOD], {}),
        ([GOOD, OFF_TOPIC, GOOD, OFF_TOPIC, GOOD], {}),
        ([FABRICATED], {}),
        ([GOOD], {"tier": "low"}),
        ([GOOD, WRONG_NUMBER], {"tier": "medium"}),
    ]:
        response = make_pipeline(scripted(answers), **kwargs).invoke(QUESTION)
        validate_response(response.model_dump(mode="json"))


def test_tiers_keep_the_trace_shape(make_pipeline, spans):
    low = make_pipeline(scripted([GOOD]), tier="low").invoke(QUESTION)
    assert low.status == "unverified" and low.confidence is None and low.tier == "low"
    assert spans.tree_problems(low.request_id) == []
    skipped = {
        s.name for s in spans.for_request(low.request_id) if s.attributes.get(sc.STAGE_SKIPPED)
    }
    assert skipped == {sc.SPAN_PLAN, sc.SPAN_VERIFY}
    assert len(spans.named(sc.SPAN_SAMPLE_ONE, low.request_id)) == 1

    medium = make_pipeline(scripted([FABRICATED]), tier="medium").invoke(QUESTION)
    assert medium.decision == "review"  # medium flags but never withholds
    assert medium.answer == FABRICATED
    assert len(spans.named(sc.SPAN_SAMPLE_ONE, medium.request_id)) == 3


def test_inline_plan_records_sample_plans(make_pipeline, spans):
    inline = f"PLAN: {PLAN}\nANSWER: {GOOD}"
    response = make_pipeline(scripted([inline]), plan="inline").invoke(QUESTION)
    assert response.decision == "pass"
    assert response.answer == GOOD
    plan_span = spans.named(sc.SPAN_PLAN, response.request_id)[0]
    assert plan_span.attributes[sc.PLAN_AGREEMENT] == 1.0
    assert list(plan_span.attributes[sc.PLAN_MATERIAL_IDS]) == ["returns"]


def test_temperature_zero_reports_consistency_as_uninformative(make_pipeline):
    response = make_pipeline(scripted([GOOD]), temperature=0.0).invoke(QUESTION)
    assert response.signal_detail.consistency_informative is False
    assert any("temperature 0" in w for w in response.warnings)


def test_bad_input_gets_a_clear_error(make_pipeline):
    pipeline = make_pipeline(scripted([GOOD]))
    with pytest.raises(InputError, match="non-empty"):
        pipeline.invoke("   ")
    with pytest.raises(InputError, match="unknown input"):
        pipeline.invoke({"question": "q", "colour": "red"})
    with pytest.raises(InputError):
        pipeline.invoke(42)
    with pytest.raises(InputError, match="limit"):
        pipeline.invoke("x" * 9000)


def test_dict_input_carries_session_user_and_channel(make_pipeline, spans):
    response = make_pipeline(scripted([GOOD])).invoke(
        {"question": QUESTION, "session_id": "s-1", "user_id": "u-9", "channel": "web"}
    )
    root = spans.root(response.request_id)
    assert root.attributes[sc.OI_SESSION_ID] == "s-1"
    assert root.attributes[sc.OI_USER_ID] == "u-9"
    assert root.attributes[sc.CHANNEL] == "web"


def test_composes_in_lcel_and_batches(make_pipeline):
    pipeline = make_pipeline(scripted([GOOD]))
    chain = pipeline | RunnableLambda(lambda r: r.decision)
    assert chain.invoke(QUESTION) == "pass"
    results = pipeline.batch([QUESTION, QUESTION])
    assert [r.decision for r in results] == ["pass", "pass"]
    assert len({r.request_id for r in results}) == 2
    results = asyncio.run(pipeline.abatch([QUESTION, QUESTION]))
    assert all(isinstance(r, Response) for r in results)


def test_thresholds_are_configurable(make_pipeline):
    mixed = [GOOD, OFF_TOPIC, GOOD, GOOD, OFF_TOPIC]
    default = make_pipeline(scripted(mixed)).invoke(QUESTION)
    lenient = make_pipeline(scripted(mixed), thresholds=Thresholds(0.5, 0.3)).invoke(QUESTION)
    assert default.confidence == lenient.confidence
    assert default.decision == "review" and lenient.decision == "pass"


def test_fifty_concurrent_requests_give_fifty_clean_trees(make_pipeline, spans):
    pipeline = make_pipeline(scripted([GOOD, GOOD_ALT], latency=0.01), n_samples=3)

    async def run_all():
        return await asyncio.gather(*(pipeline.ainvoke(QUESTION) for _ in range(50)))

    responses = asyncio.run(run_all())
    assert len({r.request_id for r in responses}) == 50
    assert len({r.trace_id for r in responses}) == 50
    for r in responses:
        assert spans.tree_problems(r.request_id) == [], r.request_id
        assert len(spans.named(sc.SPAN_SAMPLE_ONE, r.request_id)) == 3
    roots = spans.named(sc.SPAN_REQUEST)
    assert len(roots) == 50 and all(s.parent is None for s in roots)


def test_failing_escalation_handler_and_audit_sink_never_fail_a_request(make_pipeline):
    class Broken:
        def handle(self, ticket):
            raise ConnectionError("queue down")

    def sink(record):
        raise OSError("disk full")

    response = make_pipeline(scripted([FABRICATED]), escalation=Broken(), audit=sink).invoke(
        QUESTION
    )
    assert response.decision == "escalate" and response.answer is None
    assert response.audit_persisted is False


def test_audit_sink_receives_the_full_record(make_pipeline):
    records = []
    response = make_pipeline(scripted([GOOD]), audit=lambda r: records.append(r) or True).invoke(
        QUESTION
    )
    assert response.audit_persisted is True
    (record,) = records
    assert record["request_id"] == response.request_id
    assert record["trace_id"] == response.trace_id
    assert len(record["samples"]) == 5 and record["samples"][0]["raw"] == GOOD
    assert record["materials"][0]["id"]
    assert record["signals"]["citations"]["claims"][0]["verdict"] == "supported"
    assert record["response"]["decision"] == "pass"


def test_plain_in_memory_vector_store_without_relevance_scores(documents, spans):
    from langchain_core.embeddings import DeterministicFakeEmbedding
    from langchain_core.vectorstores import InMemoryVectorStore

    from tracerag import RAGPipeline

    store = InMemoryVectorStore.from_documents(documents, DeterministicFakeEmbedding(size=64))
    pipeline = RAGPipeline(
        store.as_retriever(search_kwargs={"k": 5}),
        scripted([GOOD]),
        prompt_version="p",
        model_version="m",
        tracer_provider=spans.provider,
        audit=None,
    )
    response = pipeline.invoke(QUESTION)
    assert response.decision == "pass"
    retrieve = spans.named(sc.SPAN_RETRIEVE, response.request_id)[0]
    assert retrieve.attributes[sc.RETRIEVAL_SCORED] is False


def test_inlined_schema_gives_the_same_verdicts_as_the_shipped_schema():
    import jsonschema

    from tracerag.contract import response_schema, validate_with
    from tracerag.errors import ContractError

    shipped = jsonschema.Draft202012Validator(response_schema())

    class Fast:
        @staticmethod
        def is_valid(instance):
            try:
                validate_with("response.schema.json", instance)
            except ContractError:
                return False
            return True

    inlined = Fast()
    bad = [
        {},
        {"request_id": "r", "trace_id": None, "answer": None, "confidence": 1.5},
        {
            "request_id": "r",
            "trace_id": None,
            "answer": None,
            "confidence": 0.5,
            "decision": "maybe",
            "status": "answered",
            "signal_detail": {},
            "evidence": [],
            "versions": {"prompt": "p", "model": "m", "tracerag": "t"},
        },
        {
            "request_id": "r",
            "trace_id": None,
            "answer": None,
            "confidence": 0.5,
            "decision": "pass",
            "status": "answered",
            "signal_detail": {},
            "evidence": [{"material_id": "m", "title": "t", "quote": "q", "score": 2}],
            "versions": {"prompt": "p", "model": "m", "tracerag": "t"},
        },
    ]
    for instance in bad:
        assert not shipped.is_valid(instance) and not inlined.is_valid(instance)
    good = dict(bad[2], decision="pass")
    assert shipped.is_valid(good) and inlined.is_valid(good)


def test_malformed_plan_is_retried_at_a_raised_temperature(make_pipeline):
    llm = ScriptedChatModel(responses=[GOOD], plan_responses=["not json", "still not", PLAN])
    response = make_pipeline(llm).invoke(QUESTION)
    assert response.signal_detail.plan_ok is True
    temperatures = [c.temperature for c in llm.calls if c.task == "plan"]
    assert temperatures == [0.0, 0.3, 0.6]


def test_citation_ids_match_regardless_of_case_and_markup_is_not_a_claim(make_pipeline):
    answer = "<answer>\nCustomers may return unused items within 30 days of delivery. [Returns]"
    response = make_pipeline(scripted([answer])).invoke(QUESTION)
    assert [c.verdict for c in response.claims] == ["supported"]
    assert response.signal_detail.fabricated_citations == []


def test_retries_are_bounded_and_back_off(monkeypatch):
    from tracerag import RetryPolicy
    from tracerag._llm import Tries, retry_call

    sleeps = []

    async def fake_sleep(seconds):
        sleeps.append(seconds)

    monkeypatch.setattr("asyncio.sleep", fake_sleep)
    calls = []

    async def always_fails():
        calls.append(1)
        raise ConnectionError("down")

    policy = RetryPolicy(attempts=4, initial_wait=0.5, max_wait=1.5, jitter=0.0)
    tries = Tries()
    seen = []
    with pytest.raises(ConnectionError):
        asyncio.run(
            retry_call(always_fails, policy, on_retry=lambda n, e: seen.append(n), tries=tries)
        )
    assert len(calls) == 4 and tries.count == 4
    assert seen == [1, 2, 3]
    assert sleeps == [0.5, 1.0, 1.5]  # exponential, capped at max_wait

    calls.clear()

    async def not_retryable():
        calls.append(1)
        raise TypeError("a bug, not a transient failure")

    with pytest.raises(TypeError):
        asyncio.run(retry_call(not_retryable, policy))
    assert len(calls) == 1


def test_a_failing_support_backend_escalates_instead_of_crashing(make_pipeline):
    class Broken:
        name = "broken"
        threshold = 0.5

        def __call__(self, claim, material_text, *, corpus=None):
            raise RuntimeError("backend down")

    response = make_pipeline(scripted([GOOD]), support_backend=Broken()).invoke(QUESTION)
    assert response.decision == "escalate"
    assert response.answer is None
    assert response.signal_detail.citation_valid is False


def test_no_op_tracer_gives_no_fake_trace_id(retriever):
    from opentelemetry.trace import NoOpTracerProvider

    from tracerag import RAGPipeline

    response = RAGPipeline(
        retriever,
        scripted([GOOD]),
        prompt_version="p",
        model_version="m",
        tracer_provider=NoOpTracerProvider(),
        audit=None,
    ).invoke(QUESTION)
    assert response.trace_id is None
    assert response.decision == "pass"
