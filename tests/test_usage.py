"""Token usage and cost: counted per call, totalled per stage and request, priced, exported."""

from __future__ import annotations

import json

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough
from pipeline_fixtures import GOOD, PLAN, QUESTION

from tracerag import _semconv as sc
from tracerag import _usage as usage
from tracerag.signals._judge import JudgeSupport
from tracerag.testing import ScriptCall, ScriptedChatModel

PLAN_USAGE = {"input_tokens": 100, "output_tokens": 20}
ANSWER_USAGE = {"input_tokens": 200, "output_tokens": 30}
PRICES = {"scripted-chat-model": {"input_per_1k": 0.5, "output_per_1k": 2.0}}


def by_task(call: ScriptCall, reply: str) -> dict[str, int]:
    return PLAN_USAGE if call.task == "plan" else ANSWER_USAGE


def run(make_pipeline, llm, **options):
    records: list[dict] = []
    pipeline = make_pipeline(llm, audit=lambda r: records.append(r) or True, **options)
    response = pipeline.invoke(QUESTION)
    assert len(records) == 1
    return response, records[0]


# -- the estimator ---------------------------------------------------------------------------


def test_estimate_counts_cjk_characters_and_four_character_chunks():
    # Laptops(2) are(1) covered(2) for(1) 24(1) months.(2)
    assert usage.estimate_tokens("Laptops are covered for 24 months.") == 9
    # 账户将被锁定 (6) + 30 (1) + 分钟 (2) + 。(1)
    assert usage.estimate_tokens("账户将被锁定30分钟。") == 10
    # [returns] is 9 characters: 3 chunks; 退货 2 characters
    assert usage.estimate_tokens("退货 [returns]") == 5
    assert usage.estimate_tokens("") == 0
    assert usage.estimate_tokens(None) == 0
    assert usage.estimate_tokens("  \n\t ") == 0


def test_estimate_of_messages_is_the_sum_of_their_texts():
    messages = [SystemMessage(content="Cite every sentence."), HumanMessage(content="保修多久？")]
    expected = usage.estimate_tokens("Cite every sentence.") + usage.estimate_tokens("保修多久？")
    assert usage.estimate_messages(messages) == expected == 6 + 5
    assert usage.estimate_messages("abcdefgh") == 2


# -- one call ---------------------------------------------------------------------------------


def test_reported_usage_metadata_is_taken_as_reported():
    message = AIMessage(
        content="x", usage_metadata={"input_tokens": 7, "output_tokens": 3, "total_tokens": 10}
    )
    call = usage.usage_of(message, stage="sample", model="m", prompt="a long prompt " * 50)
    assert call == usage.CallUsage("sample", "m", 7, 3, False, usage.SOURCE_USAGE_METADATA)
    assert call.total_tokens == 10


def test_provider_token_usage_in_llm_output_or_response_metadata():
    bare = AIMessage(content="x")
    call = usage.usage_of(
        bare,
        stage="plan",
        model="m",
        llm_output={"token_usage": {"prompt_tokens": 11, "completion_tokens": 4}},
    )
    assert (call.input_tokens, call.output_tokens, call.estimated) == (11, 4, False)
    assert call.source == usage.SOURCE_LLM_OUTPUT
    meta = AIMessage(
        content="x", response_metadata={"token_usage": {"input_tokens": 5, "output_tokens": 2}}
    )
    assert usage.reported_usage(meta) == (5, 2, usage.SOURCE_LLM_OUTPUT)


def test_unreported_usage_is_estimated_and_marked():
    prompt = [HumanMessage(content="How long is the warranty?")]
    call = usage.usage_of(
        AIMessage(content="24 months."), stage="sample", model=None, prompt=prompt
    )
    assert call.estimated and call.source == usage.SOURCE_ESTIMATE
    assert call.model == "unknown"
    assert call.input_tokens == usage.estimate_messages(prompt) == 7
    assert call.output_tokens == usage.estimate_tokens("24 months.") == 3


def test_malformed_reported_counts_fall_back_to_the_estimate():
    message = AIMessage(content="abcd", response_metadata={"token_usage": {"prompt_tokens": -1}})
    assert usage.reported_usage(message) is None
    assert usage.usage_of(message, stage="sample", model="m").estimated


# -- totals and money ---------------------------------------------------------------------------


