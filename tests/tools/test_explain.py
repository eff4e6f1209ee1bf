"""``tracerag explain``: occlusion, counterfactual and paraphrase experiments, stored and traced."""

from __future__ import annotations

import re

import pytest
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pipeline_fixtures import FAST_RETRY

from tracerag import _semconv as sc
from tracerag import cli
from tracerag._pipeline import RAGPipeline
from tracerag.demo.kb import build_retriever, load_documents
from tracerag.prompts import MATERIAL_BLOCK_RE
from tracerag.store._base import KIND_EXPLANATION
from tracerag.store._sqlite import SQLiteAuditStore
from tracerag.testing import ScriptCall, ScriptedChatModel, SpanCapture, tracerag_name
from tracerag.text._quantities import extract_quantities
from tracerag.tools._replay import ReplayRefused
from tracerag.tools._show import render_timeline
from tracerag.tools.explain import (
    PLACEHOLDER,
    CostTooHigh,
    counterfactual_text,
    explain,
    explain_window,
    light_paraphrases,
    plan_experiments,
    sampled,
)

QUESTION = "How long is the warranty on a laptop?"
WARRANTY = "Under Clause 6.1, laptops and tablets are covered by an extended 24-month warranty."
CARE = (
    "Care+ costs ¥199 for a phone and ¥399 for a laptop, and must be bought within 30 days of "
    "buying the device."
)
CANNOT = "I cannot answer from the materials."
NO_PLAN = '{"material_ids": [], "key_facts": []}'


def _sentence(prompt: str, starts: str) -> tuple[str, str] | None:
    """The material id and sentence of the prompt that starts like ``starts``."""
    for block in MATERIAL_BLOCK_RE.finditer(prompt):
        for sentence in re.split(r"(?<=\.)\s+", block.group("text")):
            if sentence.startswith(starts):
                return block.group("id"), sentence
    return None


def reader(call: ScriptCall) -> str:
    """A model that answers from what its prompt's materials say (and nothing else)."""
    if call.task == "plan":
        return NO_PLAN
    warranty = _sentence(call.prompt, "Under Clause 6.1, laptops")
    if warranty is None:
        return CANNOT
    answer = f"{warranty[1]} [{warranty[0]}]"
    care = _sentence(call.prompt, "Care+ costs")
    if care is not None:
        answer += f" {care[1]} [{care[0]}]"
    return answer


def stubborn(call: ScriptCall) -> str:
    """A model that gives the same answer whatever its materials say."""
    return NO_PLAN if call.task == "plan" else f"{WARRANTY} [warranty] {CARE} [care-plus]"


def model(responder, name: str = "reader") -> ScriptedChatModel:
    return ScriptedChatModel(responder=responder, model_name=name)


@pytest.fixture
def store(tmp_path):
    s = SQLiteAuditStore(str(tmp_path / "audit.sqlite"), auto_enqueue=False)
    yield s
    s.close()


def answered(store, llm, spans=None, question=QUESTION, **options) -> str:
    """Answer over the demo knowledge base, recording into the store; the request_id."""
    settings = {
        "prompt_version": "p1",
        "model_version": llm.model_name,
        "n_samples": 2,
        "retry": FAST_RETRY,
        "audit": lambda r: store.append_record(r) or True,
        "tracer_provider": spans.provider if spans else None,
    }
    settings.update(options)
    return RAGPipeline(build_retriever(k=4), llm, **settings).invoke(question).request_id


def run_explain(store, rid, llm, **kwargs):
    kwargs.setdefault("prompt_version", "p1")
    kwargs.setdefault("model_version", llm.model_name)
    kwargs.setdefault("retry", FAST_RETRY)
    return explain(store, rid, llm, **kwargs)


# -- occlusion -----------------------------------------------------------------------------------


def test_occlusion_finds_the_one_material_whose_masking_changes_the_answer(store):
    rid = answered(store, model(reader))
    report = run_explain(store, rid, model(reader))
    by_id = {o.material_id: o for o in report.occlusion}
    assert set(by_id) == {"warranty", "care-plus"}  # the used materials, each masked once
    assert report.decisive == ["warranty"]

    masked = by_id["warranty"]
    assert masked.answer_changed and masked.answer_after == CANNOT
    assert masked.confidence_before > masked.confidence_after
    assert masked.decision_before == "pass" and masked.decision_after == "escalate"
    assert set(masked.lost_claims) == {WARRANTY, CARE}

    care = by_id["care-plus"]
    assert not care.answer_changed  # the warranty answer stands without Care+
    assert care.lost_claims == (CARE,)


