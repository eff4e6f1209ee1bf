"""Property: a claim whose number differs from its cited material's is never verified."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_budget import examples

from tracerag.signals._citations import SUPPORTED, verify_citations
from tracerag.signals._claims import citation_ids, split_claims, strip_citations
from tracerag.signals._types import Material

TEMPLATES = [
    ("Customers may return unused items within {n} days of delivery.", "en"),
    ("Standard shipping costs ${n} for small orders.", "en"),
    ("Gold membership costs {n}元 per year.", "zh"),
    ("笔记本电脑享受{n}个月保修。", "zh"),
    ("Refunds are paid within {n} business days.", "en"),
]


@settings(max_examples=examples(150), deadline=None)
@given(
    template=st.sampled_from(TEMPLATES),
    material_n=st.integers(min_value=1, max_value=5000),
    claim_n=st.integers(min_value=1, max_value=5000),
)
def test_changed_number_never_verifies(template, material_n, claim_n):
    text, _ = template
    material = Material(id="M01", text=text.format(n=material_n), title="policy")
    claim = text.format(n=claim_n).rstrip("。.") + ". [M01]"
    report = verify_citations(claim, [material])
    verdicts = {c.verdict for c in report.claims}
    if claim_n != material_n:
        assert SUPPORTED not in verdicts
    else:
        assert verdicts == {SUPPORTED}


@given(st.lists(st.sampled_from(["M01", "policy-7", "退货-2", "a.b"]), min_size=1, max_size=3))
def test_citation_markers_round_trip(ids):
    answer = "Items may be returned. " + "".join(f"[{i}]" for i in ids)
    assert citation_ids(answer) == ids
    assert strip_citations(answer) == "Items may be returned."
    (claim,) = split_claims(answer)
    assert list(claim.cited_ids) == list(dict.fromkeys(ids))


def test_markdown_links_are_not_citations():
    assert citation_ids("See [the policy](https://example.com/p) for details.") == []


def test_comma_separated_and_chinese_markers():
    claims = split_claims("退货期限为30天。[M01，M02] Shipping is free over $50. [M03][M04]")
    assert [list(c.cited_ids) for c in claims] == [["M01", "M02"], ["M03", "M04"]]
