"""Stage 1, register: give the request its id and record who asked what, with which versions.

A request with no prompt version or no model version is refused here, before any model call:
a trace that cannot say which model and prompt made an answer cannot be audited.
"""

from __future__ import annotations

import json
import uuid

from langchain_core.runnables import RunnableConfig
from opentelemetry.trace import Span

from tracerag import __version__, semconv
from tracerag.context import RequestContext
from tracerag.errors import MissingVersionError
from tracerag.settings import Settings
from tracerag.tracing import capture


def new_request_id() -> str:
    """A fresh request id (UUID4, hex)."""
    return uuid.uuid4().hex


async def register(
    ctx: RequestContext, settings: Settings, span: Span, config: RunnableConfig | None = None
) -> RequestContext:
    """Assign the request_id and record the input, channel, versions and sampling parameters."""
    if not ctx.request_id:
        ctx.request_id = new_request_id()
    ctx.versions.tracerag = __version__
    ctx.versions.prompt = ctx.versions.prompt or settings.prompt_version
    ctx.versions.model = ctx.versions.model or settings.model_version
    ctx.tier = settings.tier
    ctx.params.update(
        {
            "n_samples": settings.samples_for_tier(),
            "temperature": settings.temperature,
            "plan_mode": settings.plan_mode,
            "k": settings.k,
        }
    )
    span.set_attributes(
        {
            semconv.REQUEST_ID: ctx.request_id,
            semconv.TIER: ctx.tier,
            semconv.VERSION_TRACERAG: __version__,
            semconv.N_SAMPLES: settings.samples_for_tier(),
            semconv.TEMPERATURE: float(settings.temperature),
            semconv.PLAN_MODE: settings.plan_mode,
            semconv.STARTED_AT: ctx.started_at.isoformat(),
            semconv.OI_LLM_INVOCATION_PARAMETERS: json.dumps(ctx.params, default=str),
        }
    )
    if ctx.channel:
        span.set_attribute(semconv.CHANNEL, ctx.channel)
    question = capture(ctx.question)
    if question is not None:
        span.set_attribute(semconv.OI_INPUT_VALUE, question)
    if ctx.versions.prompt:
        span.set_attribute(semconv.VERSION_PROMPT, ctx.versions.prompt)
    if ctx.versions.model:
        span.set_attribute(semconv.VERSION_MODEL, ctx.versions.model)
    missing = [name for name in ("prompt", "model") if not getattr(ctx.versions, name)]
    if missing:
        raise MissingVersionError(
            f"request {ctx.request_id} refused: no {' and no '.join(missing)} version. "
            "Pass prompt_version= and model_version= so every answer can be traced to the "
            "prompt and model that made it."
        )
    return ctx
