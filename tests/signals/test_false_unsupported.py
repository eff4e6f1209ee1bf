"""The false-unsupported audit: a correct answer that quotes the knowledge base is never called
unsupported, while a general sentence given for a case the material states specifically still is.

The cases (``quoted_answers.py``) are natural questions over the demo knowledge base, several
phrasings per fact, English and Chinese, answered by quoting the sentences that answer them, in
one and two sentences. ``benchmarks/false_unsupported.py`` prints the same audit with the rival
check's precision and recall on the labelled data.
"""

from __future__ import annotations

from collections import Counter

import pytest
from langchain_core.documents import Document
from pipeline_fixtures import FAST_RETRY
from quoted_answers import FACTS, cases, material

from tracerag import RAGPipeline, Thresholds
from tracerag.demo.kb import build_retriever, build_vectorstore, load_documents
from tracerag.demo.models.extractive import ExtractiveChatModel
from tracerag.signals._citations import verify_citations
from tracerag.signals._specificity import find_conflict
from tracerag.signals._types import Material
from tracerag.testing import ScriptedChatModel

CASES = cases()
SHIPPING_Q = "From what order value does standard shipping become free?"
SHIPPING_A = "Orders of ¥299 or more ship free with standard domestic delivery. [shipping-fees]"
RETURNS_Q = "Can I return an opened item within 30 days for a full refund?"
RETURNS_A = (
    "Under Clause 4.2, unopened items can be returned within 15 days of delivery for a full "
    "refund. [returns] Opened items in resalable condition can be returned within 7 days of "
    "delivery, minus a 10% restocking fee. [returns]"
)
LAPTOP_Q = "How long is the warranty on a laptop?"
GENERAL_A = (
    "All new devices sold by Northwind Gadgets carry a 12-month warranty from the date of "
    "delivery. [warranty]"
)
WARRANTY_ZH = (
    "北风数码销售的所有新设备均享有自签收之日起12个月的保修。根据第6.1条，笔记本电脑和平板电脑"
    "享有延长的24个月保修。保修涵盖制造缺陷，但不包括意外损坏。"
)


def test_the_audit_is_large_and_covers_both_languages_and_lengths():
    kinds = Counter((c.lang, min(c.n_sentences, 2), c.origin) for c in CASES)
    assert len(CASES) >= 400
    for lang in ("en", "zh"):
        for n in (1, 2):
            assert kinds[(lang, n, "hand")] >= 30
            assert kinds[(lang, n, "other-kb")] >= 10
    # several phrasings per fact, every answer verbatim from its document
    assert all(len(questions) >= 2 for _, _, questions in FACTS)
    for c in CASES:
        for claim in verify_citations(c.answer, [material(c.material_id)]).claims:
            assert claim.text in material(c.material_id).text


@pytest.mark.parametrize("backend", ["lexical", "learned"])
def test_no_quoted_answer_is_called_unsupported(backend):
    wrong = []
    for c in CASES:
        report = verify_citations(
            c.answer, [material(c.material_id)], question=c.question, backend=backend
        )
        assert len(report.claims) == c.n_sentences
        wrong += [(c.question, v.text, v.reason) for v in report.claims if v.verdict != "supported"]
    assert wrong == []


def _pipeline(llm, **kwargs):
    return RAGPipeline(
        build_retriever(k=4),
        llm,
        prompt_version="audit-v1",
        model_version=llm.model_name,
        n_samples=3,
        retry=FAST_RETRY,
        **kwargs,
    )


@pytest.mark.parametrize(
    ("question", "answer"),
    [(SHIPPING_Q, SHIPPING_A), (RETURNS_Q, RETURNS_A)],
    ids=["shipping-threshold", "returns-two-windows"],
)
def test_the_reported_answers_pass_through_the_pipeline(question, answer):
    # the two cases, a model that answers them verbatim every time
    llm = ScriptedChatModel(responses=[answer], model_name="fixed-answer")
    response = _pipeline(llm).invoke(question)
    assert [c.verdict for c in response.claims] == ["supported"] * answer.count("[")
    assert response.signal_detail.citation_valid is True
    assert response.decision == "pass" and response.answer == answer


