"""Shared fixtures: real documents in a real vector store, span capture, fast retries."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.documents import Document

from tracerag import RAGPipeline, RetryPolicy
from tracerag.config import reset_config
from tracerag.testing import ScriptedChatModel, SpanCapture

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


@pytest.fixture(scope="session", autouse=True)
def _audit_store_in_temp_dir(tmp_path_factory):
    """Pipelines built with the default audit="auto" write to a temporary SQLite store."""
    import os

    path = tmp_path_factory.mktemp("audit") / "audit.sqlite"
    previous = os.environ.get("TRACERAG_STORE")
    os.environ["TRACERAG_STORE"] = str(path)
    reset_config()
    yield path
    if previous is None:
        os.environ.pop("TRACERAG_STORE", None)
    else:
        os.environ["TRACERAG_STORE"] = previous
    reset_config()


@pytest.fixture(autouse=True)
def _tracerag_logger_restored():
    """A test that sets the ``tracerag`` logger's level or propagation leaves it as it was."""
    import logging

    logger = logging.getLogger("tracerag")
    level, propagate, handlers = logger.level, logger.propagate, list(logger.handlers)
    yield
    logger.setLevel(level)
    logger.propagate = propagate
    for handler in [h for h in logger.handlers if h not in handlers]:
        logger.removeHandler(handler)


@pytest.fixture(autouse=True)
def _fresh_config(monkeypatch):
    """Each test reads the environment it set up: tracerag reads ``TRACERAG_*`` once per process
    (``tracerag.config``), so a test that changes one through ``monkeypatch`` has it read anew."""
    setenv, delenv = monkeypatch.setenv, monkeypatch.delenv

    def set_and_reset(name, value, prepend=None):
        setenv(name, value, prepend)
        if str(name).startswith("TRACERAG_"):
            reset_config()

    def del_and_reset(name, raising=True):
        delenv(name, raising)
        if str(name).startswith("TRACERAG_"):
            reset_config()

    monkeypatch.setenv = set_and_reset
    monkeypatch.delenv = del_and_reset
    reset_config()
    yield
    reset_config()


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
            "retry": FAST_RETRY,
            "tracer_provider": spans.provider,
        }
        options.update(overrides)
        return RAGPipeline(retriever, llm, **options)

    return make


def scripted(answers: list[str], **kwargs: Any) -> ScriptedChatModel:
    """A scripted model that plans PLAN and answers in turn from ``answers``."""
    return ScriptedChatModel(responses=answers, plan_responses=[PLAN], **kwargs)
