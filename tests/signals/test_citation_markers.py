"""Citation markers as models write them: ``[id]``, full-width ``【id】`` and ``［id］``, and
numbered footnotes ``[1]`` that name the materials in the order the prompt showed them, in the
pipeline and in wrap() alike."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pipeline_fixtures import FAST_RETRY, QUESTION, format_docs
from quoted_answers import material

from tracerag import RAGPipeline, wrap
from tracerag.signals._citations import verify_citations
from tracerag.signals._claims import citation_ids, split_claims, strip_citations
from tracerag.testing import ScriptCall, ScriptedChatModel

LAPTOP_EN = "Under Clause 6.1, laptops and tablets are covered by an extended 24-month warranty."
INVOICE_ZH = "订单签收后90天内，可在“我的订单”页面申请开具发票。"


@pytest.mark.parametrize(
    ("text", "ids", "plain"),
    [
        ("保修期为24个月【warranty】。", ["warranty"], "保修期为24个月。"),
        ("保修期为24个月［warranty］。", ["warranty"], "保修期为24个月。"),
        ("Covered for 24 months 【warranty】.", ["warranty"], "Covered for 24 months."),
        ("两条【a、b】和［c，d］", ["a", "b", "c", "d"], "两条和"),
        ("见［１］与【２】", ["1", "2"], "见与"),  # full-width digits read as digits
        ("［ｗａｒｒａｎｔｙ］", ["warranty"], ""),
        ("【warranty】（见上）", ["warranty"], "（见上）"),
        # not citations: a bracket closed the other way, a markdown link, a Chinese heading
        ("mixed 【warranty] and [warranty】", [], "mixed 【warranty] and [warranty】"),
        ("【温馨提示】保修期为24个月。", [], "【温馨提示】保修期为24个月。"),
        ("[the policy](https://example.com)", [], "[the policy](https://example.com)"),
    ],
)
def test_markers_in_every_bracket_models_use(text, ids, plain):
    assert citation_ids(text) == ids
    assert strip_citations(text) == plain


@pytest.mark.parametrize(
    "answer",
    [
        "保修期为24个月。【warranty】退货期限为15天。【returns】",
        "保修期为24个月。［warranty］退货期限为15天。［returns］",
        "保修期为24个月【warranty】。退货期限为15天［returns］。",
        "Covered for 24 months. ［warranty］ Returns take 15 days. 【returns】",
    ],
)
def test_a_full_width_marker_after_the_full_stop_cites_the_sentence_before_it(answer):
    claims = split_claims(answer)
    assert [c.cited_ids for c in claims] == [("warranty",), ("returns",)]
    assert "warranty" not in claims[0].text and "returns" not in claims[1].text


@pytest.mark.parametrize(
    ("answer", "material_id"),
    [
        (f"{LAPTOP_EN} 【warranty】", "warranty"),
        (f"{LAPTOP_EN} ［warranty］", "warranty"),
        (f"{INVOICE_ZH}【invoices】", "invoices"),
        (f"{INVOICE_ZH}［invoices］", "invoices"),
    ],
)
def test_a_full_width_cited_correct_answer_passes(answer, material_id):
    report = verify_citations(answer, [material(material_id)], question="How long? 多久？")
    assert [c.verdict for c in report.claims] == ["supported"]
    assert report.claims[0].cited_ids == [material_id] and report.valid


@pytest.mark.parametrize(
    "answer",
    [f"{LAPTOP_EN} 【warranty-2019】", f"{INVOICE_ZH}［invoice-99］", f"{INVOICE_ZH}【３】"],
)
def test_a_full_width_cited_fabricated_id_is_still_fabricated(answer):
    report = verify_citations(answer, [material("warranty"), material("invoices")])
    (claim,) = report.claims
    assert claim.verdict == "fabricated_citation"
    assert report.fabricated == claim.fabricated_ids and not report.valid


def _shown(prompt: str) -> list[str]:
    """The material ids in the order the pipeline's prompt shows them."""
    return re.findall(r'<material id="([^"]+)"', prompt)


def _footnoted(template: str):
    """A responder citing the returns material by its position in the prompt."""

    def respond(call: ScriptCall) -> str:
        shown = _shown(call.prompt)
        if "returns" not in shown:
            return "I cannot tell. [9]"
        return template.format(n=shown.index("returns") + 1)

    return respond


@pytest.mark.parametrize(
    "template",
    [
        "Customers may return unused items within 30 days of delivery for a full refund. [{n}]",
        "Customers may return unused items within 30 days of delivery for a full refund. 【{n}】",
    ],
    ids=["ascii", "full-width"],
)
def test_the_pipeline_reads_a_numbered_footnote_as_the_material_shown_there(retriever, template):
    llm = ScriptedChatModel(responder=_footnoted(template), model_name="footnotes")
    pipeline = RAGPipeline(
        retriever,
        llm,
        prompt_version="test-prompt-v1",
        model_version="footnotes",
        n_samples=3,
        retry=FAST_RETRY,
    )
    response = pipeline.invoke(QUESTION)
    (claim,) = response.claims
    assert claim.verdict == "supported" and claim.material_id == "returns"
    assert response.decision == "pass"
    assert [e.material_id for e in response.evidence] == ["returns"]
    # a position past the materials shown is fabricated, as an unknown id is
    beyond = ScriptedChatModel(
        responses=["Customers may return unused items within 30 days of delivery. [9]"],
        model_name="footnotes",
    )
    records: list[dict[str, Any]] = []
    off = RAGPipeline(
        retriever,
        beyond,
        prompt_version="test-prompt-v1",
        model_version="footnotes",
        n_samples=3,
        retry=FAST_RETRY,
        audit=records.append,
    ).invoke(QUESTION)
    assert off.answer is None and off.decision == "escalate"
    # the withheld answer's claims are the operator's (the record), not the caller's
    (kept,) = records[-1]["signals"]["citations"]["claims"]
    assert kept["verdict"] == "fabricated_citation"


def test_wrap_and_the_pipeline_agree_on_full_width_footnotes(retriever):
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnablePassthrough

    def respond(call: ScriptCall) -> str:
        for line in call.prompt.splitlines():
            if line.startswith("[") and "30 days" in line:
                n = line[1 : line.index("]")]
                return f"Customers may return unused items within 30 days of delivery. ［{n}］"
        return "I cannot tell. ［9］"

    llm = ScriptedChatModel(responder=respond, model_name="footnotes")
    prompt = ChatPromptTemplate.from_template(
        "Answer from the context, citing [n].\n\nContext:\n{context}\n\nQuestion: {question}"
    )
    chain = (
        {"context": retriever | format_docs, "question": RunnablePassthrough()}
        | prompt
        | llm
        | StrOutputParser()
    )
    response = wrap(chain, n_samples=3, retry=FAST_RETRY).invoke(QUESTION)
    (claim,) = response.claims
    assert claim.verdict == "supported" and claim.material_id == "returns"
    assert response.decision == "pass"