def test_the_bundled_extractive_model_is_not_called_unsupported_on_the_shipping_question():
    response = _pipeline(ExtractiveChatModel(seed=1)).invoke(SHIPPING_Q)
    verdicts = {c.text: c.verdict for c in response.claims}
    # it may also quote the 2023 edition (¥199), which is rightly stale, never "unsupported"
    assert "unsupported" not in verdicts.values(), response.claims
    assert verdicts["Orders of ¥299 or more ship free with standard domestic delivery."] == (
        "supported"
    )


def test_the_general_sentence_still_fails_for_the_laptop_through_the_pipeline():
    llm = ScriptedChatModel(responses=[GENERAL_A], model_name="fixed-answer")
    records: list[dict] = []
    response = _pipeline(llm, audit=records.append).invoke(LAPTOP_Q)
    assert response.decision == "escalate" and response.answer is None
    # a withheld answer's claims are the operator's: the audit record keeps the verdict
    kept = records[-1]["signals"]["citations"]["claims"]
    assert [c["verdict"] for c in kept] == ["unsupported"]
    # flagged instead of withheld, the caller sees why: the reason names the rival sentence,
    # both values and the sentence the claim rests on
    flagged = _pipeline(llm, thresholds=Thresholds(pass_at=1.0, review_at=0.0)).invoke(LAPTOP_Q)
    (claim,) = flagged.claims
    assert claim.verdict == "unsupported" and flagged.decision == "review"
    assert "24-month, not 12-month" in claim.reason
    assert "laptops and tablets are covered by an extended 24-month warranty" in claim.reason
    assert "the claim rests on 'All new devices sold by Northwind Gadgets" in claim.reason
    assert "(laptop)" in claim.reason


def test_the_chinese_twin_still_fails_through_the_pipeline():
    docs = [d for d in load_documents() if d.id != "warranty"]
    docs.append(Document(id="warranty", page_content=WARRANTY_ZH, metadata={"id": "warranty"}))
    retriever = build_vectorstore(docs).as_retriever(search_kwargs={"k": 4})
    llm = ScriptedChatModel(
        responses=["北风数码销售的所有新设备均享有自签收之日起12个月的保修。[warranty]"],
        model_name="fixed-answer",
    )

    def pipeline(**kwargs):
        return RAGPipeline(
            retriever,
            llm,
            prompt_version="audit-v1",
            model_version="fixed-answer",
            n_samples=3,
            retry=FAST_RETRY,
            **kwargs,
        )

    records: list[dict] = []
    response = pipeline(audit=records.append).invoke("笔记本电脑的保修期多长？")
    assert response.decision == "escalate" and response.answer is None
    kept = records[-1]["signals"]["citations"]["claims"]
    assert [c["verdict"] for c in kept] == ["unsupported"]
    flagged = pipeline(thresholds=Thresholds(pass_at=1.0, review_at=0.0))
    (claim,) = flagged.invoke("笔记本电脑的保修期多长？").claims
    assert claim.verdict == "unsupported"
    assert "24个月, not 12个月" in claim.reason and "(笔记本电脑" in claim.reason
    # the same answer to the question about any device passes
    assert pipeline().invoke("新设备的保修期多长？").claims[0].verdict == "supported"


def _claims(answer: str, question: str, text: str) -> list:
    return verify_citations(answer, [Material(id="m", text=text)], question=question).claims