def test_the_placeholder_keeps_the_prompt_shape():
    llm = model(reader)
    store = SQLiteAuditStore(":memory:", auto_enqueue=False)
    rid = answered(store, llm)
    run_explain(store, rid, llm, counterfactuals=0)
    prompts = [c.prompt for c in llm.calls if c.task != "plan"]
    shapes = {
        tuple((b.group("id"), b.group("title")) for b in MATERIAL_BLOCK_RE.finditer(p))
        for p in prompts
    }
    assert len(shapes) == 1  # same ids, titles and order in every run
    assert any(PLACEHOLDER in p for p in prompts)
    store.close()


# -- counterfactual ------------------------------------------------------------------------------


def test_the_counterfactual_flags_a_model_that_ignores_its_materials(store):
    rid = answered(store, model(stubborn, "stubborn"))
    report = run_explain(store, rid, model(stubborn, "stubborn"))
    assert report.counterfactuals
    assert all(c.outcome == "ignores" for c in report.counterfactuals)
    assert "answering_from_prior" in report.flags
    changed = {(c.material_id, c.original, c.altered) for c in report.counterfactuals}
    assert ("warranty", "24-month", "38-month") in changed
    assert ("care-plus", "¥199", "¥318") in changed


def test_the_counterfactual_passes_a_model_that_follows_its_materials(store):
    rid = answered(store, model(reader))
    report = run_explain(store, rid, model(reader))
    assert report.counterfactuals
    assert all(c.outcome == "follows" for c in report.counterfactuals), report.counterfactuals
    assert "38-month" in report.counterfactuals[0].answer_after
    assert "answering_from_prior" not in report.flags


@pytest.mark.parametrize(
    ("text", "altered"),
    [
        ("500元", "800元"),
        ("¥15", "¥24"),
        ("24-month", "38-month"),
        ("7个工作日", "11个工作日"),
        ("两年", "3年"),
        ("2025-01-01", "2026-01-01"),
        ("2025年3月1日", "2026年3月1日"),
        ("10%", "16%"),
        ("1,200 yuan", "1,920 yuan"),
        ("two years", "3 years"),
    ],
)
def test_a_counterfactual_value_is_clearly_different_and_reads_back(text, altered):
    (q,) = extract_quantities(text)
    assert counterfactual_text(q) == altered
    (again,) = extract_quantities(altered)
    assert again.kind == q.kind and again.key != q.key


def test_no_counterfactual_when_the_answer_states_no_value(store):
    def plain(call: ScriptCall) -> str:
        if call.task == "plan":
            return NO_PLAN
        return "The warranty covers manufacturing defects but not accidental damage. [warranty]"

    rid = answered(store, model(plain, "plain"))
    plan = plan_experiments(store.get(rid).record)
    assert plan.counterfactuals == ()
    assert any("states no amount" in n for n in plan.notes)


# -- paraphrase --------------------------------------------------------------------------------


class KeywordRetriever(BaseRetriever):
    """Returns the warranty documents only when the question says 'laptop'."""

    docs: dict[str, Document]

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        ids = ["warranty", "care-plus"] if "laptop" in query.lower() else ["trade-in"]
        return [self.docs[i] for i in ids]


def _keyword_retriever() -> KeywordRetriever:
    return KeywordRetriever(docs={d.metadata["id"]: d for d in load_documents()})


def test_the_paraphrase_check_flags_an_unstable_retrieval(store):
    rid = answered(store, model(reader))
    report = run_explain(
        store,
        rid,
        model(reader),
        counterfactuals=0,
        retriever=_keyword_retriever(),
        paraphrases=["What warranty period applies to notebooks?", *light_paraphrases(QUESTION)],
    )
    unstable, light = report.paraphrases
    assert unstable.top_after == "trade-in" and unstable.conclusion_flipped
    assert unstable.unstable and unstable.answer_after == CANNOT
    assert not light.unstable
    assert set(light.key_after) == set(light.key_before) == {"warranty", "care-plus"}
    assert "unstable_retrieval" in report.flags


def test_paraphrases_without_a_live_retriever_are_skipped_and_cost_nothing(store):
    rid = answered(store, model(reader))
    llm = model(reader)
    report = run_explain(store, rid, llm, counterfactuals=0, paraphrases=["Anything?"])
    assert report.paraphrases == []
    assert any("no live retriever" in n for n in report.notes)
    assert llm.call_count == report.plan.model_calls == 3 * 3  # baseline + 2 occlusions


