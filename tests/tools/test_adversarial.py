"""The adversarial self-test: mutations, and the verifier's goals on the demo knowledge base."""

from __future__ import annotations

import json
import random

import pytest

from tracerag.cli import main
from tracerag.demo.models.extractive import ExtractiveChatModel
from tracerag.signals._claims import split_claims
from tracerag.signals._types import Material
from tracerag.tools.adversarial import (
    DEFAULT_FLOORS,
    MUTATION_KINDS,
    Case,
    Inventory,
    MutatingChatModel,
    cases_from_records,
    claim_mutations,
    demo_records,
    mutate_answer,
    parse_floors,
    run_adversarial,
    store_cases,
)

WARRANTY = Material(
    id="warranty",
    text="All new devices carry a 12-month warranty from the date of delivery. Under Clause "
    "6.1, laptops and tablets are covered by an extended 24-month warranty.",
)
CARE = Material(
    id="care-plus",
    text="Care+ costs ¥199 for a phone and ¥399 for a laptop. Gold members pay with Alipay.",
)
RETURNS = Material(
    id="returns",
    text="The returns policy takes effect on 2025-01-01. Opened items cannot be returned.",
)
PRICE = Material(
    id="price-protection", text="现行价格保护规则自2025年1月1日起生效。秒杀商品不在价格保护范围内。"
)
OLD = Material(
    id="returns-2023",
    text="Any item can be returned within 30 days.",
    metadata={"superseded_by": "returns"},
)
MATERIALS = [WARRANTY, CARE, RETURNS, PRICE, OLD]


def mutations(kind: str, answer: str, index: int = 0, seed: int = 0):
    inventory = Inventory()
    inventory.add([*MATERIALS, Material(id="gift-cards", text="Gift cards last 3 years.")])
    return claim_mutations(kind, answer, index, MATERIALS, inventory, random.Random(seed))


# -- the mutations -------------------------------------------------------------------------------


def test_fabricated_ids_were_never_retrieved():
    found = mutations("fabricated", "Laptops get a 24-month warranty. [warranty]")
    retrieved = {m.id for m in MATERIALS}
    assert len(found) == 2  # a known id that was not retrieved, and an invented one
    for m in found:
        (claim,) = split_claims(m.answer)
        assert claim.cited_ids and not set(claim.cited_ids) & retrieved
    assert "[gift-cards]" in found[0].answer


def test_wrong_material_is_another_current_retrieved_one():
    found = mutations("wrong_material", "Laptops get a 24-month warranty. [warranty]")
    assert found
    for m in found:
        (claim,) = split_claims(m.answer)
        (cited,) = claim.cited_ids
        assert cited in {"care-plus", "returns", "price-protection"}  # never the outdated one


def test_numbers_change_in_every_way_but_never_repeat_a_claim_number():
    found = mutations("number", "Care+ costs ¥199 for a phone and ¥399 for a laptop. [care-plus]")
    details = {m.detail for m in found}
    assert "¥199 → ¥398" in details and "¥199 → ¥99" in details and "¥399 → ¥798" in details
    assert not any("→ ¥399" in d for d in details)  # would repeat the other price
    zh = mutations("number", "登录密码连续输错5次后，账户将被锁定30分钟。[warranty]")
    assert {m.detail for m in zh} >= {"5 → 10", "30分钟 → 60分钟"}


@pytest.mark.parametrize(
    "answer, pattern",
    [
        ("The policy takes effect on 2025-01-01. [returns]", r"\d{4}-\d{2}-\d{2}"),
        ("现行价格保护规则自2025年1月1日起生效。[price-protection]", r"20\d\d年\d+月\d+日"),
        ("The new rules apply from March 15, 2024. [returns]", r"[A-Z][a-z]+ \d+, 20\d\d"),
    ],
)
def test_dates_shift_in_their_own_format(answer, pattern):
    import re

    found = mutations("date", answer)
    assert len(found) == 3  # day, month and year
    for m in found:
        (claim,) = split_claims(m.answer)
        assert re.search(pattern, claim.text), claim.text
        assert claim.text != split_claims(answer)[0].text


def test_entity_swaps_use_names_from_another_material():
    found = mutations("entity", "Under Clause 6.1, laptops and tablets are covered. [warranty]")
    assert found
    assert any("phones" in m.mutated for m in found)  # "phone" occurs in care-plus
    zh = mutations("entity", "会员日当天，金卡会员购物可获得双倍积分。[warranty]")
    assert zh == []  # no other tier occurs in another material here


