"""Specificity: a general sentence does not answer a question the material answers specifically."""

from __future__ import annotations

import pytest
from langchain_core.documents import Document
from pipeline_fixtures import FAST_RETRY, scripted

from tracerag import RAGPipeline, Thresholds
from tracerag.signals._citations import averify_citations, verify_citations
from tracerag.signals._specificity import check_specificity, find_conflict, question_subject
from tracerag.signals._support import get_backend
from tracerag.signals._types import Material

WARRANTY = (
    "All new devices sold by Northwind Gadgets carry a 12-month warranty from the date of "
    "delivery. Under Clause 6.1, laptops and tablets are covered by an extended 24-month "
    "warranty. The warranty covers manufacturing defects but not accidental damage."
)
WARRANTY_ZH = (
    "Northwind 销售的所有新设备均享有自交付之日起12个月的保修。根据第6.1条，笔记本电脑和平板电脑"
    "享有延长的24个月保修。保修涵盖制造缺陷，但不包括意外损坏。"
)
GENERAL = "All new devices carry a 12-month warranty [warranty]."
GENERAL_ZH = "所有新设备均享有12个月保修[warranty]。"
LAPTOP_Q = "How long is the warranty on a laptop?"
LAPTOP_Q_ZH = "笔记本电脑的保修期多长？"


def _verdict(answer: str, text: str, question: str | None, backend: str = "lexical"):
    report = verify_citations(
        answer, [Material(id="warranty", text=text)], question=question, backend=backend
    )
    return report.claims[0]


@pytest.mark.parametrize(
    ("answer", "text", "question", "rival"),
    [
        (GENERAL, WARRANTY, LAPTOP_Q, "24-month"),
        (GENERAL_ZH, WARRANTY_ZH, LAPTOP_Q_ZH, "24个月"),
    ],
    ids=["en", "zh"],
)
@pytest.mark.parametrize("backend", ["lexical", "learned"])
def test_general_claim_does_not_answer_the_specific_question(
    answer, text, question, rival, backend
):
    assert _verdict(answer, text, None, backend).verdict == "supported"  # as before, alone
    verdict = _verdict(answer, text, question, backend)
    assert verdict.verdict == "unsupported"
    assert verdict.score < get_backend(backend).threshold
    assert rival in verdict.sentence and rival in verdict.reason
    assert text[verdict.start : verdict.end] == verdict.sentence
    assert "question's case" in verdict.reason


def test_general_claim_still_answers_a_question_about_another_case():
    # the material says nothing special about phones: the general sentence answers
    assert _verdict(GENERAL, WARRANTY, "How long is the warranty on a phone?").verdict == (
        "supported"
    )
    assert _verdict(GENERAL_ZH, WARRANTY_ZH, "手机的保修期多长？").verdict == "supported"


def test_general_claim_still_answers_the_general_question():
    assert _verdict(GENERAL, WARRANTY, "How long is the warranty?").verdict == "supported"
    assert _verdict(GENERAL_ZH, WARRANTY_ZH, "保修期多长？").verdict == "supported"


@pytest.mark.parametrize(
    "text",
    [
        # the specific sentence agrees with the general one
        "All new devices carry a 12-month warranty. Laptops are covered by the same 12-month "
        "warranty as every other device.",
        # it names the subject but no value of the kind
        "All new devices carry a 12-month warranty. Laptop warranty claims need a photo.",
        # another value, but of another quantity (days of repair, not months of warranty)
        "All new devices carry a 12-month warranty. Laptops under warranty are repaired "
        "within 10 days.",
        # a rival value about something else than the question's subject
        "All new devices carry a 12-month warranty. Refurbished phones carry a 6-month warranty.",
    ],
)
def test_a_general_sentence_that_matches_the_specific_case_still_passes(text):
    assert _verdict(GENERAL, text, LAPTOP_Q).verdict == "supported"


def test_the_specific_case_stated_in_the_same_sentence_is_found_by_its_clause():
    text = "Every device carries a 12-month warranty, while laptops carry a 24-month warranty."
    claim = "Every device carries a 12-month warranty [warranty]."
    assert _verdict(claim, text, None).verdict == "supported"
    verdict = _verdict(claim, text, LAPTOP_Q)
    assert verdict.verdict == "unsupported"
    assert "24-month, not 12-month" in verdict.reason
    # the same sentence says nothing special about phones
    assert _verdict(claim, text, "How long is the warranty on a phone?").verdict == "supported"


