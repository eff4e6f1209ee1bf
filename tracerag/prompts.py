"""The prompts tracerag sends to the chat model, and the formats it reads back.

Materials are given inside ``<material id="..." title="...">…</material>`` blocks; answers cite
them with the id in square brackets, e.g. ``[M03]`` or ``[policy-7]``. Plans are JSON objects
``{"material_ids": [...], "key_facts": [...]}``. In inline mode a sample writes
``PLAN: {json}`` on its first line, then ``ANSWER: text``.

A prompt's version is a stable fingerprint of its text (see ``fingerprint``), so a trace can
always say which prompt produced an answer.
"""

from __future__ import annotations

import hashlib
import html
import re
from collections.abc import Sequence

from langchain_core.prompts import ChatPromptTemplate

from tracerag.signals.types import Material, Plan

TASK_PLAN = "plan"
TASK_ANSWER = "answer"
TASK_PLAN_AND_ANSWER = "plan_and_answer"

SYSTEM = (
    "You answer customer questions using only the materials provided. "
    "After every sentence, cite the material that supports it by its id in square brackets, "
    "for example [M03]. Cite only material ids that appear below; never invent one. "
    "Copy amounts, dates and clause numbers exactly as the material states them. "
    "If the materials do not answer the question, say that you cannot answer from them. "
    "Answer in the language of the question."
)

PLAN_INSTRUCTION = (
    "Before answering, plan. Reply with one JSON object only, no prose: "
    '{"material_ids": [ids of the materials you will rely on], '
    '"key_facts": [the amounts, dates and clauses you will use, copied from the materials]}'
)

ANSWER_INSTRUCTION = "Answer the question. Cite every sentence with [material id]."

ANSWER_WITH_PLAN_INSTRUCTION = (
    "Answer the question following this plan. Cite every sentence with [material id].\n"
    "<plan>{plan}</plan>"
)

INLINE_INSTRUCTION = (
    "First write one line 'PLAN: ' followed by a JSON object "
    '{"material_ids": [...], "key_facts": [...]}; then a line \'ANSWER: \' followed by the answer, '
    "citing every sentence with [material id]."
)

HUMAN = (
    "<task>{task}</task>\n<materials>\n{materials}\n</materials>\n"
    "<question>{question}</question>\n{instruction}"
)

PROMPT = ChatPromptTemplate.from_messages([("system", SYSTEM), ("human", HUMAN)])

MATERIAL_BLOCK_RE = re.compile(
    r'<material id="(?P<id>[^"]*)"(?: title="(?P<title>[^"]*)")?>\n?(?P<text>.*?)\n?</material>',
    re.S,
)
QUESTION_RE = re.compile(r"<question>(?P<q>.*?)</question>", re.S)
TASK_RE = re.compile(r"<task>(?P<task>[a-z_]+)</task>")
PLAN_LINE_RE = re.compile(r"^\s*PLAN:\s*(?P<plan>\{.*?\})\s*$", re.M | re.S)
ANSWER_LINE_RE = re.compile(r"^\s*ANSWER:\s*(?P<answer>.*)\Z", re.M | re.S)


def format_materials(materials: Sequence[Material]) -> str:
    """The materials block of a prompt, one ``<material>`` element per retrieved material."""

    def attr(value: str) -> str:
        return html.escape(value, quote=True)

    return "\n".join(
        f'<material id="{attr(m.id)}" title="{attr(m.title)}">\n{m.text}\n</material>'
        for m in materials
    )


def format_plan(plan: Plan | None) -> str:
    """A plan as the JSON text given back to the model."""
    import json

    if plan is None or not plan.ok:
        return "{}"
    return json.dumps(
        {"material_ids": plan.material_ids, "key_facts": plan.key_facts}, ensure_ascii=False
    )


def prompt_values(
    task: str, question: str, materials: Sequence[Material], plan: Plan | None = None
) -> dict[str, str]:
    """Variables for ``PROMPT`` for one task (plan, answer, or plan_and_answer)."""
    if task == TASK_PLAN:
        instruction = PLAN_INSTRUCTION
    elif task == TASK_PLAN_AND_ANSWER:
        instruction = INLINE_INSTRUCTION
    elif plan is not None and plan.ok:
        instruction = ANSWER_WITH_PLAN_INSTRUCTION.format(plan=format_plan(plan))
    else:
        instruction = ANSWER_INSTRUCTION
    return {
        "task": task,
        "materials": format_materials(materials),
        "question": question,
        "instruction": instruction,
    }


def fingerprint(*texts: str) -> str:
    """A stable short hash of prompt template text: the default prompt version."""
    digest = hashlib.sha256("\x1f".join(texts).encode("utf-8")).hexdigest()
    return f"sha256:{digest[:12]}"


DEFAULT_PROMPT_VERSION = fingerprint(
    SYSTEM,
    HUMAN,
    PLAN_INSTRUCTION,
    ANSWER_INSTRUCTION,
    ANSWER_WITH_PLAN_INSTRUCTION,
    INLINE_INSTRUCTION,
)
