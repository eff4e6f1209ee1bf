"""Running the pipeline for the server: one request in, its Response out, its record stored.

``Answerer.run`` answers inside the caller's trace context and writes the request's audit record
to the app's store before the answer goes out. A store that fails, or does not commit within
``commit_wait`` seconds (``TRACERAG_AUDIT_COMMIT_WAIT``, default 1), does not hold the answer:
the record goes to the audit writer's journal and ``audit_persisted`` says whether it is durable
there. ``stage_event`` is what the stream tells about each completed stage.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypedDict

from langchain_core.runnables import Runnable
from opentelemetry import context as otel_context

from tracerag._llm import model_name
from tracerag._pipeline import RAGPipeline
from tracerag._runnable import StagedRunnable
from tracerag._settings import PlanMode
from tracerag.config import get_config
from tracerag.contract import Response as RAGResponse
from tracerag.demo._run import build_model
from tracerag.demo.kb import build_retriever
from tracerag.errors import ConfigurationError
from tracerag.events import StageEvent
from tracerag.prompts import DEFAULT_PROMPT_VERSION
from tracerag.store._base import AuditStore, DuplicateRequest, InvalidRecord
from tracerag.store._writer import AuditWriter

if TYPE_CHECKING:
    from tracerag._pipeline import RAGPipeline
    from tracerag._settings import PlanMode, PlanModeName
    from tracerag.materials import MaterialRegistry

logger = logging.getLogger("tracerag.server")

#: seconds an answer waits for its record's store commit before the journal takes it
DEFAULT_COMMIT_WAIT = 1.0
#: threads committing records to the store (apart from the pipeline's executor)
COMMIT_THREADS = 4
#: records waiting for ``Answerer.after_record`` at most (more are logged and dropped)
MAX_HANDED_ON = 1000


def commit_wait_from_config() -> float:
    """``TRACERAG_AUDIT_COMMIT_WAIT`` in seconds (default 1; not a positive number: default)."""
    raw = get_config().audit_commit_wait
    if not raw:
        return DEFAULT_COMMIT_WAIT
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        logger.warning(
            "TRACERAG_AUDIT_COMMIT_WAIT=%r is not a positive number of seconds; using %s",
            raw,
            DEFAULT_COMMIT_WAIT,
        )
        return DEFAULT_COMMIT_WAIT
    return value


class _Commit:
    """One record's direct commit: run by a store thread, or given up before it started."""

    __slots__ = ("_lock", "_state", "record")

    def __init__(self, record: Mapping[str, Any]) -> None:
        self.record = record
        self._lock = threading.Lock()
        self._state = "queued"

    def start(self) -> bool:
        """True when the commit may run (it was not given up)."""
        with self._lock:
            if self._state != "queued":
                return False
            self._state = "running"
            return True

    def give_up(self) -> bool:
        """True when the commit had not started (and now never will)."""
        with self._lock:
            if self._state == "queued":
                self._state = "abandoned"
                return True
            return False


class DemoOptions(TypedDict, total=False):
    """The demo pipeline's settings ``create_app`` hands to ``demo_pipeline``."""

    n_samples: int
    temperature: float
    plan: PlanMode | PlanModeName
    seed: int | None


def demo_pipeline(
    model: str = "extractive",
    *,
    n_samples: int = 5,
    temperature: float = 0.7,
    plan: PlanMode | PlanModeName = "separate",
    seed: int | None = None,
    registry: MaterialRegistry | None = None,
) -> RAGPipeline:
    """The pipeline served by default: the bundled knowledge base and an offline model.

    With a material ``registry``, retrieval goes through it (``registry.govern``): materials
    that are quarantined, deleted, pending review or expired are withheld, the rest reranked by
    credibility (four of the eight most similar). First sight is left to the server's record
    hook (``Answerer.after_record``), off the answer's path."""
    llm = build_model(model, seed)
    retriever = (
        build_retriever(k=4)
        if registry is None
        else registry.govern(build_retriever(k=8), k=4, register_unseen=False)
    )
    return RAGPipeline(
        retriever,
        llm,
        prompt_version=DEFAULT_PROMPT_VERSION,
        model_version=model_name(llm) or type(llm).__name__,
        n_samples=n_samples,
        temperature=temperature,
        plan=PlanMode.parse(plan, "plan"),
        audit=None,
    )