CALLS = [
    usage.CallUsage("plan", "a", 100, 20),
    usage.CallUsage("sample", "a", 200, 30),
    usage.CallUsage("sample", "a", 210, 31, estimated=True, source=usage.SOURCE_ESTIMATE),
    usage.CallUsage("verify", "judge", 50, 10),
]


def test_summary_per_stage_and_model():
    summary = usage.summarize(CALLS)
    assert summary.total == usage.StageUsage(4, 560, 91, 1)
    assert summary.estimated
    assert list(summary.by_stage) == ["plan", "sample", "verify"]
    assert summary.by_stage["sample"] == usage.StageUsage(2, 410, 61, 1)
    assert summary.by_model["judge"] == usage.StageUsage(1, 50, 10, 0)
    assert usage.summarize([]).total.calls == 0


def test_cost_from_the_price_table_and_unpriced_models():
    prices = usage.parse_prices({"a": {"input_per_1k": 1.0, "output_per_1k": 4.0}})
    cost = usage.cost_of(CALLS, prices)
    # plan 0.1 + 0.08; samples 0.2 + 0.12 and 0.21 + 0.124
    assert cost.by_stage["plan"] == pytest.approx(0.18)
    assert cost.by_stage["sample"] == pytest.approx(0.654)
    assert cost.total == pytest.approx(0.834)
    assert "verify" not in cost.by_stage
    assert cost.unpriced == ("judge",)
    nothing = usage.cost_of(CALLS, {})
    assert nothing.total is None and set(nothing.unpriced) == {"a", "judge"}


def test_price_table_from_a_json_file(tmp_path):
    path = tmp_path / "prices.json"
    path.write_text(
        json.dumps({"currency": "EUR", "m": {"input_per_1k": 0.15, "output_per_1k": 0.6}}),
        encoding="utf-8",
    )
    assert usage.load_prices(path) == {"m": usage.Price(0.15, 0.6)}
    assert usage.load_prices(str(path)) == usage.load_prices({"m": usage.Price(0.15, 0.6)})
    assert usage.load_prices(None) is None
    with pytest.raises(ValueError, match=r"'m'.*output_per_1k"):
        usage.parse_prices({"m": {"input_per_1k": 1}})
    with pytest.raises(ValueError, match="non-negative"):
        usage.parse_prices({"m": {"input_per_1k": -1, "output_per_1k": 1}})
    with pytest.raises(ValueError, match="cannot read"):
        usage.load_prices(tmp_path / "missing.json")


def test_ledger_collects_only_inside_metering():
    usage.note(CALLS[0])  # outside a request: nothing to add to, nothing fails
    assert usage.current_ledger() is None
    with usage.metering() as ledger:
        usage.note(CALLS[0])
        with usage.metering() as inner:
            usage.note(CALLS[1])
        usage.note(CALLS[3])
    assert ledger.calls() == (CALLS[0], CALLS[3])
    assert inner.calls() == (CALLS[1],)
    assert usage.current_ledger() is None


# -- through the pipeline, with scripted usage -------------------------------------------------


def test_request_totals_per_stage_in_record_and_spans(make_pipeline, spans):
    llm = ScriptedChatModel(responses=[GOOD], plan_responses=[PLAN], usage=by_task)
    response, record = run(make_pipeline, llm, n_samples=3, prices=PRICES)
    spent = record["usage"]
    assert spent["calls"] == 4
    assert (spent["input_tokens"], spent["output_tokens"]) == (700, 110)
    assert spent["total_tokens"] == 810
    assert spent["estimated"] is False
    assert spent["by_stage"]["plan"] == {
        "calls": 1,
        "input_tokens": 100,
        "output_tokens": 20,
        "total_tokens": 120,
        "estimated_calls": 0,
    }
    assert spent["by_stage"]["sample"]["calls"] == 3
    assert spent["by_stage"]["sample"]["input_tokens"] == 600
    assert spent["by_stage"]["sample"]["output_tokens"] == 90
    assert set(spent["by_stage"]) == {"plan", "sample"}
    # plan: 100 * 0.5 / 1000 + 20 * 2 / 1000; samples: 600 * 0.5 / 1000 + 90 * 2 / 1000
    assert spent["cost"]["by_stage"] == {"plan": 0.09, "sample": 0.48}
    assert spent["cost"]["total"] == 0.57
    assert spent["cost"]["unpriced_models"] == []

    rid = response.request_id
    root = spans.root(rid).attributes
    assert root[sc.USAGE_CALLS] == 4
    assert (root[sc.USAGE_INPUT_TOKENS], root[sc.USAGE_OUTPUT_TOKENS]) == (700, 110)
    assert root[sc.usage_stage("plan", "input_tokens")] == 100
    assert root[sc.usage_stage("sample", "calls")] == 3
    assert root[sc.USAGE_COST] == pytest.approx(0.57)
    assert root[sc.USAGE_ESTIMATED] is False
    plan_span = spans.named(sc.SPAN_PLAN, rid)[0].attributes
    assert plan_span[sc.GENAI_USAGE_INPUT_TOKENS] == 100
    assert plan_span[sc.GENAI_USAGE_OUTPUT_TOKENS] == 20
    samples = spans.named(sc.SPAN_SAMPLE_ONE, rid)
    assert [s.attributes[sc.GENAI_USAGE_INPUT_TOKENS] for s in samples] == [200, 200, 200]
    assert [s.attributes[sc.GENAI_USAGE_OUTPUT_TOKENS] for s in samples] == [30, 30, 30]
    assert all(s.attributes[sc.USAGE_ESTIMATED] is False for s in samples)


