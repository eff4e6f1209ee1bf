"""Calling the model and the retriever: bounded retries, timeouts, clean output, token usage.

``retry_call`` runs one call with bounded retries: each attempt is bounded by the policy's
timeout, and only errors that may pass on a retry are retried (``is_transient``). The first
attempt runs directly; a failed one is handed to tenacity's ``AsyncRetrying``, which makes the
retries.
``call_model`` adds what a model's output must satisfy before tracerag uses it: at most
``RetryPolicy.max_output_chars`` characters, and text that encodes (lone UTF-16 surrogates
become U+FFFD).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import sys
import threading
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableConfig
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from tracerag import _semconv as semconv
from tracerag._settings import RetryPolicy
from tracerag.errors import (
    CallError,
    CallTimeoutError,
    InputTypeError,
    ModelTimeoutError,
    OutputTooLongError,
    RetrieverTimeoutError,
    TraceragError,
)
from tracerag.telemetry import _instruments as metrics
from tracerag.text._unicode import fix_surrogates

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import Span

__all__ = [
    "OnRetry",
    "ReplyChatModel",
    "Tries",
    "ainvoke_model",
    "call_model",
    "clean_message",
    "clean_text",
    "invocation_parameters",
    "is_transient",
    "model_name",
    "provider_name",
    "record_retry",
    "retry_call",
    "retrying",
    "text_of",
    "token_usage",
    "with_temperature",
]

OnRetry = Callable[[int, BaseException], None]
T = TypeVar("T")
M = TypeVar("M", bound=BaseMessage)


class ErrorRecorder(Protocol):
    """Where a retried error is kept (a stage's ``ErrorLog``)."""

    def record_error(self, stage: str, error: BaseException, **extra: Any) -> None: ...


def record_retry(
    ctx: ErrorRecorder,
    span: Span,
    stage: str,
    meter_provider: MeterProvider | None = None,
    **extra: Any,
) -> OnRetry:
    """An ``on_retry`` callback keeping each retried error on the context, span and metrics."""
    return _RetryRecord(ctx, span, stage, meter_provider, extra)


class _RetryRecord:
    """What ``record_retry`` returns: one small object per call (most calls are never retried)."""

    __slots__ = ("ctx", "extra", "meter_provider", "span", "stage")

    def __init__(
        self,
        ctx: ErrorRecorder,
        span: Span,
        stage: str,
        meter_provider: MeterProvider | None,
        extra: dict[str, Any],
    ) -> None:
        self.ctx = ctx
        self.span = span
        self.stage = stage
        self.meter_provider = meter_provider
        self.extra = extra

    def __call__(self, attempt: int, error: BaseException) -> None:
        self.ctx.record_error(self.stage, error, attempt=attempt, retried=True, **self.extra)
        self.span.add_event(
            semconv.EVENT_RETRY, {semconv.RETRY_ATTEMPT: attempt, semconv.RETRY_ERROR: repr(error)}
        )
        metrics.record_retry(self.stage, error, meter_provider=self.meter_provider)


# Errors of the caller's or the model's own code: the same call fails the same way again.
# (pydantic's ValidationError, json's JSONDecodeError and UnicodeError are ValueErrors.)
_PERMANENT = (
    TypeError,
    ValueError,
    AttributeError,
    LookupError,
    NotImplementedError,
    AssertionError,
    RecursionError,
)
# LangGraph errors that a retry cannot fix, matched by name so LangGraph is not imported.
_PERMANENT_LANGGRAPH = frozenset({"InvalidUpdateError", "EmptyInputError", "GraphRecursionError"})
# Client errors worth a retry: timeout, conflict, too early, rate limited.
_RETRIED_4XX = frozenset({408, 409, 425, 429})
_PERMANENT_5XX = frozenset({501, 505})


def http_status(error: BaseException) -> int | None:
    """The HTTP status an error carries (provider SDKs and httpx), or None."""
    candidates = [getattr(error, name, None) for name in ("status_code", "status", "http_status")]
    candidates.append(getattr(getattr(error, "response", None), "status_code", None))
    for value in candidates:
        if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
            return value
    return None


def is_transient(error: BaseException) -> bool:
    """Whether retrying the call could succeed.

    Retried: timeouts, connection errors, rate limits (429), server errors (5xx), and errors
    not known to be permanent. Not retried: auth and validation errors (400, 401, 403, 404,
    422 and other 4xx), ``TypeError``/``ValueError`` and other programming errors (pydantic's
    ``ValidationError`` included), LangGraph's ``InvalidUpdateError``, tracerag's own errors
    except call timeouts, and anything that is not an ``Exception`` (cancellation).
    """
    if not isinstance(error, Exception):
        return False
    if isinstance(error, CallTimeoutError):
        return True
    if isinstance(error, TraceragError):
        return False
    status = http_status(error)
    if status is not None:
        if 400 <= status < 500:
            return status in _RETRIED_4XX
        return status not in _PERMANENT_5XX
    if isinstance(error, _PERMANENT):
        return False
    return not any(
        cls.__name__ in _PERMANENT_LANGGRAPH and cls.__module__.startswith("langgraph")
        for cls in type(error).__mro__
    )


def _backoff(policy: RetryPolicy) -> wait_exponential_jitter:
    try:
        return wait_exponential_jitter(
            multiplier=policy.initial_wait, max=policy.max_wait, jitter=policy.jitter
        )
    except TypeError:  # tenacity before 9.2 names the first wait ``initial``
        return wait_exponential_jitter(
            initial=policy.initial_wait, max=policy.max_wait, jitter=policy.jitter
        )


def retrying(
    policy: RetryPolicy,
    on_retry: OnRetry | None = None,
    retry_on: Callable[[BaseException], bool] = is_transient,
) -> AsyncRetrying:
    """A tenacity controller for the policy: bounded attempts, exponential backoff with jitter.

    ``on_retry(attempt, error)`` hears each failed attempt that will be retried.
    """

    def before_sleep(state: RetryCallState) -> None:
        if on_retry is not None and state.outcome is not None:
            error = state.outcome.exception()
            if error is not None:
                on_retry(state.attempt_number, error)

    return AsyncRetrying(
        stop=stop_after_attempt(policy.attempts),
        wait=_backoff(policy),
        retry=retry_if_exception(retry_on),
        before_sleep=before_sleep,
        reraise=True,
    )


@dataclass
class Tries:
    """How many attempts a retried call made (set while it runs, kept when it fails)."""

    count: int = 0


if sys.version_info >= (3, 11):  # ``Task.uncancel`` is new in 3.11

    class _Bound:
        """A time limit on the awaits of the current task inside ``with``: when it passes, the task
        is cancelled and the block raises ``error(seconds)``. What ``asyncio.timeout`` does, as a
        plain context manager (no coroutine of its own, one timer and no other object per use);
        a cancellation from elsewhere, or a ``TimeoutError`` of the awaited code, passes through.
        Python 3.11+ (it needs ``Task.uncancel``)."""

        __slots__ = ("_cancelling", "_error", "_expired", "_handle", "_seconds", "_task")

        def __init__(self, seconds: float, error: Callable[[float], Exception]) -> None:
            self._seconds = seconds
            self._error = error
            self._expired = False

        def __enter__(self) -> None:
            loop = asyncio.get_running_loop()
            task = asyncio.current_task(loop)
            if task is None:
                raise AssertionError("a time limit applies only inside a task")
            self._task = task
            self._cancelling = task.cancelling()
            self._handle = loop.call_at(
                loop.time() + self._seconds, self._expire, context=_timer_context()
            )

        def _expire(self) -> None:
            self._expired = True
            self._task.cancel()

        def __exit__(self, exc_type: type[BaseException] | None, exc: object, tb: object) -> None:
            self._handle.cancel()
            if (
                self._expired
                and self._task.uncancel() <= self._cancelling
                and exc_type is asyncio.CancelledError
            ):
                raise self._error(self._seconds) from None


_timers = threading.local()


def _timer_context() -> contextvars.Context:
    """An empty context for this thread's time-limit timers: expiring one only cancels its task,
    so a timer need not copy (and keep alive) the context of the call it bounds."""
    try:
        context: contextvars.Context = _timers.context
    except AttributeError:
        context = _timers.context = contextvars.Context()
    return context


async def within(
    fn: Callable[[], Awaitable[T]], seconds: float | None, error: Callable[[float], Exception]
) -> T:
    """Await ``fn()``; raise ``error(seconds)`` if it does not finish in time (None: no limit)."""
    if seconds is None:
        return await fn()
    if sys.version_info >= (3, 11):
        with _Bound(seconds, error):
            return await fn()
    try:
        return await asyncio.wait_for(fn(), seconds)
    except asyncio.TimeoutError:
        raise error(seconds) from None


async def retry_call(
    fn: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    on_retry: OnRetry | None = None,
    retry_on: Callable[[BaseException], bool] = is_transient,
    tries: Tries | None = None,
    calls: Literal["model", "retriever"] = "model",
) -> T:
    """Await ``fn()``, each attempt bounded by the policy's timeout for ``calls``; retry errors
    ``retry_on`` accepts, with backoff, up to ``policy.attempts``; raise the last error."""
    counter = tries if tries is not None else Tries()
    seconds: float | None
    timeout_error: Callable[[float], Exception]
    if calls == "retriever":
        seconds, timeout_error = policy.retriever_timeout, RetrieverTimeoutError
    else:
        seconds, timeout_error = policy.model_timeout, ModelTimeoutError

    counter.count = 1
    try:  # the first attempt runs without tenacity: most calls succeed on it
        return await within(fn, seconds, timeout_error)
    except Exception as exc:
        if policy.attempts <= 1 or not retry_on(exc):
            raise
        first = exc
    return await _retry_after(
        first, fn, policy, on_retry, retry_on, counter, seconds, timeout_error
    )


async def _retry_after(
    first: Exception,
    fn: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    on_retry: OnRetry | None,
    retry_on: Callable[[BaseException], bool],
    counter: Tries,
    seconds: float | None,
    timeout_error: Callable[[float], Exception],
) -> T:
    """The attempts after a first one that failed with ``first``, under tenacity (apart from
    ``retry_call`` so that its first attempt makes no closure)."""
    failed: Exception | None = first

    async def attempt() -> T:
        nonlocal failed
        if failed is not None:  # tenacity takes the first attempt's error as its own attempt 1
            error, failed = failed, None
            raise error
        counter.count += 1
        return await within(fn, seconds, timeout_error)

    return await retrying(policy, on_retry, retry_on)(attempt)


def clean_text(text: str, max_chars: int | None) -> str:
    """Model output text fit for use: lone surrogates replaced by U+FFFD; OutputTooLongError
    (holding the text cut to the cap) when it is longer than ``max_chars``."""
    if max_chars is not None and len(text) > max_chars:
        raise OutputTooLongError(len(text), max_chars, fix_surrogates(text[:max_chars]))
    return fix_surrogates(text)


def clean_message(message: M, max_chars: int | None) -> M:
    """The message with its text checked and cleaned as by ``clean_text``."""
    content = message.content
    if isinstance(content, str):
        text = clean_text(content, max_chars)
        return message if text is content else message.model_copy(update={"content": text})
    if max_chars is not None:
        clean_text(text_of(message), max_chars)  # raises when over the cap
    blocks: list[str | dict[Any, Any]] = []
    changed = False
    for block in content:
        if isinstance(block, str):
            fixed: str | dict[Any, Any] = fix_surrogates(block)
        elif isinstance(block, dict) and isinstance(block.get("text"), str):
            text = fix_surrogates(block["text"])
            fixed = block if text is block["text"] else {**block, "text": text}
        else:
            fixed = block
        changed = changed or fixed is not block
        blocks.append(fixed)
    return message.model_copy(update={"content": blocks}) if changed else message


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
    safe: dict[str, Any] = json.loads(json.dumps(params, default=str))
    return safe


async def ainvoke_model(
    llm: BaseChatModel,
    messages: list[BaseMessage],
    *,
    config: RunnableConfig | None = None,
    max_chars: int | None = None,
) -> BaseMessage:
    """One model call (no retry, no timeout), its output checked by ``clean_message``."""
    return clean_message(await llm.ainvoke(messages, config=config), max_chars)


async def call_model(
    llm: BaseChatModel,
    messages: list[BaseMessage],
    *,
    policy: RetryPolicy,
    on_retry: OnRetry | None = None,
    config: RunnableConfig | None = None,
    tries: Tries | None = None,
) -> AIMessage:
    """Invoke the model under the policy: bounded retries, a timeout per attempt, and output
    capped and cleaned (attempts made are counted in ``tries``)."""
    if sys.version_info >= (3, 11):
        counter = tries if tries is not None else Tries()
        counter.count = 1
        seconds = policy.model_timeout
        try:  # the first attempt, as ``retry_call`` makes it, with no coroutine or closure more
            if seconds is None:
                message = await llm.ainvoke(messages, config=config)
            else:
                with _Bound(seconds, ModelTimeoutError):
                    message = await llm.ainvoke(messages, config=config)
            return clean_message(message, policy.max_output_chars)
        except Exception as exc:
            if policy.attempts <= 1 or not is_transient(exc):
                raise
            first = exc
        return await _retry_after(
            first,
            _model_attempt(llm, messages, config, policy.max_output_chars),
            policy,
            on_retry,
            is_transient,
            counter,
            seconds,
            ModelTimeoutError,
        )
    return await retry_call(
        _model_attempt(llm, messages, config, policy.max_output_chars),
        policy,
        on_retry=on_retry,
        tries=tries,
    )


#: id(model) -> (a weak reference to it, its slots per event loop)
_SLOTS: dict[int, tuple[weakref.ref[Any], dict[int, asyncio.Semaphore]]] = {}
_SLOTS_LOCK = threading.Lock()


def concurrency_of(limit: int | None, model: Any) -> int | None:
    """How many calls may be in flight at once to ``model``: ``limit`` (the settings'
    ``max_concurrency``), else the model's own ``max_concurrency`` field (the bundled local
    model's is 1), else no limit (None)."""
    if limit is not None:
        return limit
    own = getattr(model, "max_concurrency", None)
    return own if isinstance(own, int) and not isinstance(own, bool) and own >= 1 else None


def model_slots(limit: int | None, model: Any) -> contextlib.AbstractAsyncContextManager[Any]:
    """What a call to ``model`` holds while it runs: one of its ``limit`` slots, shared by every
    request on this event loop (a nullcontext when there is no limit), so calls beyond the
    limit queue instead of timing out on a server that answers one at a time; a call's
    timeout runs from when it holds its slot."""
    if limit is None or model is None:
        return contextlib.nullcontext()
    loop = id(asyncio.get_running_loop())
    key = id(model)
    with _SLOTS_LOCK:
        known = _SLOTS.get(key)
        if known is None or known[0]() is not model:

            def forget(_: object) -> None:
                with _SLOTS_LOCK:
                    entry = _SLOTS.get(key)
                    if entry is not None and entry[0]() is None:
                        del _SLOTS[key]

            known = _SLOTS[key] = (weakref.ref(model, forget), {})
        by_loop = known[1]
        slots = by_loop.get(loop)
        if slots is None:  # a semaphore belongs to one event loop (a sync call runs its own)
            slots = by_loop[loop] = asyncio.Semaphore(limit)
    return slots


def generates_several(llm: BaseChatModel) -> bool:
    """Whether one call of the model can answer one prompt several times: it takes the
    OpenAI-compatible ``n`` (LangChain's ChatOpenAI and its compatible servers) and does not
    stream (a streamed call gives one answer)."""
    fields = type(llm).model_fields
    if "n" not in fields:
        return False
    return not getattr(llm, "streaming", False)


async def call_model_several(
    llm: BaseChatModel,
    messages: list[BaseMessage],
    n: int,
    *,
    policy: RetryPolicy,
    on_retry: OnRetry | None = None,
    config: RunnableConfig | None = None,
    tries: Tries | None = None,
) -> list[AIMessage]:
    """``n`` answers to one prompt in one call (``agenerate`` with ``n``), under the policy as
    ``call_model``: the prompt is sent, and billed, once. Each answer is capped and cleaned; a
    call that returns fewer than ``n`` fails (``CallError``)."""
    from langchain_core.runnables.config import ensure_config

    given = ensure_config(config)

    async def once() -> list[AIMessage]:
        result = await llm.agenerate(
            [messages],
            callbacks=given.get("callbacks"),
            tags=given.get("tags"),
            metadata=given.get("metadata"),
            run_name=given.get("run_name"),
            n=n,
        )
        found = result.generations[0] if result.generations else []
        replies = [
            g.message
            for g in found
            if isinstance(g, ChatGeneration) and isinstance(g.message, AIMessage)
        ]
        if len(replies) < n:
            raise CallError(f"the model returned {len(replies)} answers to a call for {n}")
        return [clean_message(m, policy.max_output_chars) for m in replies[:n]]

    return await retry_call(once, policy, on_retry=on_retry, tries=tries)


def _model_attempt(
    llm: BaseChatModel,
    messages: list[BaseMessage],
    config: RunnableConfig | None,
    max_chars: int | None,
) -> Callable[[], Awaitable[AIMessage]]:
    """One attempt of ``call_model``, for ``retry_call``: ``ainvoke_model``, typed as the
    model's reply."""

    async def once() -> AIMessage:
        return clean_message(await llm.ainvoke(messages, config=config), max_chars)

    return once


def text_of(message: BaseMessage, *, strict: bool = False, sep: str = "") -> str:
    """The plain text of a message (text content blocks joined with ``sep``).

    ``strict`` raises TypeError on a non-text block (an image, a tool call) instead of skipping it.
    """
    content = message.content
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif strict:
            raise InputTypeError(f"a {type(block).__name__} content block is not text")
    return sep.join(parts)


def token_usage(message: AIMessage) -> tuple[int | None, int | None]:
    """Input and output token counts the model reported, if any."""
    usage = getattr(message, "usage_metadata", None)
    if not usage:
        return None, None
    return usage.get("input_tokens"), usage.get("output_tokens")


class ReplyChatModel(BaseChatModel):
    """A LangChain chat model written as one method, ``_reply(messages, **kwargs)`` (``stop``
    among the keyword arguments). ``_areply`` is the async form: by default ``_reply`` in a
    worker thread, so a model that computes does not hold up the event loop."""

    def _reply(self, messages: list[BaseMessage], **kwargs: Any) -> ChatResult:
        raise NotImplementedError

    async def _areply(self, messages: list[BaseMessage], **kwargs: Any) -> ChatResult:
        return await asyncio.to_thread(self._reply, messages, **kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return self._reply(messages, stop=stop, **kwargs)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return await self._areply(messages, stop=stop, **kwargs)