@pytest.mark.parametrize(
    "answer, expected",
    [
        ("Laptops are covered by a 24-month warranty. [warranty]", "are not covered"),
        ("Opened items cannot be returned. [returns]", "Opened items can be returned"),
        ("Care+ costs ¥199 for a phone. [care-plus]", "does not cost"),
        ("秒杀商品不在价格保护范围内。[price-protection]", "秒杀商品在价格保护范围内"),
        ("每个订单可以申请1次价格保护。[price-protection]", "不可以"),
    ],
)
def test_negation_is_added_or_removed(answer, expected):
    (m,) = mutations("negation", answer)
    assert expected in m.answer


def test_mutations_leave_other_claims_alone():
    answer = "Laptops get a 24-month warranty. [warranty] Care+ costs ¥199 for a phone. [care-plus]"
    checked = 0
    for kind in MUTATION_KINDS:
        for m in mutations(kind, answer, index=1):
            assert m.answer.startswith("Laptops get a 24-month warranty. [warranty]")
            checked += 1
    assert checked


def test_mutate_answer_picks_a_cited_claim():
    m = mutate_answer(
        "Opened items cannot be returned. [returns]", MATERIALS, "negation", random.Random(1)
    )
    assert m is not None and m.kind == "negation"
    assert mutate_answer("No citation here.", MATERIALS, "number", random.Random(1)) is None


def test_parse_floors():
    assert parse_floors(None) == DEFAULT_FLOORS
    floors = parse_floors(["fabricated=1.0,number=0.9", "wrong-material=95%"])
    assert floors["number"] == 0.9 and floors["wrong_material"] == pytest.approx(0.95)
    assert floors["date"] == DEFAULT_FLOORS["date"]
    for bad in ("numbers=0.9", "number", "number=2"):
        with pytest.raises(ValueError):
            parse_floors([bad])


# -- the goals on the demo knowledge base --------------------------------------------------------


@pytest.fixture
def demo(adversarial_demo):
    """Real answers: every demo and probe question through RAGPipeline at seeds 1, 2, 3."""
    return adversarial_demo


@pytest.fixture
def report(lexical_report):
    return lexical_report


def test_demo_cases_are_real_pipeline_answers(demo):
    assert len(demo) >= 50
    assert any(any("\u4e00" <= ch <= "\u9fff" for ch in c.question) for c in demo)
    for case in demo:
        ids = {m.id for m in case.materials}
        assert case.answer and ids


def test_every_mutation_type_is_exercised_in_both_languages(report):
    for kind in ("fabricated", "wrong_material", "number", "negation"):
        assert report.kinds[kind].by_language.get("en", [0, 0])[1] > 0, kind
        assert report.kinds[kind].by_language.get("zh", [0, 0])[1] > 0, kind
    assert report.kinds["date"].total >= 4
    assert report.kinds["entity"].total >= 10


def test_all_fabricated_citations_are_intercepted(report):
    result = report.kinds["fabricated"]
    assert result.total >= 50 and result.intercepted == result.total


def test_changed_numbers_are_intercepted(report):
    result = report.kinds["number"]
    assert result.total >= 50
    assert result.rate >= 0.95, result.misses[:5]


def test_shifted_dates_are_intercepted(report):
    result = report.kinds["date"]
    assert result.rate >= 0.95, result.misses[:5]


def test_false_alarms_on_unmutated_answers(report):
    assert report.eligible >= 40
    assert report.false_alarm_rate <= 0.05, report.false_alarm_examples[:5]


def test_report_passes_the_default_floors(report):
    assert report.ok, report.failures()
    data = report.to_dict()
    json.dumps(data, ensure_ascii=False)
    assert data["ok"] and set(data["mutations"]) == set(MUTATION_KINDS)
    text = report.render()
    assert "result: PASS" in text and "false alarms" in text


