"""RAGPipeline: a LangChain Runnable that answers a question through the six traced stages."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, TypedDict

from langchain_core.language_models import BaseChatModel
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from tracerag._adaptive import AgreementPrior
from tracerag._choices import PlanMode, PlanModeName, Tier, TierName, check_options
from tracerag._routing import EscalationHandler, InMemoryEscalationHandler, Thresholds
from tracerag._runnable import StagedRunnable
from tracerag._settings import RetryPolicy, Settings
from tracerag._sinks import AuditTarget, resolve_sink
from tracerag._usage import Price, load_prices
from tracerag.errors import ConfigurationError
from tracerag.prompts import PromptVersion
from tracerag.signals._attribution import ShapeThresholds
from tracerag.signals._confidence import Combiner
from tracerag.signals._consistency import Equivalence
from tracerag.signals._relevance import AnswerRelevance
from tracerag.signals._rules import Rule
from tracerag.signals._support import SupportBackend
from tracerag.signals.calibrated import default_combiner
from tracerag.stages._table import ModelSource, Step, steps_for

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "AuditTarget",
    "PipelineOptions",
    "RAGPipeline",
    "RAGPipelineOptions",
    "Step",
    "build_settings",
    "steps_for",
]


class PipelineOptions(TypedDict, total=False):
    """The options both front doors take, ``RAGPipeline(...)`` and ``wrap(...)``.

    ``n_samples`` (5): the most answers drawn per request at tier high; ``min_samples`` (2)
    are drawn first, more only while the route could still change with probability above
    ``stop_risk`` (0.02) under the ``agreement_prior`` (see ``tracerag._adaptive``);
    ``min_samples=n_samples`` draws them all. ``max_concurrency``: model calls in flight at
    once (None: the model's own limit, if it has one). ``thresholds``: a ``Thresholds``
    or a ``(pass_at, review_at)`` pair (default ``Thresholds()``). ``rules``: deterministic
    checks every answer must pass. ``escalation``: where escalated and review-flagged requests
    go (default: a bounded ``InMemoryEscalationHandler``). ``tier`` ("high"): high, medium or
    low (a ``Tier`` or its name). ``support_backend`` ("lexical"): a registered name or a
    ``SupportBackend``.
    ``equivalence``: when two sampled answers agree. ``combiner``: signals to confidence
    (default: the one ``TRACERAG_CALIBRATION`` names, else ``heuristic-v1``). ``retry``: a
    ``RetryPolicy``. ``tracer_provider`` and ``meter_provider`` (None: the ones in force at each
    request). ``audit`` ("auto"): where audit records go (see ``tracerag._sinks``).
    ``review_clustered_retrieval`` (False), ``relevance_floor`` and ``retrieval_shape``: see
    ``tracerag.signals._attribution``. ``prices``: a price table per model (a mapping or a JSON
    file, see ``tracerag._usage``) for the cost of each request. ``answer_relevance``: how to
    judge whether the answer addresses the question (a ``tracerag.AnswerRelevance``; None or
    True: the default one; False: not judged); a passing answer that does not address it goes
    to review. ``question_rewriter``: a runnable that rewrites a conversation's turn as a
    standalone question (LangChain's history-aware retriever pattern: it is given ``{"input":
    turn, "chat_history": [the user's earlier turns]}`` and returns the question as text or a
    message); None (the default): the turn is resolved without a model
    (``tracerag.text._followup``).
    """

    n_samples: int
    min_samples: int
    stop_risk: float
    agreement_prior: AgreementPrior
    verify_prior: tuple[float, float]
    max_concurrency: int | None
    thresholds: Thresholds | tuple[float, float] | None
    rules: Sequence[Rule]
    escalation: EscalationHandler | None
    tier: Tier | TierName
    support_backend: str | SupportBackend
    equivalence: Equivalence | None
    combiner: Combiner | None
    retry: RetryPolicy | None
    tracer_provider: TracerProvider | None
    meter_provider: MeterProvider | None
    audit: AuditTarget
    review_clustered_retrieval: bool
    relevance_floor: float | None
    retrieval_shape: ShapeThresholds | None
    prices: Mapping[str, Price | Mapping[str, float] | str] | str | None
    answer_relevance: AnswerRelevance | bool | None
    question_rewriter: Runnable[dict[str, object], object] | None


class RAGPipelineOptions(PipelineOptions, total=False):
    """``PipelineOptions`` and what only ``RAGPipeline`` takes (``wrap()`` reads them from the
    app): ``temperature`` (0.7) of the sampled answers, ``k``: how many retrieved materials
    to keep (None: all the retriever returns), ``prompt``: the prompt texts to send (a
    ``tracerag.prompts.PromptVersion``; default ``DEFAULT_PROMPT``)."""

    temperature: float
    k: int | None
    prompt: PromptVersion | None


class SettingsOptions(TypedDict, total=False):
    """The options ``build_settings`` hands to ``Settings`` as they are."""

    retriever: BaseRetriever | None
    llm: BaseChatModel | None
    prompt_version: str | None
    model_version: str | None
    prompt_version_source: str | None
    model_version_source: str | None
    n_samples: int
    min_samples: int
    stop_risk: float
    agreement_prior: AgreementPrior
    verify_prior: tuple[float, float]
    max_concurrency: int | None
    temperature: float
    k: int | None
    support_backend: str | SupportBackend
    equivalence: Equivalence | None
    meter_provider: MeterProvider | None
    review_clustered_retrieval: bool
    relevance_floor: float | None
    prompt: PromptVersion | None
    question_rewriter: Runnable[dict[str, object], object] | None


def build_settings(
    *,
    tracer_provider: TracerProvider | None = None,
    thresholds: Thresholds | tuple[float, float] | None = None,
    rules: Sequence[Rule] = (),
    escalation: EscalationHandler | None = None,
    combiner: Combiner | None = None,
    retry: RetryPolicy | None = None,
    audit: AuditTarget = "auto",
    retrieval_shape: ShapeThresholds | None = None,
    prices: Mapping[str, Price | Mapping[str, float] | str] | str | None = None,
    tier: Tier | TierName = Tier.HIGH,
    plan_mode: PlanMode | PlanModeName = PlanMode.SEPARATE,
    answer_relevance: AnswerRelevance | bool | None = None,
    **options: Unpack[SettingsOptions],
) -> Settings:
    """Settings from user-facing options, with every default filled in (shared with wrap())."""
    if isinstance(thresholds, tuple):
        thresholds = Thresholds(pass_at=thresholds[0], review_at=thresholds[1])
    if answer_relevance is None or answer_relevance is True:
        answer_relevance = AnswerRelevance()
    elif answer_relevance is False:
        answer_relevance = None
    elif not isinstance(answer_relevance, AnswerRelevance):
        raise ConfigurationError(
            "answer_relevance must be an AnswerRelevance, True or False, got "
            f"{type(answer_relevance).__name__}"
        )
    rewriter = options.get("question_rewriter")
    if rewriter is not None and not isinstance(rewriter, Runnable):
        raise ConfigurationError(
            "question_rewriter must be a LangChain Runnable (a prompt | model | parser chain), "
            f"got {type(rewriter).__name__}"
        )
    return Settings(
        tier=Tier.parse(tier, "tier"),
        plan_mode=PlanMode.parse(plan_mode, "plan"),
        tracer_provider=tracer_provider,
        thresholds=thresholds or Thresholds(),
        rules=tuple(rules),
        escalation=escalation or InMemoryEscalationHandler(),
        combiner=combiner or default_combiner(),
        retry=retry or RetryPolicy(),
        record_sink=resolve_sink(audit),
        retrieval_shape=retrieval_shape or ShapeThresholds(),
        prices=load_prices(prices),
        answer_relevance=answer_relevance,
        **options,
    )


class RAGPipeline(StagedRunnable):
    """Answers questions from a retriever's materials with verified citations and a confidence.

    Input: a question string, or ``{"question", "session_id", "user_id", "channel"}`` (all but
    question optional); a follow-up adds its conversation as ``chat_history``, or comes as a
    chat input ``{"messages": [...]}`` whose last user message is the question (see
    docs/conversations.md). Output: a ``tracerag.Response``. Works with ``invoke``, ``ainvoke``,
    ``batch``, ``abatch`` and inside LCEL; ``arun`` adds per-call hooks (stage events, record
    sink). ``plan``: "separate" (a plan call before sampling) or "inline". Its other options
    are ``RAGPipelineOptions``.
    """

    def __init__(
        self,
        retriever: BaseRetriever,
        llm: BaseChatModel,
        *,
        prompt_version: str | None,
        model_version: str | None,
        plan: PlanMode | PlanModeName = PlanMode.SEPARATE,
        **options: Unpack[RAGPipelineOptions],
    ) -> None:
        check_options("RAGPipeline", options, RAGPipelineOptions.__optional_keys__)
        if not isinstance(retriever, BaseRetriever):
            raise ConfigurationError(
                f"retriever must be a LangChain BaseRetriever, got {type(retriever).__name__}"
            )
        if not isinstance(llm, BaseChatModel):
            raise ConfigurationError(
                f"llm must be a LangChain BaseChatModel, got {type(llm).__name__}"
            )
        settings = build_settings(
            retriever=retriever,
            llm=llm,
            prompt_version=prompt_version,
            model_version=model_version,
            plan_mode=plan,
            **options,
        )
        super().__init__(settings, ModelSource())

    @property
    def escalation(self) -> EscalationHandler:
        """The handler that receives escalated and review-flagged requests."""
        return self.settings.escalation
