"""The state of one request: its input and the typed, immutable output of each stage.

Each stage reads the ``RequestState`` built so far and returns its own output (``Registration``,
``Retrieval``, ``Plan``, ``SampleSet``, ``Verification``, ``Decision``); the runner puts that
output into a new state. No stage changes what an earlier stage produced.

Each part of the state declares what it says and where each value goes in a class-level
``SIGNALS`` table (see ``tracerag._declare``): its stage span's attributes, the stage event's
signals, the audit record, the metrics, the root span. ``to_record()`` (the JSON-able audit
record; ``tracerag.store.AuditRecord`` is its typed reader), ``root_attributes()``,
``root_metadata()`` and ``outcome_fields()`` are derived from those tables, as are a stage
span's attributes (``tracerag._declare.span_attributes``) and a stage event's signals.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from tracerag import _semconv as semconv
from tracerag._choices import PlanMode, Route, Stage, Tier
from tracerag._declare import (
    EACH,
    LEAVES,
    OMIT,
    Compiled,
    Declared,
    Signal,
    attributes,
    compiled,
    jsonable,
)
from tracerag.errors import InputError
from tracerag.signals._attribution import (
    RetrievalExplanation,
    ShapeThresholds,
    explain_retrieval,
)
from tracerag.signals._types import Material, Plan, utcnow
from tracerag.telemetry._content_capture import capture
from tracerag.text._followup import ResolutionMethod, resolve_turn
from tracerag.text._unicode import first_lone_surrogate, fix_surrogates, is_invisible

if TYPE_CHECKING:
    from tracerag._routing import Ticket
    from tracerag.contract import ClaimCheck, Evidence, MaterialUse, Response, SignalDetail
    from tracerag.contract import Versions as ResponseVersions
    from tracerag.signals._attribution import Attribution
    from tracerag.signals._citations import CitationReport
    from tracerag.signals._consistency import ConsistencyReport
    from tracerag.signals._relevance import RelevanceReport
    from tracerag.signals._rules import RuleResult

__all__ = [
    "INPUT_KEYS",
    "MAX_EARLIER_TURNS",
    "RECORD_LAYOUT",
    "RECORD_VERSION",
    "Conversation",
    "ConversationSource",
    "Decision",
    "ErrorLog",
    "PlanResult",
    "Registration",
    "RequestInput",
    "RequestState",
    "Retrieval",
    "RunVersions",
    "Sample",
    "SampleSet",
    "Selection",
    "StageError",
    "StageRefusal",
    "Verification",
    "parse_input",
]

#: The layout version of the audit record ``RequestState.to_record()`` writes.
RECORD_VERSION = 2

INPUT_KEYS = frozenset(
    {"question", "session_id", "user_id", "channel", "request_id", "chat_history", "messages"}
)

#: The user's earlier turns a request is read with (and its record keeps), at most: the last.
MAX_EARLIER_TURNS = 20

#: Where a request's earlier turns come from: the request's ``chat_history``, the earlier
#: messages of the app's ``messages`` input, the app's checkpointed thread, or the history of a
#: ``RunnableWithMessageHistory``.
ConversationSource = Literal["chat_history", "messages", "thread", "history"]


@dataclass(frozen=True)
class Conversation:
    """The conversation a request's turn belongs to, and the standalone question it asks.

    ``earlier`` are the user's earlier turns (oldest first); ``standalone`` the question the
    turn asks read with them (``tracerag.text._followup``), which the verifier and the
    relevance check use; ``method`` how it was resolved (``standalone``: the turn as it is;
    ``substituted``, ``joined``, ``context``; ``rewriter``: the configured rewriter's);
    ``source`` where the earlier turns were read; ``rewriter_error`` why the configured
    question rewriter gave no question, when it failed (its turn is then resolved without it);
    ``read_error`` why the app's conversation store could not be read (the turn is then read
    with what the input holds).
    """

    earlier: tuple[str, ...]
    standalone: str
    method: ResolutionMethod
    source: ConversationSource
    #: why the configured rewriter gave no question (the turn was resolved without it)
    rewriter_error: str | None = None
    #: why the app's conversation could not be read (the turn was read on its own)
    read_error: str | None = None

    @classmethod
    def of(cls, turn: str, earlier: Sequence[str], source: ConversationSource) -> Conversation:
        """The conversation of ``turn`` after ``earlier``, resolved without a model."""
        resolved = resolve_turn(turn, earlier)
        return cls(tuple(earlier), resolved.question, resolved.method, source)

    def to_record(self) -> dict[str, Any]:
        """The record's ``conversation`` section."""
        record: dict[str, Any] = {
            "source": self.source,
            "resolution": self.method,
            "earlier_turns": len(self.earlier),
            "earlier_questions": list(self.earlier),
        }
        if self.rewriter_error is not None:
            record["rewriter_error"] = self.rewriter_error
        if self.read_error is not None:
            record["read_error"] = self.read_error
        return record


def _conversation_record(i: RequestInput) -> Any:
    return i.conversation.to_record() if i.conversation is not None else None


def _user_turns(value: Any, key: str) -> tuple[str, ...]:
    """The user turns of a chat history in any form LangChain accepts for messages."""
    from langchain_core.messages import HumanMessage, convert_to_messages

    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise InputError(
            f"{key} must be a list of chat messages (HumanMessage/AIMessage objects, "
            f"(role, text) tuples or role dicts), got {type(value).__name__}"
        )
    try:
        messages = convert_to_messages(list(value))
    except Exception as exc:  # LangChain refuses the same input with the same error
        raise InputError(f"{key} is not a list of chat messages LangChain can read: {exc}") from exc
    turns = []
    for message in messages:
        if isinstance(message, HumanMessage):
            text = message.text if isinstance(message.text, str) else str(message.content)
            if first_lone_surrogate(text) is not None:
                raise InputError(f"{key} holds a message that is not valid Unicode")
            if text.strip():
                turns.append(text.strip())
    return tuple(turns)