def test_light_paraphrases_add_or_remove_a_polite_opening():
    assert light_paraphrases("How long is the warranty?") == [
        "Could you tell me: how long is the warranty?"
    ]
    assert light_paraphrases("Please tell me the fee") == ["Tell me the fee"]
    assert light_paraphrases("保修期多久？") == ["请问保修期多久？"]
    assert light_paraphrases("请问保修期多久？") == ["保修期多久？"]


# -- versions, cost, storage, traces ----------------------------------------------------------


def test_other_versions_are_refused_unless_forced(store):
    rid = answered(store, model(reader))
    llm = model(reader)
    with pytest.raises(ReplayRefused):
        run_explain(store, rid, llm, prompt_version="p2")
    assert llm.call_count == 0
    assert store.get(rid).of_kind(KIND_EXPLANATION) == []
    report = run_explain(store, rid, llm, prompt_version="p2", force=True, counterfactuals=0)
    assert report.forced and report.to_dict()["forced"] is True


def test_the_model_calls_are_known_before_and_capped(store):
    rid = answered(store, model(reader), n_samples=3)
    plan = plan_experiments(store.get(rid).record)
    assert plan.calls_per_run == 3 + 1  # three samples and the plan call
    assert plan.runs == 1 + 2 + 2  # baseline, two occlusions, two counterfactuals
    llm = model(reader)
    with pytest.raises(CostTooHigh):
        run_explain(store, rid, llm, max_calls=plan.model_calls - 1)
    assert llm.call_count == 0
    announced = []
    report = run_explain(store, rid, llm, max_calls=plan.model_calls, announce=announced.append)
    assert announced[0].model_calls == plan.model_calls
    assert report.model_calls == llm.call_count == plan.model_calls


def test_the_report_is_in_the_hash_chained_trail_and_shown(store):
    rid = answered(store, model(reader))
    report = run_explain(store, rid, model(reader), actor="ops-dana")
    (entry,) = store.get(rid).of_kind(KIND_EXPLANATION)
    assert entry.actor == "ops-dana"
    assert entry.payload["decisive"] == ["warranty"]
    assert entry.payload["model_calls"]["made"] == report.model_calls
    assert store.verify_chain().ok
    text = render_timeline(store.get(rid))
    assert "ATTRIBUTION" in text and "EXPLANATIONS (1)" in text
    assert "=> decisive: warranty" in text
    assert "key        warranty" in text
    assert "REVIEW AND OPERATOR ACTIONS (0)" in text


def test_the_experiments_form_one_trace_linked_to_the_request(store):
    spans = SpanCapture()
    rid = answered(store, model(reader), spans=spans)
    original = spans.named(sc.SPAN_ASSEMBLE, rid)[0]
    report = run_explain(
        store, rid, model(reader), tracer_provider=spans.provider, counterfactuals=1
    )
    (root,) = spans.named(sc.SPAN_EXPLAIN)
    (link,) = root.links
    assert link.context.trace_id == original.context.trace_id
    assert link.context.span_id == original.context.span_id
    assert root.context.trace_id != original.context.trace_id
    assert report.trace_id == f"{root.context.trace_id:032x}"
    experiments = spans.named(sc.SPAN_EXPLAIN_EXPERIMENT)
    kinds = [s.attributes[sc.EXPLAIN_EXPERIMENT] for s in experiments]
    assert sorted(kinds) == ["baseline", "counterfactual", "occlusion", "occlusion"]
    in_trace = [s for s in spans.spans() if s.context.trace_id == root.context.trace_id]
    reruns = [s for s in in_trace if tracerag_name(s) == sc.SPAN_REQUEST]
    assert len(reruns) == 4  # every re-run's six stages sit in the explanation's trace
    assert list(root.attributes[sc.EXPLAIN_FLAGS]) == report.flags


# -- many requests -----------------------------------------------------------------------------


def test_a_window_is_sampled_stably_and_capped_as_a_whole(store):
    ids = [answered(store, model(reader)) for _ in range(3)]
    assert sampled("x", 1.0) and not sampled("x", 0.0)
    rates = [sampled(rid, 0.5) for rid in ids]
    assert rates == [sampled(rid, 0.5) for rid in ids]  # the same sample every time
    since = "2000-01-01T00:00:00+00:00"
    with pytest.raises(CostTooHigh):
        explain_window(
            store,
            model(reader),
            rate=1.0,
            since=since,
            max_calls=10,
            prompt_version="p1",
            model_version="reader",
            retry=FAST_RETRY,
        )
    announced = []
    reports, skipped = explain_window(
        store,
        model(reader),
        rate=1.0,
        since=since,
        counterfactuals=0,
        announce=lambda rids, total: announced.append((rids, total)),
        prompt_version="p1",
        model_version="reader",
        retry=FAST_RETRY,
    )
    assert sorted(r.request_id for r in reports) == sorted(ids) and skipped == []
    assert announced[0][1] == sum(r.plan.model_calls for r in reports)


