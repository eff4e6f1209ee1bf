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
from dataclasses import dataclass
from functools import lru_cache

from langchain_core.messages import BaseMessage
from langchain_core.prompts import ChatPromptTemplate

from tracerag.errors import ConfigurationError, UnknownPromptError
from tracerag.signals._types import Material, Plan

__all__ = ["DEFAULT_PROMPT", "PromptVersion", "get_prompt", "prompt_names", "register_prompt"]

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


# ---------------------------------------------------------------------------------------------
# Prompt versions


@dataclass(frozen=True)
class PromptVersion:
    """A named set of the prompt texts tracerag sends; ``version`` identifies it in records.

    The human message layout (``HUMAN``: task, materials, question, instruction) is shared by
    every version, so materials and plans are always given the same way.
    """

    name: str
    system: str = SYSTEM
    plan_instruction: str = PLAN_INSTRUCTION
    answer_instruction: str = ANSWER_INSTRUCTION
    answer_with_plan_instruction: str = ANSWER_WITH_PLAN_INSTRUCTION
    inline_instruction: str = INLINE_INSTRUCTION
    description: str = ""

    @property
    def fingerprint(self) -> str:
        """The stable hash of this version's texts (see ``fingerprint``)."""
        return fingerprint(
            self.system,
            HUMAN,
            self.plan_instruction,
            self.answer_instruction,
            self.answer_with_plan_instruction,
            self.inline_instruction,
        )

    @property
    def version(self) -> str:
        """``name@sha256:…``: the prompt version a pipeline records for this prompt."""
        return f"{self.name}@{self.fingerprint}"

    def messages(
        self, task: str, question: str, materials: Sequence[Material], plan: Plan | None = None
    ) -> list[BaseMessage]:
        """The chat messages for one task (plan, answer, or plan_and_answer)."""
        if task == TASK_PLAN:
            instruction = self.plan_instruction
        elif task == TASK_PLAN_AND_ANSWER:
            instruction = self.inline_instruction
        elif plan is not None and plan.ok:
            instruction = self.answer_with_plan_instruction.format(plan=format_plan(plan))
        else:
            instruction = self.answer_instruction
        return _template(self.system).format_messages(
            task=task,
            materials=format_materials(materials),
            question=question,
            instruction=instruction,
        )


@lru_cache(maxsize=64)
def _template(system: str) -> ChatPromptTemplate:
    """The chat template of a prompt version with this system text (built once, shared)."""
    return ChatPromptTemplate.from_messages([("system", system), ("human", HUMAN)])


#: The prompt tracerag sends unless a pipeline is given another (its fingerprint is
#: ``DEFAULT_PROMPT_VERSION``).
DEFAULT_PROMPT = PromptVersion(
    name="v1", description="answers only from the materials and cites every sentence"
)

_PROMPTS: dict[str, PromptVersion] = {DEFAULT_PROMPT.name: DEFAULT_PROMPT}


def register_prompt(prompt: PromptVersion) -> PromptVersion:
    """Make a prompt version available by name (``get_prompt``); a name is registered once."""
    known = _PROMPTS.get(prompt.name)
    if known is not None and known != prompt:
        raise ConfigurationError(f"another prompt is already registered as {prompt.name!r}")
    _PROMPTS[prompt.name] = prompt
    return prompt


def get_prompt(name: str) -> PromptVersion:
    """The prompt version registered as ``name``; ``UnknownPromptError`` lists the known names."""
    try:
        return _PROMPTS[name]
    except KeyError:
        raise UnknownPromptError(
            f"no prompt version {name!r}; registered: {', '.join(sorted(_PROMPTS))}"
        ) from None


def prompt_names() -> list[str]:
    """The names of the registered prompt versions, sorted."""
    return sorted(_PROMPTS)


def prompt_messages(
    task: str,
    question: str,
    materials: Sequence[Material],
    plan: Plan | None = None,
    *,
    prompt: PromptVersion | None = None,
) -> list[BaseMessage]:
    """The messages of one task under ``prompt`` (default: ``DEFAULT_PROMPT``)."""
    return (prompt or DEFAULT_PROMPT).messages(task, question, materials, plan)