def test_the_answer_that_gives_the_specific_case_too_passes():
    text = material("warranty").text
    both = (
        "All new devices sold by Northwind Gadgets carry a 12-month warranty from the date of "
        "delivery. [m] Under Clause 6.1, laptops and tablets are covered by an extended "
        "24-month warranty. [m]"
    )
    assert [c.verdict for c in _claims(both, LAPTOP_Q, text)] == ["supported", "supported"]
    # a second claim that gets the specific case wrong does not excuse the first
    wrong = (
        "All new devices sold by Northwind Gadgets carry a 12-month warranty from the date of "
        "delivery. [m] Laptops and tablets are covered by an extended 36-month warranty. [m]"
    )
    verdicts = [c.verdict for c in _claims(wrong, LAPTOP_Q, text)]
    assert verdicts[1] == "unsupported"
    # nor one that gives the general value for the specific case
    same = (
        "All new devices sold by Northwind Gadgets carry a 12-month warranty from the date of "
        "delivery. [m] Laptops and tablets are covered by the same 12-month warranty. [m]"
    )
    claims = _claims(same, LAPTOP_Q, text)
    assert claims[1].verdict == "unsupported" and "24-month" in claims[1].reason
    # nor does a second claim that names the case but states no value of the kind
    vague = (
        "All new devices sold by Northwind Gadgets carry a 12-month warranty from the date of "
        "delivery. [m] Laptops are popular. [m]"
    )
    assert _claims(vague, LAPTOP_Q, text)[0].verdict == "unsupported"


@pytest.mark.parametrize(
    ("question", "answer", "text", "rival"),
    [
        (
            "How long does delivery to Tibet take?",
            "Standard delivery reaches most mainland cities within 3 to 5 business days. [m]",
            material("delivery-times").text,
            "Tibet",
        ),
        (
            "How much is express delivery?",
            "Standard domestic shipping costs ¥12 per order. [m]",
            "Standard domestic shipping costs ¥12 per order. Express delivery costs ¥25 per order.",
            "¥25",
        ),
        (
            "已拆封的商品多少天内可以退？",
            "所有商品可在签收后15天内退货。[m]",
            "所有商品可在签收后15天内退货。已拆封的商品可在签收后7天内退货，并收取10%的手续费。",
            "7天",
        ),
        (
            "加急配送要多少钱？",
            "标准配送每单收费12元。[m]",
            "标准配送每单收费12元。满299元的订单免运费。加急配送每单收费25元。",
            "25元",
        ),
    ],
    ids=["en-region", "en-sibling", "zh-opened", "zh-express"],
)
def test_a_statement_the_question_singles_out_is_still_a_rival(question, answer, text, rival):
    (claim,) = _claims(answer, question, text)
    assert claim.verdict == "unsupported"
    assert rival in claim.sentence and rival in claim.reason
    assert claim.reason.startswith("the material states the question's case")


def test_an_open_question_is_answered_by_any_true_case():
    # no value asked: a sentence stating one case of the policy is a true part of the answer
    text = material("returns").text
    answer = (
        "Opened items in resalable condition can be returned within 7 days of delivery, minus a "
        "10% restocking fee. [m]"
    )
    assert _claims(answer, "What is your returns and refunds policy?", text)[0].verdict == (
        "supported"
    )
    # asked for the value, the same sentence is checked (and here it is the right one)
    assert _claims(answer, "How long do I have to return an opened item?", text)[0].verdict == (
        "supported"
    )
    assert (
        find_conflict(
            "How long do I have to return an unopened item?", answer.removesuffix(" [m]"), text
        )
        is not None
    )


def test_a_word_shared_by_several_statements_names_the_topic_not_a_case():
    text = material("shipping-fees").text
    answer = "Express domestic delivery costs ¥25 per order regardless of the order value. [m]"
    # "shipping" is in two of the three sentences: it does not single out the ¥12 one
    assert _claims(answer, "What are the shipping fees?", text)[0].verdict == "supported"


def test_every_unsupported_verdict_names_a_sentence_and_a_reason():
    for c in CASES[:80]:
        # the same answers to the wrong document's question are often unsupported: each says why
        wrong_id = "warranty" if c.material_id != "warranty" else "shipping-fees"
        for v in verify_citations(
            c.answer.replace(f"[{c.material_id}]", f"[{wrong_id}]"),
            [material(wrong_id)],
            question=c.question,
        ).claims:
            if v.verdict == "unsupported":
                assert v.reason and v.sentence and v.start is not None and v.end is not None
                assert material(wrong_id).text[v.start : v.end] == v.sentence