def test_retried_plan_calls_are_each_counted(make_pipeline):
    llm = ScriptedChatModel(responses=[GOOD], plan_responses=["not json", PLAN], usage=by_task)
    _, record = run(make_pipeline, llm, n_samples=2)
    plan = record["usage"]["by_stage"]["plan"]
    assert (plan["calls"], plan["input_tokens"], plan["output_tokens"]) == (2, 200, 40)
    assert record["usage"]["calls"] == 4
    assert "cost" not in record["usage"]  # no price table, no money


def test_unreported_usage_is_estimated_from_what_was_sent(make_pipeline, spans):
    llm = ScriptedChatModel(responses=[GOOD], plan_responses=[PLAN], report_usage=False)
    response, record = run(make_pipeline, llm, n_samples=2)
    spent = record["usage"]
    assert spent["estimated"] is True
    assert spent["estimated_calls"] == spent["calls"] == 3
    prompts = {c.task: c.prompt for c in llm.calls}
    sample = spent["by_stage"]["sample"]
    assert sample["input_tokens"] == 2 * usage.estimate_tokens(prompts["answer"])
    assert sample["output_tokens"] == 2 * usage.estimate_tokens(GOOD)
    assert spent["by_stage"]["plan"]["output_tokens"] == usage.estimate_tokens(PLAN)
    one = spans.named(sc.SPAN_SAMPLE_ONE, response.request_id)[0].attributes
    assert one[sc.USAGE_ESTIMATED] is True
    assert one[sc.GENAI_USAGE_OUTPUT_TOKENS] == usage.estimate_tokens(GOOD)
    assert spans.root(response.request_id).attributes[sc.USAGE_ESTIMATED] is True


def test_default_scripted_usage_counts_what_the_model_read_and_wrote():
    llm = ScriptedChatModel(responses=["两年保修。"])
    message = llm.invoke([SystemMessage(content="Cite."), HumanMessage(content="保修多久？")])
    assert message.usage_metadata["input_tokens"] == 2 + 5
    assert message.usage_metadata["output_tokens"] == 5


def test_judge_calls_count_under_verify(make_pipeline):
    verdict = json.dumps(
        {
            "supported": True,
            "score": 0.9,
            "quote": "Customers may return unused items within 30 days of delivery",
        }
    )
    judge_llm = ScriptedChatModel(
        responses=[verdict],
        model_name="judge-model",
        usage={"input_tokens": 50, "output_tokens": 9},
    )
    judge = JudgeSupport(judge_llm)  # used as an object: nothing is registered by name
    llm = ScriptedChatModel(responses=[GOOD], plan_responses=[PLAN], usage=by_task)
    _, record = run(
        make_pipeline,
        llm,
        n_samples=3,
        support_backend=judge,
        prices={**PRICES, "judge-model": {"input_per_1k": 1.0, "output_per_1k": 1.0}},
    )
    spent = record["usage"]
    # three identical samples are verified once: one claim, one cited material, one judge call
    assert judge_llm.call_count == 1
    assert spent["by_stage"]["verify"]["calls"] == 1
    assert spent["by_stage"]["verify"]["input_tokens"] == 50
    assert spent["by_model"]["judge-model"]["output_tokens"] == 9
    assert spent["calls"] == 5
    assert spent["cost"]["by_stage"]["verify"] == pytest.approx(0.059)
    assert spent["cost"]["total"] == pytest.approx(0.57 + 0.059)


