"""Token usage and cost of model calls: per call, per stage, per request.

A model call's usage is what the model reported — LangChain's ``AIMessage.usage_metadata``
(``input_tokens``/``output_tokens``), else a provider's ``token_usage`` (in ``llm_output`` or
``response_metadata``; ``prompt_tokens``/``completion_tokens`` or ``input_tokens``/
``output_tokens``) — and, when the model reports nothing, an estimate marked
``estimated=True``.

The estimator (``estimate_tokens``) counts one token per CJK character (Han, kana, Hangul,
CJK punctuation and full-width forms) and, for every other run of non-space characters, one
token per started chunk of four characters (``"warranty"`` → 2, ``"24"`` → 1, ``"[M03]"`` → 2).
That follows how BPE tokenizers of current chat models split text: about four characters per
token in English, and one or more tokens per Chinese character. It is a planning figure, not a
bill: it is usually within ±30% of a real tokenizer on English, and undercounts Chinese for
tokenizers that spend two or three tokens on a rare character.

Money comes only from a price table the user supplies, per model, in the currency they bill
in — ``{"model-name": {"input_per_1k": 0.15, "output_per_1k": 0.6}}`` or a JSON file of that
shape (``load_prices``); tracerag ships no prices. A call to a model missing from the table has
no cost, and the model is listed as unpriced.

Stages record their calls into the request's ledger with ``note(call)``; the runner opens the
ledger around a request (``metering()``) and turns its calls into the audit record's ``usage``
section (``usage_section``) and the root span's totals (``root_attributes``).
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

from langchain_core.messages import BaseMessage

from tracerag import _semconv as semconv
from tracerag.errors import ConfigurationError

T = TypeVar("T")

__all__ = [
    "SOURCE_ESTIMATE",
    "SOURCE_LLM_OUTPUT",
    "SOURCE_USAGE_METADATA",
    "STAGE_PLAN",
    "STAGE_SAMPLE",
    "STAGE_VERIFY",
    "CallUsage",
    "Cost",
    "Price",
    "StageUsage",
    "UsageLedger",
    "UsageSummary",
    "cost_of",
    "current_ledger",
    "estimate_messages",
    "estimate_tokens",
    "load_prices",
    "metering",
    "note",
    "parse_prices",
    "reported_usage",
    "root_attributes",
    "span_attributes",
    "summarize",
    "usage_of",
    "usage_section",
]

STAGE_PLAN = "plan"
STAGE_SAMPLE = "sample"
STAGE_VERIFY = "verify"

SOURCE_USAGE_METADATA = "usage_metadata"
SOURCE_LLM_OUTPUT = "llm_output"
SOURCE_ESTIMATE = "estimate"

#: Characters counted as one token each: CJK ideographs, kana, Hangul, CJK punctuation and
#: full-width forms.
_CJK = (
    "\u3000-\u303f"  # CJK symbols and punctuation
    "\u3040-\u30ff"  # hiragana, katakana
    "\u3400-\u4dbf"  # CJK extension A
    "\u4e00-\u9fff"  # CJK unified ideographs
    "\uac00-\ud7af"  # Hangul syllables
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\uff00-\uffef"  # half- and full-width forms
)
_TOKEN_RE = re.compile(f"[{_CJK}]|[^\\s{_CJK}]+")
_CJK_RE = re.compile(f"[{_CJK}]")
#: Characters per token for text that is not CJK.
CHARS_PER_TOKEN = 4


def estimate_tokens(text: str | None) -> int:
    """Estimated tokens of a text: one per CJK character, one per started 4-character chunk
    of every other whitespace-separated run."""
    if not text:
        return 0
    return _estimate(text)


@lru_cache(maxsize=4096)
def _estimate(text: str) -> int:
    # the N samples of a request send the same prompt: its estimate is made once
    cjk = len(_CJK_RE.findall(text))
    rest = _CJK_RE.sub(" ", text) if cjk else text
    return cjk + sum((len(run) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN for run in rest.split())


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, Mapping) and isinstance(block.get("text"), str):
                parts.append(block["text"])
        return "\n".join(parts)
    return "" if content is None else str(content)


def estimate_messages(prompt: Sequence[BaseMessage] | str | None) -> int:
    """Estimated tokens of a prompt: the sum over its messages' text (or of one string)."""
    if prompt is None:
        return 0
    if isinstance(prompt, str):
        return estimate_tokens(prompt)
    return sum(estimate_tokens(_content_text(m.content)) for m in prompt)