@dataclass(frozen=True)
class StageError:
    """Something that went wrong in a stage: kept as data, never lost."""

    stage: str
    type: str
    message: str
    at: str
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The error as it appears in the audit record."""
        return {
            "stage": str(self.stage),
            "type": self.type,
            "message": self.message,
            **jsonable(dict(self.extra)),
            "at": self.at,
        }


class ErrorLog:
    """The errors one stage run collects (retries included), in the order they happened."""

    def __init__(self) -> None:
        self._errors: list[StageError] = []

    def record_error(self, stage: str, error: BaseException | str, **extra: Any) -> None:
        """Keep an error with its stage."""
        if isinstance(error, BaseException):
            kind, message = type(error).__name__, str(error)
        else:
            kind, message = "error", error
        self._errors.append(
            StageError(stage, kind, message, utcnow().isoformat(), MappingProxyType(extra))
        )

    def freeze(self) -> tuple[StageError, ...]:
        """The errors collected so far."""
        return tuple(self._errors)


class StageRefusal(Exception):
    """A stage that finished its output and refuses the request all the same.

    The runner keeps ``output`` in the request's state (so the audit record shows what the
    stage did), then fails the request with ``error``.
    """

    def __init__(self, error: BaseException, output: Any) -> None:
        super().__init__(str(error))
        self.error = error
        self.output = output


@dataclass(frozen=True)
class RequestInput:
    """What the caller asked, checked: a non-empty question and optional ids.

    ``app_input`` (``wrap()`` only) is the caller's input as the wrapped app takes it, passed
    to the app unchanged; None when the app's input is made from the question.
    ``conversation``: the earlier turns the question follows and the standalone question it
    asks (None: a request on its own); ``question`` stays the turn as the user wrote it.
    """

    question: str
    session_id: str | None = None
    user_id: str | None = None
    channel: str | None = None
    request_id: str | None = None
    started_at: datetime = field(default_factory=utcnow)
    app_input: Any = field(default=None, compare=False, repr=False)
    conversation: Conversation | None = None

    #: the request's input: in the record, on the root span and (as the stage that registers
    #: it) on the register span
    SIGNALS: ClassVar[tuple[Signal, ...]] = (
        Signal(
            lambda i: i.question,
            record="question",
            span=semconv.OI_INPUT_VALUE,
            root=semconv.OI_INPUT_VALUE,
            span_as=capture,
        ),
        # a conversation's turn: the standalone question it asks (none for a request on its own,
        # whose question is what it asks)
        Signal(
            lambda i: i.conversation.standalone if i.conversation is not None else None,
            record="standalone_question",
            span=semconv.QUESTION_STANDALONE,
            root=semconv.QUESTION_STANDALONE,
            span_as=capture,
        ),
        Signal(
            lambda i: i.conversation.method if i.conversation is not None else None,
            span=semconv.QUESTION_RESOLUTION,
            root=semconv.QUESTION_RESOLUTION,
        ),
        Signal(
            lambda i: len(i.conversation.earlier) if i.conversation is not None else None,
            span=semconv.CONVERSATION_TURNS,
            root=semconv.CONVERSATION_TURNS,
        ),
        Signal(
            lambda i: i.conversation.source if i.conversation is not None else None,
            span=semconv.CONVERSATION_SOURCE,
        ),
        Signal(_conversation_record, record="conversation", is_json=True),
        Signal(lambda i: i.session_id, record="session_id", root=semconv.OI_SESSION_ID, when=bool),
        Signal(lambda i: i.user_id, record="user_id", root=semconv.OI_USER_ID, when=bool),
        Signal(
            lambda i: i.channel,
            record="channel",
            span=semconv.CHANNEL,
            root=semconv.CHANNEL,
            when=bool,
        ),
        Signal(lambda i: i.started_at.isoformat(), record="started_at", span=semconv.STARTED_AT),
    )

    @property
    def standalone_question(self) -> str:
        """The question the turn asks, read with the conversation (the turn on its own)."""
        return self.conversation.standalone if self.conversation is not None else self.question

    def following(
        self,
        earlier: Sequence[str],
        source: ConversationSource,
        *,
        standalone: str | None = None,
        method: ResolutionMethod | None = None,
    ) -> RequestInput:
        """This request as the turn after the user's ``earlier`` turns (none: as it is).

        The standalone question is resolved without a model unless ``standalone`` (with its
        ``method``, e.g. ``rewriter``) is given. The last ``MAX_EARLIER_TURNS`` turns are read
        (and recorded): a follow-up leans on the turns just before it.
        """
        turns = tuple(t.strip() for t in earlier if t.strip())[-MAX_EARLIER_TURNS:]
        if not turns:
            return self
        conversation = Conversation.of(self.question, turns, source)
        if standalone is not None and standalone.strip():
            conversation = Conversation(turns, standalone.strip(), method or "rewriter", source)
        return replace(self, conversation=conversation)

    @classmethod
    def parse(cls, value: Any, *, max_chars: int = 8000) -> RequestInput:
        """A RequestInput from a question string or a dict; InputError on anything else.

        A dict's ``chat_history`` (the conversation's earlier messages, in any form LangChain
        accepts for messages) makes the request a turn of that conversation: its standalone
        question is resolved from the user's earlier turns (``Conversation``). A dict may give
        ``messages`` instead of ``question``: a chat input whose last user message is the
        question and whose earlier ones are the conversation.

        Refused: a question that is empty or shows nothing (only whitespace, zero-width or other
        invisible characters), longer than ``max_chars``, or any field that is not valid Unicode
        (a lone UTF-16 surrogate such as ``"\\ud800"``). Surrogate pairs are joined into the
        character they encode.
        """
        if isinstance(value, RequestInput):
            data: dict[str, Any] = {
                k: getattr(value, k)
                for k in (
                    "question",
                    *sorted(INPUT_KEYS - {"question", "chat_history", "messages"}),
                )
            }
        elif isinstance(value, str):
            data = {"question": value}
        elif isinstance(value, dict):
            unknown = set(value) - INPUT_KEYS
            if unknown:
                raise InputError(
                    f"unknown input field(s) {sorted(unknown)}; accepted: {sorted(INPUT_KEYS)}"
                )
            data = dict(value)
        else:
            raise InputError(
                "input must be a question string or a dict with 'question', "
                f"got {type(value).__name__}"
            )
        earlier: tuple[str, ...] | None = None
        source: ConversationSource = "chat_history"
        if data.get("messages") is not None:
            # a chat input: the question is its last user message, the ones before it the
            # conversation's earlier turns
            if "question" in data or data.get("chat_history") is not None:
                raise InputError(
                    "give the question as 'question' (with 'chat_history') or as the last "
                    "user message of 'messages', not both"
                )
            turns = _user_turns(data["messages"], "messages")
            if not turns:
                raise InputError(
                    "messages holds no user message with text; the question is the last one"
                )
            data["question"], earlier, source = turns[-1], turns[:-1], "messages"
        elif data.get("chat_history") is not None:
            earlier = _user_turns(data["chat_history"], "chat_history")
        question = data.get("question")
        if not isinstance(question, str) or not question.strip():
            raise InputError("the question must be a non-empty string")
        if len(question) > max_chars:
            raise InputError(
                f"the question is {len(question)} characters; the limit is {max_chars}"
            )
        for key in ("question", "session_id", "user_id", "channel", "request_id"):
            field_value = data.get(key)
            if field_value is None:
                continue
            if not isinstance(field_value, str):
                raise InputError(f"{key} must be a string")
            lone = first_lone_surrogate(field_value)
            if lone is not None:
                raise InputError(
                    f"{key} is not valid Unicode: a lone UTF-16 surrogate at character {lone}"
                )
            data[key] = fix_surrogates(field_value)
        question = data["question"]
        if is_invisible(question):
            raise InputError("the question shows no visible character")
        parsed = cls(
            question=question.strip(),
            session_id=data.get("session_id"),
            user_id=data.get("user_id"),
            channel=data.get("channel"),
            request_id=data.get("request_id") or None,
            conversation=value.conversation if isinstance(value, RequestInput) else None,
        )
        if earlier is None:
            return parsed
        return parsed.following(earlier, source)


def parse_input(value: Any, *, max_chars: int = 8000) -> RequestInput:
    """A RequestInput from a question string or a dict; InputError on anything else."""
    return RequestInput.parse(value, max_chars=max_chars)


@dataclass(frozen=True)
class RunVersions:
    """Which prompt, model and tracerag produced an answer, and how each version was obtained.

    ``prompt_source``: ``argument``, ``template`` (the app's prompt templates), ``run-template``
    (templates its runs formatted) or ``model-input`` (a fingerprint of what reached the model);
    ``model_source``: ``argument``, ``app`` or ``run`` (see ``tracerag.wrap``).
    """

    prompt: str | None = None
    model: str | None = None
    tracerag: str = ""
    prompt_source: str | None = None
    model_source: str | None = None


def _sampling(r: Registration) -> str:
    """The sampling parameters as OpenInference's invocation parameters (JSON)."""
    params = {"n_samples": r.n_samples, "temperature": r.temperature, "plan_mode": r.plan_mode}
    return json.dumps({**params, "k": r.k}, default=str)


@dataclass(frozen=True)
class Registration:
    """Stage 1: the request's id, tier, versions and sampling parameters.

    ``versions_from_runs`` names the versions (``prompt``, ``model``) neither given nor found
    in a wrapped app: the sample stage learns them from the app's runs, or refuses the request.
    """

    request_id: str
    tier: Tier
    versions: RunVersions
    n_samples: int
    temperature: float
    plan_mode: PlanMode
    k: int | None = None
    versions_from_runs: tuple[str, ...] = ()

    SIGNALS: ClassVar[tuple[Signal, ...]] = (
        Signal(lambda r: r.request_id, span=semconv.REQUEST_ID),
        Signal(
            lambda r: r.tier,
            span=semconv.TIER,
            stream="tier",
            record="tier",
            metric="tier",
            root=semconv.TIER,
            meta="tier",
        ),
        Signal(
            lambda r: r.n_samples,
            span=semconv.N_SAMPLES,
            stream="n_samples",
            record="params.n_samples",
        ),
        # the registered versions (the root span and the record show those the runs taught too)
        Signal(
            lambda r: r.versions.prompt,
            span=semconv.VERSION_PROMPT,
            when=bool,
            stream="prompt_version",
            metric="prompt_version",
        ),
        Signal(
            lambda r: r.versions.model,
            span=semconv.VERSION_MODEL,
            when=bool,
            stream="model_version",
            metric="model_version",
        ),
        # how each registered version was obtained
        Signal(
            lambda r: (r.versions.prompt_source or "argument") if r.versions.prompt else None,
            span=semconv.VERSION_PROMPT_SOURCE,
        ),
        Signal(
            lambda r: (r.versions.model_source or "argument") if r.versions.model else None,
            span=semconv.VERSION_MODEL_SOURCE,
        ),
        Signal(lambda r: r.versions.tracerag, span=semconv.VERSION_TRACERAG),
        Signal(
            lambda r: r.temperature,
            span=semconv.TEMPERATURE,
            span_as=float,
            record="params.temperature",
        ),
        Signal(lambda r: r.plan_mode, span=semconv.PLAN_MODE, record="params.plan_mode"),
        Signal(lambda r: r.k, record="params.k"),
        Signal(
            lambda r: list(r.versions_from_runs) or OMIT,
            span=semconv.VERSION_FROM_RUNS,
            record="params.versions_from_runs",
        ),
        Signal(_sampling, span=semconv.OI_LLM_INVOCATION_PARAMETERS),
    )

    @property
    def params(self) -> dict[str, Any]:
        """The sampling parameters as the audit record keeps them."""
        params: dict[str, Any] = _record_of(self).get("params", {})
        return params


def _documents(r: Retrieval) -> dict[str, Any]:
    """The materials as OpenInference retrieval documents (their text under the capture policy)."""
    attrs: dict[str, Any] = {}
    for i, m in enumerate(r.materials):
        attrs[semconv.oi_document(i, "id")] = m.id
        content = capture(m.text)
        if content is not None:
            attrs[semconv.oi_document(i, "content")] = content
        if m.score is not None:
            attrs[semconv.oi_document(i, "score")] = float(m.score)
        attrs[semconv.oi_document(i, "metadata")] = json.dumps(
            {"title": m.title, "source": m.source, "rank": m.rank},
            ensure_ascii=False,
            default=str,
        )
    return attrs


def _retrieved_count(s: RequestState) -> int:
    # an app that retrieves only inside its runs (source "runs") has its runs' materials
    # counted as its retrieval
    r = s.retrieval
    assert r is not None
    return len(s.materials if r.source == "runs" else r.materials)


def _added_from_runs(s: RequestState) -> Any:
    added = s.samples.extra_materials if s.samples is not None else ()
    return [m.id for m in added] if added else OMIT


@dataclass(frozen=True)
class Retrieval:
    """Stage 2: the retrieved materials in rank order, and what their scores say.

    ``source`` (``wrap()`` only) says where the materials come from: ``retriever`` (called in
    this stage) or ``runs`` (the app retrieves only inside its runs; the sample stage adds them).
    """

    materials: tuple[Material, ...] = ()
    scored: bool = False
    top_score: float | None = None
    score_margin: float | None = None
    note: str | None = None
    errors: tuple[StageError, ...] = ()
    #: the score shape (``tracerag.signals._attribution``): clear, moderate, clustered, single…
    shape: str | None = None
    relative_margin: float | None = None
    near_top: tuple[str, ...] = ()
    source: str | None = None
    #: the full score-shape explanation the fields above come from (for attribution)
    explanation: RetrievalExplanation | None = field(default=None, compare=False, repr=False)

    SIGNALS: ClassVar[tuple[Signal, ...]] = (
        Signal(lambda r: len(r.materials), span=semconv.RETRIEVAL_COUNT, stream="count"),
        Signal(_retrieved_count, across=True, record="retrieval.count"),
        Signal(
            lambda r: [m.id for m in r.materials],
            span=semconv.RETRIEVAL_MATERIAL_IDS,
            stream="material_ids",
        ),
        Signal(lambda r: r.scored, span=semconv.RETRIEVAL_SCORED, record="retrieval.scored"),
        Signal(
            lambda r: r.top_score,
            span=semconv.RETRIEVAL_TOP_SCORE,
            span_as=float,
            stream="top_score",
            record="retrieval.top_score",
        ),
        Signal(
            lambda r: r.score_margin,
            span=semconv.RETRIEVAL_SCORE_MARGIN,
            span_as=float,
            stream="score_margin",
            record="retrieval.score_margin",
        ),
        Signal(lambda r: r.note, record="retrieval.note"),
        Signal(lambda r: r.shape, span=semconv.RETRIEVAL_SHAPE, record="retrieval.shape"),
        Signal(
            lambda r: r.relative_margin,
            span=semconv.RETRIEVAL_RELATIVE_MARGIN,
            record="retrieval.relative_margin",
        ),
        Signal(lambda r: r.near_top, record="retrieval.near_top"),
        Signal(
            lambda r: list(r.near_top) if r.shape is not None else None,
            span=semconv.RETRIEVAL_NEAR_TOP,
        ),
        Signal(lambda r: r.source, span=semconv.RETRIEVAL_SOURCE),
        Signal(
            lambda s: s.retrieval_source if s.retrieval.source is not None else OMIT,
            across=True,
            record="retrieval.source",
        ),
        Signal(_added_from_runs, across=True, record="retrieval.added_from_runs"),
        Signal(_documents, span=EACH),
    )

    @classmethod
    def of(
        cls,
        materials: tuple[Material, ...],
        *,
        note: str | None = None,
        errors: tuple[StageError, ...] = (),
        shape: ShapeThresholds | None = None,
        source: str | None = None,
    ) -> Retrieval:
        """A Retrieval with its score signals and score shape computed from the materials."""
        explained = explain_retrieval(
            [(m.id, m.score) for m in materials], shape or ShapeThresholds()
        )
        scores = [m.score for m in materials if m.score is not None]
        scored = bool(materials) and len(scores) == len(materials)
        ordered = sorted(scores, reverse=True)
        margin = round(ordered[0] - ordered[1], 6) if scored and len(ordered) > 1 else None
        if note is None and not scored:
            note = "retriever gives no relevance scores"
        return cls(
            materials=materials,
            scored=scored,
            top_score=ordered[0] if scored else None,
            score_margin=margin,
            note=note,
            errors=tuple(errors),
            shape=explained.shape,
            relative_margin=explained.relative_margin,
            near_top=tuple(explained.near_top),
            source=source,
            explanation=explained,
        )


@dataclass(frozen=True)
class PlanResult:
    """Stage 3: the plan (asked of the model, or agreed among the samples' own).

    ``source``: ``model`` (one plan call), else the mode of the samples' plans (``inline``,
    ``wrap``).
    """

    plan: Plan
    errors: tuple[StageError, ...] = ()
    source: str = "model"

    SIGNALS: ClassVar[tuple[Signal, ...]] = (
        Signal(
            lambda r: list(r.plan.material_ids),
            span=semconv.PLAN_MATERIAL_IDS,
            stream="material_ids",
        ),
        Signal(lambda r: r.plan.ok, span=semconv.PLAN_OK, stream="ok"),
        Signal(lambda r: r.plan.attempts, span=semconv.PLAN_ATTEMPTS, stream="attempts"),
        Signal(lambda r: r.plan.mode, stream="mode"),
        Signal(lambda r: r.source, span=semconv.PLAN_SOURCE),
        Signal(lambda r: list(r.plan.key_facts), span=semconv.PLAN_KEY_FACTS),
        Signal(lambda r: r.plan.agreement, span=semconv.PLAN_AGREEMENT),
        Signal(lambda r: r.plan.error, span=semconv.PLAN_ERROR, when=bool),
        Signal(lambda r: r.plan, record="plan"),
    )


@dataclass(frozen=True)
class Sample:
    """One sampled answer; ``answer`` is the text after any inline plan has been split off."""

    index: int
    raw: str | None = None
    answer: str | None = None
    plan: Plan | None = None
    error: str | None = None
    attempts: int = 0
    latency_s: float = 0.0
    input_tokens: int | None = None
    output_tokens: int | None = None
    # the retrieved order this sample saw, for ``[1]``-style positional citations (wrap mode)
    material_order: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.answer and self.answer.strip())


