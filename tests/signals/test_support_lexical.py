from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from tracerag.signals._lexical import LexicalSupport
from tracerag.signals._support import support

POLICY_EN = (
    "Returns are accepted within 30 days of delivery. "
    "Refunds are issued to the original payment method within 5 business days. "
    "Gift cards cannot be refunded. "
    "Shipping is free for orders over $50. [M03]"
)
POLICY_ZH = (
    "退货政策：自签收之日起7天内可无理由退货。"
    "退款将在3到5个工作日内退回原支付账户。"
    "运费为10元，订单满99元免运费。"
    "礼品卡不支持退款。"
)


def test_english_claim_supported_with_sentence_offsets() -> None:
    result = support(
        "Refunds go back to the original payment method within 5 business days.", POLICY_EN
    )
    assert result.supported and result.backend == "lexical"
    assert POLICY_EN[result.start : result.end] == result.sentence
    assert result.sentence.startswith("Refunds are issued")
    assert not result.mismatches


def test_chinese_claim_supported() -> None:
    result = support("退款会在3-5个工作日内退回原支付账户。", POLICY_ZH)
    assert result.supported
    assert result.sentence == "退款将在3到5个工作日内退回原支付账户。"
    assert POLICY_ZH[result.start : result.end] == result.sentence


def test_changed_amount_is_a_mismatch() -> None:
    result = support("订单满199元免运费。", POLICY_ZH)
    assert not result.supported
    assert result.mismatches == ("199元",)
    assert "199元" in result.reason
    assert result.score < get_threshold()


def test_amount_in_another_format_still_matches() -> None:
    assert support("运费是十元。", POLICY_ZH).supported
    assert support("Orders above 50 dollars ship free.", POLICY_EN).supported


def test_changed_duration_is_a_mismatch() -> None:
    result = support("Returns are accepted within 60 days of delivery.", POLICY_EN)
    assert not result.supported
    assert result.mismatches == ("60 days",)


def test_negation_flip_is_not_supported() -> None:
    result = support("Gift cards can be refunded.", POLICY_EN)
    assert not result.supported
    assert "negation" in result.reason
    result = support("礼品卡支持退款。", POLICY_ZH)
    assert not result.supported


def test_unrelated_claim_is_not_supported_and_names_its_words() -> None:
    result = support("Customers earn loyalty points on every purchase.", POLICY_EN)
    assert not result.supported
    assert "loyalty" in result.unsupported_terms
    assert "points" in result.unsupported_terms


def test_candidates_are_ranked_sentences() -> None:
    result = support("Returns are accepted within 30 days.", POLICY_EN)
    assert len(result.candidates) >= 3
    scores = [c[2] for c in result.candidates]
    assert scores == sorted(scores, reverse=True)
    assert (result.start, result.end) == result.candidates[0][:2]
    for start, end, _ in result.candidates:
        assert POLICY_EN[start:end].strip() == POLICY_EN[start:end]


def test_corpus_changes_weights_not_the_verdict() -> None:
    corpus = [POLICY_EN, "Shipping to Canada costs $15.", "Returns need a receipt."]
    result = support("Returns are accepted within 30 days.", POLICY_EN, corpus=corpus)
    assert result.supported


def test_claim_with_citation_marker() -> None:
    assert support("Shipping is free for orders over $50 [M03].", POLICY_EN).supported


def get_threshold() -> float:
    return LexicalSupport().threshold


_claims = [
    "Returns are accepted within {n} days of delivery.",
    "Refunds take {n} business days.",
    "Shipping is free for orders over ${n}.",
    "退款将在{n}个工作日内退回。",
    "订单满{n}元免运费。",
    "The fee is {n}% of the order.",
]
_materials = [
    "Returns are accepted within {m} days of delivery. Refunds take {m} business days.",
    "Shipping is free for orders over ${m}. The fee is {m}% of the order.",
    "退款将在{m}个工作日内退回。订单满{m}元免运费。",
    "Returns are accepted within {m} days of delivery, refunds take {m} business days, "
    "shipping is free for orders over ${m} and the fee is {m}%. "
    "订单满{m}元免运费，{m}个工作日内退回。",
]


@settings(max_examples=examples(150), deadline=None)
@given(
    st.integers(min_value=0, max_value=100_000),
    st.integers(min_value=0, max_value=100_000),
    st.sampled_from(_claims),
    st.sampled_from(_materials),
)
def test_a_claim_whose_number_is_not_in_the_material_is_never_supported(
    n: int, m: int, claim: str, material: str
) -> None:
    assume(n != m)
    result = support(claim.format(n=n), material.format(m=m))
    assert not result.supported
    assert result.mismatches


@settings(max_examples=examples(50), deadline=None)
@given(st.integers(min_value=0, max_value=100_000), st.sampled_from(_claims))
def test_the_claim_restated_by_the_material_is_supported(n: int, claim: str) -> None:
    text = claim.format(n=n)
    assert support(text, "Policy. " + text + " Other things apply.").supported


_text = st.lists(
    st.sampled_from([*"ab Z1.2,。！？；!?;元%$年月日不没[]M0 \n", "退款", "30天", " not "]),
    min_size=1,
    max_size=40,
).map("".join)


@settings(max_examples=examples(100), deadline=None)
@given(_text, _text)
def test_any_text_gives_a_well_formed_result(claim: str, material: str) -> None:
    assume(claim.strip() and material.strip())
    result = support(claim, material)
    assert 0.0 <= result.score <= 1.0
    assert material[result.start : result.end] == result.sentence
    assert not (result.supported and result.mismatches)