# ---------------------------------------------------------------------------------------------
# One call


@dataclass(frozen=True)
class CallUsage:
    """Tokens one model call read and wrote, the stage that made it, and where the count is from.

    ``source``: ``usage_metadata`` or ``llm_output`` (the model reported it) or ``estimate``
    (``estimated`` is True).
    """

    stage: str
    model: str
    input_tokens: int
    output_tokens: int
    estimated: bool = False
    source: str = SOURCE_USAGE_METADATA
    #: answers the call returned for its one prompt (OpenAI-compatible ``n``): the prompt's
    #: input tokens are billed once for all of them, the output tokens are theirs together
    generations: int = 1

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and (math.isnan(value) or not value.is_integer()):
        return None
    return int(value) if value >= 0 else None


def _pair(usage: Any) -> tuple[int, int] | None:
    if not isinstance(usage, Mapping):
        return None
    for inp, out in (("input_tokens", "output_tokens"), ("prompt_tokens", "completion_tokens")):
        i, o = _count(usage.get(inp)), _count(usage.get(out))
        if i is not None and o is not None:
            return i, o
    return None


def reported_usage(
    message: Any = None, llm_output: Mapping[str, Any] | None = None
) -> tuple[int, int, str] | None:
    """``(input_tokens, output_tokens, source)`` as the model reported them, or None.

    Looked for in order: ``message.usage_metadata``; ``llm_output["token_usage"]`` (or
    ``["usage"]``); ``message.response_metadata["token_usage"]`` (or ``["usage"]``).
    """
    pair = _pair(getattr(message, "usage_metadata", None))
    if pair is not None:
        return (*pair, SOURCE_USAGE_METADATA)
    metadata = getattr(message, "response_metadata", None)
    for holder in (llm_output, metadata):
        if isinstance(holder, Mapping):
            for key in ("token_usage", "usage"):
                pair = _pair(holder.get(key))
                if pair is not None:
                    return (*pair, SOURCE_LLM_OUTPUT)
    return None


def usage_of(
    message: Any,
    *,
    stage: str,
    model: str | None,
    prompt: Sequence[BaseMessage] | str | None = None,
    llm_output: Mapping[str, Any] | None = None,
) -> CallUsage:
    """The usage of one model call: reported by the model, else estimated from ``prompt`` and
    the reply's text (``estimated=True``)."""
    name = model or "unknown"
    reported = reported_usage(message, llm_output)
    if reported is not None:
        inp, out, source = reported
        return CallUsage(stage, name, inp, out, estimated=False, source=source)
    reply = _content_text(getattr(message, "content", message))
    return CallUsage(
        stage,
        name,
        estimate_messages(prompt),
        estimate_tokens(reply),
        estimated=True,
        source=SOURCE_ESTIMATE,
    )


# ---------------------------------------------------------------------------------------------
# Totals


@dataclass(frozen=True)
class StageUsage:
    """Calls and tokens of one stage (or one model); ``estimated_calls`` of them estimated."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    estimated_calls: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def add(self, call: CallUsage) -> StageUsage:
        return StageUsage(
            self.calls + 1,
            self.input_tokens + call.input_tokens,
            self.output_tokens + call.output_tokens,
            self.estimated_calls + int(call.estimated),
        )

    def to_dict(self) -> dict[str, int]:
        return _counts_dict(self.calls, self.input_tokens, self.output_tokens, self.estimated_calls)


def _counts_dict(
    calls: int, input_tokens: int, output_tokens: int, estimated_calls: int
) -> dict[str, int]:
    """The record's form of the counts of a stage, a model or a request."""
    return {
        "calls": calls,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "total_tokens": input_tokens + output_tokens,
        "estimated_calls": estimated_calls,
    }


@dataclass(frozen=True)
class UsageSummary:
    """A request's model calls and tokens in total, per stage and per model."""

    total: StageUsage = field(default_factory=StageUsage)
    by_stage: Mapping[str, StageUsage] = field(default_factory=dict)
    by_model: Mapping[str, StageUsage] = field(default_factory=dict)

    @property
    def estimated(self) -> bool:
        """Whether any count in it is an estimate."""
        return self.total.estimated_calls > 0


