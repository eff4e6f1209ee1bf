"""One prompt for several samples, over HTTP: ChatOpenAI against an OpenAI-compatible server
on 127.0.0.1 that returns ``n`` choices per call (tests/openai_compatible.py). A round of
samples is one request with ``n``; the prompt is billed once, and the usage record says so."""

from __future__ import annotations

import httpx
import pytest
from openai_compatible import CompletionsServer

from tracerag import RAGPipeline
from tracerag._llm import generates_several
from tracerag.demo.kb import build_retriever
from tracerag.prompts import TASK_RE

pytest.importorskip("langchain_openai")

QUESTION = "How long is the warranty on a laptop?"


def chat_model(base_url: str, client: httpx.Client, aclient: httpx.AsyncClient):
    from langchain_openai import ChatOpenAI

    # the test's own HTTP clients, closed at its end (ChatOpenAI's defaults are process-wide)
    return ChatOpenAI(
        base_url=base_url,
        api_key="test-key",
        model="extractive",
        temperature=0.7,
        max_retries=0,
        timeout=30,
        http_client=client,
        http_async_client=aclient,
    )


def sample_bodies(server: CompletionsServer) -> list[dict]:
    """The requests that asked for answers (not the plan)."""
    found = []
    for body in server.bodies:
        prompt = "\n".join(str(m.get("content")) for m in body["messages"])
        match = TASK_RE.search(prompt)
        if match is None or match.group("task") != "plan":
            found.append(body)
    return found


@pytest.mark.parametrize("first", [5, 2])
def test_samples_share_one_request_and_the_prompt_is_billed_once(first):
    with (
        CompletionsServer.running() as server,
        httpx.Client(timeout=30) as client,
    ):
        aclient = httpx.AsyncClient(timeout=30)
        try:
            llm = chat_model(server.base_url, client, aclient)
            assert generates_several(llm)
            records: list[dict] = []
            pipeline = RAGPipeline(
                build_retriever(k=4),
                llm,
                prompt_version="p",
                model_version="extractive",
                n_samples=5,
                min_samples=first,
                audit=records.append,
            )
            response = pipeline.invoke(QUESTION)
            bare = llm.invoke(sample_bodies(server)[0]["messages"])
        finally:
            import asyncio

            asyncio.run(aclient.aclose())
    assert response.decision == "pass"
    record = records[0]
    asked = sample_bodies(server)[:-1]  # the last is the bare call above
    adaptive = record["params"]["adaptive"]
    # one request per round, each asking for that round's samples at once
    assert len(asked) == adaptive["rounds"] == adaptive["calls"]
    assert sum(int(b.get("n") or 1) for b in asked) == adaptive["drawn"] == len(record["samples"])
    assert [b["messages"] for b in asked] == [asked[0]["messages"]] * len(asked)
    billed = record["usage"]["by_stage"]["sample"]["input_tokens"]
    one = bare.usage_metadata["input_tokens"]
    assert billed <= 1.5 * one, (billed, one)
    detail = [c for c in record["usage"]["calls_detail"] if c["stage"] == "sample"]
    assert detail[0]["generations"] == asked[0]["n"] == first
    assert detail[0]["input_tokens"] == one  # the server's own count, once


def test_a_server_that_returns_fewer_choices_fails_the_samples_it_owes():
    """A server that ignores ``n`` answers once: the round's samples fail, never silently
    become copies of one answer."""
    with CompletionsServer.running() as server, httpx.Client(timeout=30) as client:
        original = server.answer

        def one_choice(body):
            return original({**body, "n": 1})

        server.answer = one_choice  # type: ignore[method-assign]
        aclient = httpx.AsyncClient(timeout=30)
        try:
            records: list[dict] = []
            pipeline = RAGPipeline(
                build_retriever(k=4),
                chat_model(server.base_url, client, aclient),
                prompt_version="p",
                model_version="extractive",
                n_samples=3,
                min_samples=3,
                audit=records.append,
            )
            response = pipeline.invoke(QUESTION)
        finally:
            import asyncio

            asyncio.run(aclient.aclose())
    assert response.decision == "escalate"
    errors = [s["error"] for s in records[0]["samples"]]
    assert all(e and "returned 1 answers to a call for 3" in e for e in errors), errors
