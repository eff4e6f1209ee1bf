"""Stage 1, register: fix the request's id, tier, versions and sampling parameters.

A request with no prompt version or no model version is refused here, before any model call:
a trace that cannot say which model and prompt made an answer cannot be audited. Under
``wrap()`` the versions an app calls only inside its runs are left to the sample stage to learn
(``Registration.versions_from_runs``); it refuses the request if the runs do not show them.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any

from langchain_core.runnables import RunnableConfig
from opentelemetry.trace import Span

from tracerag import __version__, semconv
from tracerag.errors import MissingVersionError
from tracerag.settings import Settings
from tracerag.state import Registration, RequestState, RunVersions
from tracerag.tracing import capture


def new_request_id() -> str:
    """A fresh request id (UUID4, hex)."""
    return uuid.uuid4().hex


async def register(
    state: RequestState,
    settings: Settings,
    span: Span,
    config: RunnableConfig | None = None,
    *,
    learn_from_runs: bool = False,
) -> Registration:
    """The request's registration: id, versions, tier and the tier's sampling parameters.

    ``learn_from_runs``: a missing version is marked to be learned from the samples' runs
    instead of refusing the request here.
    """
    registration = Registration(
        request_id=state.input.request_id or new_request_id(),
        tier=settings.tier,
        versions=RunVersions(
            prompt=settings.prompt_version,
            model=settings.model_version,
            tracerag=__version__,
            prompt_source=(settings.prompt_version_source or "argument")
            if settings.prompt_version
            else None,
            model_source=(settings.model_version_source or "argument")
            if settings.model_version
            else None,
        ),
        n_samples=settings.samples_for_tier(),
        temperature=settings.temperature,
        plan_mode=settings.plan_mode,
        k=settings.k,
    )
    versions = registration.versions
    attrs: dict[str, Any] = {
        semconv.REQUEST_ID: registration.request_id,
        semconv.TIER: registration.tier,
        semconv.VERSION_TRACERAG: __version__,
        semconv.N_SAMPLES: registration.n_samples,
        semconv.TEMPERATURE: float(registration.temperature),
        semconv.PLAN_MODE: registration.plan_mode,
        semconv.STARTED_AT: state.input.started_at.isoformat(),
        semconv.OI_LLM_INVOCATION_PARAMETERS: json.dumps(registration.params, default=str),
    }
    if state.input.channel:
        attrs[semconv.CHANNEL] = state.input.channel
    question = capture(state.question)
    if question is not None:
        attrs[semconv.OI_INPUT_VALUE] = question
    if versions.prompt:
        attrs[semconv.VERSION_PROMPT] = versions.prompt
        attrs[semconv.VERSION_PROMPT_SOURCE] = versions.prompt_source or "argument"
    if versions.model:
        attrs[semconv.VERSION_MODEL] = versions.model
        attrs[semconv.VERSION_MODEL_SOURCE] = versions.model_source or "argument"
    span.set_attributes(attrs)
    missing = [name for name in ("prompt", "model") if not getattr(versions, name)]
    if missing and learn_from_runs:
        span.set_attribute(semconv.VERSION_FROM_RUNS, missing)
        return dataclasses.replace(registration, versions_from_runs=tuple(missing))
    if missing:
        raise MissingVersionError(
            f"request {registration.request_id} refused: no {' and no '.join(missing)} version. "
            "Pass prompt_version= and model_version= so every answer can be traced to the "
            "prompt and model that made it."
        )
    return registration