def test_a_missed_floor_fails_the_report(demo, report):
    # the subset is the cases of the full run's misses: the mutations are seeded by the answer's
    # content, so the same mutations are made again and the same ones are missed
    missed = {k: {m["case"] for m in r.misses} for k, r in report.kinds.items() if r.misses}
    assert missed, "the lexical backend intercepted every mutation: no subset misses a floor"
    subset = [c for c in demo if any(c.case_id in ids for ids in missed.values())]
    assert subset
    strict = run_adversarial(
        subset,
        floors={
            "entity": 1.0,
            "negation": 1.0,
            "number": 1.0,
            "wrong_material": 1.0,
            "date": 1.0,
            "fabricated": 1.0,
        },
    )
    assert {k for k, r in strict.kinds.items() if not r.ok} == set(missed)
    assert not strict.ok and "< floor" in "".join(strict.failures())


def test_outdated_citations_are_not_counted_as_false_alarms(demo, report):
    def cites_an_outdated_material(case) -> bool:
        claims = split_claims(case.answer)
        by_id = {m.id: m for m in case.materials}
        cited = [c for claim in claims for c in claim.cited_ids]
        return (
            bool(cited)
            and all(claim.cited_ids for claim in claims)
            and all(c in by_id for c in cited)
            and any(by_id[c].stale_reason() for c in cited)
        )

    outdated = [c for c in demo if cites_an_outdated_material(c)]
    assert outdated, "no demo answer cites an outdated material"
    assert report.excluded.get("citing an outdated material", 0) == len(outdated)
    alone = run_adversarial(outdated)
    assert alone.excluded == {"citing an outdated material": len(outdated)}
    assert (alone.eligible, alone.false_alarms, alone.false_alarm_rate) == (0, 0, None)


# -- stored records, the wrapper model and the command -------------------------------------------


@pytest.fixture(scope="module")
def records():
    return demo_records(
        seeds=[1],
        questions=[
            "How long is the warranty on a laptop?",
            "Care+ 多少钱？",
            "How much does air-conditioner installation cost?",
            "登录密码输错几次会锁定账户？",
        ],
    )


def test_cases_from_records_dedupe_answers(records):
    cases = cases_from_records(records + records)
    assert len(cases) == len(cases_from_records(records))
    assert all(isinstance(c, Case) and c.materials for c in cases)
    assert cases_from_records([{"materials": [], "samples": []}]) == []


def test_store_cases_and_command(records, tmp_path, capsys):
    from tracerag.store import open_store

    url = str(tmp_path / "audit.sqlite")
    store = open_store(url)
    for record in records:
        store.append_record(record)
    store.close()
    cases = store_cases(url)
    assert len(cases) == len(cases_from_records(records))
    assert main(["audit", "adversarial", "--store", url, "--json", "--floor", "number=0"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["mutations"]["fabricated"]["rate"] == 1.0
    assert data["source"].startswith("store ")
    from tracerag.signals._support import Support, register_backend

    class Credulous:  # a verifier that believes everything
        name = "credulous"
        threshold = 0.5

        def __call__(self, claim, material_text, *, corpus=None):
            return Support(1.0, True, material_text, 0, len(material_text), self.name)

    register_backend("credulous", Credulous)
    code = main(["audit", "adversarial", "--store", url, "--backend", "credulous"])
    out = capsys.readouterr().out
    assert code == 1 and "BELOW FLOOR" in out and "result: FAIL" in out
    assert main(["audit", "adversarial", "--store", url, "--floor", "nonsense=1"]) == 2
    assert main(["audit", "adversarial", "--store", url, "--backend", "judge"]) == 2
    assert "JudgeSupport" in capsys.readouterr().err


def test_mutating_model_makes_answers_wrong():
    from tracerag._pipeline import RAGPipeline
    from tracerag.demo.kb import build_retriever

    base = ExtractiveChatModel(seed=3)
    model = MutatingChatModel(base=base, kind="number", rate=1.0, seed=3)
    records: list[dict] = []
    pipeline = RAGPipeline(
        build_retriever(k=4),
        model,
        prompt_version="p",
        model_version="m",
        n_samples=3,
        audit=lambda record: records.append(record) or True,
    )
    response = pipeline.invoke("How long is the warranty on a laptop?")
    mutated = model.mutated
    assert len(mutated) == 3
    assert all(m.mutated != m.original and m.kind == "number" for m in mutated.values())
    assert response.decision == "escalate" and response.answer is None
    # the changed number is caught (the score is the operator's: the answer is withheld)
    assert records[0]["response"]["signal_detail"]["citation_score"] == 0.0
