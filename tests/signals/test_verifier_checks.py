"""The verifier's checks against the sentence a claim aligns to (lexical and learned backends)."""

import pytest

from tracerag.signals._embeddings import minilm_available
from tracerag.signals._learned import FEATURES, Combiner, LearnedSupport
from tracerag.signals._lexical import LexicalSupport
from tracerag.signals._support import get_backend

WARRANTY = (
    "All new devices carry a 12-month warranty from the date of delivery. Under Clause 6.1, "
    "laptops and tablets are covered by an extended 24-month warranty."
)
WARRANTY_ZH = "笔记本电脑和平板电脑享受24个月保修。手机享受12个月保修，人为损坏不在保修范围内。"
BACKENDS = [LexicalSupport(), LearnedSupport()]


@pytest.fixture(params=BACKENDS, ids=lambda b: b.name)
def backend(request):
    return request.param


def test_a_number_stated_only_in_another_sentence_is_not_support(backend):
    claim = "Under Clause 6.1, laptops are covered by an extended 12-month warranty."
    result = backend(claim, WARRANTY)
    assert not result.supported
    assert "12-month" in result.mismatches
    assert "24-month" in result.reason
    assert backend(
        "Under Clause 6.1, laptops are covered by an extended 24-month warranty.", WARRANTY
    ).supported


def test_chinese_number_stated_only_elsewhere_is_not_support(backend):
    assert not backend("笔记本电脑享受12个月保修。", WARRANTY_ZH).supported
    assert backend("笔记本电脑享受24个月保修。", WARRANTY_ZH).supported
    material = "笔记本电脑享受24个月保修。手机享受12个月保修。"
    assert backend("手机享受十二个月保修。", material).supported  # number words


def test_a_question_in_the_material_supports_nothing(backend):
    material = "Why do people sneeze when they look at the sun? Nobody knows for sure."
    assert not backend("People sneeze when they look at the sun.", material).supported


def test_a_preamble_naming_the_source_is_not_content(backend):
    material = "Adults need seven or more hours of sleep each night for good health."
    claim = (
        "According to the National Institutes of Health, adults need seven or more hours "
        "of sleep each night."
    )
    assert backend(claim, material).supported


def test_a_reversed_comparison_is_not_support(backend):
    material = "Calcium is more reactive than magnesium, and both react with water."
    assert backend("Calcium is more reactive than magnesium.", material).supported
    reversed_ = backend("Magnesium is more reactive than calcium.", material)
    assert not reversed_.supported and "comparison" in reversed_.reason


def test_each_coordinated_part_must_be_stated(backend):
    claim = (
        "Under Clause 6.1, laptops and dishwashers are covered by an extended 24-month warranty."
    )
    result = backend(claim, WARRANTY)
    assert not result.supported and "dishwashers" in result.reason


def test_learned_never_supports_a_claim_the_material_barely_covers():
    backend = LearnedSupport()
    result = backend("People sneeze when they look at the sun.", "Nobody knows for sure.")
    assert not result.supported and result.score < backend.threshold


def test_shipped_coefficients_load_and_score_in_range():
    combiner = Combiner.load()
    assert combiner.features == FEATURES and combiner.version.startswith("support-learned")
    assert 0.0 < combiner.threshold < 1.0
    low = combiner.probability([0.0] * len(FEATURES))
    full = list(combiner.mean)
    full[FEATURES.index("adjusted")] = 1.0
    full[FEATURES.index("coverage")] = 1.0
    assert 0.0 <= low <= 1.0
    assert combiner.probability(full) > combiner.probability(combiner.mean)


def test_numbers_in_words_are_compared(backend):
    material = "The committee meets six to seven times per year. 退货运费为一百二十元。"
    assert not backend("The committee meets one per year.", material).supported
    assert backend("退货运费为120元。", material).supported
    assert not backend("退货运费为一百元。", material).supported


def test_the_claims_actor_must_act_in_the_sentence(backend):
    material = "In 2019 the group split, with Jones leaving the party and joining Smith's faction."
    moved = backend("Smith left the party in 2019.", material)
    assert not moved.supported and "Smith" in moved.reason
    material = "The company was founded in 1990 by John Smith and has grown since."
    assert backend("John Smith founded the company in 1990.", material).supported


def test_a_chinese_word_swapped_wholesale_is_not_support(backend):
    material = (
        "登录密码连续输错5次后，账户将被锁定30分钟。"
        "更换绑定手机号需要通过原手机号短信或人脸识别验证。"
    )
    swapped = backend("更换绑定平板电脑号需要通过原手机号短信或人脸识别验证。", material)
    assert not swapped.supported and "平板电脑" in swapped.reason
    assert backend("更换绑定手机号需要通过原手机号短信或人脸识别验证。", material).supported
    # a verb or auxiliary said another way is a paraphrase, not a swap
    assert backend("更换绑定手机号必须通过原手机号短信或人脸识别验证。", material).supported
    material = "在校学生完成学生认证后，购买笔记本电脑和平板电脑可享受5%的折扣。"
    assert not backend(
        "在校学生完成学生认证后，购买笔记本电脑和手机可享受5%的折扣。", material
    ).supported


def test_the_combiner_with_similarities_needs_embeddings():
    from tracerag.errors import ConfigurationError

    combiner = Combiner.load(embeddings=True)
    assert combiner.uses_similarity and not Combiner.load().uses_similarity
    with pytest.raises(ConfigurationError, match="embeddings"):
        LearnedSupport(combiner)


@pytest.mark.skipif(not minilm_available(), reason="MiniLM model not installed (embeddings extra)")
def test_learned_with_minilm_keeps_the_checks_and_accepts_a_restatement():
    backend = get_backend("learned-embeddings")
    assert backend.combiner.uses_similarity
    claim = "Under Clause 6.1, laptops are covered by an extended 12-month warranty."
    result = backend(claim, WARRANTY)
    assert not result.supported and "12-month" in result.mismatches
    assert backend(
        "Under Clause 6.1, laptops are covered by an extended 24-month warranty.", WARRANTY
    ).supported
    reversed_ = backend(
        "Magnesium is more reactive than calcium.",
        "Calcium is more reactive than magnesium, and both react with water.",
    )
    assert not reversed_.supported