def test_amounts_and_percentages_have_rivals_too():
    text = (
        "Shipping costs $5 per order. Orders to Hong Kong cost $25 to ship. "
        "Members get 5% off. Gold members get 10% off every order."
    )
    assert (
        _verdict(
            "Shipping costs $5 per order [warranty].",
            text,
            "How much does shipping to Hong Kong cost?",
        ).verdict
        == "unsupported"
    )
    assert (
        _verdict(
            "Members get 5% off [warranty].", text, "What discount do gold members get?"
        ).verdict
        == "unsupported"
    )
    assert (
        _verdict(
            "Shipping costs $5 per order [warranty].", text, "How much does shipping cost?"
        ).verdict
        == "supported"
    )


def test_question_subject_drops_asking_words_and_what_the_claim_says():
    assert question_subject(LAPTOP_Q, "All new devices carry a 12-month warranty") == ("laptop",)
    assert question_subject(LAPTOP_Q_ZH, "所有新设备均享有12个月保修") == (
        "笔记",
        "记本",
        "本电",
        "电脑",
        "修期",
    )
    assert question_subject("How long is the warranty?", "The warranty lasts 12 months") == ()


def test_only_a_supported_verdict_is_withdrawn_and_nothing_without_a_question():
    backend = get_backend("lexical")
    unsupported = backend("All new devices carry a 6-month warranty.", WARRANTY)
    assert (
        check_specificity(
            LAPTOP_Q,
            "All new devices carry a 6-month warranty.",
            WARRANTY,
            unsupported,
            threshold=backend.threshold,
        )
        is unsupported
    )
    supported = backend("All new devices carry a 12-month warranty.", WARRANTY)
    for question in (None, "", "   "):
        assert (
            check_specificity(
                question,
                "All new devices carry a 12-month warranty.",
                WARRANTY,
                supported,
                threshold=0.45,
            )
            is supported
        )
    assert find_conflict(LAPTOP_Q, "New devices carry a warranty.", WARRANTY) is None


async def test_async_verification_applies_it_too():
    report = await averify_citations(
        GENERAL, [Material(id="warranty", text=WARRANTY)], question=LAPTOP_Q
    )
    assert report.claims[0].verdict == "unsupported"
    assert not report.valid


def test_the_pipeline_routes_the_general_answer_to_the_specific_question(spans, documents):
    from tracerag.demo.kb import build_vectorstore

    documents.append(Document(page_content=WARRANTY, metadata={"id": "warranty"}))
    retriever = build_vectorstore(documents).as_retriever(search_kwargs={"k": 6})
    llm = scripted([GENERAL])
    pipeline = RAGPipeline(
        retriever,
        llm,
        prompt_version="test-prompt-v1",
        model_version=llm.model_name,
        n_samples=3,
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
    )
    response = pipeline.invoke(LAPTOP_Q)
    assert response.decision == "escalate" and response.answer is None
    assert response.claims == []  # the verdicts of a withheld answer: the flagged run below
    # withheld from the caller, handed to a person with the candidate answer
    (ticket,) = pipeline.escalation.tickets
    assert ticket.candidate_answer == GENERAL
    # flagged rather than withheld (every confidence reviews), the caller sees it too
    flagged = RAGPipeline(
        retriever,
        llm,
        prompt_version="test-prompt-v1",
        model_version=llm.model_name,
        n_samples=3,
        retry=FAST_RETRY,
        tracer_provider=spans.provider,
        thresholds=Thresholds(pass_at=1.0, review_at=0.0),
    ).invoke(LAPTOP_Q)
    assert flagged.decision == "review"
    claim = flagged.claims[0]
    assert claim.verdict == "unsupported" and "24-month, not 12-month" in claim.reason
    general = pipeline.invoke("How long is the warranty on a new device?")
    assert general.claims[0].verdict == "supported"
    assert general.decision == "pass"
