from hypothesis import given
from hypothesis import strategies as st

from tracerag.text._sentences import Sentence, split_sentences


def texts(text: str) -> list[str]:
    return [s.text for s in split_sentences(text)]


def test_english_and_chinese_full_stops() -> None:
    assert texts("Refunds take 30 days. Shipping is free! Really? Yes; fine") == [
        "Refunds take 30 days.",
        "Shipping is free!",
        "Really?",
        "Yes;",
        "fine",
    ]
    assert texts("退款需要30天。运费为3.5元；请注意！好吗？") == [
        "退款需要30天。",
        "运费为3.5元；",
        "请注意！",
        "好吗？",
    ]


def test_newlines_split() -> None:
    assert texts("first line\nsecond line\n\n third") == ["first line", "second line", "third"]


def test_numbers_amounts_and_dates_are_not_split() -> None:
    text = "It costs ¥1,200.50 or 3.5 USD from 15.03.2024 on. Done."
    assert texts(text) == ["It costs ¥1,200.50 or 3.5 USD from 15.03.2024 on.", "Done."]


def test_abbreviations_are_not_split() -> None:
    text = (
        "Items, e.g. shoes, i.e. footwear, etc. are fine. "
        "Mr. Li and Dr. Wu of the U.S. office agree. See No. 5 now."
    )
    assert texts(text) == [
        "Items, e.g. shoes, i.e. footwear, etc. are fine.",
        "Mr. Li and Dr. Wu of the U.S. office agree.",
        "See No. 5 now.",
    ]


def test_etc_at_sentence_end_splits_before_capital() -> None:
    assert texts("We sell apples, pears, etc. Then we close.") == [
        "We sell apples, pears, etc.",
        "Then we close.",
    ]


def test_trailing_citation_marker_belongs_to_previous_sentence() -> None:
    assert texts("Refunds take 30 days. [M03] Shipping is free. [M04]") == [
        "Refunds take 30 days. [M03]",
        "Shipping is free. [M04]",
    ]
    assert texts("退款需要30天。[M03]运费免费。[M04][M05]") == [
        "退款需要30天。[M03]",
        "运费免费。[M04][M05]",
    ]


def test_no_split_inside_citation_markers() -> None:
    assert texts("Free shipping [M03; M04] over $50. Next [policy.7].") == [
        "Free shipping [M03; M04] over $50.",
        "Next [policy.7].",
    ]


def test_closing_quotes_stay_with_sentence() -> None:
    assert texts('He said "done." Then left.') == ['He said "done."', "Then left."]
    assert texts("他说：“好的。”然后走了。") == ["他说：“好的。”", "然后走了。"]


def test_offsets_and_empty_input() -> None:
    text = "  Hello there.   第二句。 "
    sentences = split_sentences(text)
    assert sentences == [Sentence("Hello there.", 2, 14), Sentence("第二句。", 17, 21)]
    assert split_sentences("") == []
    assert split_sentences("   \n ") == []


_alphabet = st.sampled_from([*"ab 1.2,。！？；!?;\n[M03]e.g.元%", "U.S.", "Mr. ", "[M03]", "3.5"])


@given(st.lists(_alphabet, max_size=40).map("".join))
def test_offsets_always_slice_to_the_sentence_text(text: str) -> None:
    previous_end = 0
    for s in split_sentences(text):
        assert text[s.start : s.end] == s.text
        assert s.text == s.text.strip() and s.text
        assert s.start >= previous_end
        previous_end = s.end


@given(st.text(max_size=200))
def test_any_text_splits_and_keeps_all_non_space_characters(text: str) -> None:
    sentences = split_sentences(text)
    kept = "".join(s.text for s in sentences)
    assert "".join(kept.split()) == "".join(text.split())