def _sampled_at(s: SampleSet) -> float | None:
    t = s.temperature
    return t if t is not None and t >= 0 else None


@dataclass(frozen=True)
class SampleSet:
    """Stage 4: the samples, the temperature they were drawn at, and what sampling learned.

    ``temperature`` is the one the samples were drawn at as far as tracerag knows (None: the
    model has none tracerag can set or see). ``temperature_zero``: the request asked for
    temperature 0 (its samples cannot disagree). ``extra_materials`` are documents the samples'
    own runs retrieved that the retrieve stage did not (wrap mode): they may be cited, so they
    join the materials after retrieval's. ``positional`` allows ``[2]``-style citations by
    position in a sample's retrieved order. ``versions`` are the versions the runs showed, for
    those the registration lacked (``Registration.versions_from_runs``). ``kept`` is the sample
    whose answer the app itself keeps (a wrapped graph's own run, whose answer is in the
    caller's thread): when set, it is the answer verified and returned, the other samples tell
    how far they agree with it. ``sampling`` and ``runs`` (wrap mode) say how the samples were
    drawn: ``answer`` or ``app``, and per sample ``app`` (the app's own run), ``fork`` or
    ``private``.
    """

    samples: tuple[Sample, ...] = ()
    temperature: float | None = None
    temperature_zero: bool = False
    positional: bool = False
    extra_materials: tuple[Material, ...] = ()
    versions: RunVersions | None = None
    warnings: tuple[str, ...] = ()
    errors: tuple[StageError, ...] = ()
    kept: int | None = None
    sampling: str | None = None
    runs: tuple[str, ...] = ()
    #: adaptive sampling (``tracerag._adaptive``): the most that could be drawn (0: not
    #: recorded), the rounds drawn, why sampling stopped, the posterior probability that the
    #: samples not drawn would have changed the route, and the model calls the samples took
    max_samples: int = 0
    rounds: int = 0
    stop_reason: str | None = None
    stop_risk: float | None = None
    calls: int | None = None
    min_samples: int = 0
    risk_bound: float | None = None
    #: the citation reports the stopping rule already made, by sample index (the verify stage
    #: reuses them when the materials are the ones they were made against)
    verified: Mapping[int, Any] = field(default_factory=dict, compare=False, repr=False)

    SIGNALS: ClassVar[tuple[Signal, ...]] = (
        Signal(lambda s: s.n_ok, span=semconv.SAMPLES_OK, stream="samples_ok"),
        Signal(lambda s: len(s.samples) if s.max_samples else None, span=semconv.SAMPLES_DRAWN),
        Signal(lambda s: s.max_samples or None, span=semconv.SAMPLES_MAX),
        Signal(lambda s: s.rounds or None, span=semconv.SAMPLES_ROUNDS),
        Signal(lambda s: s.stop_reason, span=semconv.SAMPLES_STOP, stream="sampling_stop"),
        Signal(lambda s: s.stop_risk, span=semconv.SAMPLES_STOP_RISK),
        Signal(lambda s: s.calls, span=semconv.SAMPLES_CALLS),
        Signal(
            lambda s: (
                {
                    "min_samples": s.min_samples,
                    "max": s.max_samples,
                    "risk_bound": s.risk_bound,
                    "drawn": len(s.samples),
                    "rounds": s.rounds,
                    "stop_reason": s.stop_reason,
                    "stop_risk": s.stop_risk,
                    "calls": s.calls,
                }
                if s.max_samples
                else OMIT
            ),
            record="params.adaptive",
        ),
        Signal(lambda s: s.stop_reason, metric="stop_reason"),
        Signal(
            lambda s: len(s.samples) - s.n_ok,
            span=semconv.SAMPLES_FAILED,
            stream="samples_failed",
        ),
        Signal(lambda s: s.drawn_at_zero, span=semconv.TEMPERATURE_ZERO),
        Signal(_sampled_at, span=semconv.TEMPERATURE, span_as=float),
        Signal(lambda s: True if s.positional else OMIT, record="params.positional"),
        Signal(
            lambda s: s.temperature if s.temperature is not None else OMIT,
            record="params.temperature",
        ),
        Signal(lambda s: True if s.temperature_zero else OMIT, record="params.temperature_zero"),
        Signal(lambda s: s.sampling if s.sampling is not None else OMIT, record="params.sampling"),
        Signal(lambda s: list(s.runs) if s.sampling is not None else OMIT, record="params.runs"),
        Signal(lambda s: s.kept if s.kept is not None else OMIT, record="params.kept_sample"),
        Signal(lambda s: s.samples, record="samples"),
        Signal(lambda s: s.warnings, record="warnings"),
        Signal(lambda s: len(s.samples), metric="n_samples", absent=0),
    )

    @property
    def ok(self) -> tuple[Sample, ...]:
        """The samples that gave an answer."""
        return tuple([s for s in self.samples if s.ok])

    @property
    def n_ok(self) -> int:
        """How many samples gave an answer."""
        return len([s for s in self.samples if s.ok])

    @property
    def drawn_at_zero(self) -> bool:
        """Several samples drawn at temperature 0: they cannot disagree (a warning)."""
        return self.temperature == 0.0 and len(self.samples) > 1


