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
    """Runs a pipeline for the server and keeps every request's record in the store."""

    def __init__(self, pipeline: Any, store: AuditStore) -> None:
        self.pipeline = pipeline
        self.store = store
        self._writer: Any = None
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

    def persist(self, record: Mapping[str, Any]) -> bool:
        """Write a record now; on a store failure hand it to a retrying background writer."""
        try:
            self.store.append_record(record)
            self.last_store_error = None
            return True
        except DuplicateRequest:
            return True
        except InvalidRecord:
            logger.exception("audit record of request %s refused", record.get("request_id"))
            return False
        except Exception as exc:
            self.last_store_error = type(exc).__name__
            logger.warning(
                "audit store failed for request %s (%s); retrying in the background",
                record.get("request_id"),
                exc,
            )
            self.writer().submit(record)
            return False

    def writer(self) -> Any:
        if self._writer is None:
            from tracerag.store.writer import AuditWriter

            self._writer = AuditWriter(self.store)
        return self._writer

    def store_state(self) -> dict[str, Any]:
        """Whether records reach the store now: ``ready``, ``backlog`` and the last failure.

        Built from what the writer exposes today (``healthy``, ``pending``); when the store
        grows a readiness check of its own, this is the one place to switch to it.
        """
        writer = self._writer
        healthy = self.last_store_error is None and (writer is None or bool(writer.healthy))
        return {
            "ready": healthy,
            "backlog": int(writer.pending) if writer is not None else 0,
            "last_error": self.last_store_error,
        }

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()

    async def persist_async(self, record: dict[str, Any]) -> bool:
        """``persist`` off the event loop: the record sink of every request run here."""
        return await asyncio.to_thread(self.persist, record)

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
            return await self.pipeline.arun(
                data, on_stage=on_stage, record_sink=self.persist_async
            )
        finally:
            if token is not None:
                otel_context.detach(token)


def stage_event(event: StageEvent) -> dict[str, Any]:
    """What a stream tells about a completed stage: its name, duration and key signals."""
    return event.to_dict()