def summarize(calls: Iterable[CallUsage]) -> UsageSummary:
    """Totals of the calls, per stage and per model (stages in first-call order)."""
    total, by_stage, by_model = _counts(calls)
    return UsageSummary(
        StageUsage(*total),
        {k: StageUsage(*v) for k, v in by_stage.items()},
        {k: StageUsage(*v) for k, v in by_model.items()},
    )


def _counts(
    calls: Iterable[CallUsage],
) -> tuple[list[int], dict[str, list[int]], dict[str, list[int]]]:
    """Counts (calls, input, output, estimated calls) in total, per stage and per model."""
    total = [0, 0, 0, 0]
    by_stage: dict[str, list[int]] = {}
    by_model: dict[str, list[int]] = {}
    for call in calls:
        inp, out, estimated = call.input_tokens, call.output_tokens, int(call.estimated)
        stage = by_stage.get(call.stage)
        if stage is None:
            stage = by_stage[call.stage] = [0, 0, 0, 0]
        model = by_model.get(call.model)
        if model is None:
            model = by_model[call.model] = [0, 0, 0, 0]
        for counts in (total, stage, model):
            counts[0] += 1
            counts[1] += inp
            counts[2] += out
            counts[3] += estimated
    return total, by_stage, by_model


# ---------------------------------------------------------------------------------------------
# Prices and cost


@dataclass(frozen=True)
class Price:
    """What 1,000 input and 1,000 output tokens of one model cost, in the user's currency."""

    input_per_1k: float
    output_per_1k: float

    def of(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input_per_1k + output_tokens * self.output_per_1k) / 1000


def parse_prices(data: Mapping[str, Any]) -> dict[str, Price]:
    """A price table from ``{"model": {"input_per_1k": x, "output_per_1k": y}}``.

    A top-level ``"currency"`` or ``"note"`` string is allowed and ignored. Raises
    ``ConfigurationError`` naming the model whose entry is not two non-negative numbers.
    """
    if not isinstance(data, Mapping):
        raise ConfigurationError("a price table is a JSON object of model name -> prices")
    table: dict[str, Price] = {}
    for model, entry in data.items():
        if model in ("currency", "note") and isinstance(entry, str):
            continue
        if not isinstance(entry, Mapping):
            raise ConfigurationError(
                f"price of {model!r} must be an object with input_per_1k and output_per_1k"
            )
        values = []
        for key in ("input_per_1k", "output_per_1k"):
            value = entry.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ConfigurationError(f"price of {model!r}: {key} must be a non-negative number")
            values.append(float(value))
        table[str(model)] = Price(*values)
    return table


def load_prices(source: str | Path | Mapping[str, Any] | None) -> dict[str, Price] | None:
    """A price table from a mapping, a JSON file path, or None (no prices)."""
    if source is None:
        return None
    if isinstance(source, Mapping):
        if all(isinstance(v, Price) for v in source.values()):
            return dict(source)
        return parse_prices(source)
    path = Path(source)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"cannot read the price table {path}: {exc}") from exc
    return parse_prices(data)


@dataclass(frozen=True)
class Cost:
    """Money spent on a set of calls, in the price table's currency.

    ``total`` is None when no call could be priced; ``unpriced`` names the models without a
    price (their calls are left out of every figure).
    """

    total: float | None
    by_stage: Mapping[str, float]
    by_model: Mapping[str, float]
    unpriced: tuple[str, ...] = ()


def cost_of(calls: Iterable[CallUsage], prices: Mapping[str, Price] | None) -> Cost:
    """What the calls cost under the price table."""
    by_stage: dict[str, float] = {}
    by_model: dict[str, float] = {}
    unpriced: list[str] = []
    priced_any = False
    for call in calls:
        price = (prices or {}).get(call.model)
        if price is None:
            if call.model not in unpriced:
                unpriced.append(call.model)
            continue
        priced_any = True
        money = price.of(call.input_tokens, call.output_tokens)
        by_stage[call.stage] = by_stage.get(call.stage, 0.0) + money
        by_model[call.model] = by_model.get(call.model, 0.0) + money
    total = sum(by_model.values()) if priced_any else None
    return Cost(total, by_stage, by_model, tuple(unpriced))


def _money(value: float | None) -> float | None:
    return None if value is None else round(value, 10)


