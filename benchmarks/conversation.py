"""What reading a conversation costs: resolving a follow-up and reading the app's thread.

Measured side by side in one run, each figure a median of interleaved rounds:

- resolution: microseconds per turn for ``resolve_turn`` over English and Chinese follow-ups,
  standalone turns and pronoun references (one earlier turn), and over a 20-turn history;
- RAGPipeline, a zero-latency scripted model, N samples: the standalone question asked on its
  own, and the follow-up with one earlier turn in ``chat_history``, and with 20; wall time as
  a ratio to the question on its own;
- wrap() of a ``create_agent`` agent with an ``InMemorySaver``, on a thread holding 0 (a first
  turn), 1 and 10 earlier turns: the time of reading the conversation (the thread's
  ``aget_state`` and the resolution) beside the whole request's, and their ratio.

Every request measured must pass (the follow-up verified as its standalone question).

    python benchmarks/conversation.py [--rounds 15] [--samples 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from langchain.agents import create_agent
from langchain.tools import tool
from langchain_core.documents import Document
from langchain_core.vectorstores import InMemoryVectorStore
from langgraph.checkpoint.memory import InMemorySaver

from tracerag import RAGPipeline, wrap
from tracerag._settings import RetryPolicy
from tracerag.demo.kb import HashingEmbeddings
from tracerag.testing import ScriptCall, ScriptedChatModel, ToolCallingChatModel
from tracerag.text._followup import resolve_turn

TURNS: list[tuple[str, str]] = [
    ("And for a phone?", "How long is the warranty on a laptop?"),
    ("What about express shipping?", "How much does standard shipping cost?"),
    ("And to Mexico?", "Do you ship to Canada?"),
    ("What if I lost the receipt?", "Can I return a laptop?"),
    ("Is it waterproof?", "How long is the warranty on a laptop?"),
    ("What is your returns policy?", "How long is the warranty on a laptop?"),
    ("那手机呢？", "笔记本电脑的保修期是多久？"),
    ("换成法国呢", "寄到德国的运费是多少？"),
    ("那过了保修期呢？", "上门维修收费吗？"),
    ("它防水吗？", "笔记本电脑的保修期是多久？"),
    ("退货政策是什么？", "笔记本电脑的保修期是多久？"),
]
DOCS = [
    Document(
        page_content=(
            "All new devices carry a 12-month warranty from the date of delivery. "
            "Laptops and tablets are covered by an extended 24-month warranty."
        ),
        metadata={"id": "warranty", "title": "Standard warranty"},
    ),
    Document(
        page_content="Standard shipping costs $5 for orders under $50.",
        metadata={"id": "shipping", "title": "Shipping fees"},
    ),
]
FIRST = "How long is the warranty on a laptop?"
FOLLOW_UP = "And for a phone?"
ANSWER = "All new devices carry a 12-month warranty from the date of delivery. [warranty]"
FIRST_ANSWER = "Laptops and tablets are covered by an extended 24-month warranty. [warranty]"
FAST = RetryPolicy(attempts=1, initial_wait=0.001, max_wait=0.01, jitter=0.0)


def store() -> InMemoryVectorStore:
    return InMemoryVectorStore.from_documents(
        DOCS, embedding=HashingEmbeddings.fit(d.page_content for d in DOCS)
    )


def median_us(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def resolution(rounds: int) -> dict[str, float]:
    long_history = [FIRST, *(f"Question number {i}?" for i in range(18)), FIRST]

    def all_turns() -> None:
        for turn, previous in TURNS:
            resolve_turn(turn, [previous])

    per_turn = median_us(all_turns, rounds * 20) / len(TURNS)
    long = median_us(lambda: resolve_turn(FOLLOW_UP, long_history), rounds * 20)
    return {"one earlier turn": per_turn, "20 earlier turns": long}


def answer(call: ScriptCall) -> str:
    """The phone's answer to the follow-up (as the app or the standalone question shows it),
    the laptop's to the first turn."""
    follow_up = FOLLOW_UP in call.prompt or "for a phone" in call.prompt
    return ANSWER if follow_up else FIRST_ANSWER


