"""ExtractiveChatModel: prompt parsing, sampling behaviour, plan formats and foreign prompts."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
from langchain_core.documents import Document
from langchain_core.messages import AIMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate

from tracerag._usage import estimate_tokens
from tracerag.demo.kb import load_documents
from tracerag.demo.models.extractive import (
    CANNOT_ANSWER_EN,
    CANNOT_ANSWER_ZH,
    ExtractiveChatModel,
    parse_prompt,
)
from tracerag.prompts import (
    ANSWER_LINE_RE,
    PLAN_LINE_RE,
    PROMPT,
    TASK_ANSWER,
    TASK_PLAN,
    TASK_PLAN_AND_ANSWER,
    prompt_values,
)
from tracerag.signals._types import Material, Plan

CITATION_RE = re.compile(r"\[([^\]]+)\]")
DOCS = {d.metadata["id"]: d for d in load_documents()}


def materials(*ids: str) -> list[Material]:
    return [
        Material(
            id=i,
            text=DOCS[i].page_content,
            title=DOCS[i].metadata["title"],
            metadata=DOCS[i].metadata,
        )
        for i in ids
    ]


def messages(question: str, ids: tuple[str, ...], task: str = TASK_ANSWER, plan=None):
    return PROMPT.format_messages(**prompt_values(task, question, materials(*ids), plan))


WARRANTY_Q = "How long is the warranty on a laptop?"
WARRANTY_IDS = ("warranty", "care-plus", "warranty-claims", "trade-in")
LAPTOP_SENTENCE = (
    "Under Clause 6.1, laptops and tablets are covered by an extended 24-month warranty."
)
INSTALL_Q = "How much does installation cost?"
INSTALL_IDS = ("appliance-installation", "tv-installation", "shipping-fees", "delivery-times")


def test_parses_the_real_tracerag_prompt():
    parsed = parse_prompt(messages(WARRANTY_Q, WARRANTY_IDS))
    assert parsed.task == TASK_ANSWER
    assert parsed.question == WARRANTY_Q
    assert [m.id for m in parsed.materials] == list(WARRANTY_IDS)
    assert LAPTOP_SENTENCE in parsed.materials[0].sentences
    assert not parsed.foreign


def test_temperature_zero_is_deterministic_and_verbatim():
    model = ExtractiveChatModel(temperature=0)
    msgs = messages(WARRANTY_Q, WARRANTY_IDS)
    answers = {model.invoke(msgs).content for _ in range(5)}
    assert answers == {f"{LAPTOP_SENTENCE} [warranty]"}


def test_every_quoted_sentence_is_verbatim_from_the_cited_material():
    model = ExtractiveChatModel(seed=3)
    msgs = messages(INSTALL_Q, INSTALL_IDS)
    for _ in range(10):
        answer = model.invoke(msgs).content
        quoted = re.findall(r"\s*(.+?)\s*\[([^\]]+)\]", answer)
        assert quoted, answer
        for sentence, cited in quoted:
            assert sentence in DOCS[cited].page_content


def test_samples_vary_when_sentences_compete():
    model = ExtractiveChatModel(temperature=0.7)
    msgs = messages(INSTALL_Q, INSTALL_IDS)
    answers = [model.invoke(msgs).content for _ in range(20)]
    assert len(set(answers)) >= 3
    cited = {c for a in answers for c in CITATION_RE.findall(a)}
    assert cited == {"appliance-installation", "tv-installation"}


def test_samples_are_stable_when_one_sentence_dominates():
    model = ExtractiveChatModel(temperature=0.7, seed=11)
    msgs = messages(WARRANTY_Q, WARRANTY_IDS)
    answers = [model.invoke(msgs).content for _ in range(30)]
    assert all(a.startswith(LAPTOP_SENTENCE) for a in answers)
    assert Counter(answers).most_common(1)[0][1] >= 26


def test_seed_makes_runs_reproducible_and_calls_differ_without_one():
    msgs = messages(INSTALL_Q, INSTALL_IDS)
    a, b = ExtractiveChatModel(seed=5), ExtractiveChatModel(seed=5)
    run_a = [a.invoke(msgs).content for _ in range(8)]
    run_b = [b.invoke(msgs).content for _ in range(8)]
    assert run_a == run_b
    unseeded = ExtractiveChatModel()
    assert len({unseeded.invoke(msgs).content for _ in range(12)}) > 1


def test_temperature_can_be_given_per_call():
    model = ExtractiveChatModel(temperature=1.0)
    msgs = messages(INSTALL_Q, INSTALL_IDS)
    assert len({model.invoke(msgs, temperature=0).content for _ in range(6)}) == 1


def test_plan_task_returns_valid_json_plan():
    model = ExtractiveChatModel(temperature=0)
    text = model.invoke(messages(WARRANTY_Q, WARRANTY_IDS, task=TASK_PLAN)).content
    plan = json.loads(text)
    assert plan["material_ids"] == ["warranty"]
    assert "Clause 6.1" in plan["key_facts"]
    assert "24-month" in plan["key_facts"]


def test_plan_keeps_competing_materials_in_play():
    model = ExtractiveChatModel(temperature=0.7)
    plan = json.loads(model.invoke(messages(INSTALL_Q, INSTALL_IDS, task=TASK_PLAN)).content)
    assert plan["material_ids"] == ["appliance-installation", "tv-installation"]
    assert {"¥199", "¥350", "¥149", "¥299"} <= set(plan["key_facts"])


def test_plan_and_answer_inline_format():
    model = ExtractiveChatModel(temperature=0)
    text = model.invoke(messages(WARRANTY_Q, WARRANTY_IDS, task=TASK_PLAN_AND_ANSWER)).content
    assert text.startswith("PLAN: ")
    plan = json.loads(PLAN_LINE_RE.search(text).group("plan"))
    answer = ANSWER_LINE_RE.search(text).group("answer")
    assert plan["material_ids"] == ["warranty"]
    assert answer == f"{LAPTOP_SENTENCE} [warranty]"


def test_answer_follows_the_plan_in_the_instruction():
    model = ExtractiveChatModel(temperature=0.7, seed=2)
    plan = Plan(material_ids=["tv-installation"], key_facts=["¥149"])
    msgs = messages(INSTALL_Q, INSTALL_IDS, plan=plan)
    assert "<plan>" in msgs[-1].content
    for _ in range(10):
        cited = set(CITATION_RE.findall(model.invoke(msgs).content))
        assert cited == {"tv-installation"}


def test_plan_naming_unknown_materials_is_ignored():
    model = ExtractiveChatModel(temperature=0)
    plan = Plan(material_ids=["no-such-id"], key_facts=[])
    answer = model.invoke(messages(WARRANTY_Q, WARRANTY_IDS, plan=plan)).content
    assert answer == f"{LAPTOP_SENTENCE} [warranty]"


def test_chinese_question_and_citation_format():
    model = ExtractiveChatModel(temperature=0)
    question = "订单签收后多久内可以申请开具发票？"
    answer = model.invoke(messages(question, ("invoices", "invoice-reissue", "coupons"))).content
    assert answer == "订单签收后90天内，可在“我的订单”页面申请开具发票。[invoices]"


def test_cannot_answer_in_the_question_language():
    model = ExtractiveChatModel(temperature=0.7)
    ids = ("invoice-reissue", "account-security", "onsite-repair")
    assert model.invoke(messages("你们招聘兼职店员吗？", ids)).content == CANNOT_ANSWER_ZH
    english = model.invoke(messages("Do you price-match competitors like JD.com?", ids))
    assert english.content == CANNOT_ANSWER_EN
    assert not CITATION_RE.search(english.content)


def test_english_sentence_is_copied_verbatim_for_a_chinese_question():
    model = ExtractiveChatModel(temperature=0)
    docs = [Material(id="M1", text="Gift cards are valid for 3 years. 礼品卡有效期为3年。")]
    msgs = PROMPT.format_messages(**prompt_values(TASK_ANSWER, "礼品卡有效期多久？", docs))
    assert model.invoke(msgs).content == "礼品卡有效期为3年。[M1]"
    msgs = PROMPT.format_messages(**prompt_values(TASK_ANSWER, "gift cards 有效期多久？", docs[:1]))
    assert model.invoke(msgs).content.startswith("Gift cards are valid for 3 years. [M1]")


def _format_docs(docs: list[Document]) -> str:
    return "\n\n".join(d.page_content for d in docs)


def test_foreign_prompt_cites_paragraph_positions():
    docs = [DOCS[i] for i in ("care-plus", "warranty", "gift-cards")]
    prompt = ChatPromptTemplate.from_template(
        "Answer the question based only on the following context:\n{context}\n\n"
        "Question: {question}\n"
    )
    chain = prompt | ExtractiveChatModel(temperature=0) | StrOutputParser()
    answer = chain.invoke({"context": _format_docs(docs), "question": WARRANTY_Q})
    assert answer == f"{LAPTOP_SENTENCE} [2]"


def test_foreign_prompt_with_context_in_the_system_message():
    docs = [DOCS[i] for i in ("gift-cards", "invoices")]
    prompt = ChatPromptTemplate.from_messages(
        [
            ("system", "You are a helpful assistant. Use the context below.\n\n{context}"),
            ("human", "{question}"),
        ]
    )
    model = ExtractiveChatModel(temperature=0)
    msgs = prompt.format_messages(
        context=_format_docs(docs), question="订单签收后多久内可以申请开具发票？"
    )
    parsed = parse_prompt(msgs)
    assert parsed.foreign
    assert [m.id for m in parsed.materials] == ["1", "2"]
    assert model.invoke(msgs).content.endswith("。[2]")


def test_usage_and_response_metadata():
    model = ExtractiveChatModel(temperature=0)
    message = model.invoke(messages(WARRANTY_Q, WARRANTY_IDS))
    assert isinstance(message, AIMessage)
    usage = message.usage_metadata
    assert usage["input_tokens"] > 50
    assert usage["output_tokens"] == estimate_tokens(message.content)
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert message.response_metadata["model_name"] == "tracerag-extractive-1"
    params = model._identifying_params
    assert params["model_name"] == "tracerag-extractive-1"
    assert params["temperature"] == 0


def test_chinese_output_tokens_count_characters():
    model = ExtractiveChatModel(temperature=0)
    message = model.invoke(messages("登录密码输错几次会锁定账户？", ("account-security",)))
    assert message.content == "登录密码连续输错5次后，账户将被锁定30分钟。[account-security]"
    assert message.usage_metadata["output_tokens"] >= 15


@pytest.mark.asyncio
async def test_async_invoke_and_batch():
    model = ExtractiveChatModel(temperature=0.7)
    msgs = messages(INSTALL_Q, INSTALL_IDS)
    answers = await model.abatch([msgs] * 12)
    assert all(CITATION_RE.search(a.content) for a in answers)
    assert len({a.content for a in answers}) > 1


def test_in_an_agent_it_calls_the_tool_then_cites_what_the_tool_returned():
    from langchain.agents import create_agent
    from langchain.tools import tool

    @tool(response_format="content_and_artifact")
    def lookup(query: str):
        """Look up the policies."""
        docs = [
            "Source: {'id': 'gift-cards', 'title': 'Gift cards'}\nContent: A Northwind gift card "
            "is valid for 3 years from the date of purchase.",
            "Delivery takes 3 to 5 business days.",
        ]
        return "\n\n".join(docs), []

    model = ExtractiveChatModel(temperature=0.0, max_sentences=1)
    agent = create_agent(model, [lookup], system_prompt="Use the tool.")
    out = agent.invoke({"messages": [("user", "How long is a Northwind gift card valid?")]})
    kinds = [m.type for m in out["messages"]]
    assert kinds == ["human", "ai", "tool", "ai"]
    assert out["messages"][1].tool_calls[0]["args"] == {
        "query": "How long is a Northwind gift card valid?"
    }
    assert out["messages"][-1].content == (
        "A Northwind gift card is valid for 3 years from the date of purchase. [gift-cards]"
    )
    # a passage without a Source line is cited by its position among the tool's passages
    out = agent.invoke({"messages": [("user", "How many business days does delivery take?")]})
    assert out["messages"][-1].content.endswith("[2]")