def usage_section(
    calls: Sequence[CallUsage], prices: Mapping[str, Price] | None = None
) -> dict[str, Any]:
    """The audit record's ``usage`` section: totals, per stage, per model, each call, cost."""
    total, by_stage, by_model = _counts(calls)
    section: dict[str, Any] = {
        **_counts_dict(*total),
        "estimated": total[3] > 0,
        "by_stage": {k: _counts_dict(*v) for k, v in by_stage.items()},
        "by_model": {k: _counts_dict(*v) for k, v in by_model.items()},
        "calls_detail": [
            {
                "stage": c.stage,
                "model": c.model,
                "input_tokens": c.input_tokens,
                "output_tokens": c.output_tokens,
                "estimated": c.estimated,
                "source": c.source,
                **({"generations": c.generations} if c.generations != 1 else {}),
            }
            for c in calls
        ],
    }
    if prices is not None:
        cost = cost_of(calls, prices)
        section["cost"] = {
            "total": _money(cost.total),
            "by_stage": {k: _money(v) for k, v in cost.by_stage.items()},
            "by_model": {k: _money(v) for k, v in cost.by_model.items()},
            "unpriced_models": list(cost.unpriced),
        }
    return section


# ---------------------------------------------------------------------------------------------
# Span attributes


def span_attributes(calls: CallUsage | Sequence[CallUsage]) -> dict[str, Any]:
    """GenAI (and OpenInference) token attributes of a model span, with the estimated flag."""
    items = [calls] if isinstance(calls, CallUsage) else list(calls)
    if not items:
        return {}
    inp = sum(c.input_tokens for c in items)
    out = sum(c.output_tokens for c in items)
    return {
        semconv.GENAI_USAGE_INPUT_TOKENS: inp,
        semconv.GENAI_USAGE_OUTPUT_TOKENS: out,
        semconv.OI_LLM_TOKEN_PROMPT: inp,
        semconv.OI_LLM_TOKEN_COMPLETION: out,
        semconv.OI_LLM_TOKEN_TOTAL: inp + out,
        semconv.USAGE_ESTIMATED: any(c.estimated for c in items),
    }


def root_attributes(section: Mapping[str, Any]) -> dict[str, Any]:
    """The request's totals for its root span, from a ``usage_section``."""
    attrs: dict[str, Any] = {
        semconv.USAGE_CALLS: int(section.get("calls", 0)),
        semconv.USAGE_INPUT_TOKENS: int(section.get("input_tokens", 0)),
        semconv.USAGE_OUTPUT_TOKENS: int(section.get("output_tokens", 0)),
        semconv.USAGE_ESTIMATED: bool(section.get("estimated", False)),
    }
    for stage, totals in (section.get("by_stage") or {}).items():
        attrs[semconv.usage_stage(stage, "input_tokens")] = int(totals.get("input_tokens", 0))
        attrs[semconv.usage_stage(stage, "output_tokens")] = int(totals.get("output_tokens", 0))
        attrs[semconv.usage_stage(stage, "calls")] = int(totals.get("calls", 0))
    cost = section.get("cost") or {}
    if cost.get("total") is not None:
        attrs[semconv.USAGE_COST] = float(cost["total"])
    return attrs


# ---------------------------------------------------------------------------------------------
# The request's ledger


class UsageLedger:
    """The model calls of one request, in the order they were noted (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: list[CallUsage] = []

    def add(self, call: CallUsage) -> None:
        with self._lock:
            self._calls.append(call)

    def calls(self) -> tuple[CallUsage, ...]:
        with self._lock:
            return tuple(self._calls)


_LEDGER: ContextVar[UsageLedger | None] = ContextVar("tracerag_usage_ledger", default=None)


def current_ledger() -> UsageLedger | None:
    """The ledger of the request being run, if any."""
    return _LEDGER.get()


@contextmanager
def bound(var: ContextVar[T | None], value: T) -> Iterator[T]:
    """``var`` holds ``value`` inside the block (and in tasks and threads it starts)."""
    token = var.set(value)
    try:
        yield value
    finally:
        var.reset(token)


def metering() -> AbstractContextManager[UsageLedger]:
    """A fresh ledger for the calls made inside the block (and tasks it starts)."""
    return bound(_LEDGER, UsageLedger())


def note(call: CallUsage) -> CallUsage:
    """Add a call to the current request's ledger (nothing happens outside a request)."""
    ledger = _LEDGER.get()
    if ledger is not None:
        ledger.add(call)
    return call
