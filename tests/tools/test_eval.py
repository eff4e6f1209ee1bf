"""``tracerag eval``: two prompt versions over the demo knowledge base, compared and gated."""

from __future__ import annotations

import json

import pytest
from langchain_core.messages import HumanMessage, SystemMessage
from pipeline_fixtures import REPO

from tracerag.cli import main
from tracerag.demo._prompt_versions import V2_NOCITE
from tracerag.demo.models.extractive import ExtractiveChatModel, asks_for_citations
from tracerag.prompts import (
    DEFAULT_PROMPT,
    DEFAULT_PROMPT_VERSION,
    PROMPT,
    PromptVersion,
    get_prompt,
    prompt_values,
    register_prompt,
)
from tracerag.signals._types import Material
from tracerag.store import open_store
from tracerag.tools import _eval_compare as evc
from tracerag.tools import _eval_results as ev
from tracerag.tools._metrics import compute
from tracerag.tools._show import render_timeline

QUESTIONS = REPO / "examples" / "eval" / "questions.jsonl"
V1 = "prompt@v1,model@extractive"
V2 = "prompt@v2-nocite,model@extractive"


# -- prompt versions ----------------------------------------------------------------------------


def test_default_prompt_version_is_the_current_prompt():
    assert DEFAULT_PROMPT.fingerprint == DEFAULT_PROMPT_VERSION
    assert DEFAULT_PROMPT.version == f"v1@{DEFAULT_PROMPT_VERSION}"
    materials = [Material(id="warranty", text="Laptops are covered for 24 months.")]
    for task in ("plan", "answer", "plan_and_answer"):
        assert DEFAULT_PROMPT.messages(task, "How long?", materials) == PROMPT.format_messages(
            **prompt_values(task, "How long?", materials)
        )
    assert get_prompt("v1") is DEFAULT_PROMPT


def test_registry_refuses_a_second_prompt_under_a_taken_name():
    assert register_prompt(V2_NOCITE) is V2_NOCITE  # the same one again is fine
    with pytest.raises(ValueError, match="already registered"):
        register_prompt(PromptVersion(name="v1", system="Be brief."))
    with pytest.raises(KeyError, match="v2-nocite"):
        get_prompt("v9")
    assert V2_NOCITE.fingerprint != DEFAULT_PROMPT.fingerprint


def test_extractive_model_cites_only_when_the_prompt_asks():
    materials = [Material(id="warranty", text="Laptops are covered for 24 months.")]
    question = "How long is the warranty on a laptop?"
    model = ExtractiveChatModel(temperature=0)
    cited = model.invoke(DEFAULT_PROMPT.messages("answer", question, materials)).content
    plain = model.invoke(V2_NOCITE.messages("answer", question, materials)).content
    assert cited == "Laptops are covered for 24 months. [warranty]"
    assert plain == "Laptops are covered for 24 months."
    # a material that talks about citing does not make the prompt ask for citations
    cites = [Material(id="m", text="Please cite the order number in every letter.")]
    assert not asks_for_citations(V2_NOCITE.messages("answer", question, cites))
    assert asks_for_citations(
        [
            SystemMessage(content="回答时请引用资料编号。"),
            HumanMessage(content="<question>x</question>"),
        ]
    )


# -- inputs ---------------------------------------------------------------------------------------


def test_parse_arm():
    assert ev.parse_arm("prompt@v2,model@local") == ev.Arm("v2", "local")
    assert ev.parse_arm(" model@local ") == ev.Arm("v1", "local")
    arm = ev.parse_arm("prompt@v1,model@extractive,samples@3,tier@medium")
    assert (arm.samples, arm.tier) == (3, "medium")
    assert arm.label == "prompt@v1,model@extractive,samples@3,tier@medium"
    for bad in ("prompt=v1", "colour@red", "prompt@v1,prompt@v2", "samples@0", "tier@top"):
        with pytest.raises(ValueError):
            ev.parse_arm(bad)


