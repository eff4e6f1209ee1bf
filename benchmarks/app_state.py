"""What a wrapped app's own state holds after its turns: a thread, a history, a paused turn.

Counted, not timed, with offline models (tracerag.testing) over the demo knowledge base, N=5:

- thread: ``create_agent(..., checkpointer=InMemorySaver())`` wrapped, three turns on one
  thread_id, the middle one answered with a wrong number (escalated): the checkpoints and
  pending writes of every thread that hold the withheld sentence, whether the third turn's
  model was given it, and the threads left in the checkpointer;
- history: LangChain's conversational RAG chain in a ``RunnableWithMessageHistory``: the
  messages in the history after one passed turn, and the copies of a withheld (fabricated)
  answer after an escalated second turn;
- structured: ``create_agent(..., response_format=...)`` with ``ToolStrategy`` and
  ``ProviderStrategy``, a correct cited answer: the decision, and whether the structured object
  is returned;
- interrupt: ``HumanInTheLoopMiddleware`` gating the retrieval tool: the paused turn's decision
  and interrupts, then ``Command(resume=...)``: the resumed turn's decision (or the error).

    python benchmarks/app_state.py [--compare BEFORE_TREE]

``--compare`` runs the same scenarios on another source tree of tracerag (in its own process)
and prints both side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

N = 5
QUESTION = "How long is the warranty on a laptop?"
SENTENCE = "Under Clause 6.1, laptops and tablets are covered by an extended 24-month warranty."
WRONG = SENTENCE.replace("24-month", "36-month")


def _kb() -> Any:
    from langchain_core.vectorstores import InMemoryVectorStore

    from tracerag.demo.kb import HashingEmbeddings, load_documents

    docs = load_documents()
    return InMemoryVectorStore.from_documents(
        docs, embedding=HashingEmbeddings.fit(d.page_content for d in docs)
    )


def _agent(responder: Any, **kwargs: Any) -> Any:
    from langchain.agents import create_agent
    from langchain.tools import tool

    from tracerag.testing import ToolCallingChatModel

    store = _kb()

    @tool(response_format="content_and_artifact")
    def retrieve_context(query: str) -> Any:
        """Retrieve information to help answer a query."""
        docs = store.similarity_search(query, k=2)
        return "\n\n".join(f"Source: {d.metadata}\nContent: {d.page_content}" for d in docs), docs

    model_class = kwargs.pop("model_class", ToolCallingChatModel)
    model = model_class(responder=responder, model_name="tool-model-1", temperature=0.7)
    prompt = "Use the tool to answer, and cite each source you use by its id."
    return create_agent(model, [retrieve_context], system_prompt=prompt, **kwargs), model


def _answer(wrong: bool) -> Any:
    def respond(call: Any) -> str:
        if "24-month" not in call.prompt:
            return "I don't know."
        return f"{WRONG if wrong else SENTENCE} [warranty]"

    return respond


def thread() -> dict[str, Any]:
    from langgraph.checkpoint.memory import InMemorySaver

    from tracerag import wrap

    state = {"wrong": False}
    saver = InMemorySaver()
    agent, model = _agent(lambda c: _answer(state["wrong"])(c), checkpointer=saver)
    wrapped = wrap(agent, n_samples=N, audit=None)
    config = {"configurable": {"thread_id": "customer-7"}}
    decisions = []
    for wrong in (False, True, False):
        state["wrong"] = wrong
        before = model.call_count
        decisions.append(wrapped.invoke({"messages": [("user", QUESTION)]}, config).decision)
    third = [c.prompt for c in model.calls[before:]]
    saved = list(saver.list(None))
    return {
        "decisions": decisions,
        "checkpoints holding the withheld sentence": sum(
            "36-month" in repr((t.checkpoint, t.pending_writes)) for t in saved
        ),
        "checkpoints in all": len(saved),
        "third turn's model given it": any("36-month" in p for p in third),
        "threads left": sorted({t.config["configurable"]["thread_id"] for t in saved}),
    }


def history() -> dict[str, Any]:
    from langchain_classic.chains import create_history_aware_retriever, create_retrieval_chain
    from langchain_classic.chains.combine_documents import create_stuff_documents_chain
    from langchain_core.chat_history import BaseChatMessageHistory
    from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder, PromptTemplate
    from langchain_core.runnables.history import RunnableWithMessageHistory

    from tracerag import wrap
    from tracerag.testing import ScriptedChatModel

    class History(BaseChatMessageHistory):
        def __init__(self) -> None:
            self.messages = []

        def add_messages(self, messages: Any) -> None:
            self.messages = [*self.messages, *messages]

        def clear(self) -> None:
            self.messages = []

    state = {"bad": False}
    standalone = "Rewrite the latest user question as a standalone question."

    def respond(call: Any) -> str:
        if standalone in call.prompt:
            return QUESTION
        if "[warranty]" in call.prompt and "24-month" in call.prompt:
            return f"{SENTENCE} [{'policy-99' if state['bad'] else 'warranty'}]"
        return "I don't know."

    llm = ScriptedChatModel(responder=respond, model_name="scripted-x", temperature=0.7)
    retriever = _kb().as_retriever(search_kwargs={"k": 4})
    contextualize = ChatPromptTemplate.from_messages(
        [("system", standalone), MessagesPlaceholder("chat_history"), ("human", "{input}")]
    )
    qa = ChatPromptTemplate.from_messages(
        [
            ("system", "Answer from the context; cite each passage by its [id].\n\n{context}"),
            MessagesPlaceholder("chat_history"),
            ("human", "{input}"),
        ]
    )
    chain = create_retrieval_chain(
        create_history_aware_retriever(llm, retriever, contextualize),
        create_stuff_documents_chain(
            llm, qa, document_prompt=PromptTemplate.from_template("[{id}] {page_content}")
        ),
    )
    histories: dict[str, History] = {}
    app = RunnableWithMessageHistory(
        chain,
        lambda session_id: histories.setdefault(session_id, History()),
        input_messages_key="input",
        history_messages_key="chat_history",
        output_messages_key="answer",
    )
    wrapped = wrap(app, n_samples=N, audit=None)
    config = {"configurable": {"session_id": "s-1"}}
    first = wrapped.invoke({"input": QUESTION}, config).decision
    after_first = len(histories["s-1"].messages)
    state["bad"] = True
    second = wrapped.invoke({"input": QUESTION}, config).decision
    return {
        "decisions": [first, second],
        "messages after turn 1": after_first,
        "copies of the withheld answer after turn 2": sum(
            "policy-99" in str(m.content) for m in histories["s-1"].messages
        ),
    }


def structured() -> dict[str, Any]:
    from langchain.agents.structured_output import ProviderStrategy, ToolStrategy
    from langchain_core.messages import AIMessage, ToolCall
    from langchain_core.outputs import ChatGeneration, ChatResult
    from pydantic import BaseModel, Field

    from tracerag import wrap
    from tracerag.testing import ToolCallingChatModel

    class CitedAnswer(BaseModel):
        """An answer from the store's policies."""

        answer: str = Field(description="The answer, in one sentence.")
        sources: list[str] = Field(description="The ids of the sources used.")

    class Answerer(ToolCallingChatModel):
        def _tool_call(self, messages: Any, **kwargs: Any) -> Any:
            schemas = list(kwargs.get("tools") or [])
            names = [s["function"]["name"] for s in schemas]
            free = {
                **kwargs,
                "tools": [s for s in schemas if s["function"]["name"] != "CitedAnswer"],
            }
            free.pop("tool_choice", None)
            called = super()._tool_call(messages, **free)
            if called is not None or "CitedAnswer" not in names:
                return called
            _call, text = self._next(messages)
            tool_call = ToolCall(
                name="CitedAnswer", args=json.loads(text), id="s", type="tool_call"
            )
            message = AIMessage(content="", tool_calls=[tool_call])
            return ChatResult(generations=[ChatGeneration(message=message)])

    reply = json.dumps({"answer": SENTENCE, "sources": ["warranty"]})
    found = {}
    for name, strategy in (("tool", ToolStrategy), ("provider", ProviderStrategy)):
        agent, _ = _agent(
            lambda call: reply, model_class=Answerer, response_format=strategy(CitedAnswer)
        )
        response = wrap(agent, n_samples=N, audit=None).invoke(QUESTION)
        found[name] = {
            "decision": response.decision,
            "structured returned": getattr(response, "structured", None) is not None,
            "warnings": response.warnings,
        }
    return found


