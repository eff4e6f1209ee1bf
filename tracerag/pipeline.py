"""RAGPipeline: a LangChain Runnable that answers a question through the six traced stages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnableConfig
from opentelemetry.trace import TracerProvider

from tracerag.audit import resolve_sink
from tracerag.calibration import default_combiner
from tracerag.contract import Response
from tracerag.errors import ConfigurationError
from tracerag.routing import EscalationHandler, InMemoryEscalationHandler, Thresholds
from tracerag.runner import Step, parse_input, run_steps, run_sync
from tracerag.settings import RetryPolicy, Settings
from tracerag.signals.confidence import Combiner
from tracerag.signals.consistency import Equivalence
from tracerag.signals.rules import Rule
from tracerag.signals.support import SupportBackend
from tracerag.stages.assemble import assemble
from tracerag.stages.plan import plan, plan_from_samples
from tracerag.stages.register import register
from tracerag.stages.retrieve import retrieve
from tracerag.stages.sample import sample
from tracerag.stages.verify import verify


def steps_for(tier: str, plan_mode: str) -> list[Step]:
    """The six stages in run order for a tier and plan mode (skipped ones kept, marked)."""
    if tier == "low":
        return [
            Step("register", register),
            Step("retrieve", retrieve),
            Step("plan", None, "tier low: no plan"),
            Step("sample", sample),
            Step("verify", None, "tier low: no verification"),
            Step("assemble", assemble),
        ]
    if tier == "medium":
        planning = Step("plan", None, "tier medium: no plan")
        return [
            Step("register", register),
            Step("retrieve", retrieve),
            planning,
            Step("sample", sample),
            Step("verify", verify),
            Step("assemble", assemble),
        ]
    if plan_mode == "inline":  # plans are written by the samples, so they are recorded after
        return [
            Step("register", register),
            Step("retrieve", retrieve),
            Step("sample", sample),
            Step("plan", plan_from_samples),
            Step("verify", verify),
            Step("assemble", assemble),
        ]
    return [
        Step("register", register),
        Step("retrieve", retrieve),
        Step("plan", plan),
        Step("sample", sample),
        Step("verify", verify),
        Step("assemble", assemble),
    ]


def build_settings(
    *,
    tracer_provider: TracerProvider | None = None,
    thresholds: Thresholds | tuple[float, float] | None = None,
    rules: Sequence[Rule] = (),
    escalation: EscalationHandler | None = None,
    combiner: Combiner | None = None,
    retry: RetryPolicy | None = None,
    audit: Any = "auto",
    **options: Any,
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
        **options,
    )


class RAGPipeline(Runnable[Any, Response]):
    """Answers questions from a retriever's materials with verified citations and a confidence.

    Input: a question string, or ``{"question", "session_id", "user_id", "channel"}`` (all but
    question optional). Output: a ``tracerag.Response``. Works with ``invoke``, ``ainvoke``,
    ``batch``, ``abatch`` and inside LCEL.
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
    ) -> None:
        if not isinstance(retriever, BaseRetriever):
            raise ConfigurationError(
                f"retriever must be a LangChain BaseRetriever, got {type(retriever).__name__}"
            )
        if not isinstance(llm, BaseChatModel):
            raise ConfigurationError(
                f"llm must be a LangChain BaseChatModel, got {type(llm).__name__}"
            )
        self.settings = build_settings(
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
        )
        self.steps = steps_for(tier, plan)

    @property
    def escalation(self) -> EscalationHandler:
        """The handler that receives escalated and review-flagged requests."""
        return self.settings.escalation

    async def ainvoke(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Response:
        ctx = parse_input(input, max_chars=self.settings.max_question_chars)
        return await run_steps(ctx, self.settings, self.steps, config)

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Response:
        return run_sync(lambda: self.ainvoke(input, config, **kwargs))

    @property
    def InputType(self) -> Any:
        return str | dict

    @property
    def OutputType(self) -> type[Response]:
        return Response
