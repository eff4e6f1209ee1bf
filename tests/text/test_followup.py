"""A follow-up turn read as the standalone question it asks (``tracerag.text._followup``).

Each row: the turn, the user's earlier turns, the standalone question and how it was resolved.
The conversations are customer-service ones of many shapes (a new subject after the same or
another preposition, a number for a number, a copula's subject, a verb's object, "ones",
chained follow-ups), not the one the defect was found with alone.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tracerag.text._followup import resolve_turn

ENGLISH = [
    (
        "And if I paid by card?",
        ["How long does a refund take?"],
        "How long does a refund take if I paid by card?",
        "substituted",
    ),
    (
        "What if it's refurbished?",
        ["How long is the warranty on a laptop?"],
        "How long is the warranty on a laptop if it's refurbished?",
        "substituted",
    ),
    (
        "What if it is a phone?",
        ["How long is the warranty on a laptop?"],
        "How long is the warranty on a phone?",
        "substituted",
    ),
    (
        "And for a phone?",
        ["How long is the warranty on a laptop?"],
        "How long is the warranty for a phone?",
        "substituted",
    ),
    (
        "What about phones?",
        ["How long is the warranty on a laptop?"],
        "How long is the warranty on phones?",
        "substituted",
    ),
    (
        "And tablets?",
        ["How long is the warranty on a laptop?"],
        "How long is the warranty on tablets?",
        "substituted",
    ),
    (
        "And for a tablet?",
        ["How long is the warranty on a laptop?", "And for a phone?"],
        "How long is the warranty for a tablet?",
        "substituted",
    ),
    ("And Mexico?", ["Do you ship to Canada?"], "Do you ship to Mexico?", "substituted"),
    (
        "And to the UK?",
        ["How much is shipping to Canada?"],
        "How much is shipping to the UK?",
        "substituted",
    ),
    (
        "What about furniture?",
        ["What is the return window for electronics?"],
        "What is the return window for furniture?",
        "substituted",
    ),
    (
        "And in Germany?",
        ["Can I return a laptop after 30 days?"],
        "Can I return a laptop after 30 days in Germany?",
        "substituted",
    ),
    (
        "What about 60 days?",
        ["Can I return a laptop after 30 days?"],
        "Can I return a laptop after 60 days?",
        "substituted",
    ),
    ("And returns?", ["Is shipping free?"], "Is returns free?", "substituted"),
    (
        "Same for express shipping?",
        ["Is standard shipping free?"],
        "Is express shipping free?",
        "substituted",
    ),
    (
        "What about unopened ones?",
        ["Can I return opened items?"],
        "Can I return unopened items?",
        "substituted",
    ),
    (
        "What about screen cracks?",
        ["Does the warranty cover water damage?"],
        "Does the warranty cover screen cracks?",
        "substituted",
    ),
    ("And my PIN?", ["How do I reset my password?"], "How do I reset my PIN?", "substituted"),
    (
        "And on weekends?",
        ["What are your opening hours on weekdays?"],
        "What are your opening hours on weekends?",
        "substituted",
    ),
    (
        "What about early cancellation?",
        ["Is there a fee for late payment?"],
        "Is there a fee for early cancellation?",
        "substituted",
    ),
    ("Or with Apple Pay?", ["Can I pay with PayPal?"], "Can I pay with Apple Pay?", "substituted"),
    (
        "And for sale items?",
        ["What is the return window?"],
        "What is the return window for sale items?",
        "substituted",
    ),
    ("And the phone?", ["Is the laptop waterproof?"], "Is the phone waterproof?", "substituted"),
    (
        "And the iPhone 15?",
        ["Is the iPhone 14 covered by AppleCare?"],
        "Is the iPhone 15 covered by AppleCare?",
        "substituted",
    ),
    (
        "And how long does shipping take?",
        ["How long is the warranty on a laptop?"],
        "And how long does shipping take?",
        "standalone",
    ),
    (
        "What is your returns policy?",
        ["How long is the warranty on a laptop?"],
        "What is your returns policy?",
        "standalone",
    ),
    (
        "Is it waterproof?",
        ["How long is the warranty on a laptop?"],
        "Is it waterproof? (How long is the warranty on a laptop)",
        "context",
    ),
    (
        "Is it possible to ship to Canada?",
        ["How long is the warranty on a laptop?"],
        "Is it possible to ship to Canada?",
        "standalone",
    ),
    ("Thanks!", ["How long is the warranty on a laptop?"], "Thanks!", "standalone"),
    (
        "What if I lost the receipt?",
        ["Can I return a laptop?"],
        "Can I return a laptop if I lost the receipt?",
        "substituted",
    ),
]

CHINESE = [
    ("那过了保修期呢？", ["上门维修收费吗？"], "过了保修期，上门维修收费吗？", "substituted"),
    ("如果超过30天呢？", ["可以退货吗？"], "超过30天，可以退货吗？", "substituted"),
    ("那手机呢？", ["笔记本电脑的保修期是多久？"], "手机的保修期是多久？", "substituted"),
    ("手机呢", ["笔记本电脑保修多久？"], "手机保修多久？", "substituted"),
    ("那手机的呢？", ["笔记本电脑的保修期是多久？"], "手机的保修期是多久？", "substituted"),
    ("那平板电脑呢？", ["笔记本电脑的保修期是多久？"], "平板电脑的保修期是多久？", "substituted"),
    (
        "那平板呢？",
        ["笔记本电脑的保修期是多久？", "那手机呢？"],
        "平板的保修期是多久？",
        "substituted",
    ),
    ("那法国呢？", ["寄到德国的运费是多少？"], "寄到法国的运费是多少？", "substituted"),
    ("上海呢？", ["在北京配送要几天？"], "在上海配送要几天？", "substituted"),
    ("那换货呢？", ["退货需要几天？"], "换货需要几天？", "substituted"),
    ("那非会员呢？", ["会员有什么优惠？"], "非会员有什么优惠？", "substituted"),
    ("那国际订单呢？", ["运费多少钱？"], "国际订单：运费多少钱？", "joined"),
    ("如果是手机呢？", ["笔记本电脑的保修期是多久？"], "手机的保修期是多久？", "substituted"),
    ("手机也一样吗？", ["笔记本电脑的保修期是多久？"], "手机的保修期是多久？", "substituted"),
    ("退货政策是什么？", ["笔记本电脑的保修期是多久？"], "退货政策是什么？", "standalone"),
    ("那退货要多久呢？", ["笔记本电脑的保修期是多久？"], "那退货要多久呢？", "standalone"),
    ("它防水吗？", ["笔记本电脑的保修期是多久？"], "笔记本电脑防水吗？", "substituted"),
    ("用支付宝呢？", ["可以用微信支付吗？"], "可以用支付宝支付吗？", "substituted"),
]


@pytest.mark.parametrize(("turn", "earlier", "question", "method"), ENGLISH)
def test_english_follow_ups(turn, earlier, question, method):
    resolved = resolve_turn(turn, earlier)
    assert (resolved.question, resolved.method) == (question, method)
    assert resolved.turn == turn


@pytest.mark.parametrize(("turn", "earlier", "question", "method"), CHINESE)
def test_chinese_follow_ups(turn, earlier, question, method):
    resolved = resolve_turn(turn, earlier)
    assert (resolved.question, resolved.method) == (question, method)


def test_a_substituted_follow_up_names_what_it_replaced():
    resolved = resolve_turn("And for a phone?", ["How long is the warranty on a laptop?"])
    assert resolved.subject == "for a phone" and resolved.replaced == "on a laptop"
    assert resolved.previous == "How long is the warranty on a laptop?" and resolved.changed
    zh = resolve_turn("那手机呢？", ["笔记本电脑的保修期是多久？"])
    assert zh.subject == "手机" and zh.replaced == "笔记本电脑"


def test_a_turn_without_earlier_turns_is_its_own_question():
    resolved = resolve_turn("  And for a phone?  ", [])
    assert (resolved.question, resolved.method, resolved.previous) == (
        "And for a phone?",
        "standalone",
        None,
    )
    assert not resolved.changed
    assert resolve_turn("那手机呢？", ["", "   "]).method == "standalone"


def test_a_follow_up_that_cannot_be_placed_keeps_both_questions():
    resolved = resolve_turn("那国际订单呢？", ["运费多少钱？"])
    assert resolved.method == "joined"
    assert "国际订单" in resolved.question and "运费多少钱" in resolved.question
    mixed = resolve_turn("那手机呢？", ["How long is the warranty on a laptop?"])
    assert mixed.method == "joined" and "手机" in mixed.question and "warranty" in mixed.question


def test_a_follow_up_with_a_pronoun_carries_the_previous_question():
    resolved = resolve_turn("Does it cover water damage?", ["Can I return a laptop?"])
    assert resolved.method == "context"
    assert resolved.question.startswith("Does it cover water damage?")
    assert "return a laptop" in resolved.question


_QUESTIONS = st.sampled_from(
    [
        "How long is the warranty on a laptop?",
        "Do you ship to Canada?",
        "Is standard shipping free?",
        "笔记本电脑的保修期是多久？",
        "寄到德国的运费是多少？",
        "会员有什么优惠？",
    ]
)
_SUBJECTS = st.sampled_from(["a phone", "tablets", "Mexico", "express shipping", "gift cards"])
_ZH_SUBJECTS = st.sampled_from(["手机", "平板电脑", "法国", "非会员", "耳机"])


@given(_QUESTIONS, _SUBJECTS, st.sampled_from(["And {}?", "What about {}?", "How about {}?"]))
def test_an_english_follow_up_s_subject_is_always_in_its_question(previous, subject, form):
    resolved = resolve_turn(form.format(subject), [previous])
    assert resolved.method in ("substituted", "joined")
    assert subject in resolved.question


@given(_QUESTIONS, _ZH_SUBJECTS, st.sampled_from(["那{}呢？", "{}呢", "如果是{}呢？", "换成{}呢"]))
def test_a_chinese_follow_up_s_subject_is_always_in_its_question(previous, subject, form):
    resolved = resolve_turn(form.format(subject), [previous])
    assert resolved.method in ("substituted", "joined")
    assert subject in resolved.question


STANDALONE = [
    "What is your returns policy?",
    "How much does express shipping cost?",
    "Can I pay with a credit card?",
    "And how long does a refund take?",
    "Is it possible to ship to Canada?",
    "退货政策是什么？",
    "那退货要多久呢？",
    "手机保修多久？",
    "运费怎么算？",
]


@given(_QUESTIONS, st.sampled_from(STANDALONE))
def test_a_standalone_turn_stays_as_it_is(previous, turn):
    resolved = resolve_turn(turn, [previous])
    assert (resolved.question, resolved.method) == (turn, "standalone")


@pytest.mark.parametrize(
    ("turn", "previous", "question"),
    [
        ("Thanks. And for a phone?", "How long is the warranty on a laptop?", None),
        ("Great, thanks! What about tablets?", "How long is the warranty on a laptop?", None),
        ("OK thanks, and for a phone?", "How long is the warranty on a laptop?", None),
        ("好的，谢谢。那手机呢？", "笔记本电脑的保修期是多久？", "手机的保修期是多久？"),
        ("谢谢！手机呢？", "笔记本电脑的保修期是多久？", "手机的保修期是多久？"),
    ],
)
def test_an_acknowledgement_before_a_follow_up_is_read_past(turn, previous, question):
    resolved = resolve_turn(turn, [previous])
    assert resolved.method == "substituted" and resolved.turn == turn
    if question is not None:
        assert resolved.question == question
    else:
        assert resolved.question.startswith("How long is the warranty ")
        assert not resolved.question.endswith("laptop?")


def test_an_acknowledgement_before_a_question_of_its_own_leaves_it_as_it_is():
    turn = "Thanks. What is your returns policy?"
    resolved = resolve_turn(turn, ["How long is the warranty on a laptop?"])
    assert (resolved.question, resolved.method) == (turn, "standalone")


def test_an_acknowledgement_between_the_turns_is_no_question_to_follow():
    earlier = ["How long is the warranty on a laptop?", "Thanks!", "ok"]
    resolved = resolve_turn("And for a phone?", earlier)
    assert resolved.question == "How long is the warranty for a phone?"
    zh = resolve_turn("那手机呢？", ["笔记本电脑的保修期是多久？", "好的，谢谢！"])
    assert zh.question == "手机的保修期是多久？"


@pytest.mark.parametrize(
    ("turn", "question"),
    [
        ("它防水吗？", "笔记本电脑防水吗？"),
        ("这个能退吗？", "笔记本电脑能退吗？"),
        ("那款多少钱？", "笔记本电脑多少钱？"),
        ("这个月有什么活动？", "这个月有什么活动？"),  # 这个 before a noun of its own
    ],
)
def test_a_chinese_pronoun_stands_for_the_previous_subject(turn, question):
    assert resolve_turn(turn, ["笔记本电脑的保修期是多久？"]).question == question


@pytest.mark.parametrize(
    ("turn", "question"),
    [
        ("For a phone?", "How long is the warranty for a phone?"),
        ("Refund policy?", "Refund policy?"),  # terse, but a question of its own
        ("Opening hours?", "Opening hours?"),
    ],
)
def test_a_turn_without_a_lead_is_a_follow_up_only_when_a_preposition_opens_it(turn, question):
    assert resolve_turn(turn, ["How long is the warranty on a laptop?"]).question == question