def interrupt() -> dict[str, Any]:
    from langchain.agents.middleware import HumanInTheLoopMiddleware
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command

    from tracerag import wrap

    gate = HumanInTheLoopMiddleware(interrupt_on={"retrieve_context": True})
    agent, model = _agent(_answer(False), checkpointer=InMemorySaver(), middleware=[gate])
    wrapped = wrap(agent, n_samples=N, audit=None)
    config = {"configurable": {"thread_id": "hitl"}}
    paused = wrapped.invoke({"messages": [("user", QUESTION)]}, config)
    found: dict[str, Any] = {
        "paused turn": [paused.decision, paused.status],
        "interrupts in the Response": len(getattr(paused, "interrupts", [])),
        "paused turn warnings": paused.warnings,
        "model calls for the paused turn": model.call_count,
    }
    try:
        done = wrapped.invoke(Command(resume={"decisions": [{"type": "approve"}]}), config)
        found["resumed turn"] = done.decision
    except Exception as exc:
        found["resumed turn"] = f"{type(exc).__name__}: {str(exc)[:80]}"
    return found


SCENARIOS = {"thread": thread, "history": history, "structured": structured, "interrupt": interrupt}


def measure() -> dict[str, Any]:
    warnings.simplefilter("ignore")
    import logging

    logging.disable(logging.WARNING)
    found = {}
    for name, scenario in SCENARIOS.items():
        try:
            found[name] = scenario()
        except Exception as exc:
            found[name] = f"{type(exc).__name__}: {str(exc)[:120]}"
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", help="another source tree of tracerag, measured too")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.json:
        print(json.dumps(measure(), default=str))
        return
    here = Path(__file__).resolve().parent.parent
    trees = [("after", here)]
    if args.compare:
        trees.insert(0, ("before", Path(args.compare).resolve()))
    results = {}
    for label, tree in trees:
        env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
        out = subprocess.run(
            [sys.executable, "-B", __file__, "--json"],
            env=env,
            cwd=tree,
            capture_output=True,
            text=True,
            check=True,
        )
        results[label] = json.loads(out.stdout.strip().splitlines()[-1])
    for name in SCENARIOS:
        print(f"## {name}")
        for label, found in results.items():
            print(f"  {label}: {json.dumps(found[name], ensure_ascii=False)}")


if __name__ == "__main__":
    main()
