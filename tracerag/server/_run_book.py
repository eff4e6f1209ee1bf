"""Answer runs the server can replay: resumable streams, idempotent requests, decisions.

Every answer request the server runs is a ``Run``: its request id (chosen before the
pipeline starts), a fingerprint of the question, and its events in order (``stage`` ×6, then
``response`` or ``error``). Streams read a run from any position, so a reconnect with
``Last-Event-ID`` resumes the same request, and an ``Idempotency-Key`` seen again joins or
replays the run it named instead of asking again: no second request, no second review item.

``RunBook`` keeps recent runs in memory (at most ``max_runs`` finished ones, each for ``ttl``
seconds) and, when the audit store has a database, in the ``answer_runs`` table beside it
(``tracerag.server._run_table``), so a key or a request id used on another replica finds the
run there. A replica that finds a run under way elsewhere follows the table until the run
ends; a run whose replica stopped ends in an ``error`` event (``request_unfinished``). A
replayed ``response`` is read from the request's hash-chained audit record, never from the
table. When the table cannot be reached, keys and runs hold on the replica that took them
(logged).

``DecisionWatch`` tells waiting streams a reviewer's decision: at once when it was taken on
this replica, otherwise within ``poll_interval`` seconds (one query for all waiting requests).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal, NamedTuple

from tracerag.contract import Response, caller_stage, caller_view, withheld
from tracerag.errors import ConfigurationError, InputError, TraceragError
from tracerag.events import StageEvent
from tracerag.server._run_table import RunTable, StoredRun
from tracerag.stages._register import new_request_id
from tracerag.store._base import AuditStore, RequestNotFound
from tracerag.store._codec import RequestTrail

logger = logging.getLogger("tracerag.server")

EventName = Literal["stage", "response", "error", "decision"]
#: the events that end a run
FINAL_EVENTS = ("response", "error")
#: decisions that put a request in front of a reviewer
REVIEWED = ("review", "escalate")

DEFAULT_TTL = 600.0
DEFAULT_MAX_RUNS = 1000
#: how long a replica follows a run under way on another replica before giving up on it
DEFAULT_FOLLOW_SECONDS = 300.0
#: how often a follower looks at the table, and the watch at the store
FOLLOW_INTERVAL = 0.25
POLL_INTERVAL = 1.0
#: the longest a table call may take before the run goes on without it
TABLE_TIMEOUT = 3.0
PURGE_EVERY = 60.0
MAX_KEY_CHARS = 255

StatusOf = Callable[[RequestTrail], dict[str, Any]]


class KeyReused(TraceragError):
    """An ``Idempotency-Key`` came back with another question."""


def fingerprint(data: Mapping[str, Any]) -> str:
    """What identifies a question: its text and the session, user and channel it came with."""
    fields = {k: data.get(k) for k in ("question", "session_id", "user_id", "channel")}
    text = json.dumps(fields, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def key_problem(key: str) -> str | None:
    """Why an ``Idempotency-Key`` cannot be used, or None."""
    if not 1 <= len(key) <= MAX_KEY_CHARS:
        return f"an Idempotency-Key is 1 to {MAX_KEY_CHARS} characters"
    if not all(0x21 <= ord(ch) <= 0x7E for ch in key):
        return "an Idempotency-Key is visible ASCII (no spaces)"
    return None


def event_id(request_id: str, name: str, data: Any) -> str:
    """The id a stream gives an event: ``<request_id>:<stage>`` or ``<request_id>:<event>``."""
    if name == "stage" and isinstance(data, Mapping):
        return f"{request_id}:{data.get('stage')}"
    return f"{request_id}:{name}"


def parse_event_id(value: str) -> tuple[str, str] | None:
    """``(request_id, part)`` from an event id, or None when it is not one of ours."""
    request_id, sep, part = value.strip().partition(":")
    if not sep or not request_id or not part or len(request_id) > 200:
        return None
    if not all(ch.isascii() and (ch.isalnum() or ch in "-_.") for ch in request_id):
        return None
    return request_id, part


class Event(NamedTuple):
    """One event of a run, encoded once: its name, its id's part after the request id, and
    its data as one line of JSON (what a stream sends, what a replay sends again)."""

    name: str
    part: str
    text: str

    @property
    def data(self) -> Any:
        return json.loads(self.text)


def encode(data: Any) -> str:
    return json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


class Run:
    """One answer request's events, readable from any position while they arrive."""

    def __init__(self, request_id: str, fingerprint: str, *, local: bool) -> None:
        self.request_id = request_id
        self.fingerprint = fingerprint
        #: True when this replica runs the pipeline; False for a replay of a stored run
        self.local = local
        self.events: list[Event] = []
        self.done = False
        self.ended_at: float | None = None
        #: the response's routing, for streams that wait for a reviewer: (decision, persisted)
        self.routed: tuple[str | None, bool | None] = (None, None)
        self._waiters: set[asyncio.Future[None]] = set()

    def add(self, name: str, data: Any) -> None:
        if self.done:
            return
        part = event_id(self.request_id, name, data).partition(":")[2]
        self.events.append(Event(name, part, encode(data)))
        if name == "response" and isinstance(data, Mapping):
            persisted = data.get("audit_persisted")
            self.routed = (data.get("decision"), persisted if isinstance(persisted, bool) else None)
        if name in FINAL_EVENTS:
            self.done = True
            self.ended_at = time.monotonic()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    async def changed(self, timeout: float) -> bool:
        """Wait for the next event; False when ``timeout`` passed first."""
        if self.done:
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.add(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            self._waiters.discard(waiter)

    async def final(self) -> Event:
        """The event that ended the run (``response`` or ``error``), once it came."""
        while not self.done:
            await self.changed(3600.0)
        return self.events[-1]

    def awaits_decision(self, store: AuditStore) -> bool:
        """True when the run ended in a response a reviewer will decide."""
        if not self.done or self.events[-1].name != "response":
            return False
        decision, persisted = self.routed
        return (
            decision in REVIEWED
            and persisted is not False
            and bool(getattr(store, "auto_enqueue", True))
        )

    def size(self) -> int:
        """Characters its events take as JSON (what a replay sends)."""
        return sum(len(e.text) + len(e.name) + len(e.part) for e in self.events)


class DecisionWatch:
    """Wakes the streams waiting for a reviewer's decision on their request."""

    def __init__(
        self,
        store: AuditStore,
        table: RunTable | None,
        status_of: StatusOf,
        *,
        poll_interval: float = POLL_INTERVAL,
    ) -> None:
        self.store = store
        self.table = table
        self.status_of = status_of
        self.poll_interval = poll_interval
        self._waiting: dict[str, set[asyncio.Future[dict[str, Any]]]] = {}
        self._poller: asyncio.Task[None] | None = None
        self._nudge: asyncio.Event | None = None
        self._hinted: set[str] = set()

    @property
    def waiting(self) -> int:
        """Requests with a stream waiting for their decision."""
        return len(self._waiting)

    async def decided(self, request_id: str) -> dict[str, Any] | None:
        """The caller's view of the request once decided (``RequestStatus``), else None."""
        try:
            trail = await asyncio.to_thread(self.store.get, request_id)
        except RequestNotFound:
            return None  # not stored yet (in the journal): not decided either
        if trail.review is None or trail.review.status != "decided":
            return None
        return self.status_of(trail)

    async def wait(self, request_id: str) -> dict[str, Any]:
        """The request's decision, when a reviewer takes it."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._waiting.setdefault(request_id, set()).add(waiter)
        try:
            try:
                now = await self.decided(request_id)
            except Exception as exc:  # the store is failing: the poller asks again
                logger.warning("decision watch: %s: %s", type(exc).__name__, exc)
                now = None
            if now is not None:
                return now
            self._ensure_poller()
            return await waiter
        finally:
            waiters = self._waiting.get(request_id)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiting[request_id]

    def notify(self, request_id: str) -> None:
        """A reviewer decided ``request_id`` on this replica: tell its streams now."""
        if request_id in self._waiting and self._nudge is not None:
            self._hinted.add(request_id)
            self._nudge.set()

    def _ensure_poller(self) -> None:
        if self._poller is None or self._poller.done():
            self._nudge = asyncio.Event()
            self._poller = asyncio.create_task(self._poll(), name="tracerag-decision-watch")

    async def _decided_ids(self, ids: list[str]) -> set[str]:
        if self.table is not None:
            try:
                return await asyncio.wait_for(
                    asyncio.to_thread(self.table.decided_among, ids), TABLE_TIMEOUT
                )
            except Exception as exc:
                logger.info("decision watch: the table failed (%s); asking the store", exc)

        def each() -> set[str]:
            found = set()
            for rid in ids:
                try:
                    if self.store.get_decision(rid) is not None:
                        found.add(rid)
                except RequestNotFound:
                    pass
            return found

        return await asyncio.to_thread(each)

    async def _poll(self) -> None:
        nudge = self._nudge
        assert nudge is not None
        while self._waiting:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(nudge.wait(), self.poll_interval)
            nudge.clear()
            hinted, self._hinted = self._hinted, set()
            ids = list(self._waiting)
            try:
                decided = hinted | await self._decided_ids(ids)
                for rid in decided:
                    waiters = self._waiting.get(rid)
                    if not waiters:
                        continue
                    status = await self.decided(rid)
                    if status is None:
                        continue
                    for waiter in list(waiters):
                        if not waiter.done():
                            waiter.set_result(status)
            except Exception as exc:  # the store is failing: try again on the next round
                logger.warning("decision watch: %s: %s", type(exc).__name__, exc)

    async def close(self) -> None:
        if self._poller is not None and not self._poller.done():
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)


Runner = Callable[[dict[str, Any], Callable[[StageEvent], None]], Awaitable[Response]]


class RunBook:
    """The runs of one app: started, joined by key, replayed, kept within bounds."""

    def __init__(
        self,
        store: AuditStore,
        table: RunTable | None,
        *,
        scope: str = "",
        ttl: float = DEFAULT_TTL,
        max_runs: int = DEFAULT_MAX_RUNS,
        follow_seconds: float = DEFAULT_FOLLOW_SECONDS,
    ) -> None:
        if not ttl > 0 or max_runs < 1:
            raise ConfigurationError("runs are kept for a positive time, at least one")
        self.store = store
        self.table = table
        self.ttl = ttl
        self.max_runs = max_runs
        self.follow_seconds = follow_seconds
        self._scope = hashlib.sha256(scope.encode("utf-8")).hexdigest()[:16]
        self.runs: OrderedDict[str, Run] = OrderedDict()
        self._keys: dict[str, str] = {}  # key hash -> request id
        self._key_of: dict[str, str] = {}  # request id -> key hash
        self._claims: dict[str, asyncio.Future[Run | None]] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self._purged_at = 0.0
        #: table calls that failed or timed out (keys then hold on this replica only)
        self.table_failures = 0

    # -- keeping --------------------------------------------------------------------------------

    def key_hash(self, key: str) -> str:
        return hashlib.sha256(f"{self._scope}\x00{key}".encode()).hexdigest()

    def _keep(self, run: Run, key: str | None) -> None:
        self.runs[run.request_id] = run
        self.runs.move_to_end(run.request_id)
        if key is not None:
            self._keys[key] = run.request_id
            self._key_of[run.request_id] = key
        self._evict()

    def _evict(self) -> None:
        """Forget finished runs past their time, and the oldest beyond ``max_runs``."""
        now = time.monotonic()
        finished = [r for r in self.runs.values() if r.done]
        excess = len(finished) - self.max_runs
        for run in finished:
            expired = run.ended_at is not None and now - run.ended_at > self.ttl
            if expired or excess > 0:
                excess -= 1
                self._forget(run.request_id)
            else:
                break  # oldest first: the rest are newer

    def _forget(self, request_id: str) -> None:
        self.runs.pop(request_id, None)
        key = self._key_of.pop(request_id, None)
        if key is not None and self._keys.get(key) == request_id:
            del self._keys[key]

    def _spawn(self, coro: Awaitable[Any], name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _table(self, fn: Callable[..., Any], *args: Any) -> Any:
        assert self.table is not None
        return await asyncio.wait_for(asyncio.to_thread(fn, *args), TABLE_TIMEOUT)

    # -- starting -------------------------------------------------------------------------------

    async def start(
        self,
        data: dict[str, Any],
        runner: Runner,
        *,
        key: str | None = None,
        resumable: bool = False,
    ) -> tuple[Run, bool]:
        """The run answering ``data``: a new one, or the one ``key`` already names.

        Returns ``(run, replayed)``. ``resumable`` (or a key) records the run in the table
        for other replicas. Raises ``KeyReused`` when the key named another question.
        """
        fp = fingerprint(data)
        kh = self.key_hash(key) if key is not None else None
        if kh is not None:
            pending = self._claims.get(kh)
            if pending is not None:
                joined = await asyncio.shield(pending)
                if joined is None:  # the claim failed: try again
                    return await self.start(data, runner, key=key, resumable=resumable)
                return self._same(joined, fp), True
            known = self._keys.get(kh)
            if known is not None and known in self.runs:
                return self._same(self.runs[known], fp), True
            claim: asyncio.Future[Run | None] = asyncio.get_running_loop().create_future()
            self._claims[kh] = claim
            run: Run | None = None
            try:
                run, replayed = await self._claim(data, runner, fp, kh, True)
            finally:
                self._claims.pop(kh, None)
                claim.set_result(run)
            return self._same(run, fp), replayed
        fresh, _ = await self._claim(data, runner, fp, None, resumable)
        return fresh, False

    @staticmethod
    def _same(run: Run, fp: str) -> Run:
        if run.fingerprint != fp:
            raise KeyReused("this Idempotency-Key was used for another question")
        return run

    async def _claim(
        self, data: dict[str, Any], runner: Runner, fp: str, kh: str | None, record: bool
    ) -> tuple[Run, bool]:
        request_id = new_request_id()
        other: StoredRun | None = None
        failed = False
        if record and self.table is not None:
            try:
                other = await self._table(
                    self.table.claim, request_id, kh, fp, time.time(), self.ttl
                )
            except Exception as exc:
                failed = True
                self.table_failures += 1
                logger.warning(
                    "answer runs: the table failed (%s: %s); request %s is resumable and its "
                    "key honoured on this replica only",
                    type(exc).__name__,
                    exc,
                    request_id,
                )
        if other is not None:
            run = Run(other.request_id, other.fingerprint, local=False)
            self._keep(run, kh)
            self._spawn(self._follow(run, other), f"tracerag-follow-{run.request_id}")
            return run, True
        run = Run(request_id, fp, local=True)
        self._keep(run, kh)
        in_table = record and self.table is not None and not failed
        self._spawn(
            self._execute(run, {**data, "request_id": request_id}, runner, in_table),
            f"tracerag-run-{request_id}",
        )
        return run, False

    async def _execute(self, run: Run, data: dict[str, Any], runner: Runner, record: bool) -> None:
        # the verify stage's signals are measured on the answer: its event waits for the
        # decision (the next stage, with no model call) and loses them when it withholds it
        held: list[dict[str, Any]] = []

        def release(hide: bool) -> None:
            for payload in held:
                run.add("stage", caller_stage(payload) if hide else payload)
            held.clear()

        def on_stage(event: StageEvent) -> None:
            payload = event.to_dict()
            if payload["stage"] == "verify":
                held.append(payload)
                return
            if payload["stage"] == "assemble":
                release(str(payload["signals"].get("decision")) == "escalate")
            run.add("stage", payload)

        try:
            response = await runner(data, on_stage)
            release(withheld(response))
            run.add("response", caller_view(response))
        except InputError as exc:
            release(True)  # no decision was made: nothing of the answer is sent
            run.add("error", {"error": "invalid_input", "detail": str(exc)})
        except Exception as exc:
            logger.exception("request %s failed", run.request_id)
            release(True)
            run.add("error", {"error": "pipeline_failed", "detail": type(exc).__name__})
        finally:
            if not run.done:  # cancelled (shutdown)
                release(True)
                run.add("error", {"error": "request_unfinished", "detail": "the server stopped"})
        if record and self.table is not None:
            try:
                events = [(e.name, e.text) for e in run.events]
                await self._table(self.table.finish, run.request_id, events)
            except Exception as exc:
                self.table_failures += 1
                logger.warning(
                    "answer runs: could not store the events of %s (%s: %s); it is replayed "
                    "from this replica only",
                    run.request_id,
                    type(exc).__name__,
                    exc,
                )
            await self._purge()
        self._evict()

    async def _purge(self) -> None:
        now = time.time()
        if self.table is None or now - self._purged_at < PURGE_EVERY:
            return
        self._purged_at = now
        try:
            await self._table(self.table.purge, now)
        except Exception as exc:
            logger.info("answer runs: purge failed: %s", exc)

    # -- finding ----------------------------------------------------------------------------------

    async def find(self, request_id: str) -> Run | None:
        """The run of a request: kept here, in the table, or rebuilt from its audit record."""
        run = self.runs.get(request_id)
        if run is not None:
            return run
        stored: StoredRun | None = None
        if self.table is not None:
            try:
                stored = await self._table(self.table.get, request_id, time.time())
            except Exception as exc:
                self.table_failures += 1
                logger.warning("answer runs: the table failed (%s); using the record", exc)
        if stored is None:
            trail = await self._trail(request_id)
            if trail is None:
                return None
            run = Run(request_id, "", local=False)
            run.add("response", self._recorded_view(trail))
            self._keep(run, None)
            return run
        run = Run(request_id, stored.fingerprint, local=False)
        self._keep(run, None)
        self._spawn(self._follow(run, stored), f"tracerag-follow-{request_id}")
        return run

    async def _trail(self, request_id: str) -> RequestTrail | None:
        try:
            return await asyncio.wait_for(
                asyncio.to_thread(self.store.get, request_id), TABLE_TIMEOUT
            )
        except RequestNotFound:
            return None

    @staticmethod
    def _recorded_view(trail: RequestTrail) -> dict[str, Any]:
        """The caller view of a stored request's response (it is in the store: persisted)."""
        response = dict(trail.record.get("response") or {})
        response["audit_persisted"] = True
        return caller_view(response)

    async def _follow(self, run: Run, stored: StoredRun | None) -> None:
        """Fill a replayed run from the table (and the audit record) until it ends."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.follow_seconds
        rounds = 0
        staged = False
        try:
            while True:
                if stored is not None and stored.events is not None and not staged:
                    staged = True
                    for name, data in stored.events:
                        if name == "response":
                            break
                        run.add(name, data)
                    if run.done:
                        return
                # the response (and a run whose replica stopped after storing its record)
                # comes from the audit record
                if stored is None or stored.events is not None or rounds % 8 == 7:
                    trail = await self._trail(run.request_id)
                    if trail is not None and trail.record.get("response"):
                        run.add("response", self._recorded_view(trail))
                        return
                if loop.time() > deadline:
                    break
                await asyncio.sleep(FOLLOW_INTERVAL)
                rounds += 1
                if self.table is not None:
                    try:
                        stored = await self._table(self.table.get, run.request_id, time.time())
                    except Exception as exc:
                        logger.info("answer runs: following %s: %s", run.request_id, exc)
        except Exception as exc:
            logger.warning("answer runs: following %s failed: %s", run.request_id, exc)
        run.add(
            "error",
            {
                "error": "request_unfinished",
                "detail": f"request {run.request_id} did not finish on the replica running "
                "it; its outcome may appear later at GET /v1/requests/{id}",
            },
        )

    # -- the end ----------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """What the book keeps now: runs, running ones, bytes of their events, keys."""
        running = sum(1 for r in self.runs.values() if not r.done)
        return {
            "runs": len(self.runs),
            "running": running,
            "bytes": sum(r.size() for r in self.runs.values()),
            "keys": len(self._keys),
            "table": self.table is not None,
            "table_failures": self.table_failures,
        }

    async def close(self, wait: float = 30.0) -> None:
        """Let runs under way finish (their records be stored) for up to ``wait`` seconds,
        then stop what is left."""
        running = [t for t in self.tasks if t.get_name().startswith("tracerag-run-")]
        if running:
            await asyncio.wait(running, timeout=wait)
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.table is not None:
            await asyncio.to_thread(self.table.close)
