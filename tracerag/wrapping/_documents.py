"""The materials of a wrapped app's request, and the order each answer was shown them in.

Materials are every document the request's runs retrieved (``RunCapture.documents``: retrievers,
tool artifacts, vector store searches) and the documents their outputs carry, after those the
retrieve stage found; a tool output that carried no documents and quotes none of them is itself
a material (what the model was shown is what its answer may cite), titled by the tool's name.
Ids and titles come from the documents' metadata (``tracerag.stages.retrieve.to_materials``).

A ``[n]`` citation is the n-th material *that run's answering call was shown*: the materials
whose text appears in the input of the run's last model call, in the order they appear there.
When none can be found there (the app reformatted them), the documents the run's output
carries, else those the run retrieved, in that order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from langchain_core.documents import Document
from langchain_core.messages import BaseMessage

from tracerag._llm import text_of
from tracerag.signals._types import Material
from tracerag.stages._retrieve import to_materials
from tracerag.wrapping._capture import ModelCall, RunCapture

#: How much of a material's text is looked for in a prompt (whitespace folded).
PROBE_CHARS = 160


def _folded(text: str) -> str:
    return " ".join(text.split())


def _probe(text: str) -> str:
    return _folded(text)[:PROBE_CHARS]


def shown_text(call: ModelCall | None) -> str:
    """Everything one model call was given, as one whitespace-folded text."""
    if call is None:
        return ""
    parts = [text_of(m, sep="\n") for m in call.messages if isinstance(m, BaseMessage)]
    parts.extend(call.prompts)
    return _folded("\n".join(parts))


def run_materials(
    known: Sequence[Material],
    captures: Sequence[RunCapture],
    output_documents: Sequence[Sequence[Document]],
) -> tuple[Material, ...]:
    """The materials the runs add to the known ones, ranked after them."""
    pairs: list[tuple[Document, float | None]] = []
    for capture, carried in zip(captures, output_documents, strict=True):
        pairs.extend((d, capture.scores.get(id(d))) for d in capture.documents)
        pairs.extend((d, None) for d in carried)
    found = list(to_materials(pairs))
    probes = [p for p in (_probe(m.text) for m in [*known, *found]) if p]
    texts: list[tuple[Document, float | None]] = []
    for capture in captures:
        for name, text in capture.tool_texts:
            folded = _folded(text)
            if any(p in folded for p in probes):
                continue  # it quotes documents that are materials already
            texts.append((Document(page_content=text, metadata={"title": name}), None))
            probes.append(_probe(text))
    found.extend(to_materials(texts))
    seen = {m.id for m in known}
    extra: list[Material] = []
    for m in found:
        if m.id in seen:
            continue
        seen.add(m.id)
        extra.append(dataclasses.replace(m, rank=len(known) + len(extra) + 1))
    return tuple(extra)


def shown_order(
    materials: Sequence[Material], capture: RunCapture, carried: Sequence[Document]
) -> tuple[str, ...]:
    """The ids of the materials this run's answering call was shown, in the order shown."""
    text = shown_text(capture.last_call)
    if text:
        placed: list[tuple[int, int, str]] = []
        for rank, m in enumerate(materials):
            probe = _probe(m.text)
            at = text.find(probe) if probe else -1
            if at >= 0:
                placed.append((at, rank, m.id))
        if placed:
            return tuple(material_id for _, _, material_id in sorted(placed))
    by_text = {m.text: m.id for m in reversed(materials)}
    used = list(carried) or list(capture.documents)
    order = (by_text.get(d.page_content) for d in used)
    return tuple(dict.fromkeys(i for i in order if i is not None))


__all__ = ["PROBE_CHARS", "run_materials", "shown_order", "shown_text"]
