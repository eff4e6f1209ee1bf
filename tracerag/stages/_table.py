"""The stage table: which stages a request runs, in which order, for a tier and plan mode.

Both front doors run this one table. What differs between them is their ``Source``: how a
request's materials are retrieved and its samples drawn (the retriever and the chat model for
``RAGPipeline``, the wrapped chain's own runs for ``wrap()``).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from langchain_core.runnables import RunnableConfig
from opentelemetry.trace import Span

from tracerag._choices import PlanMode, Stage, Tier
from tracerag._settings import Settings
from tracerag._state import RequestState, Retrieval, SampleSet
from tracerag.stages._assemble import assemble
from tracerag.stages._plan import plan, plan_from_samples
from tracerag.stages._register import register
from tracerag.stages._retrieve import retrieve
from tracerag.stages._sample import sample
from tracerag.stages._verify import verify

__all__ = ["ModelSource", "Source", "StageFn", "Step", "steps_for"]

StageFn = Callable[[RequestState, Settings, Span, "RunnableConfig | None"], Awaitable[Any]]


class Source(Protocol):
    """How a front door gets a request's materials and samples.

    A source over an agent may also name it (``agent_name: str``, not part of the protocol):
    the request's root span is then ``invoke_agent {agent_name}``.
    """

    #: ``pipeline`` or ``wrap``: recorded on the root span.
    mode: str
    #: Whether versions neither given nor found can be learned from the samples' runs
    #: (register then leaves them to the sample stage instead of refusing the request).
    learns_versions: bool

    async def retrieve(
        self, state: RequestState, settings: Settings, span: Span, config: RunnableConfig | None
    ) -> Retrieval: ...

    async def sample(
        self, state: RequestState, settings: Settings, span: Span, config: RunnableConfig | None
    ) -> SampleSet: ...


class ModelSource:
    """RAGPipeline's source: the settings' retriever, and samples from its chat model."""

    mode = "pipeline"
    learns_versions = False

    async def retrieve(
        self, state: RequestState, settings: Settings, span: Span, config: RunnableConfig | None
    ) -> Retrieval:
        return await retrieve(state, settings, span, config)

    async def sample(
        self, state: RequestState, settings: Settings, span: Span, config: RunnableConfig | None
    ) -> SampleSet:
        return await sample(state, settings, span, config)


@dataclass(frozen=True)
class Step:
    """One stage in a run: its name, its function, or why it is skipped."""

    name: Stage
    fn: StageFn | None = None
    skip_reason: str | None = None


def steps_for(tier: Tier, plan_mode: PlanMode, source: Source) -> tuple[Step, ...]:
    """The six stages in run order (skipped ones kept, marked).

    ``plan_mode="inline"``: the samples write their plans, so the plan stage runs after them
    and records how far they agree. Tiers ``medium`` and ``low`` make no plan; ``low`` does not
    verify either.
    """
    registering: StageFn = (
        functools.partial(register, learn_from_runs=True) if source.learns_versions else register
    )
    first = (Step(Stage.REGISTER, registering), Step(Stage.RETRIEVE, source.retrieve))
    drawing = Step(Stage.SAMPLE, source.sample)
    assembling = Step(Stage.ASSEMBLE, assemble)
    if tier == Tier.LOW:
        return (
            *first,
            Step(Stage.PLAN, None, "tier low: no plan"),
            drawing,
            Step(Stage.VERIFY, None, "tier low: no verification"),
            assembling,
        )
    verifying = Step(Stage.VERIFY, verify)
    if tier == Tier.MEDIUM:
        planning = Step(Stage.PLAN, None, "tier medium: no plan")
        return (*first, planning, drawing, verifying, assembling)
    if plan_mode == PlanMode.INLINE:
        return (*first, drawing, Step(Stage.PLAN, plan_from_samples), verifying, assembling)
    return (*first, Step(Stage.PLAN, plan), drawing, verifying, assembling)
