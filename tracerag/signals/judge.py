"""A support backend that asks a chat model (an "LLM judge") whether a material backs a claim.

The model must answer with one JSON object::

    {"supported": true, "score": 0.92, "quote": "<text copied from the material>"}

A reply that is not such an object is asked for again (a bounded number of times, telling the
model what was wrong); when no attempt gives one the claim is not supported, with the reason.
The verdict counts only if its quote is found in the material, verbatim up to whitespace: the
quote's offsets become the Support's ``start``/``end`` and the quote its ``sentence``. A
supported verdict with a quote that is not in the material is discarded (score 0). The number
and date check of the lexical backend still applies: a claim amount, date, duration or number
that the material does not state (found by the lexical backend's ``analyse``) caps the score
below the threshold.

The backend cannot be built by name — it needs a model. Constructing ``JudgeSupport(llm)``
registers it as ``"judge"`` (unless ``register=False``); pass the instance itself wherever a
backend is accepted::

    judge = JudgeSupport(ChatOpenAI(model="gpt-4o-mini", temperature=0))
    RAGPipeline(retriever, llm, ..., support_backend=judge)

The judge is called once per (claim, cited material) pair; use a model at temperature 0.
Verdicts are cached per (claim, material) so repeated samples do not ask twice.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import jsonschema
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from tracerag import usage
from tracerag.errors import ConfigurationError
from tracerag.signals.lexical import LexicalParams, analyse
from tracerag.signals.support import Support, check_inputs, register_backend
from tracerag.text import content_terms

__all__ = [
    "DEFAULT_THRESHOLD",
    "VERDICT_SCHEMA",
    "JudgeSupport",
    "find_quote",
    "unconfigured_judge",
]

#: Score at or above which a (supported) verdict counts as support.
DEFAULT_THRESHOLD = 0.5

VERDICT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "Support verdict",
    "type": "object",
    "required": ["supported", "score", "quote"],
    "properties": {
        "supported": {"type": "boolean"},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "quote": {"type": "string"},
        "reason": {"type": "string"},
    },
    "additionalProperties": False,
}
_VALIDATOR = jsonschema.Draft202012Validator(VERDICT_SCHEMA)

SYSTEM_PROMPT = """You check whether a passage supports a claim. Answer in the claim's language \
if you add a reason.
The claim is supported only if the passage states it: every number, amount, date, duration, \
name, product, condition and negation in the claim must agree with the passage. A claim that \
the passage contradicts, or says nothing about, is not supported.
Reply with one JSON object and nothing else:
{"supported": true or false, "score": a number from 0 to 1 (how fully the passage supports \
the claim), "quote": "the shortest passage text that supports the claim, copied exactly, \
character for character; empty if not supported", "reason": "optional, one short sentence"}"""

_FENCE_RE = re.compile(r"^\s*```(?:json|JSON)?\s*\n?(?P<body>.*?)\n?\s*```\s*$", re.S)


class _Malformed(ValueError):
    """The model's reply is not a valid verdict."""


def unconfigured_judge() -> Any:
    """The registry's factory for ``"judge"`` before a JudgeSupport exists: raises, saying why."""
    raise ConfigurationError(
        "support backend 'judge' needs a chat model and cannot be created by name: build it "
        "with tracerag.signals.judge.JudgeSupport(llm) and pass that instance as the backend "
        "(e.g. RAGPipeline(..., support_backend=JudgeSupport(llm)) or "
        "verify_citations(..., backend=JudgeSupport(llm)))"
    )


register_backend("judge", unconfigured_judge)


def _normalised(text: str, drop_spaces: bool) -> tuple[str, list[int]]:
    """Text with whitespace runs collapsed (or dropped), and each kept char's original offset."""
    chars: list[str] = []
    where: list[int] = []
    pending_space = -1
    for i, ch in enumerate(text):
        if ch.isspace():
            if pending_space < 0:
                pending_space = i
            continue
        if pending_space >= 0 and chars and not drop_spaces:
            chars.append(" ")
            where.append(pending_space)
        pending_space = -1
        chars.append(ch)
        where.append(i)
    return "".join(chars), where