@dataclass(frozen=True)
class Selection:
    """Which sample answers, and how many samples agree with it."""

    sample_index: int | None
    group: list[int]
    share: float
    reason: str


def _by_sample(v: Verification) -> dict[str, Any]:
    return {
        str(i): {
            "valid": r.valid,
            "score": r.score,
            "coverage": r.coverage,
            "accuracy": r.accuracy,
            "fabricated": list(r.fabricated),
        }
        for i, r in v.by_sample.items()
    }


def _claims(v: Verification) -> list[dict[str, Any]]:
    return [
        {
            "verdict": c.verdict,
            "cited_ids": c.cited_ids,
            "material_id": c.material_id,
            "score": c.score,
        }
        for c in v.citations.claims
    ]


def _answers_question(v: Verification) -> Any:
    """Whether the answer addresses the question (None: not judged); left out where the
    check is off."""
    return v.relevance.addresses if v.relevance is not None else OMIT


def _relevance(v: Verification) -> Any:
    return v.relevance.to_record() if v.relevance is not None else OMIT


@dataclass(frozen=True)
class Verification:
    """Stage 5: the chosen answer's citation report, consistency, selection and rules."""

    citations: CitationReport
    by_sample: Mapping[int, CitationReport]
    consistency: ConsistencyReport
    selection: Selection
    rules: tuple[RuleResult, ...] = ()
    errors: tuple[StageError, ...] = ()
    #: whether the chosen answer addresses the question (None: the check is off)
    relevance: RelevanceReport | None = None

    SIGNALS: ClassVar[tuple[Signal, ...]] = (
        Signal(
            lambda v: v.citations.valid,
            span=semconv.SIGNAL_CITATION_VALID,
            stream="citation_valid",
            io="citation_valid",
        ),
        Signal(
            lambda v: v.citations.score,
            span=semconv.SIGNAL_CITATION_SCORE,
            stream="citation_score",
            io="citation_score",
        ),
        Signal(
            lambda v: v.citations.coverage,
            span=semconv.SIGNAL_CITATION_COVERAGE,
            stream="citation_coverage",
            metric="citation_coverage",
        ),
        Signal(
            lambda v: v.citations.accuracy,
            span=semconv.SIGNAL_CITATION_ACCURACY,
            stream="citation_accuracy",
            metric="citation_accuracy",
        ),
        Signal(
            lambda v: v.citations.fabricated,
            span=semconv.SIGNAL_FABRICATED,
            stream="fabricated_citations",
            metric="fabricated",
            io="fabricated",
        ),
        Signal(
            lambda v: v.citations.stale,
            span=semconv.SIGNAL_STALE,
            stream="stale_citations",
            io="stale",
        ),
        Signal(_claims, io="claims"),
        Signal(
            lambda v: v.selection.share,
            span=semconv.SIGNAL_CONSISTENCY,
            stream="self_consistency",
            io="self_consistency",
        ),
        Signal(
            lambda v: v.consistency.n_groups,
            span=semconv.SIGNAL_CONSISTENCY_GROUPS,
            stream="consistency_groups",
        ),
        Signal(lambda v: v.consistency.groups, io="groups"),
        Signal(lambda v: v.consistency.entropy, span=semconv.SIGNAL_SEMANTIC_ENTROPY),
        Signal(lambda v: v.consistency.informative, span=semconv.SIGNAL_CONSISTENCY_INFORMATIVE),
        Signal(lambda v: all(r.passed for r in v.rules), span=semconv.SIGNAL_RULE_CHECK),
        Signal(
            lambda v: [r.name for r in v.rules if not r.passed], span=semconv.SIGNAL_RULES_FAILED
        ),
        Signal(lambda v: [{"name": r.name, "passed": r.passed} for r in v.rules], io="rules"),
        Signal(lambda v: v.selection.sample_index, span=semconv.CHOSEN_SAMPLE),
        Signal(lambda v: v.citations, record="signals.citations"),
        Signal(_by_sample, record="signals.citations_by_sample", is_json=True),
        Signal(lambda v: v.consistency, record="signals.consistency"),
        Signal(lambda v: v.selection, record="signals.selection"),
        Signal(lambda v: v.rules, record="signals.rules"),
        Signal(
            _answers_question,
            span=semconv.SIGNAL_ANSWER_RELEVANT,
            stream="answers_question",
            io="answer_relevance",
        ),
        Signal(_relevance, record="signals.relevance", is_json=True),
    )

    def to_record(self) -> dict[str, Any]:
        """The signals as the audit record keeps them."""
        signals: dict[str, Any] = _record_of(self)["signals"]
        return signals