StageHook = Callable[[StageEvent], None]


def servable(pipeline: object) -> bool:
    """True for what the server can run and record: a ``wrap()``-ed app or a ``RAGPipeline``."""
    return isinstance(pipeline, StagedRunnable)


class Answerer:
    """Runs a pipeline for the server and keeps every request's record in the store.

    A record is committed to the store before its answer goes out, so the caller and the desk
    can read it at once. When the store is failing, busy with records still waiting, or has not
    committed within ``commit_wait`` seconds (locked, frozen, slow), the record goes to the audit
    writer's crash-safe journal instead (``journal``: a directory; default beside a SQLite
    store, ``TRACERAG_AUDIT_JOURNAL``), drained into the store in the background and replayed
    after a crash. ``audit_persisted`` is true only for a record that is durable either way. A
    commit that ends after its record was journaled leaves one stored record: the journal's
    copy is skipped as already stored. Store commits run on ``commit_threads`` threads of their
    own, never on the event loop's default executor (the pipeline's).
    """

    def __init__(
        self,
        pipeline: Runnable[Any, RAGResponse],
        store: AuditStore,
        *,
        journal: str | None = None,
        commit_wait: float | None = None,
        commit_threads: int = COMMIT_THREADS,
    ) -> None:
        self.pipeline = pipeline
        self.store = store
        self.commit_wait = commit_wait_from_config() if commit_wait is None else commit_wait
        if not self.commit_wait > 0:
            raise ConfigurationError("commit_wait must be a positive number of seconds")
        self._commits = ThreadPoolExecutor(
            max_workers=max(1, commit_threads), thread_name_prefix="tracerag-store-commit"
        )
        # created now: records a crash left in the journal are replayed into the store at start
        self.writer = AuditWriter(store, journal=journal if journal else None)
        self.last_store_error: str | None = None
        #: direct commits not done within ``commit_wait`` (their records went to the journal)
        self.commit_timeouts = 0
        self._in_flight = 0
        self._in_flight_lock = threading.Lock()
        #: told every record this server persists (the material registry's first sight and
        #: read hits), on a thread of its own; see ``hand_on``
        self.after_record: Callable[[Mapping[str, Any]], None] | None = None
        self._after = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tracerag-after-record")
        self._handed_on = 0
        self._skipping = False
        self.handed_on_dropped = 0
        self.handed_on_failed = 0

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
            self.writer.report_failure(exc)  # not ready until the writer's probe sees it back
            logger.warning(
                "audit store failed for request %s (%s: %s); the record goes to the journal",
                record.get("request_id"),
                type(exc).__name__,
                exc,
            )
            return None

    @property
    def commits_in_flight(self) -> int:
        """Direct store commits queued or running (late ones included)."""
        with self._in_flight_lock:
            return self._in_flight

    def _run_commit(self, ticket: _Commit) -> bool | None:
        try:
            if not ticket.start():
                return None  # given up: the record went to the journal
            return self._commit(ticket.record)
        finally:
            with self._in_flight_lock:
                self._in_flight -= 1

    async def _commit_within(self, record: Mapping[str, Any]) -> bool | None:
        """Commit on a store thread; True when stored within ``commit_wait``, else None."""
        ticket = _Commit(record)
        with self._in_flight_lock:
            self._in_flight += 1
        future = asyncio.get_running_loop().run_in_executor(self._commits, self._run_commit, ticket)
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.commit_wait)
        except TimeoutError:
            running = not ticket.give_up()
            self.commit_timeouts += 1
            first = self.last_store_error is None
            self.last_store_error = f"CommitTimeout: a store commit took over {self.commit_wait}s"
            self.writer.report_failure(TimeoutError(self.last_store_error))
            (logger.warning if first else logger.info)(
                "audit store commit for request %s not done after %.1fs (%s); the record "
                "goes to the journal",
                record.get("request_id"),
                self.commit_wait,
                "still running" if running else "not started",
            )
            return None

    async def persist_async(self, record: dict[str, Any]) -> bool:
        """The record sink of every request run here: True only when the record is durable.

        Waits at most about ``commit_wait`` for the store, then for the journal's disk sync.
        """
        self.hand_on(record)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.commit_wait
        direct = self.writer.pending == 0 and self.writer.ready()
        if direct and await self._commit_within(record):
            return True
        if self.writer.journal is None:
            # no journal: durable only once the store commits it, waited for within the bound
            remaining = max(0.0, deadline - loop.time())
            return bool(
                await loop.run_in_executor(None, self.writer.submit_durable, record, remaining)
            )
        return bool(await self.writer.asubmit_durable(record))

    def store_state(self) -> dict[str, Any]:
        """Whether records reach the store now, from the audit writer's own state.

        A failed or hung direct commit makes the writer report not ready; its background probe
        (short backoff) makes it ready again once the store answers, with or without traffic.
        """
        status = self.writer.status()
        ready = bool(status["ready"])
        if ready:
            self.last_store_error = None
        last_error = status["last_error"] or (None if ready else self.last_store_error)
        return {**status, "ready": ready, "last_error": last_error}

    def hand_on(self, record: Mapping[str, Any]) -> None:
        """Give a record to ``after_record`` (the material registry's first sight and read
        hits) on a thread of its own, off the answer's path; at most ``MAX_HANDED_ON`` wait."""
        hook = self.after_record
        if hook is None:
            return
        if self.last_store_error is not None or not self.writer.ready():
            # the registry lives in the store: it would only wait for it, holding its lock
            self.handed_on_dropped += 1
            if not self._skipping:
                logger.warning(
                    "read hits and first sight of answered materials are not logged while the "
                    "audit store is not taking writes (from request %s on)",
                    record.get("request_id"),
                )
            self._skipping = True
            return
        if self._skipping:
            logger.warning("read hits of answered materials are logged again")
        self._skipping = False
        with self._in_flight_lock:
            if self._handed_on >= MAX_HANDED_ON:
                self.handed_on_dropped += 1
                logger.warning(
                    "read hits of request %s not logged: %d records already wait for the "
                    "material registry",
                    record.get("request_id"),
                    self._handed_on,
                )
                return
            self._handed_on += 1

        def run() -> None:
            try:
                hook(record)
            except Exception as exc:
                self.handed_on_failed += 1
                logger.warning(
                    "the material registry did not take request %s's materials and read hits "
                    "(%s: %s)",
                    record.get("request_id"),
                    type(exc).__name__,
                    exc,
                )
            finally:
                with self._in_flight_lock:
                    self._handed_on -= 1

        self._after.submit(run)

    def wait_handed_on(self, timeout: float = 30.0) -> None:
        """Wait until the records handed on so far have been taken by ``after_record``."""
        self._after.submit(lambda: None).result(timeout=timeout)

    def close(self) -> None:
        # a commit still hanging is not waited for: its record is in the journal or the buffer
        self._commits.shutdown(wait=False, cancel_futures=True)
        self._after.shutdown(wait=True)
        self.writer.close()

    async def run(
        self,
        data: dict[str, Any],
        *,
        on_stage: StageHook | None = None,
        parent: otel_context.Context | None = None,
    ) -> RAGResponse:
        """Answer one request inside the caller's trace context; store its record first."""
        token = otel_context.attach(parent) if parent is not None else None
        try:
            if not isinstance(self.pipeline, StagedRunnable):
                # not tracerag's stages: it takes the caller's fields only
                given = {k: v for k, v in data.items() if k != "request_id"}
                response: RAGResponse = await self.pipeline.ainvoke(given)
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
