"""Prompt versions for the demo: the current prompt (``v1``) and a deliberately worse one.

``v2-nocite`` is the kind of rewrite that slips through review — friendlier, shorter — but it
no longer asks the model to cite its materials. It exists so that ``tracerag eval`` on the demo
knowledge base has a regression to catch::

    tracerag eval examples/eval/questions.jsonl \\
        --baseline prompt@v1,model@extractive --candidate prompt@v2-nocite,model@extractive

Importing this module registers it (``tracerag.prompts.get_prompt("v2-nocite")``).
"""

from __future__ import annotations

from tracerag.prompts import DEFAULT_PROMPT, PromptVersion, register_prompt

__all__ = ["V1", "V2_NOCITE"]

V1 = DEFAULT_PROMPT

V2_NOCITE = register_prompt(
    PromptVersion(
        name="v2-nocite",
        system=(
            "You are a friendly customer-service assistant. Answer customer questions briefly "
            "and warmly, using only the materials provided. Copy amounts, dates and clause "
            "numbers exactly as the material states them. If the materials do not answer the "
            "question, say that you cannot answer from them. Answer in the language of the "
            "question."
        ),
        answer_instruction="Answer the question.",
        answer_with_plan_instruction=(
            "Answer the question following this plan.\n<plan>{plan}</plan>"
        ),
        inline_instruction=(
            "First write one line 'PLAN: ' followed by a JSON object "
            '{"material_ids": [...], "key_facts": [...]}; then a line \'ANSWER: \' followed by '
            "the answer."
        ),
        description="deliberately worse: a friendlier rewrite that no longer asks for citations",
    )
)