def _meta_versions(s: RequestState) -> dict[str, Any]:
    versions = s.versions
    return {"prompt": versions.prompt, "model": versions.model, "tracerag": versions.tracerag}


def _response_record(s: RequestState) -> dict[str, Any]:
    decision = s.decision
    assert decision is not None
    return decision.response_record(s.request_id, s.trace_id)


@dataclass(frozen=True)
class Decision:
    """Stage 6: the confidence, the route and everything the Response will say."""

    decision: Route
    status: str
    tier: Tier
    confidence: float | None
    answer: str | None
    signal_detail: SignalDetail
    evidence: tuple[Evidence, ...]
    claims: tuple[ClaimCheck, ...]
    versions: ResponseVersions
    ticket_id: str | None = None
    calibration: str | None = None
    warnings: tuple[str, ...] = ()
    errors: tuple[StageError, ...] = ()
    #: the compact per-material summary the Response carries (no material text)
    materials: tuple[MaterialUse, ...] = ()
    #: tiers 1 and 2 of attribution, as the audit record keeps them (``signals.attribution``)
    attribution: Mapping[str, Any] | None = None
    #: the ticket for people (escalate, review), handed on once the record's fate is known
    ticket: Ticket | None = None
    #: why the route is not the confidence's own (a clustered retrieval, conflicting citations)
    route_reason: str | None = None
    #: the attribution the record's ``attribution`` was made from
    attributed: Attribution | None = field(default=None, compare=False, repr=False)

    #: the route's span and root attributes are set once the Response is made (see
    #: ``RequestState.root_attributes``)
    SIGNALS: ClassVar[tuple[Signal, ...]] = (
        Signal(
            lambda d: d.confidence,
            span=semconv.CONFIDENCE,
            stream="confidence",
            record="confidence",
            metric="confidence",
            root=semconv.CONFIDENCE,
            meta="confidence",
        ),
        Signal(
            lambda d: d.decision,
            span=semconv.DECISION,
            stream="decision",
            record="decision",
            metric="decision",
            root=semconv.DECISION,
            meta="decision",
        ),
        Signal(lambda d: d.status, span=semconv.STATUS, root=semconv.STATUS),
        Signal(lambda d: d.ticket_id, span=semconv.TICKET_ID, root=semconv.TICKET_ID, when=bool),
        Signal(
            lambda d: d.calibration,
            span=semconv.CALIBRATION,
            root=semconv.CALIBRATION,
            when=bool,
            record="calibration",
            meta="calibration",
        ),
        Signal(lambda d: d.answer, span=semconv.OI_OUTPUT_VALUE, span_as=capture),
        Signal(lambda d: d.route_reason, span=semconv.ROUTE_REASON, when=bool),
        Signal(
            lambda d: list(d.attributed.used_ids) if d.attributed is not None else None,
            span=semconv.ATTRIBUTION_USED,
        ),
        Signal(
            lambda d: list(d.attributed.key_ids) if d.attributed is not None else None,
            span=semconv.ATTRIBUTION_KEY,
        ),
        Signal(
            lambda d: d.attributed.unattributed if d.attributed is not None else None,
            span=semconv.ATTRIBUTION_UNATTRIBUTED,
        ),
        Signal(_response_record, across=True, record="response", is_json=True),
        Signal(
            lambda d: d.attribution if d.attribution is not None else OMIT,
            record="signals.attribution",
        ),
    )

    def _fields(self, request_id: str, trace_id: str | None) -> dict[str, Any]:
        return {
            "request_id": request_id,
            "trace_id": trace_id,
            "answer": self.answer,
            "confidence": self.confidence,
            # the Response's fields are the plain names
            "decision": str(self.decision),
            "status": self.status,
            "tier": str(self.tier),
            "signal_detail": self.signal_detail,
            "evidence": list(self.evidence),
            "claims": list(self.claims),
            "versions": self.versions,
            "ticket_id": self.ticket_id,
            "calibration": self.calibration,
            "warnings": list(self.warnings),
            "materials": list(self.materials),
        }

    def response(
        self, request_id: str, trace_id: str | None, audit_persisted: bool | None
    ) -> Response:
        """The Response, validated (its one construction)."""
        from tracerag.contract import Response

        return Response(**self._fields(request_id, trace_id), audit_persisted=audit_persisted)

    def response_record(self, request_id: str, trace_id: str | None) -> dict[str, Any]:
        """The Response as the audit record keeps it, before the record is persisted."""
        from tracerag.contract import Response

        draft = Response.model_construct(**self._fields(request_id, trace_id))
        return draft.model_dump(mode="json")


