"""A support backend that asks a chat model (an "LLM judge") whether a material backs a claim.

The prompt follows the published fact checkers (MiniCheck and its kin): one claim and one chunk
of the material; the model answers with one JSON object::

    {"supported": true, "quote": "<text copied from the chunk>", "score": 0.92}

(``score`` and ``reason`` are optional.) A material longer than ``chunk_chars`` is split at
sentence ends into overlapping chunks that are asked in turn until one supports the claim. A
reply that is not such an object is asked for again (a bounded number of times, telling the
model what was wrong); when no attempt gives one the claim is not supported, with the reason.
The verdict counts only if its quote is found in the chunk, verbatim up to whitespace: the
quote's offsets in the material become the Support's ``start``/``end`` and the quote its
``sentence``. A supported verdict with a quote that is not in the material is discarded
(score 0). The number and date check of the lexical backend still applies: a claim amount,
date, duration or number that the material does not state caps the score below the threshold.

The backend cannot be built by name — it needs a model. Pass the instance wherever a backend is
accepted, or register it explicitly under a name::

    judge = tracerag.JudgeSupport(ChatOpenAI(model="gpt-4o-mini", temperature=0))
    RAGPipeline(retriever, llm, ..., support_backend=judge)
    judge.register()  # optional: makes get_backend("judge") return it

From async code (the pipeline's verify stage) the model is called with ``ainvoke`` and retries
wait with ``asyncio.sleep``, so a slow judge does not hold up other requests. Every model call
and its tokens are reported to the enclosing ``usage_scope`` (the verify span records them).
Use a model at temperature 0; verdicts are cached per (claim, material).

Checker LLMs (``style="minicheck"``): Bespoke-MiniCheck-7B and models trained like it take
their own prompt — MiniCheck's system prompt, then ``Document: …`` and ``Claim: …`` — and
answer "Yes" or "No". Served by Ollama or any OpenAI-compatible server (``ChatOpenAI`` with
the server's ``base_url``), the score is the probability of "Yes" against "No" in the first
token's log-probabilities where the server returns them (``logprobs``: asked for by default
when the chat model has a ``logprobs`` setting, as ``ChatOpenAI`` has), else 1 for Yes and 0
for No. Such a model quotes nothing: the supporting sentence is the sentence of the chunk that
answered Yes which shares most of the claim's weighted words (the lexical alignment).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import jsonschema
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from tenacity import (
    AsyncRetrying,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from tracerag import _usage as usage
from tracerag.errors import ConfigurationError
from tracerag.signals._lexical import LexicalParams, analyse
from tracerag.signals._support import (
    LruCache,
    Support,
    check_inputs,
    record_usage,
    register_backend,
)
from tracerag.text._sentences import split_sentences
from tracerag.text._words import content_terms

__all__ = [
    "DEFAULT_CHECKER_CHUNK_CHARS",
    "DEFAULT_CHUNK_CHARS",
    "DEFAULT_THRESHOLD",
    "MINICHECK_SYSTEM_PROMPT",
    "VERDICT_SCHEMA",
    "JudgeSupport",
    "Style",
    "chunk_material",
    "find_quote",
    "unconfigured_judge",
]

#: Score at or above which a (supported) verdict counts as support.
DEFAULT_THRESHOLD = 0.5
#: Longest material chunk (characters) sent with one claim.
DEFAULT_CHUNK_CHARS = 2400

VERDICT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "Support verdict",
    "type": "object",
    "required": ["supported", "quote"],
    "properties": {
        "supported": {"type": "boolean"},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "quote": {"type": "string"},
        "reason": {"type": "string"},
    },
    "additionalProperties": False,
}
_VALIDATOR = jsonschema.Draft202012Validator(VERDICT_SCHEMA)

SYSTEM_PROMPT = """You are a fact checker. You are given a document and a claim. Decide \
whether the document supports the claim.
The claim is supported only if the document states all of it: every number, amount, date, \
duration, name, product, role, comparison, condition and negation in the claim must agree with \
the document. A claim that the document contradicts, or only partly states, or says nothing \
about, is unsupported. Titles, headings and questions in the document are not statements.
Reply with one JSON object and nothing else:
{"supported": true or false, "quote": "the shortest document text that supports the claim, \
copied exactly, character for character; empty if unsupported", "score": a number from 0 to 1 \
(how sure you are that the document supports the claim), "reason": "optional, one short \
sentence in the claim's language"}"""

#: Bespoke-MiniCheck's instruction, as its authors publish it (the model was trained with it).
MINICHECK_SYSTEM_PROMPT = (
    "Determine whether the provided claim is consistent with the corresponding document. "
    "Consistency in this context implies that all information presented in the claim is "
    "substantiated by the document. If not, it should be considered inconsistent. Please assess "
    'the claim\'s consistency with the document by responding with either "Yes" or "No".'
)
#: Longest material chunk (characters) a checker LLM is sent with one claim: Bespoke-MiniCheck
#: reads 32k tokens; smaller servers' windows are the usual limit.
DEFAULT_CHECKER_CHUNK_CHARS = 6000
Style = Literal["json", "minicheck"]
_YES_NO_RE = re.compile(r"^\W*(yes|no)\b", re.I)

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
        verdict: dict[str, Any] = json.loads(body)
    except ValueError as exc:
        raise _Malformed(f"the reply is not JSON ({getattr(exc, 'msg', exc)})") from None
    errors = sorted(_VALIDATOR.iter_errors(verdict), key=lambda e: list(e.path))
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.path) or "the verdict"
        raise _Malformed(f"{where}: {first.message}")
    return verdict


def chunk_material(
    material_text: str, max_chars: int = DEFAULT_CHUNK_CHARS
) -> list[tuple[int, int]]:
    """``[start, end)`` offsets of chunks of the material, at most ``max_chars`` long where its
    sentences allow, cut at sentence ends; neighbouring chunks share one sentence."""
    if len(material_text) <= max_chars:
        return [(0, len(material_text))]
    sentences = split_sentences(material_text)
    if not sentences:
        return [(0, len(material_text))]
    chunks: list[tuple[int, int]] = []
    i = 0
    while i < len(sentences):
        j = i
        while j + 1 < len(sentences) and sentences[j + 1].end - sentences[i].start <= max_chars:
            j += 1
        chunks.append((sentences[i].start, sentences[j].end))
        if j + 1 >= len(sentences):
            break
        i = j if j > i else j + 1  # the last sentence of a chunk opens the next one
    return chunks


def _tokens_of(message: Any) -> tuple[int, int]:
    reported = getattr(message, "usage_metadata", None) or {}
    return int(reported.get("input_tokens") or 0), int(reported.get("output_tokens") or 0)


@dataclass
class _Asked:
    verdict: dict[str, Any]
    attempts: int


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


def _first_token_yes(message: Any) -> float | None:
    """P(Yes) / (P(Yes) + P(No)) from the first generated token's top log-probabilities (the
    OpenAI shape: ``response_metadata["logprobs"]["content"][0]["top_logprobs"]``), or None when
    the reply carries none or neither answer is among them."""
    meta = getattr(message, "response_metadata", None) or {}
    logprobs = meta.get("logprobs") if isinstance(meta, dict) else None
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not content or not isinstance(content, list) or not isinstance(content[0], dict):
        return None
    first = content[0]
    options = first.get("top_logprobs") or [first]
    yes = no = 0.0
    for option in options:
        if not isinstance(option, dict):
            continue
        token = str(option.get("token", "")).strip().lower()
        try:
            p = math.exp(float(option.get("logprob", -math.inf)))
        except (TypeError, ValueError, OverflowError):
            continue
        if token == "yes":
            yes += p
        elif token == "no":
            no += p
    return yes / (yes + no) if yes + no > 0 else None


def _parse_yes_no(message: Any) -> dict[str, Any]:
    """A checker LLM's verdict. With first-token log-probabilities that rank "Yes" or "No",
    the score is P(Yes) / (P(Yes) + P(No)) whatever token was drawn (as MiniCheck reads its
    checker); otherwise the reply must start with Yes or No, which scores 1 or 0."""
    probability = _first_token_yes(message)
    if probability is not None:
        return {
            "supported": probability >= 0.5,
            "quote": "",
            "score": probability,
            "logprobs": True,
        }
    text = _message_text(message).strip()
    found = _YES_NO_RE.match(text)
    if not found:
        raise _Malformed(f"the reply {text[:60]!r} is neither Yes nor No")
    said_yes = found.group(1).lower() == "yes"
    return {
        "supported": said_yes,
        "quote": "",
        "score": 1.0 if said_yes else 0.0,
        "logprobs": False,
    }


class JudgeSupport:
    """Support judged by a chat model, with the quote checked against the material.

    ``threshold``: the score at or above which a supported verdict counts. ``max_attempts``:
    how many times the model is asked when its reply is malformed or the call fails.
    ``chunk_chars``: the longest material chunk sent with one claim (default 2400 characters,
    6000 for ``style="minicheck"``). ``style``: ``"json"`` (the JSON verdict with a quote) or
    ``"minicheck"`` (a checker LLM's Yes/No). ``logprobs``: ask for the first token's
    log-probabilities (None: when the chat model has that setting). ``cache_size``: verdicts
    kept per (claim, material); 0 turns the cache off. The instance is not registered under a
    name unless ``register()`` is called.
    """

    def __init__(
        self,
        llm: BaseChatModel,
        threshold: float = DEFAULT_THRESHOLD,
        *,
        max_attempts: int = 3,
        retry_wait: float = 0.2,
        name: str = "judge",
        chunk_chars: int | None = None,
        cache_size: int = 2048,
        params: LexicalParams | None = None,
        style: Style = "json",
        logprobs: bool | None = None,
        top_logprobs: int = 5,
    ) -> None:
        if style not in ("json", "minicheck"):
            raise ConfigurationError(f"judge style must be 'json' or 'minicheck', got {style!r}")
        if not isinstance(llm, BaseChatModel):
            raise ConfigurationError(
                f"JudgeSupport needs a LangChain chat model, got {type(llm).__name__}"
            )
        if not 0.0 < threshold <= 1.0:
            raise ConfigurationError(f"threshold must be in (0, 1], got {threshold!r}")
        if max_attempts < 1:
            raise ConfigurationError(f"max_attempts must be at least 1, got {max_attempts!r}")
        if chunk_chars is None:
            minicheck = style == "minicheck"
            chunk_chars = DEFAULT_CHECKER_CHUNK_CHARS if minicheck else DEFAULT_CHUNK_CHARS
        if chunk_chars < 200:
            raise ConfigurationError(f"chunk_chars must be at least 200, got {chunk_chars!r}")
        self.llm = llm
        self.style: Style = style
        if logprobs is None:  # ask only models that have the setting (ChatOpenAI and its kin)
            logprobs = style == "minicheck" and "logprobs" in getattr(type(llm), "model_fields", {})
        self.logprobs = bool(logprobs)
        self._caller: Any = (
            llm.bind(logprobs=True, top_logprobs=int(top_logprobs)) if self.logprobs else llm
        )
        self.threshold = float(threshold)
        self.name = name
        self.max_attempts = int(max_attempts)
        self.retry_wait = float(retry_wait)
        self.chunk_chars = int(chunk_chars)
        self.params = params or LexicalParams()
        self._cache: LruCache[tuple[str, str], Support] = LruCache(cache_size)

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

    def messages(self, claim: str, chunk: str) -> list[BaseMessage]:
        """The prompt the judge is sent for one claim and one chunk of a material."""
        if self.style == "minicheck":
            return [
                SystemMessage(content=MINICHECK_SYSTEM_PROMPT),
                HumanMessage(content=f"Document: {chunk}\nClaim: {claim}"),
            ]
        return [
            SystemMessage(content=SYSTEM_PROMPT),
            HumanMessage(content=f"<document>\n{chunk}\n</document>\n<claim>\n{claim}\n</claim>"),
        ]

    # ------------------------------------------------------------------------------------------

    def _cached(self, key: tuple[str, str]) -> Support | None:
        cached = self._cache.get(key)
        if cached is not None:
            record_usage(cached=1)
        return cached

    def __call__(
        self, claim: str, material_text: str, *, corpus: Sequence[str] | None = None
    ) -> Support:
        """Ask the judge whether ``material_text`` supports ``claim`` (blocking)."""
        key, cached = self._lookup(claim, material_text)
        if cached is not None:
            return cached
        mismatches = self._mismatches(claim, material_text, corpus)
        verdicts: list[tuple[tuple[int, int], _Asked | Exception]] = []
        for span in chunk_material(material_text, self.chunk_chars):
            verdicts.append((span, self._ask_chunk(claim, material_text, span)))
            if self._settles(verdicts[-1][1], material_text, span):
                break
        return self._cache.put(key, self._conclude(material_text, verdicts, mismatches, claim))

    async def acheck(
        self, claim: str, material_text: str, *, corpus: Sequence[str] | None = None
    ) -> Support:
        """Ask the judge whether ``material_text`` supports ``claim``, without blocking the loop."""
        key, cached = self._lookup(claim, material_text)
        if cached is not None:
            return cached
        mismatches = await asyncio.to_thread(self._mismatches, claim, material_text, corpus)
        verdicts: list[tuple[tuple[int, int], _Asked | Exception]] = []
        for span in chunk_material(material_text, self.chunk_chars):
            verdicts.append((span, await self._aask_chunk(claim, material_text, span)))
            if self._settles(verdicts[-1][1], material_text, span):
                break
        return self._cache.put(key, self._conclude(material_text, verdicts, mismatches, claim))

    def _lookup(self, claim: str, material_text: str) -> tuple[tuple[str, str], Support | None]:
        """The cache key of a checked (claim, material) and the verdict kept for it, if any."""
        check_inputs(claim, material_text)
        key = (claim, material_text)
        return key, self._cached(key)

    def _ask_chunk(
        self, claim: str, material_text: str, span: tuple[int, int]
    ) -> _Asked | Exception:
        try:
            return self._ask(claim, material_text[span[0] : span[1]])
        except Exception as exc:
            return exc

    async def _aask_chunk(
        self, claim: str, material_text: str, span: tuple[int, int]
    ) -> _Asked | Exception:
        try:
            return await self._aask(claim, material_text[span[0] : span[1]])
        except Exception as exc:
            return exc

    def _mismatches(
        self, claim: str, material_text: str, corpus: Sequence[str] | None
    ) -> tuple[str, ...]:
        analysis = analyse(claim, material_text, corpus, self.params)
        return tuple(q.raw for q in analysis.mismatches)

    def _retry_args(self) -> dict[str, Any]:
        return {
            "stop": stop_after_attempt(self.max_attempts),
            "wait": wait_exponential(multiplier=self.retry_wait, max=max(self.retry_wait * 8, 0.0)),
            "retry": retry_if_exception_type(Exception),
            "reraise": True,
        }

    def _correction(
        self, messages: list[BaseMessage], reply: str, exc: _Malformed
    ) -> list[BaseMessage]:
        if self.style == "minicheck":
            return [
                *messages,
                AIMessage(content=reply),
                HumanMessage(content='Answer with "Yes" or "No" only.'),
            ]
        return [
            *messages,
            AIMessage(content=reply),
            HumanMessage(
                content=f"That reply is not a valid verdict: {exc}. Reply with only the JSON "
                "object with keys supported and quote (score and reason optional)."
            ),
        ]

    def _ask(self, claim: str, chunk: str) -> _Asked:
        messages = self.messages(claim, chunk)
        attempts = 0
        for attempt in Retrying(**self._retry_args()):
            with attempt:
                attempts += 1
                record_usage(calls=1)
                return _Asked(self._read(self._caller.invoke(messages), messages), attempts)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _aask(self, claim: str, chunk: str) -> _Asked:
        messages = self.messages(claim, chunk)
        attempts = 0
        async for attempt in AsyncRetrying(**self._retry_args()):
            with attempt:
                attempts += 1
                record_usage(calls=1)
                reply = await self._caller.ainvoke(messages)
                return _Asked(self._read(reply, messages), attempts)
        raise AssertionError("unreachable")  # pragma: no cover

    def _read(self, message: BaseMessage, messages: list[BaseMessage]) -> dict[str, Any]:
        """The verdict in one reply, its cost counted; a malformed reply raises ``_Malformed``
        after the correction is appended to ``messages`` (in place) for the next attempt."""
        tokens_in, tokens_out = _tokens_of(message)
        record_usage(input_tokens=tokens_in, output_tokens=tokens_out)
        usage.note(
            usage.usage_of(message, stage=usage.STAGE_VERIFY, model=self._model, prompt=messages)
        )
        reply = _message_text(message)
        try:
            if self.style == "minicheck":
                return _parse_yes_no(message)
            return _parse_verdict(reply)
        except _Malformed as exc:
            messages[:] = self._correction(messages, reply, exc)
            raise

    @staticmethod
    def _quote_span(
        asked: _Asked, material_text: str, span: tuple[int, int]
    ) -> tuple[int, int] | None:
        quote = asked.verdict["quote"]
        found = find_quote(quote, material_text[span[0] : span[1]]) if quote.strip() else None
        return (found[0] + span[0], found[1] + span[0]) if found else None

    def _settles(
        self, asked: _Asked | Exception, material_text: str, span: tuple[int, int]
    ) -> bool:
        """Whether a chunk's verdict ends the search: a supported verdict with a real quote (a
        checker LLM's: a score at the threshold)."""
        if not isinstance(asked, _Asked) or not asked.verdict["supported"]:
            return False
        if self.style == "minicheck":
            return self._score_of(asked) >= self.threshold
        found = self._quote_span(asked, material_text, span)
        return found is not None and bool(content_terms(material_text[found[0] : found[1]]))

    def _conclude(
        self,
        material_text: str,
        verdicts: list[tuple[tuple[int, int], _Asked | Exception]],
        mismatches: tuple[str, ...],
        claim: str = "",
    ) -> Support:
        span, asked = verdicts[-1]
        if isinstance(asked, Exception):
            failures = [a for _, a in verdicts if isinstance(a, Exception)]
            if len(failures) < len(verdicts):  # an earlier chunk answered: use the best answer
                span, asked = max(
                    ((s, a) for s, a in verdicts if isinstance(a, _Asked)),
                    key=lambda sa: self._score_of(sa[1]),
                )
            elif isinstance(asked, _Malformed):
                return self._unsupported(
                    f"judge gave no valid verdict in {self.max_attempts} attempts: {asked}"
                )
            else:  # a failing judge must not pass a claim: fail closed
                return self._unsupported(
                    f"judge call failed after {self.max_attempts} attempts: "
                    f"{type(asked).__name__}: {asked}"
                )
        assert isinstance(asked, _Asked)
        if self.style == "minicheck":
            return self._conclude_checker(material_text, verdicts, mismatches, claim)
        verdict = asked.verdict
        said_supported = bool(verdict["supported"])
        score = self._score_of(asked)
        quote = verdict["quote"]
        reasons: list[str] = []
        note = str(verdict.get("reason") or "").strip()
        found = self._quote_span(asked, material_text, span)
        if said_supported:
            if found is None:
                what = "an empty quote" if not quote.strip() else "a quote not in the material"
                return self._unsupported(f"judge verdict discarded: {what} ({quote[:80]!r})")
            if not content_terms(material_text[found[0] : found[1]]):
                return self._unsupported(
                    f"judge verdict discarded: the quote {quote!r} has no content words"
                )
        else:
            score = min(score, self._mismatch_cap)
            reasons.append("judge: not supported")
            if len(verdicts) > 1:
                reasons.append(f"in none of {len(verdicts)} chunks")
        start, end = found if found is not None else (0, 0)
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
        if asked.attempts > 1:
            reasons.append(f"after {asked.attempts} attempts")
        return self._support(
            material_text, score, supported, (start, end), reasons, mismatches, found is not None
        )

    def _conclude_checker(
        self,
        material_text: str,
        verdicts: list[tuple[tuple[int, int], _Asked | Exception]],
        mismatches: tuple[str, ...],
        claim: str,
    ) -> Support:
        """A checker LLM's verdict: the best-scoring chunk wins; its sentence that shares most
        of the claim is the supporting sentence."""
        answered = [(span, a) for span, a in verdicts if isinstance(a, _Asked)]
        span, asked = max(answered, key=lambda sa: self._score_of(sa[1]))
        score = self._score_of(asked)
        said_yes = bool(asked.verdict["supported"])
        reasons: list[str] = []
        how = "first-token probability" if asked.verdict.get("logprobs") else "answer"
        reasons.append(f"checker LLM: {'Yes' if said_yes else 'No'} ({how} {score:.2f})")
        if len(verdicts) > 1:
            reasons.append(f"best of {len(answered)} chunks asked")
        if len(answered) < len(verdicts):
            reasons.append(f"{len(verdicts) - len(answered)} chunks failed")
        if mismatches:
            score = min(score, self._mismatch_cap)
            reasons[:0] = [f"{raw} not in material" for raw in mismatches]
        supported = score >= self.threshold and not mismatches
        if not supported and not mismatches and said_yes:
            reasons.append(f"score below threshold {self.threshold:.2f}")
        if asked.attempts > 1:
            reasons.append(f"after {asked.attempts} attempts")
        inside = [s for s in split_sentences(material_text) if span[0] <= s.start < span[1]]
        claim_terms = set(content_terms(claim))
        best = max(
            inside, key=lambda s: len(claim_terms & set(content_terms(s.text))), default=None
        )
        start, end = (best.start, best.end) if best is not None else span
        return self._support(material_text, score, supported, (start, end), reasons, mismatches)

    def _support(
        self,
        material_text: str,
        score: float,
        supported: bool,
        span: tuple[int, int],
        reasons: list[str],
        mismatches: tuple[str, ...],
        located: bool = True,
    ) -> Support:
        """The verdict as a ``Support``: the score clamped to [0, 1], the sentence at ``span``,
        and that sentence as the one candidate when it was located in the material."""
        start, end = span
        return Support(
            score=round(max(0.0, min(1.0, score)), 6),
            supported=supported,
            sentence=material_text[start:end],
            start=start,
            end=end,
            backend=self.name,
            reason="; ".join(reasons),
            mismatches=mismatches,
            candidates=((start, end, round(score, 4)),) if located else (),
        )

    @staticmethod
    def _score_of(asked: _Asked) -> float:
        verdict = asked.verdict
        if "score" in verdict:
            return float(verdict["score"])
        return 1.0 if verdict["supported"] else 0.0

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