def test_low_tier_is_one_sample_call(make_pipeline):
    llm = ScriptedChatModel(responses=[GOOD], plan_responses=[PLAN], usage=by_task)
    _, record = run(make_pipeline, llm, tier="low")
    assert record["usage"]["calls"] == 1
    assert list(record["usage"]["by_stage"]) == ["sample"]


def test_wrapped_chain_samples_are_counted(retriever, spans):
    from tracerag import wrap

    llm = ScriptedChatModel(responses=[GOOD], usage={"input_tokens": 40, "output_tokens": 8})
    prompt = ChatPromptTemplate.from_template("Context:\n{context}\n\nQuestion: {question}")
    chain = (
        {
            "context": retriever | (lambda docs: "\n\n".join(d.page_content for d in docs)),
            "question": RunnablePassthrough(),
        }
        | prompt
        | llm
        | StrOutputParser()
    )
    records: list[dict] = []
    traced = wrap(
        chain,
        n_samples=3,
        min_samples=3,
        tracer_provider=spans.provider,
        audit=lambda r: records.append(r) or True,
        prices={"scripted-chat-model": {"input_per_1k": 1.0, "output_per_1k": 1.0}},
    )
    response = traced.invoke(QUESTION)
    spent = records[0]["usage"]
    assert spent["by_stage"] == {
        "sample": {
            "calls": 3,
            "input_tokens": 120,
            "output_tokens": 24,
            "total_tokens": 144,
            "estimated_calls": 0,
        }
    }
    assert spent["cost"]["total"] == pytest.approx(0.144)
    ones = spans.named(sc.SPAN_SAMPLE_ONE, response.request_id)
    assert [s.attributes[sc.GENAI_USAGE_INPUT_TOKENS] for s in ones] == [40, 40, 40]


def test_usage_metrics_by_stage_tier_and_versions(make_pipeline):
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    llm = ScriptedChatModel(responses=[GOOD], plan_responses=[PLAN], usage=by_task)
    for _ in range(2):
        run(make_pipeline, llm, n_samples=3, prices=PRICES, meter_provider=provider)
    points: dict[str, list] = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                points[metric.name] = list(metric.data.data_points)
    tokens = {
        (p.attributes["stage"], p.attributes["direction"]): p.value
        for p in points[sc.METRIC_USAGE_TOKENS]
    }
    assert tokens == {
        ("plan", "input"): 200,
        ("plan", "output"): 40,
        ("sample", "input"): 1200,
        ("sample", "output"): 180,
    }
    some = points[sc.METRIC_USAGE_TOKENS][0].attributes
    assert some["prompt_version"] == "test-prompt-v1"
    assert some["model_version"] == "scripted-chat-model"
    assert some["tier"] == "high"
    assert some["decision"] == "pass"
    calls = {p.attributes["stage"]: p.value for p in points[sc.METRIC_USAGE_CALLS]}
    assert calls == {"plan": 2, "sample": 6}
    cost = {p.attributes["stage"]: p.value for p in points[sc.METRIC_USAGE_COST]}
    assert cost == pytest.approx({"plan": 0.18, "sample": 0.96})
    provider.shutdown()


def test_tracerag_metrics_reports_tokens_and_cost_per_request(make_pipeline, tmp_path):
    from tracerag.store import open_store
    from tracerag.tools._metrics import compute

    store = open_store(str(tmp_path / "audit.sqlite"), auto_enqueue=False)
    try:
        llm = ScriptedChatModel(responses=[GOOD], plan_responses=[PLAN], usage=by_task)
        pipeline = make_pipeline(
            llm, n_samples=3, prices=PRICES, audit=lambda r: store.append_record(r) or True
        )
        decisions = [pipeline.invoke(QUESTION).decision for _ in range(2)]
        out = compute(store, since=None)
    finally:
        store.close()
    assert out.requests == out.requests_with_usage == 2
    assert out.tokens_per_request == 810
    assert out.model_calls_per_request == 4
    assert out.cost_per_request == pytest.approx(0.57)
    assert decisions.count("pass") == 2
    assert out.cost_per_passed_answer == pytest.approx(0.57)
    text = out.render()
    assert "tokens per request            810  (4.0 model calls)" in text
    assert "cost per request              0.570000  (per passed answer 0.570000)" in text