def find_quote(quote: str, material: str) -> tuple[int, int] | None:
    """Offsets of ``quote`` in ``material``, matching verbatim up to whitespace; None if absent.

    Whitespace runs compare equal to one space; when that fails (e.g. a space added between
    Chinese characters) the quote is looked for with all whitespace removed.
    """
    if not quote.strip():
        return None
    for drop in (False, True):
        q, _ = _normalised(quote, drop)
        m, where = _normalised(material, drop)
        at = m.find(q)
        if at >= 0 and q:
            return where[at], where[at + len(q) - 1] + 1
    return None


def _parse_verdict(text: str) -> dict[str, Any]:
    body = text.strip()
    fenced = _FENCE_RE.match(body)
    if fenced:
        body = fenced.group("body").strip()
    try:
        verdict = json.loads(body)
    except ValueError as exc:
        raise _Malformed(f"the reply is not JSON ({getattr(exc, 'msg', exc)})") from None
    errors = sorted(_VALIDATOR.iter_errors(verdict), key=lambda e: list(e.path))
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.path) or "the verdict"
        raise _Malformed(f"{where}: {first.message}")
    return verdict


def _message_text(message: Any) -> str:
    content = getattr(message, "content", message)
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            b if isinstance(b, str) else str(b.get("text", "")) if isinstance(b, dict) else ""
            for b in content
        )
    return str(content)