def test_load_questions(tmp_path):
    questions = ev.load_questions(QUESTIONS)
    assert len(questions) == 8
    assert questions[0].expected_decision == "pass" and questions[0].expected_answer
    path = tmp_path / "q.jsonl"
    path.write_text('# a comment\n{"question": "Why?"}\n\n{"question": "How?", "id": "h"}\n')
    assert [(q.id, q.question) for q in ev.load_questions(path)] == [("q2", "Why?"), ("h", "How?")]
    for text, message in (
        ('{"question": "x", "expected_decision": "maybe"}', "expected_decision"),
        ('{"question": "x", "id": "a"}\n{"question": "y", "id": "a"}', "used twice"),
        ('{"q": "x"}', "question"),
        ("not json", "not JSON"),
        ("", "no questions"),
    ):
        path.write_text(text)
        with pytest.raises(ValueError, match=message):
            ev.load_questions(path)


# -- the comparison -------------------------------------------------------------------------------


def test_gate_checks_direction_and_margin():
    base = {"coverage": 0.90, "accuracy": 0.80, "interception": 0.9, "review": 0.10,
            "escalation": 0.20}  # fmt: skip
    same = evc.gate(base, dict(base))
    assert same == []
    within = {**base, "coverage": 0.885, "escalation": 0.215}
    assert evc.gate(base, within) == []
    worse = {**base, "coverage": 0.85, "escalation": 0.30, "review": 0.0}
    failed = {f["indicator"]: f for f in evc.gate(base, worse)}
    assert set(failed) == {"coverage", "escalation"}  # fewer reviews is not worse
    assert "worse by 5.0 pt" in failed["coverage"]["why"]
    assert evc.gate(base, worse, margins={"coverage": 0.06, "escalation": 0.2}) == []
    assert evc.gate(base, worse, indicators=["accuracy"]) == []
    unmeasured = evc.gate(base, {**base, "interception": None})
    assert [f["indicator"] for f in unmeasured] == ["interception"]
    assert evc.gate({**base, "accuracy": None}, {**base, "accuracy": None}) == []


def test_changed_decisions_keep_both_request_ids():
    def outcome(qid, rid, decision):
        return ev.Outcome(qid, rid, decision, None, None, None, None)

    base = [outcome("a", "r1", "pass"), outcome("b", "r2", "review")]
    cand = [outcome("a", "r3", "pass"), outcome("b", "r4", "escalate")]
    assert evc.changed_decisions(base, cand) == [
        {
            "question_id": "b",
            "baseline": "review",
            "candidate": "escalate",
            "baseline_request_id": "r2",
            "candidate_request_id": "r4",
            "baseline_confidence": None,
            "candidate_confidence": None,
        }
    ]


def test_confidence_distribution():
    dist = ev.confidence_distribution([0.1, 0.5, None, 0.7, 0.9, 1.0])
    assert dist["n"] == 5
    assert dist["mean"] == pytest.approx(0.64)
    assert (dist["min"], dist["p10"], dist["p50"], dist["p90"], dist["max"]) == (
        0.1, 0.1, 0.7, 1.0, 1.0,
    )  # fmt: skip
    assert dist["bands"] == {"below_review": 2, "review_band": 1, "pass_band": 2}
    assert ev.confidence_distribution([])["mean"] is None


# -- the command on the demo knowledge base ----------------------------------------------------


