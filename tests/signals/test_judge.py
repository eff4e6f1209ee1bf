"""The LLM-judge support backend, driven by a scripted chat model."""

from __future__ import annotations

import json

import pytest

from tracerag.errors import ConfigurationError
from tracerag.signals._citations import FABRICATED, SUPPORTED, UNSUPPORTED, verify_citations
from tracerag.signals._judge import JudgeSupport, find_quote, unconfigured_judge
from tracerag.signals._support import get_backend, register_backend
from tracerag.signals._types import Material
from tracerag.testing import ScriptedChatModel

MATERIAL = (
    "All new devices carry a 12-month warranty from the date of delivery. Under Clause 6.1, "
    "laptops and tablets are covered by an extended 24-month warranty."
)
CLAIM = "Laptops are covered for 24 months."
QUOTE = "laptops and tablets are covered by an extended 24-month warranty"
ZH_MATERIAL = "登录密码连续输错5次后，账户将被锁定30分钟。更换绑定手机号需要通过原手机号短信验证。"


def verdict(supported: bool = True, score: float = 0.9, quote: str = QUOTE, **extra) -> str:
    return json.dumps({"supported": supported, "score": score, "quote": quote, **extra})


def judge(*responses: str, **options) -> tuple[JudgeSupport, ScriptedChatModel]:
    llm = ScriptedChatModel(responses=list(responses))
    options.setdefault("retry_wait", 0.0)
    return JudgeSupport(llm, **options), llm


@pytest.fixture(autouse=True)
def _restore_registry():
    yield
    register_backend("judge", unconfigured_judge)


def test_supported_verdict_takes_the_quote_offsets():
    backend, llm = judge(verdict())
    result = backend(CLAIM, MATERIAL)
    assert result.supported and result.score == pytest.approx(0.9)
    assert MATERIAL[result.start : result.end] == QUOTE == result.sentence
    assert result.backend == "judge"
    assert llm.call_count == 1
    prompt = llm.calls[0].prompt
    assert CLAIM in prompt and MATERIAL in prompt and '"quote"' in prompt


def test_quote_matches_up_to_whitespace_and_code_fences():
    spaced = "laptops  and tablets\nare covered by an extended   24-month warranty"
    backend, _ = judge("```json\n" + verdict(quote=spaced) + "\n```")
    result = backend(CLAIM, MATERIAL)
    assert result.supported
    assert MATERIAL[result.start : result.end] == QUOTE


def test_chinese_quote_with_spaces_added_is_found():
    claim = "密码输错5次会锁定30分钟。"
    quoted = "登录密码连续输错 5 次后，账户将被锁定 30 分钟"
    backend, _ = judge(verdict(quote=quoted, score=0.95))
    result = backend(claim, ZH_MATERIAL)
    assert result.supported
    assert ZH_MATERIAL[result.start : result.end] == "登录密码连续输错5次后，账户将被锁定30分钟"


def test_quote_not_in_material_discards_the_verdict():
    backend, _ = judge(verdict(quote="laptops are covered for three years"))
    result = backend(CLAIM, MATERIAL)
    assert not result.supported and result.score == 0.0
    assert "discarded" in result.reason and "not in the material" in result.reason


def test_supported_with_empty_quote_is_discarded():
    backend, _ = judge(verdict(quote="  "))
    result = backend(CLAIM, MATERIAL)
    assert not result.supported and result.score == 0.0
    assert "empty quote" in result.reason


def test_quote_without_content_words_is_discarded():
    backend, _ = judge(verdict(quote="the"))
    result = backend(CLAIM, MATERIAL)
    assert not result.supported and "no content words" in result.reason


def test_unsupported_verdict_stays_below_threshold():
    backend, _ = judge(verdict(supported=False, score=0.95, quote=""))
    result = backend(CLAIM, MATERIAL)
    assert not result.supported and result.score < backend.threshold
    assert "not supported" in result.reason


def test_low_score_is_not_supported():
    backend, _ = judge(verdict(score=0.3), threshold=0.5)
    result = backend(CLAIM, MATERIAL)
    assert not result.supported and "below threshold" in result.reason


def test_claim_number_missing_from_material_caps_the_score():
    # the judge is fooled, the number check is not
    backend, _ = judge(verdict(score=1.0))
    result = backend("Laptops are covered for 36 months.", MATERIAL)
    assert not result.supported
    assert result.score < backend.threshold
    assert result.mismatches == ("36 months",)
    assert "36 months not in material" in result.reason


def test_malformed_reply_is_retried_with_the_error_and_then_accepted():
    backend, llm = judge("Sure! The claim is supported.", '{"supported": "yes"}', verdict())
    result = backend(CLAIM, MATERIAL)
    assert result.supported
    assert llm.call_count == 3
    assert "not a valid verdict" in llm.calls[1].prompt  # the model was told what was wrong
    assert "after 3 attempts" in result.reason


def test_malformed_replies_exhaust_attempts_to_a_clear_unsupported_result():
    backend, llm = judge("not json", max_attempts=2)
    result = backend(CLAIM, MATERIAL)
    assert not result.supported and result.score == 0.0
    assert "no valid verdict in 2 attempts" in result.reason
    assert llm.call_count == 2


