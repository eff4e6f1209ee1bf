"""Tier 1 and tier 2 attribution: retrieval shape, surface match, use and rejection, shares."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, fields
from datetime import date

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tracerag._routing import ESCALATE, PASS, REVIEW
from tracerag.signals._attribution import (
    BELOW_FLOOR,
    CITED_SUPPORTED,
    CITED_UNSUPPORTED,
    CLEAR,
    CLUSTERED,
    IRRELEVANT,
    KEY,
    MODERATE,
    NOT_CITED,
    OUTSIDE_VALIDITY,
    STALE,
    SUPPORTING,
    ClaimLink,
    MaterialAttribution,
    ShapeThresholds,
    apply_retrieval_shape,
    attribute,
    claim_links,
    explain_retrieval,
    surface_match,
    validity_reason,
)
from tracerag.signals._citations import verify_citations
from tracerag.signals._types import Material
from tracerag.text._words import token_set, tokenize

TODAY = date(2026, 6, 1)


# -- score shape ---------------------------------------------------------------------------


def test_a_clear_winner_is_clear_and_near_equal_scores_are_a_cluster():
    clear = explain_retrieval([("a", 0.52), ("b", 0.17), ("c", 0.12)])
    assert clear.shape == CLEAR
    assert clear.margin == pytest.approx(0.35)
    assert clear.relative_margin == pytest.approx(0.35 / 0.52, abs=1e-6)
    assert clear.near_top == ("a",)

    cluster = explain_retrieval([("tv", 0.355), ("appliance", 0.334), ("fees", 0.13)])
    assert cluster.shape == CLUSTERED
    assert cluster.near_top == ("tv", "appliance")
    assert cluster.candidates[0].gap == 0.0

    between = explain_retrieval([("old", 0.55), ("new", 0.426), ("x", 0.29)])
    assert between.shape == MODERATE  # 22.5 % margin: neither clear nor near-equal


def test_shape_thresholds_are_relative_to_the_top_score_and_configurable():
    # the same proportions at another scale give the same shape
    assert explain_retrieval([("a", 35.5), ("b", 33.4)]).shape == CLUSTERED
    wider = ShapeThresholds(clear_margin=0.5, cluster_band=0.3, cluster_size=3)
    assert explain_retrieval([("a", 1.0), ("b", 0.8), ("c", 0.1)], wider).shape == MODERATE
    assert explain_retrieval([("a", 1.0), ("b", 0.8), ("c", 0.75)], wider).shape == CLUSTERED
    with pytest.raises(ValueError):
        ShapeThresholds(clear_margin=0.1, cluster_band=0.2)
    with pytest.raises(ValueError):
        ShapeThresholds(cluster_size=1)


def test_degenerate_retrievals_have_their_own_shape():
    assert explain_retrieval([]).shape == "empty"
    assert explain_retrieval([("a", 0.4)]).shape == "single"
    unscored = explain_retrieval([("a", None), ("b", 0.3)])
    assert unscored.shape == "unscored"
    assert unscored.margin is None and unscored.top_score is None
    assert [c.material_id for c in unscored.candidates] == ["a", "b"]


def test_candidates_keep_retrieved_order_and_the_record_is_complete():
    record = explain_retrieval([("a", 0.3), ("b", 0.5)]).to_record()
    assert [c["id"] for c in record["candidates"]] == ["a", "b"]
    assert record["top_score"] == 0.5
    assert record["candidates"][0]["gap"] == pytest.approx(0.4)
    assert record["thresholds"]["cluster_band"] == 0.1


@pytest.mark.parametrize(
    ("decision", "shape", "enabled", "expected"),
    [
        (PASS, CLUSTERED, True, REVIEW),
        (PASS, CLUSTERED, False, PASS),
        (PASS, CLEAR, True, PASS),
        (PASS, MODERATE, True, PASS),
        (ESCALATE, CLUSTERED, True, ESCALATE),  # never softens a stricter route
        (REVIEW, CLUSTERED, True, REVIEW),
    ],
)
def test_a_clustered_retrieval_sends_a_passing_answer_to_review_only_when_enabled(
    decision, shape, enabled, expected
):
    route, why = apply_retrieval_shape(decision, shape, enabled)
    assert route == expected
    assert (why is not None) == (route != decision)


# -- surface match ---------------------------------------------------------------------------


def test_surface_match_names_the_shared_question_terms_in_english_and_chinese():
    english = surface_match(
        "How long is the warranty on a laptop?",
        "Laptops and tablets are covered by an extended 24-month warranty.",
    )
    assert set(english.shared_terms) == {"warranty", "laptop"}
    assert english.coverage == pytest.approx(2 / 3, abs=1e-4)  # long, warranty, laptop

    chinese = surface_match("登录密码输错几次会锁定账户？", "连续输错5次密码，账户将被锁定30分钟。")
    assert {"密码", "输错", "锁定", "账户"} <= set(chinese.shared_terms)
    assert "登录" not in chinese.shared_terms
    assert 0 < chinese.coverage < 1

    assert surface_match("的了吗", "anything").coverage == 0.0


# -- use and rejection ------------------------------------------------------------------------


def _materials() -> list[Material]:
    return [
        Material("warranty", "Laptops are covered for 24 months.", score=0.6),
        Material("care", "Care Plus adds accidental damage cover.", score=0.5),
        Material(
            "warranty-2023",
            "Under the 2023 edition laptops were covered for 12 months.",
            score=0.55,
            metadata={"superseded_by": "warranty"},
        ),
        Material(
            "promo",
            "Laptop promotion terms.",
            score=0.4,
            metadata={"valid_until": "2026-01-31"},
        ),
        Material("trade-in", "Trade in an old phone.", score=0.05),
    ]


def test_every_material_gets_its_reason_in_one_request():
    claims = [
        ClaimLink("supported", ("warranty",), "warranty"),
        ClaimLink("unsupported", ("care",), "care"),
        ClaimLink("stale", ("warranty-2023",), None),
    ]
    result = attribute(
        "How long is the laptop warranty?",
        _materials(),
        claims,
        relevance_floor=0.1,
        today=TODAY,
    )
    by_id = {m.material_id: m for m in result.materials}
    assert by_id["warranty"].used and by_id["warranty"].reason == CITED_SUPPORTED
    assert by_id["care"].reason == CITED_UNSUPPORTED and not by_id["care"].used
    assert by_id["warranty-2023"].reason == STALE
    assert by_id["warranty-2023"].detail == "superseded by warranty"
    assert set(by_id["warranty-2023"].reasons) == {STALE, CITED_UNSUPPORTED}
    assert by_id["promo"].reason == OUTSIDE_VALIDITY
    assert "2026-01-31" in by_id["promo"].detail
    assert by_id["trade-in"].reason == BELOW_FLOOR
    assert set(by_id["trade-in"].reasons) == {BELOW_FLOOR, NOT_CITED}
    assert result.used_ids == ("warranty",)
    assert result.unattributed == pytest.approx(2 / 3, abs=1e-6)


def test_each_material_entry_is_a_whole_frozen_material_attribution():
    claims = [ClaimLink("supported", ("warranty",), "warranty")]
    result = attribute("How long is the laptop warranty?", _materials(), claims, today=TODAY)
    names = {f.name for f in fields(MaterialAttribution)}
    for m in result.materials:
        assert set(vars(m)) == names
        assert m == MaterialAttribution(**{name: getattr(m, name) for name in names})
        assert hash(m) == hash(MaterialAttribution(**vars(m)))
        with pytest.raises(FrozenInstanceError):
            m.role = KEY  # type: ignore[misc]


def test_without_a_floor_an_uncited_material_is_retrieved_but_never_cited():
    result = attribute("q", _materials()[:2], [ClaimLink("supported", ("warranty",), "warranty")])
    assert result.get("care").reason == NOT_CITED
    assert result.get("care").detail == "retrieved, never cited"


def test_validity_agrees_with_what_the_verifier_refuses_and_adds_not_yet_effective():
    for meta in (
        {"superseded_by": "x"},
        {"status": "withdrawn"},
        {"status": "expired"},
        {"valid_until": "2025-12-31"},
    ):
        material = Material("m", "t", metadata=meta)
        assert material.stale_reason(TODAY) is not None
        assert validity_reason(meta, TODAY) is not None
    assert validity_reason({"effective_from": "2027-01-01"}, TODAY) == (
        OUTSIDE_VALIDITY,
        "effective from 2027-01-01, not yet",
    )
    current = {"effective_from": "2025-01-01", "valid_until": "2027-01-01"}
    assert validity_reason(current, TODAY) is None
    assert validity_reason({"valid_until": "not a date"}, TODAY) is None


def test_prompt_position_follows_the_prompt_order_not_the_rank():
    ms = _materials()[:3]
    result = attribute("q", ms, [], prompt_order=["care", "warranty"])
    assert [m.prompt_position for m in result.materials] == [2, 1, None]
    assert [m.rank for m in result.materials] == [1, 2, 3]


# -- shares and roles -------------------------------------------------------------------------


def test_shares_weigh_each_claim_the_same_and_roles_compare_within_the_request():
    ms = [Material(i, f"text {i}", score=0.5) for i in ("a", "b", "c", "d")]
    claims = [
        ClaimLink("supported", ("a",), "a"),
        ClaimLink("supported", ("a", "b"), "a"),
        ClaimLink("supported", ("a",), "a"),
        ClaimLink("supported", ("b",), "b"),
    ]
    result = attribute("q", ms, claims)
    shares = {m.material_id: m.share for m in result.materials}
    assert shares == {"a": 0.75, "b": 0.25, "c": 0.0, "d": 0.0}
    roles = {m.material_id: m.role for m in result.materials}
    assert roles == {"a": KEY, "b": SUPPORTING, "c": IRRELEVANT, "d": IRRELEVANT}
    assert result.key_ids == ("a",)
    assert result.get("b").cited_by == (1, 3) and result.get("b").supports == (3,)

    even = attribute("q", ms, claims[:1] + claims[3:])
    assert even.key_ids == ("a", "b")  # two materials carrying as much are both key


def test_no_claims_means_nothing_is_attributed():
    result = attribute("q", _materials()[:2], [])
    assert result.n_claims == 0 and result.unattributed == 0.0
    assert all(m.role == IRRELEVANT and m.share == 0.0 for m in result.materials)


def test_claim_links_resolve_markers_and_drop_fabricated_ids():
    materials = _materials()[:2]
    report = verify_citations(
        "Laptops are covered for 24 months. [warranty][ghost] Care Plus adds cover. [2]",
        materials,
        resolve=lambda marker: {"warranty": "warranty", "2": "care"}.get(marker),
    )
    links = claim_links(
        report.claims, resolve=lambda marker: {"warranty": "warranty", "2": "care"}.get(marker)
    )
    assert links[0].cited_ids == ("warranty",)
    assert links[1].cited_ids == ("care",)
    result = attribute("laptop warranty", materials, links)
    assert result.get("warranty").cited_by == (0,)


def test_summary_has_ids_roles_and_reasons_but_no_text():
    result = attribute(
        "How long is the laptop warranty?",
        _materials(),
        [ClaimLink("supported", ("warranty",), "warranty")],
        today=TODAY,
    )
    summary = result.summary()
    assert [s["material_id"] for s in summary] == [m.id for m in _materials()]
    assert set(summary[0]) == {
        "material_id",
        "used",
        "reason",
        "detail",
        "role",
        "share",
        "position",
        "score",
    }
    flat = repr(summary)
    assert all(m.text not in flat for m in _materials())


# -- the tokeniser's fast set form --------------------------------------------------------------

_MIXED = st.lists(
    st.sampled_from(
        [*"abcXYZ’'s ,.;0123456789[]-", *"退款到账保修期的了吗", "ies", "ed ", "ing ", "took "]
    ),
    max_size=40,
).map("".join)


@given(_MIXED)
def test_token_set_is_the_set_of_tokenize(text):
    assert token_set(text) == frozenset(tokenize(text))


def test_token_set_matches_tokenize_on_the_demo_knowledge_base():
    from tracerag.demo.kb import load_documents

    documents = load_documents()
    assert documents
    for doc in documents:
        assert token_set(doc.page_content) == frozenset(tokenize(doc.page_content))