def run_cli(capsys, *args: str) -> tuple[int, dict]:
    code = main(["eval", str(QUESTIONS), *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_worse_prompt_fails_the_gate_and_the_run_is_stored(tmp_path, capsys):
    store_path = tmp_path / "audit.sqlite"
    code, report = run_cli(capsys, "--baseline", V1, "--candidate", V2, "--store", str(store_path))
    assert code == 1
    gate = report["gate"]
    assert not gate["ok"]
    failed = {f["indicator"] for f in gate["failures"]}
    assert {"coverage", "escalation"} <= failed
    base, cand = report["baseline"], report["candidate"]
    assert base["prompt_version"].startswith("v1@sha256:")
    assert cand["prompt_version"].startswith("v2-nocite@sha256:")
    assert base["indicators"]["coverage"] > 0.5
    assert cand["indicators"]["coverage"] == 0.0
    assert base["counts"]["pass"] > cand["counts"]["pass"]
    assert sum(base["counts"].values()) == sum(cand["counts"].values()) == 8
    assert base["adversarial"]["mutations"] > 0
    assert base["indicators"]["interception"] == pytest.approx(
        base["adversarial"]["intercepted"] / base["adversarial"]["mutations"]
    )
    # a plan call and at most five samples each, several answers to one call where they settle
    calls = base["cost"]["model_calls"]
    assert 8 * 2 <= calls < 8 * (1 + 5)
    assert base["cost"]["calls_per_request"] == round(calls / 8, 2)
    assert 2 <= base["cost"]["samples_per_request"] <= 5
    assert base["cost"]["tokens_per_request"] > 0
    assert base["indicators"]["decisions"] > cand["indicators"]["decisions"]
    changed = report["changed_decisions"]
    assert changed and all(ch["baseline"] != ch["candidate"] for ch in changed)

    store = open_store(str(store_path))
    try:
        for ch in changed:  # both requests of every changed question can be looked up
            for key in ("baseline_request_id", "candidate_request_id"):
                trail = store.get(ch[key])
                assert trail.record["evaluation_run"]["run_id"] == report["run_id"]
                assert trail.record["channel"] == "evaluation"
                # the plan call, then one call per round of samples (the model answers a
                # prompt n times in one call)
                adaptive = trail.record["params"]["adaptive"]
                assert adaptive["drawn"] == len(trail.record["samples"])
                assert trail.record["usage"]["calls"] == 1 + adaptive["rounds"]
        run = store.get(report["run_id"])
        [entry] = run.of_kind("evaluation")
        assert entry.payload["gate"]["failures"] == gate["failures"]
        assert entry.payload["reason"].startswith("gate failed")
        shown = render_timeline(run)
        assert "EVALUATION" in shown and "result: FAIL" in shown
        assert changed[0]["baseline_request_id"] in shown
        # evaluation requests are neither customer traffic nor work for reviewers
        assert compute(store, since=None).requests == 0
        assert store.list_queue() == []
        assert store.verify_chain().ok
    finally:
        store.close()


def test_same_configuration_passes_the_gate(capsys):
    code, report = run_cli(capsys, "--baseline", V1, "--candidate", V1, "--no-store")
    assert code == 0
    assert report["gate"]["ok"] and report["changed_decisions"] == []
    assert report["baseline"]["indicators"] == report["candidate"]["indicators"]
    assert report["stored"] is None


def test_cost_per_request_and_per_passed_answer_from_prices(tmp_path, capsys):
    prices = tmp_path / "prices.json"
    prices.write_text(
        json.dumps({"tracerag-extractive-1": {"input_per_1k": 0.002, "output_per_1k": 0.008}})
    )
    store_path = tmp_path / "audit.sqlite"
    code, report = run_cli(
        capsys,
        "--baseline",
        V1,
        "--candidate",
        "prompt@v1,model@extractive,samples@1",
        "--prices",
        str(prices),
        "--gate",
        "escalation",
        "--margin",
        "1.0",
        "--store",
        str(store_path),
    )
    assert code == 0
    base, cand = report["baseline"]["cost"], report["candidate"]["cost"]
    store = open_store(str(store_path))
    try:
        spent = [
            store.get(o["request_id"]).record["usage"]["cost"]["total"]
            for o in report["baseline"]["outcomes"]
        ]
    finally:
        store.close()
    assert base["cost_total"] == pytest.approx(sum(spent))
    assert base["cost_per_request"] == pytest.approx(sum(spent) / 8)
    assert base["cost_per_passed_answer"] == pytest.approx(
        sum(spent) / report["baseline"]["counts"]["pass"]
    )
    assert cand["model_calls"] == 8 * 2  # one sample: a plan call and one sample each
    assert cand["cost_per_request"] < base["cost_per_request"]


def test_usage_errors_exit_2(capsys):
    assert main(["eval", str(QUESTIONS), "--baseline", "prompt@nope", "--candidate", V1]) == 2
    assert "no prompt version 'nope'" in capsys.readouterr().err
    assert main(["eval", str(QUESTIONS), "--baseline", V1, "--candidate", V2, "--gate", "x"]) == 2
    assert main(["eval", "missing.jsonl", "--baseline", V1, "--candidate", V2]) == 2
