"""Helpers for testing your own chains with tracerag: scripted chat models and span capture.

``ScriptedChatModel`` is a real LangChain chat model whose replies you script (a list cycled per
call, or a function of the prompt), that can sleep, fail a set number of times, or always fail.
``ToolCallingChatModel`` is one that agents can use: ``bind_tools`` works, it calls the bound
tools first and then answers from the script, offline and deterministic per seed.
``SpanCapture`` is a real OpenTelemetry SDK TracerProvider with an in-memory exporter, with
helpers to look at the span tree of one request.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolCall
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import Field, PrivateAttr

from tracerag import _semconv as semconv
from tracerag._llm import ReplyChatModel
from tracerag._usage import estimate_tokens
from tracerag.prompts import TASK_RE

__all__ = [
    "ScriptCall",
    "ScriptedChatModel",
    "ScriptedModelError",
    "SpanCapture",
    "ToolCallingChatModel",
    "iter_attrs",
    "tracerag_name",
]


class ScriptedModelError(RuntimeError):
    """The failure a ScriptedChatModel raises when told to fail."""


@dataclass(frozen=True)
class ScriptCall:
    """What a responder function is told about one call."""

    index: int
    task: str | None
    prompt: str
    temperature: float


Responder = Callable[[ScriptCall], str]
#: Scripted token usage of a call: fixed ``{"input_tokens": n, "output_tokens": m}``, or a
#: function of the call and the reply returning such a mapping (or None: report no usage).
UsageScript = Mapping[str, int] | Callable[[ScriptCall, str], Mapping[str, int] | None]


class ScriptedChatModel(ReplyChatModel):
    """A chat model that replies from a script.

    ``responses`` are returned in turn (cycling); ``plan_responses`` are used instead for plan
    calls (prompts whose task is ``plan``); ``responder`` computes a reply from the call.
    ``fail_first`` calls raise ``ScriptedModelError`` before replies start; ``always_fail`` makes
    every call raise. ``latency`` seconds are slept per call (asynchronously in ``ainvoke``).

    Token usage (``usage_metadata``): by default the real count of what the call read and
    wrote, in ``tracerag.usage.estimate_tokens`` units (the prompt's message texts, the reply);
    ``usage`` scripts it instead (see ``UsageScript``); ``report_usage=False`` reports none.
    """

    responses: list[str] = Field(default_factory=lambda: ["I cannot answer from the materials."])
    plan_responses: list[str] | None = None
    responder: Responder | None = None
    model_name: str = "scripted-chat-model"
    temperature: float = 0.7
    latency: float = 0.0
    fail_first: int = 0
    always_fail: bool = False
    failure_message: str = "scripted model failure"
    usage: Any = None
    report_usage: bool = True

    _lock: threading.Lock = PrivateAttr()
    _calls: list[ScriptCall] = PrivateAttr()
    _answer_counter: Any = PrivateAttr()
    _plan_counter: Any = PrivateAttr()

    # Set here, not by PrivateAttr(default_factory=...): pydantic reads the signature of a
    # private attribute's factory on every construction, about 100 µs for a builtin such as
    # list (a scripted model is built per test, so about 0.4 s over the test suite).
    def model_post_init(self, context: Any, /) -> None:
        """Each model starts with its own lock, call log and reply counters."""
        super().model_post_init(context)
        self._lock = threading.Lock()
        self._calls = []
        self._answer_counter = itertools.count()
        self._plan_counter = itertools.count()

    @property
    def _llm_type(self) -> str:
        return "scripted"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self.model_name, "temperature": self.temperature}

    @property
    def calls(self) -> list[ScriptCall]:
        """Every call made so far (including failed ones), in order."""
        with self._lock:
            return list(self._calls)

    @property
    def call_count(self) -> int:
        with self._lock:
            return len(self._calls)

    def _record(self, messages: list[BaseMessage]) -> ScriptCall:
        """Log one call (failing it when the script says so)."""
        prompt = "\n".join(str(m.content) for m in messages)
        match = TASK_RE.search(prompt)
        task = match.group("task") if match else None
        with self._lock:
            call = ScriptCall(len(self._calls), task, prompt, self.temperature)
            self._calls.append(call)
        if self.always_fail or call.index < self.fail_first:
            raise ScriptedModelError(f"{self.failure_message} (call {call.index})")
        return call

    def _next(self, messages: list[BaseMessage]) -> tuple[ScriptCall, str]:
        call = self._record(messages)
        if self.responder is not None:
            return call, self.responder(call)
        if call.task == "plan" and self.plan_responses:
            seq = self.plan_responses
            return call, seq[next(self._plan_counter) % len(seq)]
        return call, self.responses[next(self._answer_counter) % len(self.responses)]

    def _usage(
        self, messages: list[BaseMessage], call: ScriptCall, text: str
    ) -> dict[str, int] | None:
        if not self.report_usage:
            return None
        if self.usage is None:
            scripted: Mapping[str, int] | None = {
                "input_tokens": sum(estimate_tokens(str(m.content)) for m in messages),
                "output_tokens": estimate_tokens(text),
            }
        elif callable(self.usage):
            scripted = self.usage(call, text)
        else:
            scripted = self.usage
        if scripted is None:
            return None
        inp, out = int(scripted["input_tokens"]), int(scripted["output_tokens"])
        return {"input_tokens": inp, "output_tokens": out, "total_tokens": inp + out}

    def _result(self, messages: list[BaseMessage], call: ScriptCall, text: str) -> ChatResult:
        usage = self._usage(messages, call, text)
        message = AIMessage(
            content=text,
            response_metadata={"model_name": self.model_name},
            **({"usage_metadata": usage} if usage is not None else {}),
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _reply(self, messages: list[BaseMessage], **kwargs: Any) -> ChatResult:
        if self.latency:
            time.sleep(self.latency)
        return self._result(messages, *self._next(messages))

    async def _areply(self, messages: list[BaseMessage], **kwargs: Any) -> ChatResult:
        if self.latency:
            await asyncio.sleep(self.latency)
        return self._result(messages, *self._next(messages))


class ToolCallingChatModel(ScriptedChatModel):
    """A scripted chat model that calls tools, for agents (``create_agent``, ``ToolNode``).

    ``bind_tools`` binds the tools' schemas. Bound to tools, the model first calls one: while
    fewer than ``tool_rounds`` of its tool calls follow the last user message, it replies with a
    call to ``tool`` (default: the first bound tool) whose first argument is that user message.
    Then it answers from the script (``responses`` or ``responder``, as ``ScriptedChatModel``),
    and the responder sees the tool results in ``ScriptCall.prompt``. Told to call a given tool
    (``tool_choice``, as ``with_structured_output`` does), it calls it with the arguments
    ``structured`` holds for that tool's name. Tool call ids are ``call_<seed>_<n>``, so a seed
    and a script give the same conversation every time.
    """

    seed: int = 0
    tool_rounds: int = 1
    tool: str | None = None
    structured: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @property
    def _llm_type(self) -> str:
        return "scripted-tool-calling"

    def bind_tools(
        self,
        tools: Sequence[Any],
        *,
        tool_choice: str | dict[str, Any] | bool | None = None,
        **kwargs: Any,
    ) -> Runnable[Any, AIMessage]:
        """The model with the tools' OpenAI-format schemas bound, as provider models bind them."""
        schemas = [convert_to_openai_tool(t) for t in tools]
        if tool_choice is not None and tool_choice is not False:
            kwargs["tool_choice"] = tool_choice
        return self.bind(tools=schemas, **kwargs)

    def _tool_call(self, messages: list[BaseMessage], **kwargs: Any) -> ChatResult | None:
        schemas: list[dict[str, Any]] = list(kwargs.get("tools") or [])
        if not schemas:
            return None
        names = [s["function"]["name"] for s in schemas]
        choice = kwargs.get("tool_choice")
        forced = _chosen_tool(choice, names)
        last_human = max(
            (i for i, m in enumerate(messages) if isinstance(m, HumanMessage)), default=-1
        )
        if forced is not None:
            name, args = forced, dict(self.structured.get(forced, {}))
        else:
            rounds = sum(
                1 for m in messages[last_human + 1 :] if isinstance(m, AIMessage) and m.tool_calls
            )
            if rounds >= self.tool_rounds:
                return None
            name = self.tool if self.tool is not None and self.tool in names else names[0]
            schema = schemas[names.index(name)]["function"].get("parameters") or {}
            question = str(messages[last_human].content) if last_human >= 0 else ""
            first = next(iter(schema.get("properties") or {"query": None}))
            args = {first: question}
        call = self._record(messages)
        tool_call = ToolCall(
            name=name, args=args, id=f"call_{self.seed}_{call.index}", type="tool_call"
        )
        message = AIMessage(
            content="", tool_calls=[tool_call], response_metadata={"model_name": self.model_name}
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _reply(self, messages: list[BaseMessage], **kwargs: Any) -> ChatResult:
        if self.latency:
            time.sleep(self.latency)
        called = self._tool_call(messages, **kwargs)
        return called if called is not None else self._result(messages, *self._next(messages))

    async def _areply(self, messages: list[BaseMessage], **kwargs: Any) -> ChatResult:
        if self.latency:
            await asyncio.sleep(self.latency)
        called = self._tool_call(messages, **kwargs)
        return called if called is not None else self._result(messages, *self._next(messages))


def _chosen_tool(choice: Any, names: Sequence[str]) -> str | None:
    """The tool a ``tool_choice`` forces the model to call, if it forces one."""
    if choice in (None, False, "auto", "none"):
        return None
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") or choice.get("name")
        return str(name) if name in names else names[0]
    if isinstance(choice, str) and choice in names:
        return choice
    return names[0]  # "any", "required", True: some tool must be called


class SpanCapture:
    """A real SDK TracerProvider whose finished spans are kept in memory for inspection."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def spans(self) -> list[ReadableSpan]:
        """All finished spans so far."""
        return list(self.exporter.get_finished_spans())

    def clear(self) -> None:
        self.exporter.clear()

    def for_request(self, request_id: str) -> list[ReadableSpan]:
        """The spans that carry this request_id."""
        return [
            s for s in self.spans() if (s.attributes or {}).get(semconv.REQUEST_ID) == request_id
        ]

    def named(self, name: str, request_id: str | None = None) -> list[ReadableSpan]:
        """The spans named ``name``, or whose tracerag name (``tracerag.span``) is ``name``:
        ``named("tracerag.request")`` finds the root span, named ``invoke_workflow tracerag``."""
        spans = self.for_request(request_id) if request_id else self.spans()
        return [s for s in spans if s.name == name or tracerag_name(s) == name]

    def root(self, request_id: str) -> ReadableSpan:
        """The ``tracerag.request`` span of a request."""
        roots = self.named(semconv.SPAN_REQUEST, request_id)
        if len(roots) != 1:
            raise AssertionError(f"expected one root span for {request_id}, found {len(roots)}")
        return roots[0]

    def children(self, span: ReadableSpan) -> list[ReadableSpan]:
        sid = span.context.span_id
        return sorted(
            (s for s in self.spans() if s.parent is not None and s.parent.span_id == sid),
            key=lambda s: s.start_time or 0,
        )

    def tree_problems(self, request_id: str) -> list[str]:
        """What is wrong with a request's span tree (empty when it is one complete tree)."""
        problems: list[str] = []
        root = self.root(request_id)
        trace_id = root.context.trace_id
        same_trace = [s for s in self.spans() if s.context.trace_id == trace_id]
        ids = {s.context.span_id for s in same_trace}
        for s in same_trace:
            if (s.attributes or {}).get(semconv.REQUEST_ID) != request_id:
                problems.append(f"span {s.name} lacks request_id {request_id}")
            if s is not root and (s.parent is None or s.parent.span_id not in ids):
                problems.append(f"span {s.name} is orphaned")
        stage_names = [tracerag_name(c) for c in self.children(root)]
        for name in semconv.STAGE_SPANS.values():
            if stage_names.count(name) != 1:
                problems.append(f"stage span {name} appears {stage_names.count(name)} times")
        other = [s for s in self.for_request(request_id) if s.context.trace_id != trace_id]
        problems.extend(f"span {s.name} is in another trace" for s in other)
        return problems


def tracerag_name(span: ReadableSpan) -> str:
    """A span's tracerag name (``tracerag.request``, ``tracerag.retrieve``, ...): its
    ``tracerag.span`` attribute, else its name."""
    value = (span.attributes or {}).get(semconv.SPAN_NAME)
    return str(value) if value is not None else span.name


def iter_attrs(spans: Sequence[ReadableSpan], key: str) -> Iterator[Any]:
    """The values of one attribute across spans (spans without it are skipped)."""
    for s in spans:
        if s.attributes and key in s.attributes:
            yield s.attributes[key]