#: The stage output each stage fills, in run order.
_SLOTS: dict[str, str] = {
    Stage.REGISTER: "registration",
    Stage.RETRIEVE: "retrieval",
    Stage.PLAN: "planning",
    Stage.SAMPLE: "samples",
    Stage.VERIFY: "verification",
    Stage.ASSEMBLE: "decision",
}

#: The audit record of ``RECORD_VERSION``: its top-level keys in order, each with its value
#: when no part sets it (a request that failed before a stage). The values come from the parts'
#: ``SIGNALS``; a key a part declares that is not listed here follows these.
RECORD_LAYOUT: Mapping[str, Any] = MappingProxyType(
    {
        "record_version": RECORD_VERSION,
        "request_id": None,
        "trace_id": None,
        "question": None,
        "standalone_question": None,
        "conversation": None,
        "session_id": None,
        "user_id": None,
        "channel": None,
        "tier": None,
        "versions": None,
        "params": {},
        "started_at": None,
        "materials": [],
        "retrieval": {},
        "plan": None,
        "samples": [],
        "signals": {},
        "confidence": None,
        "decision": None,
        "response": None,
        "errors": [],
        "skipped": [],
        "calibration": None,
        "timings": {},
        "warnings": [],
    }
)

_FRESH = tuple(
    (key, type(seed)) for key, seed in RECORD_LAYOUT.items() if type(seed) in (dict, list)
)