def pipeline_rows(rounds: int, samples: int) -> dict[str, float]:
    llm = ScriptedChatModel(responder=answer, plan_responses=['{"material_ids": ["warranty"]}'])
    pipeline = RAGPipeline(
        store().as_retriever(search_kwargs={"k": 2}),
        llm,
        prompt_version="bench-v1",
        model_version=llm.model_name,
        n_samples=samples,
        retry=FAST,
        audit=None,
    )
    one = [("human", FIRST), ("ai", ANSWER)]
    twenty = [("human", f"Question number {i}?") for i in range(19)] + one
    inputs = {
        # the same question typed out in full: the same work, no conversation to read
        "on its own": "How long is the warranty for a phone?",
        "1 earlier turn": {"question": FOLLOW_UP, "chat_history": one},
        "20 earlier turns": {"question": FOLLOW_UP, "chat_history": twenty},
    }
    times: dict[str, list[float]] = {name: [] for name in inputs}
    for value in inputs.values():  # warm up; each must pass, or the figures mean nothing
        assert pipeline.invoke(value).decision == "pass", value
    for _ in range(rounds):
        for name, value in inputs.items():
            start = time.perf_counter()
            pipeline.invoke(value)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def agent_rows(rounds: int, samples: int) -> dict[str, tuple[float, float]]:
    """Per thread size: the median time of reading the conversation (``read_conversation``:
    the thread's ``aget_state`` and the resolution) and of the whole follow-up request."""
    docs = store()

    @tool(response_format="content_and_artifact")
    def retrieve_context(query: str):
        """Retrieve information to help answer a query."""
        found = docs.similarity_search(query, k=2)
        return "\n\n".join(f"Source: {d.metadata}\nContent: {d.page_content}" for d in found), found

    model = ToolCallingChatModel(responder=answer, model_name="tool-model-1", temperature=0.7)
    agent = create_agent(model, [retrieve_context], checkpointer=InMemorySaver())
    wrapped = wrap(agent, n_samples=samples, retry=FAST, audit=None)
    rows: dict[str, tuple[float, float]] = {}
    for earlier in (0, 1, 10):
        reads: list[float] = []
        requests: list[float] = []
        for r in range(rounds + 1):  # the first round warms up
            config = {"configurable": {"thread_id": f"t{earlier}-{r}"}}
            for _ in range(earlier):
                wrapped.invoke({"messages": [("user", FIRST)]}, config)
            turn = {"messages": [("user", FOLLOW_UP if earlier else FIRST)]}
            request = wrapped.parse_input(turn)
            start = time.perf_counter()
            asyncio.run(wrapped.read_conversation(request, config))
            read = time.perf_counter() - start
            start = time.perf_counter()
            response = wrapped.invoke(turn, config)
            if r:
                reads.append(read)
                requests.append(time.perf_counter() - start)
            assert response.decision == "pass", (earlier, response.signal_detail.relevance)
        rows[f"{earlier} earlier turns"] = (statistics.median(reads), statistics.median(requests))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--samples", type=int, default=5)
    args = parser.parse_args()
    print("resolution (resolve_turn), median per turn:")
    for name, us in resolution(args.rounds).items():
        print(f"  {name:18} {us:8.1f} µs")
    print(f"RAGPipeline, N={args.samples}, zero-latency model: wall, ratio to the question alone")
    rows = pipeline_rows(args.rounds, args.samples)
    base = rows["on its own"]
    for name, seconds in rows.items():
        print(f"  {name:18} {seconds * 1e3:8.2f} ms  {seconds / base:5.2f}x")
    print(
        f"wrap(create_agent + InMemorySaver), N={args.samples}: reading the thread, the whole "
        "request, and their ratio"
    )
    for name, (read, whole) in agent_rows(args.rounds, args.samples).items():
        print(
            f"  {name:18} read {read * 1e3:6.2f} ms  request {whole * 1e3:8.2f} ms  "
            f"{read / whole:6.3f}x"
        )


if __name__ == "__main__":
    main()