class JudgeSupport:
    """Support judged by a chat model, with the quote checked against the material.

    ``threshold``: the score at or above which a supported verdict counts. ``max_attempts``:
    how many times the model is asked when its reply is malformed or the call fails.
    ``register``: make this instance the backend named ``name`` (default ``"judge"``).
    ``cache_size``: verdicts kept per (claim, material); 0 turns the cache off.
    """

    def __init__(
        self,
        llm: BaseChatModel,
        threshold: float = DEFAULT_THRESHOLD,
        *,
        max_attempts: int = 3,
        retry_wait: float = 0.2,
        name: str = "judge",
        register: bool = True,
        cache_size: int = 2048,
        params: LexicalParams | None = None,
    ) -> None:
        if not isinstance(llm, BaseChatModel):
            raise ConfigurationError(
                f"JudgeSupport needs a LangChain chat model, got {type(llm).__name__}"
            )
        if not 0.0 < threshold <= 1.0:
            raise ConfigurationError(f"threshold must be in (0, 1], got {threshold!r}")
        if max_attempts < 1:
            raise ConfigurationError(f"max_attempts must be at least 1, got {max_attempts!r}")
        self.llm = llm
        self.threshold = float(threshold)
        self.name = name
        self.max_attempts = int(max_attempts)
        self.retry_wait = float(retry_wait)
        self.params = params or LexicalParams()
        self._cache: OrderedDict[tuple[str, str], Support] = OrderedDict()
        self._cache_size = max(0, int(cache_size))
        self._lock = threading.Lock()
        if register:
            self.register()

    def __repr__(self) -> str:
        return f"JudgeSupport(llm={type(self.llm).__name__}, threshold={self.threshold})"

    @property
    def _mismatch_cap(self) -> float:
        # the highest score a claim with a hard mismatch keeps, as in the lexical backend
        return getattr(self.params, "mismatch_cap", 0.8) * self.threshold

    @property
    def _model(self) -> str:
        for attr in ("model_name", "model", "model_id"):
            value = getattr(self.llm, attr, None)
            if isinstance(value, str) and value:
                return value
        return type(self.llm).__name__

    def register(self) -> None:
        """Make this instance the support backend named ``self.name``."""
        register_backend(self.name, lambda: self)

    def messages(self, claim: str, material_text: str) -> list[BaseMessage]:
        """The prompt the judge is sent for one claim and material."""
        return [
            SystemMessage(content=SYSTEM_PROMPT),
            HumanMessage(
                content=f"<passage>\n{material_text}\n</passage>\n<claim>\n{claim}\n</claim>"
            ),
        ]

    # ------------------------------------------------------------------------------------------

    def __call__(
        self, claim: str, material_text: str, *, corpus: Sequence[str] | None = None
    ) -> Support:
        """Ask the judge whether ``material_text`` supports ``claim``."""
        check_inputs(claim, material_text)
        key = (claim, material_text)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                return cached
        result = self._judge(claim, material_text, corpus)
        if self._cache_size:
            with self._lock:
                self._cache[key] = result
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        return result

    def _ask(self, claim: str, material_text: str) -> tuple[dict[str, Any], int]:
        messages = self.messages(claim, material_text)
        attempts = 0
        retrying = Retrying(
            stop=stop_after_attempt(self.max_attempts),
            wait=wait_exponential(multiplier=self.retry_wait, max=max(self.retry_wait * 8, 0.0)),
            retry=retry_if_exception_type(Exception),
            reraise=True,
        )
        for attempt in retrying:
            with attempt:
                attempts += 1
                message = self.llm.invoke(messages)
                usage.note(
                    usage.usage_of(
                        message, stage=usage.STAGE_VERIFY, model=self._model, prompt=messages
                    )
                )
                reply = _message_text(message)
                try:
                    return _parse_verdict(reply), attempts
                except _Malformed as exc:
                    messages = [
                        *messages,
                        AIMessage(content=reply),
                        HumanMessage(
                            content=f"That reply is not a valid verdict: {exc}. Reply with "
                            "only the JSON object with keys supported, score and quote."
                        ),
                    ]
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _judge(self, claim: str, material_text: str, corpus: Sequence[str] | None) -> Support:
        try:
            verdict, attempts = self._ask(claim, material_text)
        except _Malformed as exc:
            return self._unsupported(
                f"judge gave no valid verdict in {self.max_attempts} attempts: {exc}"
            )
        except Exception as exc:  # a failing judge must not pass a claim: fail closed
            return self._unsupported(
                f"judge call failed after {self.max_attempts} attempts: "
                f"{type(exc).__name__}: {exc}"
            )
        said_supported = bool(verdict["supported"])
        score = float(verdict["score"])
        quote = verdict["quote"]
        reasons: list[str] = []
        note = str(verdict.get("reason") or "").strip()
        span = find_quote(quote, material_text) if quote.strip() else None
        if said_supported:
            if span is None:
                what = "an empty quote" if not quote.strip() else "a quote not in the material"
                return self._unsupported(f"judge verdict discarded: {what} ({quote[:80]!r})")
            if not content_terms(material_text[span[0] : span[1]]):
                return self._unsupported(
                    f"judge verdict discarded: the quote {quote!r} has no content words"
                )
        else:
            score = min(score, self._mismatch_cap)
            reasons.append("judge: not supported")
        start, end = span if span is not None else (0, 0)
        analysis = analyse(claim, material_text, corpus, self.params)
        mismatches = tuple(q.raw for q in analysis.mismatches)
        if mismatches:
            score = min(score, self._mismatch_cap)
            reasons[:0] = [f"{raw} not in material" for raw in mismatches]
        supported = said_supported and score >= self.threshold and not mismatches
        if said_supported and not supported and not mismatches:
            reasons.append(f"judge score {score:.2f} below threshold {self.threshold:.2f}")
        if supported:
            reasons.append("judge: supported, quote found in material")
        if note:
            reasons.append(f"judge says: {note}")
        if attempts > 1:
            reasons.append(f"after {attempts} attempts")
        return Support(
            score=round(max(0.0, min(1.0, score)), 6),
            supported=supported,
            sentence=material_text[start:end],
            start=start,
            end=end,
            backend=self.name,
            reason="; ".join(reasons),
            mismatches=mismatches,
            candidates=((start, end, round(score, 4)),) if span is not None else (),
        )

    def _unsupported(self, reason: str) -> Support:
        return Support(
            score=0.0,
            supported=False,
            sentence="",
            start=0,
            end=0,
            backend=self.name,
            reason=reason,
        )