# -- the command -------------------------------------------------------------------------------


@pytest.fixture
def _own_tracing():
    from tracerag.telemetry import _providers

    yield
    _providers.reset_for_tests()


def test_the_command_explains_a_demo_request_end_to_end(tmp_path, capsys, _own_tracing):
    import json

    path = str(tmp_path / "audit.sqlite")
    assert (
        cli.main(
            [
                "demo",
                "--store",
                path,
                "--question",
                QUESTION,
                "--samples",
                "2",
                "--traces",
                str(tmp_path / "t.jsonl"),
                "--json",
            ]
        )
        == 0
    )
    response = json.loads(capsys.readouterr().out)[0]["response"]
    rid = response["request_id"]
    assert cli.main(["explain", rid, "--store", path, "--max-calls", "2"]) == 4
    assert "raise --max-calls" in capsys.readouterr().err
    traces = tmp_path / "explain.jsonl"
    assert (
        cli.main(["explain", rid, "--store", path, "--paraphrase-auto", "--traces", str(traces)])
        == 0
    )
    out = capsys.readouterr().out
    spans = [json.loads(line) for line in traces.read_text().splitlines() if line.strip()]
    (root,) = [s for s in spans if s["name"] == sc.SPAN_EXPLAIN]
    assert root["links"][0]["context"]["trace_id"] == "0x" + response["trace_id"]
    assert re.search(r"model calls: \d+ planned", out)
    assert out.index("model calls:") < out.index("explanation of")
    assert "occlusion" in out and "paraphrase:" in out
    assert cli.main(["show", rid, "--store", path]) == 0
    assert "EXPLANATIONS (1)" in capsys.readouterr().out
    assert cli.main(["explain", "--store", path]) == 2
    window = ["explain", "--sample", "1", "--since", "2000-01-01T00:00:00+00:00", "--store", path]
    assert cli.main([*window, "--paraphrase-auto"]) == 2
    capsys.readouterr()
    assert cli.main(window) == 0
    out = capsys.readouterr().out
    assert "1 request(s) sampled; model calls:" in out and f"explanation of {rid}" in out
    assert cli.main(["show", rid, "--store", path]) == 0
    assert "EXPLANATIONS (2)" in capsys.readouterr().out


def test_a_record_from_before_attribution_is_explained_from_its_claims(tmp_path):
    captured = []
    llm = model(reader)
    RAGPipeline(
        build_retriever(k=4),
        llm,
        prompt_version="p1",
        model_version="reader",
        n_samples=2,
        retry=FAST_RETRY,
        audit=lambda r: captured.append(r) or True,
    ).invoke(QUESTION)
    (record,) = captured
    del record["signals"]["attribution"]  # as a record written before attribution existed
    store = SQLiteAuditStore(str(tmp_path / "old.sqlite"), auto_enqueue=False)
    store.append_record(record)
    plan = plan_experiments(store.get(record["request_id"]).record)
    assert set(plan.occlude) == {"warranty", "care-plus"}
    report = run_explain(store, record["request_id"], model(reader), counterfactuals=0)
    assert report.decisive == ["warranty"]
    assert report.linked_span_id is None
    assert any("names no span" in n for n in report.notes)
    store.close()


def test_a_reject_or_a_complaint_queues_an_explanation(store) -> None:
    """A user's denial (and a reviewer's reject, through the same call) queues the request;
    ``explain --queued`` explains it once, and the queue is empty afterwards."""
    from tracerag.materials import MaterialRegistry
    from tracerag.materials.feedback import record_feedback
    from tracerag.tools.explain import explain_queued, queued

    rid = answered(store, model(reader))
    assert queued(store) == []
    registry = MaterialRegistry(store)
    record_feedback(rid, "deny", "that is not what the policy says", registry=registry)
    assert queued(store) == [rid]
    llm = model(reader)
    reports, skipped = explain_queued(
        store, llm, prompt_version="p1", model_version=llm.model_name, retry=FAST_RETRY
    )
    assert [r.request_id for r in reports] == [rid] and skipped == []
    assert queued(store) == []
