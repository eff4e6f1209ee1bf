"""Real pipeline pieces shared by the tests (a pytest plugin, registered in conftest.py): the
test policies as real documents in a real vector store, span capture, scripted models, fast
retries, and the answers and questions the tests send through them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough

from tracerag import RAGPipeline, RetryPolicy
from tracerag.testing import ScriptedChatModel, SpanCapture

#: The repository's root directory (examples, dashboards, benchmarks, the package).
REPO = Path(__file__).resolve().parent.parent

POLICIES = [
    Document(
        page_content=(
            "Customers may return unused items within 30 days of delivery for a full refund. "
            "Refunds are paid to the original payment method within 7 business days."
        ),
        metadata={"id": "returns", "title": "Returns and refunds", "source": "kb://returns"},
    ),
    Document(
        page_content=(
            "Standard shipping costs $5 for orders under $50. "
            "Orders of $50 or more ship free within mainland China."
        ),
        metadata={"id": "shipping", "title": "Shipping fees", "source": "kb://shipping"},
    ),
    Document(
        page_content=(
            "笔记本电脑和平板电脑享受24个月保修。手机享受12个月保修，人为损坏不在保修范围内。"
        ),
        metadata={"id": "warranty-zh", "title": "保修政策", "source": "kb://warranty"},
    ),
    Document(
        page_content=(
            "Gold members receive a 5% discount on every order. "
            "Gold membership costs 500元 per year."
        ),
        metadata={"id": "membership", "title": "Membership", "source": "kb://membership"},
    ),
    Document(
        page_content="Customers may return unused items within 14 days of delivery.",
        metadata={
            "id": "returns-2019",
            "title": "Returns (2019, superseded)",
            "superseded_by": "returns",
            "valid_until": "2020-12-31",
        },
    ),
]

GOOD = "Customers may return unused items within 30 days of delivery for a full refund. [returns]"
GOOD_ALT = (
    "You can return unused items within 30 days of delivery and get a full refund. [returns] "
    "The refund is paid within 7 business days. [returns]"
)
WRONG_NUMBER = "Customers may return unused items within 60 days of delivery. [returns]"
OFF_TOPIC = "Gold members receive a 5% discount on every order. [membership]"
FABRICATED = "Customers may return unused items within 30 days of delivery. [policy-99]"
PLAN = '{"material_ids": ["returns"], "key_facts": ["30 days"]}'
QUESTION = "How many days do I have to return an item?"
FAST_RETRY = RetryPolicy(attempts=3, initial_wait=0.001, max_wait=0.01, jitter=0.0)


@pytest.fixture
def documents() -> list[Document]:
    return [Document(page_content=d.page_content, metadata=dict(d.metadata)) for d in POLICIES]


@pytest.fixture
def retriever(documents):
    from tracerag.demo.kb import build_vectorstore

    return build_vectorstore(documents).as_retriever(search_kwargs={"k": 5})


@pytest.fixture
def spans() -> SpanCapture:
    return SpanCapture()


@pytest.fixture
def make_pipeline(retriever, spans) -> Callable[..., RAGPipeline]:
    def make(llm: ScriptedChatModel, **overrides: Any) -> RAGPipeline:
        options: dict[str, Any] = {
            "prompt_version": "test-prompt-v1",
            "model_version": llm.model_name,
            "n_samples": 5,
            # fixed N (every sample drawn): what these tests count on; tests/test_adaptive.py
            # covers adaptive sampling
            "min_samples": 5,
            "retry": FAST_RETRY,
            "tracer_provider": spans.provider,
        }
        options.update(overrides)
        return RAGPipeline(retriever, llm, **options)

    return make


def scripted(answers: list[str], **kwargs: Any) -> ScriptedChatModel:
    """A scripted model that plans PLAN and answers in turn from ``answers``."""
    return ScriptedChatModel(responses=answers, plan_responses=[PLAN], **kwargs)


# -- a chain written the standard LCEL way, for wrap() ------------------------------------------

TEMPLATE = (
    "Answer from the context. Cite passages as [n].\n\nContext:\n{context}\n\nQuestion: {question}"
)


def format_docs(docs):
    return "\n\n".join(f"[{i}] {d.page_content}" for i, d in enumerate(docs, 1))


def standard_chain(retriever, llm):
    prompt = ChatPromptTemplate.from_template(TEMPLATE)
    return (
        {"context": retriever | format_docs, "question": RunnablePassthrough()}
        | prompt
        | llm
        | StrOutputParser()
    )


def positional_answer(call):
    """Cites the passage that mentions returns by its position in the prompt's context."""
    for line in call.prompt.splitlines():
        if line.startswith("[") and "30 days" in line:
            n = line[1 : line.index("]")]
            return f"Customers may return unused items within 30 days of delivery. [{n}]"
    return "I cannot tell. [9]"