#: The root span's OpenInference metadata: its keys in order (None when no part sets one).
META_LAYOUT = ("request_id", "tier", "versions", "decision", "confidence", "calibration")


@dataclass(frozen=True)
class RequestState:
    """Everything known about one request so far, in the order the stages learn it."""

    input: RequestInput
    trace_id: str | None = None
    registration: Registration | None = None
    retrieval: Retrieval | None = None
    planning: PlanResult | None = None
    samples: SampleSet | None = None
    verification: Verification | None = None
    decision: Decision | None = None
    errors: tuple[StageError, ...] = ()
    skipped: tuple[str, ...] = ()
    timings: Mapping[str, float] = field(default_factory=dict)

    #: what the request as a whole says: values that combine its parts
    SIGNALS: ClassVar[tuple[Signal, ...]] = (
        Signal(lambda s: s.request_id, record="request_id", meta="request_id"),
        Signal(lambda s: s.trace_id, record="trace_id"),
        # the registered versions, with those the samples' runs taught where it had none
        Signal(lambda s: s.versions, record="versions"),
        Signal(_meta_versions, meta="versions"),
        Signal(lambda s: s.versions.prompt, root=semconv.VERSION_PROMPT, when=bool),
        Signal(lambda s: s.versions.model, root=semconv.VERSION_MODEL, when=bool),
        Signal(lambda s: s.versions.tracerag, root=semconv.VERSION_TRACERAG, when=bool),
        Signal(lambda s: s.materials, record="materials"),
        Signal(lambda s: [e.to_dict() for e in s.errors], record="errors", is_json=True),
        Signal(lambda s: len(s.errors), root=semconv.ERROR_COUNT),
        Signal(lambda s: s.skipped, record="skipped"),
        Signal(lambda s: s.timings, record="timings", metric="timings"),
    )

    @staticmethod
    def slot(stage: str) -> str:
        """The field a stage's output fills."""
        return _SLOTS[stage]

    def output(self, stage: str) -> Any:
        """A stage's output (None until the stage has run, or when its tier skips it)."""
        return getattr(self, _SLOTS[stage])

    def _evolve(self, **changes: Any) -> RequestState:
        # a copy with some fields changed: what dataclasses.replace does, without re-running
        # __init__ (the runner makes one per stage, on every request)
        new = object.__new__(RequestState)
        new.__dict__.update(self.__dict__)
        new.__dict__.update(changes)
        return new

    def with_output(self, stage: str, output: Any, seconds: float | None = None) -> RequestState:
        """A new state holding a stage's output, the errors it collected and its time."""
        errors = getattr(output, "errors", ()) if output is not None else ()
        changes: dict[str, Any] = {_SLOTS[stage]: output}
        if errors:
            changes["errors"] = self.errors + tuple(errors)
        if seconds is not None:
            changes["timings"] = MappingProxyType({**self.timings, stage: round(seconds, 6)})
        return self._evolve(**changes)

    def with_error(self, stage: str, error: BaseException, **extra: Any) -> RequestState:
        """A new state with one more error kept."""
        log = ErrorLog()
        log.record_error(stage, error, **extra)
        return self._evolve(errors=self.errors + log.freeze())

    def with_timing(self, name: str, seconds: float) -> RequestState:
        """A new state with the time spent in a stage (or ``request``)."""
        return self._evolve(timings=MappingProxyType({**self.timings, name: round(seconds, 6)}))

    def with_skipped(self, stage: str) -> RequestState:
        """A new state that records a stage its tier skips."""
        return self._evolve(skipped=(*self.skipped, stage))

    @property
    def request_id(self) -> str:
        if self.registration is not None:
            return self.registration.request_id
        return self.input.request_id or ""

    @property
    def plan(self) -> Plan | None:
        return self.planning.plan if self.planning is not None else None

    @property
    def question(self) -> str:
        """The turn as the user wrote it."""
        return self.input.question

    @property
    def standalone_question(self) -> str:
        """The question the request asks, read with its conversation: what is verified and
        checked for relevance (the turn itself for a request on its own)."""
        return self.input.standalone_question

    @property
    def versions(self) -> RunVersions:
        """The registered versions, with those the samples' runs showed where it had none."""
        registered = self.registration.versions if self.registration is not None else RunVersions()
        learned = self.samples.versions if self.samples is not None else None
        if learned is None:
            return registered
        return RunVersions(
            prompt=registered.prompt or learned.prompt,
            model=registered.model or learned.model,
            tracerag=registered.tracerag,
            prompt_source=registered.prompt_source if registered.prompt else learned.prompt_source,
            model_source=registered.model_source if registered.model else learned.model_source,
        )

    @property
    def retrieval_source(self) -> str | None:
        """Where the materials come from (wrap mode): ``retriever``, ``runs``, or
        ``retriever+runs`` when the runs retrieved documents the retriever did not."""
        source = self.retrieval.source if self.retrieval is not None else None
        added = self.samples is not None and bool(self.samples.extra_materials)
        if source == "retriever" and added:
            return "retriever+runs"
        return source

    @property
    def materials(self) -> tuple[Material, ...]:
        """Every material the answer may cite: retrieval's, then any the samples' runs added."""
        retrieved = self.retrieval.materials if self.retrieval is not None else ()
        if self.samples is not None and self.samples.extra_materials:
            return retrieved + self.samples.extra_materials
        return retrieved

    def material(self, material_id: str) -> Material | None:
        """The material with this id, or None if it was not retrieved."""
        return next((m for m in self.materials if m.id == material_id), None)

    @property
    def warnings(self) -> tuple[str, ...]:
        return self.samples.warnings if self.samples is not None else ()

    # -- the projections of the parts' declarations -------------------------------------------

    def parts(self) -> tuple[tuple[type[Declared], Any], ...]:
        """Each part's type and value (None when missing), the state itself last."""
        return (
            (RequestInput, self.input),
            (Registration, self.registration),
            (Retrieval, self.retrieval),
            (PlanResult, self.planning),
            (SampleSet, self.samples),
            (Verification, self.verification),
            (Decision, self.decision),
            (RequestState, self),
        )

    def to_record(self, response: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The JSON-able audit record of this request (layout ``RECORD_LAYOUT``).

        ``response`` is the Response as recorded; by default the one the decision describes.
        """
        record = dict(RECORD_LAYOUT)
        for key, empty in _FRESH:  # a section or list of its own in every record
            record[key] = empty()
        for (_, part), table in zip(self.parts(), _compiled_tables(), strict=True):
            _fill_record(record, table.record, part, self)
        if response is not None:
            record["response"] = dict(response)
        return record

    def root_attributes(self, *, routed: bool) -> dict[str, Any]:
        """The root span's attributes the parts declare; the route's once ``routed`` (the
        Response is made)."""
        attrs: dict[str, Any] = {}
        for (kind, part), table in zip(self.parts(), _compiled_tables(), strict=True):
            if part is None or not table.root or (kind is Decision and not routed):
                continue
            attrs.update(attributes(table.root, part, self))
        return attrs

    def root_metadata(self) -> dict[str, Any]:
        """The root span's OpenInference metadata (ids, tier, versions, route; no text)."""
        meta: dict[str, Any] = dict.fromkeys(META_LAYOUT)
        for (_, part), table in zip(self.parts(), _compiled_tables(), strict=True):
            for entry in table.meta:
                value = entry.absent if part is None else entry.get(self if entry.across else part)
                if value is not OMIT:
                    json_ready = entry.is_json or type(value) in LEAVES
                    meta[entry.key] = value if json_ready else jsonable(value)
        return meta

    def outcome_fields(self) -> dict[str, Any]:
        """What the metrics record of this request: ``metrics.RequestOutcome``'s fields."""
        fields: dict[str, Any] = {}
        for (_, part), table in zip(self.parts(), _compiled_tables(), strict=True):
            for entry in table.metric:
                value = entry.absent if part is None else entry.get(self if entry.across else part)
                if value is not OMIT:
                    fields[entry.key] = value
        return fields


_PARTS: tuple[type[Declared], ...] = (
    RequestInput,
    Registration,
    Retrieval,
    PlanResult,
    SampleSet,
    Verification,
    Decision,
    RequestState,
)
_COMPILED_TABLES: list[Any] = [(), ()]  # the tables last compiled, and their compiled forms


def _compiled_tables() -> tuple[Compiled, ...]:
    """Every part's compiled table, in ``RequestState.parts()`` order (compiled anew when a
    table was replaced)."""
    tables = tuple(kind.SIGNALS for kind in _PARTS)
    if tables != _COMPILED_TABLES[0]:
        _COMPILED_TABLES[:] = [tables, tuple(compiled(table) for table in tables)]
    result: tuple[Compiled, ...] = _COMPILED_TABLES[1]
    return result


def _fill_record(record: dict[str, Any], entries: Any, part: Any, state: Any) -> None:
    # the entries' fields unpacked: this runs for every record
    for section, key, get, across, absent, is_json in entries:
        # a part's value; its absent value when the part is missing
        value = absent if part is None else get(state if across else part)
        if value is OMIT:
            continue
        if not is_json and type(value) not in LEAVES:
            value = jsonable(value)
        if section is None:
            record[key] = value
        else:
            held = record.get(section)
            if held is None:
                held = record[section] = {}
            held[key] = value


def _record_of(part: Any) -> dict[str, Any]:
    """The record keys one part declares on its own (those read across the state left out)."""
    record: dict[str, Any] = {}
    entries = [e for e in compiled(type(part).SIGNALS).record if not e.across]
    _fill_record(record, entries, part, None)
    return record
