"""Stage 1, register: fix the request's id, tier, versions and sampling parameters.

A request with no prompt version or no model version is refused here, before any model call:
a trace that cannot say which model and prompt made an answer cannot be audited. Under
``wrap()`` the versions an app calls only inside its runs are left to the sample stage to learn
(``Registration.versions_from_runs``); it refuses the request if the runs do not show them.
"""

from __future__ import annotations

import uuid

from langchain_core.runnables import RunnableConfig
from opentelemetry.trace import Span

from tracerag._declare import stamp
from tracerag._settings import Settings
from tracerag._state import Registration, RequestState, RunVersions
from tracerag._version import __version__
from tracerag.errors import MissingVersionError


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
    versions = RunVersions(
        prompt=settings.prompt_version,
        model=settings.model_version,
        tracerag=__version__,
        prompt_source=(settings.prompt_version_source or "argument")
        if settings.prompt_version
        else None,
        model_source=(settings.model_version_source or "argument")
        if settings.model_version
        else None,
    )
    missing = tuple(name for name in ("prompt", "model") if not getattr(versions, name))
    registration = Registration(
        request_id=state.input.request_id or new_request_id(),
        tier=settings.tier,
        versions=versions,
        n_samples=settings.samples_for_tier(),
        temperature=settings.temperature,
        plan_mode=settings.plan_mode,
        k=settings.k,
        versions_from_runs=missing if learn_from_runs else (),
    )
    # the register span shows the request's input and its registration
    stamp(span, state.input, registration)
    if missing and not learn_from_runs:
        raise MissingVersionError(
            f"request {registration.request_id} refused: no {' and no '.join(missing)} version. "
            "Pass prompt_version= and model_version= so every answer can be traced to the "
            "prompt and model that made it."
        )
    return registration
