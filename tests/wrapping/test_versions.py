"""Versions of a wrapped app's answers: from templates, else from what reached the model."""

from __future__ import annotations

import asyncio
import uuid

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda

from tracerag.prompts import fingerprint
from tracerag.signals._types import Material
from tracerag.testing import ScriptedChatModel
from tracerag.wrapping._capture import ModelCall, RunCapture, prompt_text
from tracerag.wrapping._versions import (
    learn_model,
    learn_prompt,
    missing_version_error,
    model_input_text,
)

DOC = Material(
    id="warranty", text="Laptops carry a 24-month warranty.", metadata={"id": "warranty"}
)
TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {}}}]


def call(question: str, doc: Material = DOC, system: str = "Answer from the tool.") -> ModelCall:
    return ModelCall(
        run_id=uuid.uuid4(),
        params={"tools": TOOLS, "temperature": 0.7},
        messages=[
            SystemMessage(system),
            HumanMessage("earlier question"),
            AIMessage("earlier answer"),
            HumanMessage(question),
            AIMessage("", tool_calls=[{"name": "search", "args": {"q": question}, "id": "1"}]),
            ToolMessage(f"Source: {doc.metadata}\nContent: {doc.text}", tool_call_id="1"),
        ],
    )


def test_the_model_input_masks_the_question_documents_and_tool_outputs():
    text = model_input_text(call("How long?"), "How long?", [DOC])
    assert text == (
        "system:Answer from the tool.\n"
        "human:{question}\n"
        'tools:[{"function": {"name": "search", "parameters": {}}, "type": "function"}]'
    )
    other_doc = Material(id="returns", text="Returns within 30 days.", metadata={"id": "returns"})
    assert model_input_text(call("Returns?", other_doc), "Returns?", [other_doc]) == text
    # the system prompt and the tools are the version
    assert model_input_text(call("How long?", system="Be brief."), "How long?", [DOC]) != text
    no_tools = call("How long?")
    no_tools.params = {}
    assert model_input_text(no_tools, "How long?", [DOC]) != text


def test_a_formatted_prompt_keeps_its_static_part():
    prompt = "Question: How long? \nContext: Laptops carry a 24-month warranty.\nAnswer:"
    made = ModelCall(run_id=uuid.uuid4(), messages=[HumanMessage(prompt)])
    assert model_input_text(made, "How long?", [DOC]) == (
        "human:Question: {question} \nContext: {document}\nAnswer:"
    )
    assert model_input_text(ModelCall(run_id=uuid.uuid4()), "q", []) is None
    completion = ModelCall(run_id=uuid.uuid4(), prompts=["Q: How long?"])
    assert model_input_text(completion, "How long?", []) == "prompt:Q: {question}"


def run(chain, value) -> RunCapture:
    capture = RunCapture()
    asyncio.run(chain.ainvoke(value, config={"callbacks": [capture]}))
    return capture


def test_templates_the_runs_formatted_come_first():
    prompt = ChatPromptTemplate.from_template("Q: {q}")
    llm = ScriptedChatModel(responses=["a"], model_name="m1")
    first, second = run(prompt | llm, {"q": "x"}), run(prompt | llm, {"q": "y"})
    assert learn_prompt([first, second], "x", []) == (
        fingerprint(prompt_text(prompt)),
        "run-template",
    )
    assert learn_model([first, second]) == "m1"
    plain = run(RunnableLambda(lambda q: llm.invoke(f"Answer: {q}")), "x")
    version, how = learn_prompt([plain], "x", [])
    assert how == "model-input" and version == fingerprint("human:Answer: {question}")
    nothing = run(RunnableLambda(lambda q: q), "q")
    assert learn_prompt([nothing], "q", []) == (None, None)
    assert learn_model([nothing]) is None


def test_missing_version_error_names_the_argument():
    error = missing_version_error("r1", ["prompt", "model"])
    assert "request r1 refused" in str(error)
    assert "made no model call" in str(error)
    assert "pass prompt_version= to wrap()" in str(error)
    assert "pass model_version= to wrap()" in str(error)