@pytest.mark.parametrize(
    ("question", "checked"),
    [
        ("What is the warranty on a laptop?", True),  # the noun phrase's last word: warranty
        ("Which warranty covers a laptop?", True),
        ("Is the laptop warranty 12 months?", True),  # it states a value of the kind
        ("What is your returns policy for laptops?", False),  # it asks about a policy
        ("Tell me about laptops.", False),
    ],
)
def test_the_rival_check_applies_when_the_question_asks_for_a_value(question, checked):
    from quoted_answers import RIVAL_CASES

    _, claim, text, _ = RIVAL_CASES[0]
    assert (find_conflict(question, claim, text) is not None) is checked


def test_the_hand_written_rivals_are_all_found():
    from quoted_answers import RIVAL_CASES

    langs = Counter(lang for *_, lang in RIVAL_CASES)
    assert langs["en"] >= 6 and langs["zh"] >= 6
    for question, claim, text, _ in RIVAL_CASES:
        conflict = find_conflict(question, claim, text)
        assert conflict is not None, question
        assert conflict.rests_on and conflict.rests_on in text
        assert text[conflict.start : conflict.end] == conflict.sentence


@pytest.mark.parametrize(
    ("question", "answer"),
    [
        (SHIPPING_Q, "Standard shipping is free for orders of ¥299 or more. [shipping-fees]"),
        (
            "How much does express shipping cost?",
            "Express delivery is ¥25 per order, whatever the order value. [shipping-fees]",
        ),
        (LAPTOP_Q, "Laptops have a 24-month warranty under Clause 6.1. [warranty]"),
        ("How long is the warranty on a phone?", "Phones carry a 12-month warranty. [warranty]"),
        ("How much is Care+ for a laptop?", "Care+ for a laptop costs ¥399. [care-plus]"),
        (
            "How fast will my parcel arrive?",
            "Standard delivery reaches most mainland cities in 3 to 5 business days. "
            "[delivery-times]",
        ),
        (
            "签收后多少天内降价可以申请价保？",
            "商品签收后7天内降价，可以申请价格保护。[price-protection]",
        ),
        ("过了保修期上门修要多少钱？", "保修期外上门维修每次收取80元服务费。[onsite-repair]"),
        ("学生认证有效期多久？", "学生认证有效期为12个月。[student-discount]"),
    ],
)
def test_a_close_paraphrase_of_the_answering_sentence_passes(question, answer):
    cited = answer[answer.rindex("[") + 1 : -1]
    (claim,) = verify_citations(answer, [material(cited)], question=question).claims
    assert claim.verdict == "supported", claim.reason


def test_the_readme_agent_is_not_called_unsupported_on_the_shipping_question():
    # the README's wrapped agent (LangChain's RAG tutorial shape) with the bundled model
    from langchain.agents import create_agent
    from langchain.tools import tool

    from tracerag import wrap

    vector_store = build_vectorstore()

    @tool(response_format="content_and_artifact")
    def retrieve_context(query: str):
        """Retrieve information to help answer a query."""
        docs = vector_store.similarity_search(query, k=2)
        return "\n\n".join(f"Source: {d.metadata}\nContent: {d.page_content}" for d in docs), docs

    agent = create_agent(
        ExtractiveChatModel(seed=1),
        [retrieve_context],
        system_prompt=(
            "Use the tool to answer from the store's policies; cite each source by its id."
        ),
    )
    response = wrap(agent, n_samples=5).invoke(
        {"messages": [{"role": "user", "content": SHIPPING_Q}]}
    )
    verdicts = {c.text: c.verdict for c in response.claims}
    assert "unsupported" not in verdicts.values(), response.claims
    assert verdicts["Orders of ¥299 or more ship free with standard domestic delivery."] == (
        "supported"
    )
