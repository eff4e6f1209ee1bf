"""Sentence structure for support: preambles, headings and questions, comparisons, conjuncts."""

from tracerag.text._structure import attribution_preamble, comparisons, conjuncts, is_declarative


def test_attribution_preambles_are_found_in_english_and_chinese():
    claim = "According to the NIH, adults need 7 hours of sleep."
    assert claim[attribution_preamble(claim) :] == "adults need 7 hours of sleep."
    claim = "The NIH says that adults need sleep every night."
    assert claim[attribution_preamble(claim) :].startswith("adults")
    claim = "根据说明书，笔记本电脑享受24个月保修。"
    assert claim[attribution_preamble(claim) :] == "笔记本电脑享受24个月保修。"
    assert attribution_preamble("Adults need 7 hours of sleep.") == 0


def test_questions_and_headings_are_not_declarative():
    assert not is_declarative("Why do people sneeze?")
    assert not is_declarative("为什么会打喷嚏？")
    assert not is_declarative("Returns and refunds")
    assert is_declarative("Returns are accepted within 30 days.")
    assert is_declarative("Laptops: 24 months")  # a number: a statement, not a heading


def test_comparisons_name_each_side_and_the_direction():
    (c,) = comparisons("Calcium is more reactive than magnesium.")
    assert c.relation == "more" and "calcium" in c.left and "magnesium" in c.right
    (c,) = comparisons("Magnesium is less reactive than calcium.")
    assert c.relation == "less" and "magnesium" in c.left
    (c,) = comparisons("黄金的价格比白银高。")
    assert c.relation == "more"


def test_conjuncts_of_short_coordinated_parts():
    claim = "Under Clause 6.1, laptops and dishwashers are covered by an extended warranty."
    parts = [claim[a:b] for a, b in conjuncts(claim)]
    assert parts[:2] == ["laptops", "dishwashers"]
    claim = "笔记本电脑和平板电脑享受24个月保修"
    assert next(claim[a:b] for a, b in conjuncts(claim)).endswith("电脑")
    assert conjuncts("Refunds are issued within 5 business days.") == []


def test_actor_moved_after_the_verb_but_not_a_passive_agent():
    from tracerag.text._structure import actor_moved

    sentence = "In 2019 the group split, with Jones leaving the party and joining Smith."
    assert actor_moved("Smith left the party in 2019.", sentence) == "Smith"
    assert actor_moved("Google acquired YouTube.", "YouTube acquired Google.") == "Google"
    assert actor_moved("Google acquired YouTube.", "In 2006 Google acquired YouTube.") == ""
    assert actor_moved("Smith founded the company.", "It was founded by John Smith.") == ""