def test_schema_rejects_out_of_range_score_and_extra_keys():
    backend, _ = judge(verdict(score=1.5), max_attempts=1)
    assert "1.5" in backend(CLAIM, MATERIAL).reason
    backend, _ = judge(verdict(confidence="high"), max_attempts=1)
    assert "confidence" in backend("Another claim about laptops.", MATERIAL).reason


def test_failing_model_fails_closed():
    llm = ScriptedChatModel(always_fail=True)
    backend = JudgeSupport(llm, retry_wait=0.0, max_attempts=2)
    result = backend(CLAIM, MATERIAL)
    assert not result.supported and "judge call failed after 2 attempts" in result.reason
    assert llm.call_count == 2


def test_transient_failure_is_retried():
    llm = ScriptedChatModel(responses=[verdict()], fail_first=1)
    backend = JudgeSupport(llm, retry_wait=0.0)
    assert backend(CLAIM, MATERIAL).supported


def test_verdicts_are_cached_per_claim_and_material():
    backend, llm = judge(verdict())
    backend(CLAIM, MATERIAL)
    backend(CLAIM, MATERIAL)
    assert llm.call_count == 1


def test_judge_cannot_be_created_by_name():
    with pytest.raises(ConfigurationError, match="JudgeSupport"):
        get_backend("judge")


def test_constructing_does_not_register_and_register_is_explicit():
    backend, _ = judge(verdict())
    with pytest.raises(ConfigurationError, match="JudgeSupport"):
        get_backend("judge")
    backend.register()
    assert get_backend("judge") is backend


def test_rejects_non_models_and_bad_thresholds():
    with pytest.raises(ConfigurationError):
        JudgeSupport("gpt-4o")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        JudgeSupport(ScriptedChatModel(), threshold=0.0)


def test_verify_citations_with_the_judge():
    materials = [Material(id="warranty", text=MATERIAL)]

    def respond(call) -> str:
        if "36" in call.prompt.split("<claim>")[1]:
            return verdict(supported=False, score=0.1, quote="")
        return verdict()

    backend = JudgeSupport(ScriptedChatModel(responder=respond))
    report = verify_citations(
        "Laptops are covered for 24 months. [warranty] Tablets get 36 months. [warranty] "
        "Phones get 24 months. [nope]",
        materials,
        backend=backend,
    )
    verdicts = [c.verdict for c in report.claims]
    assert verdicts == [SUPPORTED, UNSUPPORTED, FABRICATED]
    first = report.claims[0]
    assert MATERIAL[first.start : first.end] == QUOTE
    assert report.backend == "judge"


def test_find_quote():
    assert find_quote("b  c", "a b c d") == (2, 5)
    assert find_quote("x", "a b c") is None
    assert find_quote("", "a b c") is None


@pytest.mark.integration  # a fresh interpreter in a subprocess: an integration test
def test_judge_by_name_explains_how_to_configure_it_in_a_fresh_process():
    import subprocess
    import sys

    code = (
        "from tracerag.signals._support import get_backend\n"
        "try:\n    get_backend('judge')\n"
        "except Exception as exc:\n    print(type(exc).__name__, exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    assert out.startswith("ConfigurationError") and "JudgeSupport(llm)" in out


def test_long_material_is_checked_chunk_by_chunk_until_one_supports():
    from tracerag.signals._judge import chunk_material

    filler = " ".join(f"Paragraph {i} is about something else entirely." for i in range(40))
    material = f"{filler} {MATERIAL} {filler}"
    chunks = chunk_material(material, 600)
    assert len(chunks) > 2 and all(b - a <= 600 for a, b in chunks)
    assert chunks[0][0] == 0 and chunks[-1][1] == len(material)

    def respond(call) -> str:
        if QUOTE in call.prompt:
            return verdict()
        return verdict(supported=False, score=0.0, quote="")

    llm = ScriptedChatModel(responder=respond)
    backend = JudgeSupport(llm, retry_wait=0.0, chunk_chars=600)
    result = backend(CLAIM, material)
    assert result.supported
    assert material[result.start : result.end] == QUOTE
    asked = [c.prompt for c in llm.calls]
    assert 1 < len(asked) < len(chunks)  # stops at the first chunk that supports the claim
    assert all(len(p) <= 600 + len(judge_prompt_overhead()) for p in asked)


def test_claim_in_no_chunk_is_unsupported_after_asking_every_chunk():
    filler = " ".join(f"Paragraph {i} is about something else entirely." for i in range(40))
    llm = ScriptedChatModel(responses=[verdict(supported=False, score=0.2, quote="")])
    backend = JudgeSupport(llm, retry_wait=0.0, chunk_chars=600)
    result = backend(CLAIM, filler)
    assert not result.supported and "in none of" in result.reason
    from tracerag.signals._judge import chunk_material

    assert llm.call_count == len(chunk_material(filler, 600))


def judge_prompt_overhead() -> str:
    backend = JudgeSupport(ScriptedChatModel())
    return "\n".join(str(m.content) for m in backend.messages(CLAIM, ""))
