"""Calling the chat model: temperature, bounded retries with backoff, token usage."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.runnables import RunnableConfig
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from tracerag.errors import TraceragError
from tracerag.settings import RetryPolicy

OnRetry = Callable[[int, BaseException], None]
T = TypeVar("T")


def record_retry(
    ctx: Any, span: Any, stage: str, meter_provider: Any = None, **extra: Any
) -> OnRetry:
    """An ``on_retry`` callback keeping each retried error on the context, span and metrics."""
    from tracerag import metrics, semconv

    def on_retry(attempt: int, error: BaseException) -> None:
        ctx.record_error(stage, error, attempt=attempt, retried=True, **extra)
        span.add_event(
            semconv.EVENT_RETRY, {semconv.RETRY_ATTEMPT: attempt, semconv.RETRY_ERROR: repr(error)}
        )
        metrics.record_retry(stage, error, meter_provider=meter_provider)

    return on_retry


def is_transient(error: BaseException) -> bool:
    """Whether a model error is worth retrying (programming errors are not)."""
    return not isinstance(error, (TraceragError, TypeError, NotImplementedError, AttributeError))


def retrying(
    policy: RetryPolicy,
    on_retry: OnRetry | None = None,
    retry_on: Callable[[BaseException], bool] = is_transient,
    *,
    offset: int = 0,
) -> AsyncRetrying:
    """A tenacity controller: bounded attempts, exponential backoff with jitter.

    ``offset`` attempts already happened outside it: they count against the bound, the backoff
    continues from there, and ``on_retry`` hears overall attempt numbers.
    """

    def before_sleep(state: RetryCallState) -> None:
        if on_retry is not None and state.outcome is not None:
            error = state.outcome.exception()
            if error is not None:
                on_retry(state.attempt_number + offset, error)

    return AsyncRetrying(
        stop=stop_after_attempt(max(1, policy.attempts - offset)),
        wait=wait_exponential(multiplier=policy.initial_wait * 2**offset, max=policy.max_wait)
        + wait_random(0, policy.jitter),
        retry=retry_if_exception(retry_on),
        before_sleep=before_sleep,
        reraise=True,
    )


@dataclass
class Tries:
    """How many attempts a retried call made (set while it runs, kept when it fails)."""

    count: int = 0


async def retry_call(
    fn: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    on_retry: OnRetry | None = None,
    retry_on: Callable[[BaseException], bool] = is_transient,
    tries: Tries | None = None,
) -> T:
    """Await ``fn()``; retry errors ``retry_on`` accepts, bounded, with exponential backoff.

    The first attempt runs directly, so a call that succeeds costs no retry machinery; only a
    failure enters tenacity. The last error is raised when the attempts run out.
    """
    tries = tries if tries is not None else Tries()
    tries.count = 1
    try:
        return await fn()
    except Exception as exc:
        if policy.attempts < 2 or not retry_on(exc):
            raise
        first = exc
    if on_retry is not None:
        on_retry(1, first)
    await asyncio.sleep(
        min(policy.max_wait, policy.initial_wait) + random.uniform(0, policy.jitter)
    )
    async for attempt in retrying(policy, on_retry, retry_on, offset=1):
        with attempt:
            tries.count = attempt.retry_state.attempt_number + 1
            result = await fn()
    return result


def with_temperature(llm: BaseChatModel, temperature: float) -> tuple[BaseChatModel, bool]:
    """A copy of the model set to ``temperature``; False when the model has no such field."""
    fields = type(llm).model_fields
    if "temperature" in fields:
        if getattr(llm, "temperature", None) == temperature:
            return llm, True
        return llm.model_copy(update={"temperature": temperature}), True
    return llm, False


def model_name(llm: Any) -> str | None:
    """The model's name as the provider knows it, when it says."""
    for attr in ("model_name", "model", "model_id", "deployment_name", "repo_id"):
        value = getattr(llm, attr, None)
        if isinstance(value, str) and value:
            return value
    with contextlib.suppress(Exception):  # a model that cannot describe itself has no name
        params = llm._get_ls_params()
        if params.get("ls_model_name"):
            return str(params["ls_model_name"])
    return None


def provider_name(llm: Any) -> str:
    """The GenAI provider name (``openai``, ``anthropic``, …) or the LangChain model type."""
    with contextlib.suppress(Exception):
        provider = llm._get_ls_params().get("ls_provider")
        if provider:
            return str(provider)
    return str(getattr(llm, "_llm_type", type(llm).__name__))


def invocation_parameters(llm: Any) -> dict[str, Any]:
    """The model's invocation parameters, JSON-safe."""
    try:
        params = dict(llm._identifying_params)
    except Exception:
        params = {}
    return json.loads(json.dumps(params, default=str))


async def call_model(
    llm: BaseChatModel,
    messages: list[BaseMessage],
    *,
    policy: RetryPolicy,
    on_retry: OnRetry | None = None,
    config: RunnableConfig | None = None,
    tries: Tries | None = None,
) -> AIMessage:
    """Invoke the model with bounded retries (attempts made are counted in ``tries``)."""

    async def once() -> AIMessage:
        return await llm.ainvoke(messages, config=config)  # type: ignore[return-value]

    return await retry_call(once, policy, on_retry=on_retry, tries=tries)


def text_of(message: BaseMessage, *, strict: bool = False, sep: str = "") -> str:
    """The plain text of a message (text content blocks joined with ``sep``).

    ``strict`` raises TypeError on a non-text block (an image, a tool call) instead of skipping it.
    """
    content = message.content
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif strict:
            raise TypeError(f"a {type(block).__name__} content block is not text")
    return sep.join(parts)


def token_usage(message: AIMessage) -> tuple[int | None, int | None]:
    """Input and output token counts the model reported, if any."""
    usage = getattr(message, "usage_metadata", None) or {}
    return usage.get("input_tokens"), usage.get("output_tokens")
