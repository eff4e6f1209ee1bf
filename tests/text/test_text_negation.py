import pytest

from tracerag.text._negation import is_negated, negation_cues


@pytest.mark.parametrize(
    "text",
    [
        "Refunds are not available.",
        "You can't return it.",
        "You can’t return it.",
        "It never ships abroad.",
        "No refunds after 30 days.",
        "Orders without a receipt.",
        "This is a non-refundable fee.",
        "本商品不支持退货",
        "没有发票",
        "无发票不予退款",
        "非会员",
        "未满18岁",
        "请勿吸烟",
        "不得转让",
        "禁止吸烟",
    ],
)
def test_negated(text: str) -> None:
    assert is_negated(text)


@pytest.mark.parametrize(
    "text",
    [
        "Refunds are available.",
        "Not only is it free, it is fast.",
        "Pay no later than Friday.",
        "See No. 5.",
        "不仅免费，而且快速",
        "无论何时都可以退款",
        "非常满意",
        "未来三天发货",
        "不得不说很好",
        "退款不超过500元",
    ],
)
def test_not_negated(text: str) -> None:
    assert not is_negated(text)


def test_cues_in_reading_order() -> None:
    assert negation_cues("Not now, 不得 and never") == ["not", "不得", "never"]
