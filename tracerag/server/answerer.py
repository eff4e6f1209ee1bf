"""Running the pipeline for the server: one request in, its Response out, its record stored.

``Answerer.run`` answers inside the caller's trace context and writes the request's audit record
to the app's store before the answer goes out (on a store failure the record goes to a retrying
background writer and the answer says ``audit_persisted=false``). ``stage_event`` is what the
stream tells about each completed stage.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry import context as otel_context

from tracerag.contract import Response as RAGResponse
from tracerag.runner import StagedRunnable, StageEvent
from tracerag.store.base import AuditStore, DuplicateRequest, InvalidRecord

logger = logging.getLogger("tracerag.server")


def demo_pipeline(
    model: str = "extractive",
    *,
    n_samples: int = 5,
    temperature: float = 0.7,
    plan: str = "separate",
    seed: int | None = None,
) -> Any:
    """The pipeline served by default: the bundled knowledge base and an offline model."""
    from tracerag.demo.kb import build_retriever
    from tracerag.demo.run import build_model
    from tracerag.llm import model_name
    from tracerag.pipeline import RAGPipeline
    from tracerag.prompts import DEFAULT_PROMPT_VERSION

    llm = build_model(model, seed)
    return RAGPipeline(
        build_retriever(k=4),
        llm,
        prompt_version=DEFAULT_PROMPT_VERSION,
        model_version=model_name(llm) or type(llm).__name__,
        n_samples=n_samples,
        temperature=temperature,
        plan=plan,
        audit=None,
    )


StageHook = Callable[[StageEvent], None]


class Answerer:
    """Runs a pipeline for the server and keeps every request's record in the store.

    A record is committed to the store before its answer goes out, so the caller and the desk
    can read it at once. When the store is failing, slow or busy with records still waiting,
    the record goes to the audit writer's crash-safe journal instead (``journal``: a directory;
    default beside a SQLite store, ``TRACERAG_AUDIT_JOURNAL``), drained into the store in the
    background and replayed after a crash. ``audit_persisted`` is true only for a record that
    is durable either way.
    """

    def __init__(self, pipeline: Any, store: AuditStore, *, journal: str | None = None) -> None:
        from tracerag.store.writer import AuditWriter

        self.pipeline = pipeline
        self.store = store
        # created now: records a crash left in the journal are replayed into the store at start
        self.writer = AuditWriter(store, journal=journal if journal else None)
        self.last_store_error: str | None = None

    @property
    def staged(self) -> bool:
        """True when the pipeline runs tracerag's stages (and so can be streamed and recorded)."""
        return isinstance(self.pipeline, StagedRunnable)

    @property
    def max_question_chars(self) -> int:
        if isinstance(self.pipeline, StagedRunnable):
            return self.pipeline.settings.max_question_chars
        return 8000

    def _commit(self, record: Mapping[str, Any]) -> bool | None:
        """Commit a record to the store now: True when stored, None when the store failed."""
        try:
            self.store.append_record(record)
            self.last_store_error = None
            return True
        except DuplicateRequest:
            return True
        except InvalidRecord:
            return None  # the writer quarantines it, with the reason
        except Exception as exc:
            self.last_store_error = type(exc).__name__
            logger.warning(
                "audit store failed for request %s (%s: %s); the record goes to the journal",
                record.get("request_id"),
                type(exc).__name__,
                exc,
            )
            return None

    async def persist_async(self, record: dict[str, Any]) -> bool:
        """The record sink of every request run here: True only when the record is durable."""
        if self.writer.pending == 0 and self.writer.ready():
            committed: bool | None = await asyncio.to_thread(self._commit, record)
            if committed:
                return True
        return bool(await self.writer.asubmit_durable(record))

    def store_state(self) -> dict[str, Any]:
        """Whether records reach the store now, from the audit writer's own state."""
        status = self.writer.status()
        ready = bool(status["ready"]) and self.last_store_error is None
        last_error = self.last_store_error or status["last_error"]
        return {**status, "ready": ready, "last_error": last_error}

    def close(self) -> None:
        self.writer.close()

    async def run(
        self,
        data: dict[str, Any],
        *,
        on_stage: StageHook | None = None,
        parent: Any = None,
    ) -> RAGResponse:
        """Answer one request inside the caller's trace context; store its record first."""
        token = otel_context.attach(parent) if parent is not None else None
        try:
            if not isinstance(self.pipeline, StagedRunnable):
                response: RAGResponse = await self.pipeline.ainvoke(data)
                return response
            # tracerag's own request form: a wrapped app gets the question in its question field
            request = self.pipeline.parse_input(data)
            return await self.pipeline.arun(
                request, on_stage=on_stage, record_sink=self.persist_async
            )
        finally:
            if token is not None:
                otel_context.detach(token)


def stage_event(event: StageEvent) -> dict[str, Any]:
    """What a stream tells about a completed stage: its name, duration and key signals."""
    return event.to_dict()
