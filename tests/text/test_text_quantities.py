from itertools import pairwise

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from tracerag.text._quantities import (
    Quantity,
    extract_quantities,
    parse_chinese_number,
    quantities_match,
)


def keys(text: str) -> list[tuple]:
    return [q.key for q in extract_quantities(text)]


@pytest.mark.parametrize(
    "text", ["500元", "¥500", "￥500", "500 yuan", "RMB 500", "五百元", "500块"]
)
def test_yuan_amounts_share_one_key(text: str) -> None:
    assert keys(text) == [("money", 500.0, "CNY")]


@pytest.mark.parametrize("text", ["$20", "20 USD", "20 dollars", "USD 20", "20美元"])
def test_dollar_amounts(text: str) -> None:
    assert keys(text) == [("money", 20.0, "USD")]


@pytest.mark.parametrize("text", ["2 years", "24 months", "两年", "24个月", "two years", "2年"])
def test_durations_normalise_to_months(text: str) -> None:
    assert keys(text) == [("duration", 24.0, "month")]


def test_weeks_become_days_and_days_never_equal_months() -> None:
    assert keys("2 weeks") == keys("14 days") == keys("14天") == [("duration", 14.0, "day")]
    assert keys("30 days") != keys("1 month")


@pytest.mark.parametrize(
    "text",
    ["2024-03-15", "15 March 2024", "March 15, 2024", "2024年3月15日", "15.03.2024", "2024/3/15"],
)
def test_full_dates(text: str) -> None:
    assert keys(text) == [("date", "2024-03-15", "")]


@pytest.mark.parametrize("text", ["2024年3月", "March 2024"])
def test_partial_dates(text: str) -> None:
    assert keys(text) == [("date", "2024-03", "")]


@pytest.mark.parametrize("text", ["15%", "15 percent", "百分之十五", "15％"])
def test_percentages(text: str) -> None:
    assert keys(text) == [("percent", 15.0, "%")]


@pytest.mark.parametrize(
    ("text", "value"), [("1,200", 1200.0), ("1200", 1200.0), ("三十", 30.0), ("3.5", 3.5)]
)
def test_plain_numbers(text: str, value: float) -> None:
    assert keys(text) == [("number", value, "")]


def test_numbers_inside_dates_and_amounts_are_not_repeated() -> None:
    qs = extract_quantities("On 2024-03-15 we refunded ¥1,200.50 within 30 days.")
    assert [q.kind for q in qs] == ["date", "money", "duration"]
    assert [q.raw for q in qs] == ["2024-03-15", "¥1,200.50", "30 days"]


def test_citation_markers_are_not_numbers() -> None:
    assert extract_quantities("Refunds are free [M03] [1] [M03, M04].") == []


def test_offsets_slice_to_raw() -> None:
    text = "退款金额为500元，[M03] 将于2024年3月15日前退回。"
    quantities = extract_quantities(text)
    assert quantities
    for q in quantities:
        assert text[q.start : q.end] == q.raw


def test_ranges_share_the_unit() -> None:
    assert keys("3-5 business days") == [("duration", 3.0, "workday"), ("duration", 5.0, "workday")]
    assert keys("3到5个工作日") == keys("3-5 business days")


def test_times_of_day() -> None:
    assert keys("5pm") == keys("17:00") == keys("下午5点")


def test_words_that_only_look_numeric() -> None:
    assert keys("十分满意") == []
    assert keys("千万不要") == []
    assert keys("COVID-19") == []
    assert keys("the only one") == []


def test_parse_chinese_number() -> None:
    assert parse_chinese_number("一百零五") == 105
    assert parse_chinese_number("十五") == 15
    assert parse_chinese_number("三千五百") == 3500
    assert parse_chinese_number("一亿二千万") == 120_000_000
    assert parse_chinese_number("二〇二四") == 2024
    assert parse_chinese_number("万一") is None


def _q(text: str) -> Quantity:
    (q,) = extract_quantities(text)
    return q


def test_quantities_match_across_formats() -> None:
    assert quantities_match(_q("¥500"), extract_quantities("退款500元"))
    assert not quantities_match(_q("¥600"), extract_quantities("退款500元"))
    assert not quantities_match(_q("$500"), extract_quantities("退款500元"))
    # a material date that is more precise than the claim's matches; a vaguer one does not
    assert quantities_match(_q("March 2024"), extract_quantities("on 2024-03-15"))
    assert not quantities_match(_q("2024-03-15"), extract_quantities("in March 2024"))
    # a plain number matches the same number written with a unit, and a year its dates
    assert quantities_match(_q("30"), extract_quantities("within 30 days"))
    assert quantities_match(_q("in 2024"), extract_quantities("2024年3月15日"))
    assert not quantities_match(_q("in 2023"), extract_quantities("2024年3月15日"))


_formats = [
    "{n}元",
    "¥{n}",
    "{n} yuan",
    "RMB {n}",
    "${n}",
    "{n} dollars",
    "{n}%",
    "{n} percent",
    "{n} days",
    "{n}天",
    "{n} months",
    "{n}个月",
    "{n} years",
    "{n}",
    "No. {n}",
]


@given(
    st.integers(min_value=0, max_value=10**7),
    st.integers(min_value=0, max_value=10**7),
    st.sampled_from(_formats),
    st.sampled_from(_formats),
)
def test_a_changed_number_never_matches(a: int, b: int, claim_fmt: str, material_fmt: str) -> None:
    assume(a != b)
    claim_qs = extract_quantities("The refund is " + claim_fmt.format(n=a) + " in total.")
    material_qs = extract_quantities("Policy: the refund is " + material_fmt.format(n=b) + ".")
    assert claim_qs
    assert not any(quantities_match(q, material_qs) for q in claim_qs)


@given(st.integers(min_value=0, max_value=10**7), st.sampled_from(_formats))
def test_the_same_text_always_matches(n: int, fmt: str) -> None:
    text = "退款为 " + fmt.format(n=n) + "。"
    qs = extract_quantities(text)
    assert qs and all(quantities_match(q, qs) for q in qs)


@given(st.text(max_size=80))
def test_any_text_extracts_without_overlaps(text: str) -> None:
    qs = extract_quantities(text)
    for q in qs:
        assert text[q.start : q.end] == q.raw
        assert q.kind in {"money", "percent", "date", "duration", "number"}
        hash(q.key)
    for a, b in pairwise(qs):
        assert a.end <= b.start
