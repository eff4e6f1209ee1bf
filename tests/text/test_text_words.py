from hypothesis import given
from hypothesis import strategies as st

from tracerag.text._words import content_terms, tokenize


def test_english_words_are_lowercased_and_stemmed() -> None:
    assert tokenize("Refunds Processed quickly") == ["refund", "process", "quick"]
    assert tokenize("cite cited citing cites") == ["cit"] * 4
    assert tokenize("companies company") == ["company", "company"]


def test_numbers_are_single_tokens() -> None:
    assert tokenize("1,200 and 3.50 or 42") == ["1200", "and", "3.5", "or", "42"]


def test_chinese_bigrams_and_isolated_characters() -> None:
    assert tokenize("退款政策") == ["退款", "款政", "政策"]
    assert tokenize("500元") == ["500", "元"]


def test_citation_markers_are_dropped() -> None:
    assert tokenize("Refunds take 30 days. [M03]") == ["refund", "tak", "30", "day"]
    assert tokenize("退款[M03]") == ["退款"]


def test_content_terms_drop_stopwords() -> None:
    terms = content_terms("The refund is processed within 30 days")
    assert terms == ["refund", "process", "30", "day"]
    terms = content_terms("我们的退款政策是什么")
    assert "退款" in terms and "政策" in terms
    assert "我们" not in terms and "什么" not in terms


@given(st.text(max_size=100))
def test_content_terms_are_a_subset_of_tokens(text: str) -> None:
    tokens = tokenize(text)
    assert set(content_terms(text)) <= set(tokens)
    assert all(t == t.lower() for t in tokens)
