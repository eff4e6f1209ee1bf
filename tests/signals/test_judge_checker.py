"""JudgeSupport with checker LLMs (style="minicheck"): the checker's prompt, Yes/No answers and
first-token log-probabilities; against scripted replies, and against a real llama.cpp server."""

from __future__ import annotations

import math

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from tracerag.errors import ConfigurationError
from tracerag.signals._judge import MINICHECK_SYSTEM_PROMPT, JudgeSupport

MATERIAL = (
    "All new devices carry a 12-month warranty. Laptops and tablets get 24 months. "
    "Shipping is free for orders over $50."
)
CLAIM = "Laptops get a 24-month warranty."


def _reply(text: str, top: dict[str, float] | None = None) -> AIMessage:
    meta = {}
    if top is not None:
        first = next(iter(top))
        meta["logprobs"] = {
            "content": [
                {
                    "token": first,
                    "logprob": math.log(top[first]),
                    "top_logprobs": [{"token": t, "logprob": math.log(p)} for t, p in top.items()],
                }
            ]
        }
    return AIMessage(content=text, response_metadata=meta)


class Recording(GenericFakeChatModel):
    """A scripted chat model that keeps the messages and options of every call."""

    calls: list = []  # noqa: RUF012 - replaced per instance below

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        self.calls.append((messages, kwargs))
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)


def _judge(*replies: AIMessage, **options) -> tuple[JudgeSupport, Recording]:
    model = Recording(messages=iter(replies))
    model.calls = []
    return JudgeSupport(model, style="minicheck", retry_wait=0.0, **options), model


def test_the_checker_prompt_is_minichecks_own():
    judge, _ = _judge()
    system, user = judge.messages(CLAIM, MATERIAL)
    assert isinstance(system, SystemMessage) and system.content == MINICHECK_SYSTEM_PROMPT
    assert isinstance(user, HumanMessage)
    assert user.content == f"Document: {MATERIAL}\nClaim: {CLAIM}"


def test_score_is_yes_against_no_in_the_first_token_whatever_was_drawn():
    judge, model = _judge(_reply("No", {"No": 0.3, "Yes": 0.6, "The": 0.05}), logprobs=True)
    result = judge(CLAIM, MATERIAL)
    assert result.score == pytest.approx(0.6 / 0.9, abs=1e-6)
    assert result.supported
    assert "first-token probability 0.67" in result.reason
    assert model.calls[0][1].get("logprobs") is True and model.calls[0][1]["top_logprobs"] == 5
    assert result.sentence == "Laptops and tablets get 24 months."  # shares most of the claim
    assert MATERIAL[result.start : result.end] == result.sentence


@pytest.mark.parametrize(("answer", "supported"), [("Yes.", True), ("no", False)])
def test_without_log_probabilities_the_answer_scores_one_or_zero(answer, supported):
    judge, model = _judge(_reply(answer))
    assert not judge.logprobs  # the scripted model has no logprobs setting: none asked for
    result = judge(CLAIM, MATERIAL)
    assert result.supported is supported and result.score == (1.0 if supported else 0.0)
    assert "logprobs" not in model.calls[0][1]


def test_a_reply_that_is_neither_is_asked_again_then_fails_closed():
    judge, model = _judge(_reply("The document says"), _reply("Yes"))
    result = judge(CLAIM, MATERIAL)
    assert result.supported and "after 2 attempts" in result.reason
    assert model.calls[1][0][-1].content == 'Answer with "Yes" or "No" only.'
    stubborn, _ = _judge(*[_reply("Maybe")] * 3)
    failed = stubborn(CLAIM, MATERIAL)
    assert not failed.supported and failed.score == 0.0
    assert "neither Yes nor No" in failed.reason


def test_a_number_the_material_does_not_state_caps_a_yes():
    judge, _ = _judge(_reply("Yes", {"Yes": 0.99, "No": 0.01}), logprobs=True)
    result = judge("Laptops get a 36-month warranty.", MATERIAL)
    assert not result.supported
    assert result.score <= 0.8 * judge.threshold
    assert "36-month not in material" in result.reason


def test_long_material_is_asked_chunk_by_chunk_until_one_supports():
    filler = " ".join(f"Store {k} opens at nine every day." for k in range(12))
    material = f"{filler} Laptops and tablets get a 24-month warranty."
    judge, model = _judge(_reply("No"), _reply("No"), _reply("Yes"), _reply("Yes"), chunk_chars=200)
    result = judge(CLAIM, material)
    assert len(model.calls) >= 2 and result.supported
    assert result.sentence == "Laptops and tablets get a 24-month warranty."
    assert "best of" in result.reason


def test_bad_style_is_a_configuration_error():
    with pytest.raises(ConfigurationError, match="style"):
        JudgeSupport(GenericFakeChatModel(messages=iter([])), style="yesno")  # type: ignore[arg-type]
