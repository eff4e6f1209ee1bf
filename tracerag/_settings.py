"""Settings: everything a pipeline run needs besides the request itself (frozen once built)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import TracerProvider

from tracerag._adaptive import (
    DEFAULT_AGREEMENT_PRIOR,
    DEFAULT_MIN_SAMPLES,
    DEFAULT_STOP_RISK,
    DEFAULT_VERIFY_PRIOR,
    AgreementPrior,
    StoppingRule,
    check_prior,
    prior_for,
)
from tracerag._choices import PlanMode, PlanModeName, Tier, TierName
from tracerag._routing import EscalationHandler, InMemoryEscalationHandler, Thresholds
from tracerag._usage import Price
from tracerag.errors import ConfigurationError
from tracerag.prompts import PromptVersion
from tracerag.signals._attribution import ShapeThresholds
from tracerag.signals._confidence import Combiner, HeuristicCombiner
from tracerag.signals._consistency import Equivalence
from tracerag.signals._relevance import AnswerRelevance
from tracerag.signals._rules import Rule
from tracerag.signals._support import SupportBackend

__all__ = [
    "PLAN_MODES",
    "TIERS",
    "PlanMode",
    "PlanModeName",
    "RecordSink",
    "RetryPolicy",
    "Settings",
    "Tier",
    "TierName",
]

TIERS: tuple[Tier, ...] = tuple(Tier)
PLAN_MODES: tuple[PlanMode, ...] = tuple(PlanMode)

#: Where a finished request's audit record goes: ``(record) -> accepted``, sync or async.
RecordSink = Callable[[dict[str, Any]], "bool | Awaitable[bool]"]


@dataclass(frozen=True)
class RetryPolicy:
    """How model and retriever calls are bounded: attempts, backoff, timeouts, output size.

    A failed call is retried (up to ``attempts`` in all, waiting ``initial_wait`` doubled each
    time up to ``max_wait``, plus up to ``jitter`` seconds) when retrying could help: timeouts,
    connection and rate-limit errors, server errors. Auth and validation errors, and errors
    from the model's own code, are not retried. Each attempt of a model call must return within
    ``model_timeout`` seconds and each retriever call within ``retriever_timeout`` (None: no
    limit); a timed-out attempt counts as a failed one. A model output longer than
    ``max_output_chars`` characters is cut there and its sample fails (None: no cap).
    """

    attempts: int = 3
    initial_wait: float = 0.5
    max_wait: float = 8.0
    jitter: float = 0.1
    model_timeout: float | None = 60.0
    retriever_timeout: float | None = 10.0
    max_output_chars: int | None = 20_000

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ConfigurationError("retry attempts must be at least 1")
        for name in ("model_timeout", "retriever_timeout"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigurationError(f"{name} must be a positive number of seconds or None")
        if self.max_output_chars is not None and self.max_output_chars < 1:
            raise ConfigurationError("max_output_chars must be at least 1, or None")


@dataclass(frozen=True)
class Settings:
    """The configuration every stage reads (built once per pipeline, never changed after)."""

    retriever: BaseRetriever | None
    llm: BaseChatModel | None
    tracer_provider: TracerProvider | None = None  # None: decided per request (tracing)
    prompt_version: str | None = None
    model_version: str | None = None
    # how the versions were obtained (the record says so); None: given as arguments
    prompt_version_source: str | None = None
    model_version_source: str | None = None
    n_samples: int = 5
    # adaptive sampling (tracerag._adaptive): min_samples first, more only while the route
    # could change with probability above stop_risk; min_samples >= n_samples: fixed N
    min_samples: int = DEFAULT_MIN_SAMPLES
    stop_risk: float = DEFAULT_STOP_RISK
    agreement_prior: AgreementPrior = field(default_factory=lambda: DEFAULT_AGREEMENT_PRIOR)
    # Beta prior on the chance that a sample agreeing with a candidate that does not verify
    # fully does verify fully (and would be chosen instead)
    verify_prior: tuple[float, float] = DEFAULT_VERIFY_PRIOR
    # calls in flight at once to the model (None: the model's own ``max_concurrency`` field,
    # else no limit); a one-slot local server takes 1
    max_concurrency: int | None = None
    temperature: float = 0.7
    plan_mode: PlanMode = PlanMode.SEPARATE
    tier: Tier = Tier.HIGH
    k: int | None = None
    thresholds: Thresholds = field(default_factory=Thresholds)
    rules: Sequence[Rule] = ()
    escalation: EscalationHandler = field(default_factory=InMemoryEscalationHandler)
    support_backend: str | SupportBackend = "lexical"
    equivalence: Equivalence | None = None
    combiner: Combiner = field(default_factory=HeuristicCombiner)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    record_sink: RecordSink | None = None
    meter_provider: MeterProvider | None = None  # None: decided per measurement (metrics)
    max_question_chars: int = 8000
    # attribution (tracerag.signals._attribution)
    retrieval_shape: ShapeThresholds = field(default_factory=ShapeThresholds)
    review_clustered_retrieval: bool = False  # a passing answer over a clustered retrieval: review
    relevance_floor: float | None = None  # materials scored below it are reported as such
    # does the answer address the question? (tracerag.signals._relevance; None: not checked)
    answer_relevance: AnswerRelevance | None = field(default_factory=AnswerRelevance)
    # the prompt texts sent (None: tracerag.prompts.DEFAULT_PROMPT)
    prompt: PromptVersion | None = None
    # model name -> price, for the cost of each request (None: tokens only)
    prices: Mapping[str, Price] | None = None
    # rewrites a conversation's turn as a standalone question (None: resolved without a model)
    question_rewriter: Runnable[dict[str, object], object] | None = None

    def __post_init__(self) -> None:
        # a name given as a plain string ("low") becomes its member (Tier.LOW)
        object.__setattr__(self, "tier", Tier.parse(self.tier, "tier"))
        object.__setattr__(self, "plan_mode", PlanMode.parse(self.plan_mode, "plan"))
        if not isinstance(self.n_samples, int) or self.n_samples < 1:
            raise ConfigurationError(f"n_samples must be a positive int, got {self.n_samples!r}")
        check_prior(self.agreement_prior)
        check_prior(self.verify_prior)
        StoppingRule(self.n_samples, self.min_samples, self.stop_risk)
        if self.max_concurrency is not None and (
            not isinstance(self.max_concurrency, int) or self.max_concurrency < 1
        ):
            raise ConfigurationError(
                f"max_concurrency must be a positive int or None, got {self.max_concurrency!r}"
            )
        if not 0.0 <= float(self.temperature) <= 2.0:
            raise ConfigurationError(f"temperature must be in [0, 2], got {self.temperature!r}")

    def stopping_rule(self, wanted: int, shape: str | None = None) -> StoppingRule:
        """The adaptive sampling rule for a request that draws at most ``wanted`` samples, its
        retrieval scores shaped ``shape`` (which agreement prior applies)."""
        prior = prior_for(self.agreement_prior, shape)
        return StoppingRule(wanted, self.min_samples, self.stop_risk, prior, self.verify_prior)

    def samples_for_tier(self) -> int:
        """How many samples this tier draws: all for high, up to 3 for medium, 1 for low."""
        if self.tier is Tier.LOW:
            return 1
        if self.tier is Tier.MEDIUM:
            return min(self.n_samples, 3)
        return self.n_samples
