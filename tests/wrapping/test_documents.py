"""The materials of a wrapped app's request, and the order each answer was shown them in."""

from __future__ import annotations

import uuid

from langchain_core.documents import Document
from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage

from tracerag.stages._retrieve import to_materials
from tracerag.wrapping._capture import ModelCall, RunCapture
from tracerag.wrapping._documents import run_materials, shown_order

A = Document(page_content="Returns are accepted within 30 days.", metadata={"id": "returns"})
B = Document(page_content="Laptops carry a 24-month warranty.", metadata={"id": "warranty"})
C = Document(page_content="Shipping is free over $50.", metadata={"id": "shipping"})


def capture_with(documents=(), shown: str | None = None, tool_texts=()) -> RunCapture:
    capture = RunCapture()
    capture.documents.extend(documents)
    capture.tool_texts.extend(tool_texts)
    if shown is not None:
        capture.model_calls.append(
            ModelCall(
                run_id=uuid.uuid4(),
                messages=[
                    SystemMessage("Cite by number."),
                    HumanMessage("q"),
                    ToolMessage(shown, tool_call_id="1"),
                ],
            )
        )
    return capture


def test_order_is_what_the_answering_call_was_shown():
    materials = to_materials([(A, None), (B, None), (C, None)])
    # retrieved A, B, C; the prompt showed C then A (whitespace reflowed), not B
    shown = f"[1] {C.page_content}\n\n[2]  Returns are accepted\nwithin 30 days."
    order = shown_order(materials, capture_with([A, B, C], shown), [])
    assert order == ("shipping", "returns")


def test_without_a_model_call_the_carried_then_retrieved_documents_give_the_order():
    materials = to_materials([(A, None), (B, None)])
    assert shown_order(materials, capture_with([A, B]), [B, A]) == ("warranty", "returns")
    assert shown_order(materials, capture_with([A, B]), []) == ("returns", "warranty")


def test_runs_add_what_they_retrieved_and_text_no_document_covers():
    known = to_materials([(A, None)])
    first = capture_with([A, B], tool_texts=[("search", f"Source: x\nContent: {B.page_content}")])
    second = capture_with([C], tool_texts=[("hours", "Open 9:00 to 18:00 on weekdays.")])
    extra = run_materials(known, [first, second], [[], []])
    assert [m.id for m in extra[:2]] == ["warranty", "shipping"]
    assert [m.rank for m in extra] == [2, 3, 4]
    hours = extra[2]
    assert hours.title == "hours" and hours.text == "Open 9:00 to 18:00 on weekdays."
    assert hours.id.startswith("doc-")  # no id of its own: a stable hash of its text
