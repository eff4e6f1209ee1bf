"""RAGPipeline: a LangChain Runnable that answers a question through the six traced stages."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

from langchain_core.language_models import BaseChatModel
from langchain_core.retrievers import BaseRetriever
from opentelemetry.trace import TracerProvider

from tracerag.audit import resolve_sink
from tracerag.errors import ConfigurationError
from tracerag.prompts import PromptVersion
from tracerag.routing import EscalationHandler, InMemoryEscalationHandler, Thresholds
from tracerag.runner import StagedRunnable
from tracerag.settings import RetryPolicy, Settings
from tracerag.signals.attribution import ShapeThresholds
from tracerag.signals.calibrated import default_combiner
from tracerag.signals.confidence import Combiner
from tracerag.signals.consistency import Equivalence
from tracerag.signals.rules import Rule
from tracerag.signals.support import SupportBackend
from tracerag.stages.table import ModelSource, Step, steps_for
from tracerag.usage import load_prices

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["RAGPipeline", "Step", "build_settings", "steps_for"]


class SettingsOptions(TypedDict, total=False):
    """The options ``build_settings`` hands to ``Settings`` as they are."""

    retriever: BaseRetriever | None
    llm: BaseChatModel | None
    prompt_version: str | None
    model_version: str | None
    n_samples: int
    temperature: float
    plan_mode: str
    tier: str
    k: int | None
    support_backend: str | SupportBackend
    equivalence: Equivalence | None
    meter_provider: Any
    review_clustered_retrieval: bool
    relevance_floor: float | None
    prompt: PromptVersion | None


def build_settings(
    *,
    tracer_provider: TracerProvider | None = None,
    thresholds: Thresholds | tuple[float, float] | None = None,
    rules: Sequence[Rule] = (),
    escalation: EscalationHandler | None = None,
    combiner: Combiner | None = None,
    retry: RetryPolicy | None = None,
    audit: Any = "auto",
    retrieval_shape: ShapeThresholds | None = None,
    prices: Mapping[str, Any] | str | None = None,
    **options: Unpack[SettingsOptions],
) -> Settings:
    """Settings from user-facing options, with every default filled in (shared with wrap())."""
    if isinstance(thresholds, tuple):
        thresholds = Thresholds(pass_at=thresholds[0], review_at=thresholds[1])
    return Settings(
        tracer_provider=tracer_provider,
        thresholds=thresholds or Thresholds(),
        rules=tuple(rules),
        escalation=escalation or InMemoryEscalationHandler(),
        combiner=combiner or default_combiner(),
        retry=retry or RetryPolicy(),
        record_sink=resolve_sink(audit),
        retrieval_shape=retrieval_shape or ShapeThresholds(),
        prices=load_prices(prices),
        **options,
    )


class RAGPipeline(StagedRunnable):
    """Answers questions from a retriever's materials with verified citations and a confidence.

    Input: a question string, or ``{"question", "session_id", "user_id", "channel"}`` (all but
    question optional). Output: a ``tracerag.Response``. Works with ``invoke``, ``ainvoke``,
    ``batch``, ``abatch`` and inside LCEL; ``arun`` adds per-call hooks (stage events, record
    sink). ``prompt``: the prompt texts to send (a ``tracerag.prompts.PromptVersion``; default
    ``DEFAULT_PROMPT``). ``prices``: a price table per model (a mapping or a JSON file, see
    ``tracerag.usage``) for the cost of each request.
    """

    def __init__(
        self,
        retriever: BaseRetriever,
        llm: BaseChatModel,
        *,
        prompt_version: str | None,
        model_version: str | None,
        n_samples: int = 5,
        temperature: float = 0.7,
        thresholds: Thresholds | tuple[float, float] | None = None,
        rules: Sequence[Rule] = (),
        escalation: EscalationHandler | None = None,
        plan: str = "separate",
        tier: str = "high",
        k: int | None = None,
        support_backend: str | SupportBackend = "lexical",
        equivalence: Equivalence | None = None,
        combiner: Combiner | None = None,
        retry: RetryPolicy | None = None,
        tracer_provider: TracerProvider | None = None,
        meter_provider: Any = None,
        audit: Any = "auto",
        review_clustered_retrieval: bool = False,
        relevance_floor: float | None = None,
        retrieval_shape: ShapeThresholds | None = None,
        prompt: PromptVersion | None = None,
        prices: Mapping[str, Any] | str | None = None,
    ) -> None:
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
            tracer_provider=tracer_provider,
            prompt_version=prompt_version,
            model_version=model_version,
            n_samples=n_samples,
            temperature=temperature,
            plan_mode=plan,
            tier=tier,
            k=k,
            thresholds=thresholds,
            rules=rules,
            escalation=escalation,
            support_backend=support_backend,
            equivalence=equivalence,
            combiner=combiner,
            retry=retry,
            audit=audit,
            meter_provider=meter_provider,
            review_clustered_retrieval=review_clustered_retrieval,
            relevance_floor=relevance_floor,
            retrieval_shape=retrieval_shape,
            prompt=prompt,
            prices=prices,
        )
        super().__init__(settings, ModelSource())

    @property
    def escalation(self) -> EscalationHandler:
        """The handler that receives escalated and review-flagged requests."""
        return self.settings.escalation
