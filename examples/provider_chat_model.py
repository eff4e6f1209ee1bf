"""The same RAGPipeline with a provider's chat model instead of the offline extractive one.

Any LangChain chat model works; this example uses OpenAI through ``langchain-openai``:

    pip install langchain-openai
    export OPENAI_API_KEY=...
    python examples/provider_chat_model.py
    python examples/provider_chat_model.py "降价后多少天内可以申请价格保护？"

``OPENAI_MODEL`` picks the model (default ``gpt-4o-mini``). Swap in ``ChatAnthropic``,
``AzureChatOpenAI``, ``ChatOllama`` or any other ``BaseChatModel`` the same way.
"""

from __future__ import annotations

import os
import sys

from tracerag import RAGPipeline
from tracerag.demo.kb import build_retriever, load_questions
from tracerag.prompts import DEFAULT_PROMPT_VERSION


def main(argv: list[str]) -> int:
    if not os.environ.get("OPENAI_API_KEY"):
        print(
            "OPENAI_API_KEY is not set. Export an OpenAI API key to run this example, or run "
            "examples/wrap_existing_chain.py, which works offline.",
            file=sys.stderr,
        )
        return 2
    try:
        from langchain_openai import ChatOpenAI
    except ImportError:
        print("This example needs langchain-openai: pip install langchain-openai", file=sys.stderr)
        return 2

    model_name = os.environ.get("OPENAI_MODEL", "gpt-4o-mini")
    llm = ChatOpenAI(model=model_name, temperature=0.7, timeout=60, max_retries=0)
    pipeline = RAGPipeline(
        build_retriever(k=4),
        llm,
        prompt_version=DEFAULT_PROMPT_VERSION,
        model_version=f"openai:{model_name}",
        n_samples=5,
        temperature=0.7,
        plan="separate",
        tier="high",
    )
    questions = argv or [q["question"] for q in load_questions()]
    for question in questions:
        response = pipeline.invoke(question)
        print(f"\nQ: {question}")
        print(f"decision: {response.decision}  confidence: {response.confidence}")
        print(f"answer:   {response.answer}")
        for ev in response.evidence:
            print(f"  [{ev.material_id}] {ev.title}: {ev.quote!r}")
        if response.ticket_id:
            print(f"ticket:   {response.ticket_id}")
        print(f"trace_id: {response.trace_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
