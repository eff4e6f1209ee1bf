"""The audit writer's watch on its store: failing or not since when, probing, hung operations.

``StoreHealth`` records failures and recoveries; times every store operation (``timed``) so its
watchdog thread interrupts one hanging past ``op_timeout``; and probes the store (open it,
``ping`` it) while idle, every ``probe_interval`` when healthy and with a short backoff up to
``probe_max`` when failing, so readiness follows the store with or without traffic.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from tracerag.store._link import StoreLink
from tracerag.store._retry import RetryPolicy
from tracerag.store._types import StoreReplaced, StoreVanished

logger = logging.getLogger("tracerag.audit")


class StoreHealth:
    """The store's health as the writer sees it; every change under the writer's ``cond``.

    ``pending`` tells how many records wait (for the log lines); ``stop`` is set when the
    writer aborts, and cuts every wait here short.
    """

    def __init__(
        self,
        link: StoreLink,
        retry: RetryPolicy,
        cond: threading.Condition,
        stop: threading.Event,
        *,
        op_timeout: float,
        probe_interval: float,
        probe_max: float,
        pending: Callable[[], int],
        journaled: bool,
    ) -> None:
        self._link = link
        self._retry = retry
        self._cond = cond
        self._stop = stop
        self.op_timeout = op_timeout
        self.probe_interval = probe_interval
        self.probe_max = probe_max
        self._pending = pending
        self._kept = ", kept in the journal" if journaled else ""
        self._kept_in = " in the journal" if journaled else " in memory"
        self.failing = False
        self.failing_since: float | None = None
        self.last_error: BaseException | None = None
        self.failures = 0  # failed write attempts (each retry counts)
        self._op_started: float | None = None
        self._op_seq = 0
        self._next_probe = 0.0
        self._idle_failures = 0

    # -- failing and recovered ----------------------------------------------------------------
    def failed(self, exc: BaseException, *, attempt: bool = False) -> bool:
        """The store failed with ``exc`` (``attempt``: a write attempt, counted in
        ``failures``); True when it was not failing before."""
        with self._cond:
            if attempt:
                self.failures += 1
            first = not self.failing
            if first:
                self.failing_since = time.monotonic()
            self.failing = True
            self.last_error = exc
            self._cond.notify_all()
        return first

    def report(self, exc: BaseException) -> None:
        """A failure seen outside the writer: not ready, and probed soon."""
        with self._cond:
            self.failed(exc)
            self._next_probe = time.monotonic() + self._retry.initial

    def recovered(self) -> None:
        with self._cond:
            if self.failing:
                logger.warning("audit store writing again (%d pending)", self._pending())
            self.failing = False
            self.failing_since = None
            self.last_error = None

    def failing_for(self, now: float) -> float | None:
        return None if self.failing_since is None else now - self.failing_since

    # -- timed operations and the watchdog ----------------------------------------------------
    def timed(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call ``fn`` as a store operation the watchdog watches."""
        with self._cond:
            self._op_started = time.monotonic()
            self._op_seq += 1
        try:
            return fn(*args)
        finally:
            with self._cond:
                self._op_started = None

    def hanging(self, now: float) -> float | None:
        """Seconds the store operation under way has run, once past ``op_timeout`` (None: no
        operation hangs)."""
        started = self._op_started
        if started is not None and now - started > self.op_timeout:
            return now - started
        return None

    def watch(self, stopped: Callable[[], bool]) -> None:
        """Interrupt a store operation that hangs past ``op_timeout`` (e.g. a frozen server);
        returns once ``stopped()``."""
        interrupted = -1
        while True:
            with self._cond:
                if stopped():
                    return
                started, op = self._op_started, self._op_seq
            if (
                started is not None
                and op != interrupted
                and time.monotonic() - started > self.op_timeout
            ):
                interrupted = op
                logger.warning(
                    "audit store operation hanging for more than %.1fs: interrupting it "
                    "(records are kept%s)",
                    self.op_timeout,
                    self._kept_in,
                )
                interrupt = getattr(self._link.store, "interrupt", None)
                if interrupt is not None:
                    try:
                        interrupt()
                    except Exception:
                        logger.warning("could not interrupt the audit store", exc_info=True)
            self._stop.wait(min(1.0, max(0.05, self.op_timeout / 4)))

    # -- probing ------------------------------------------------------------------------------
    def until_probe(self, now: float) -> float:
        """Seconds to the next idle probe (0 or less: due)."""
        return self._next_probe - now

    def probe_delay(self, failures: int) -> float:
        return self._retry.probe_delay(failures, self.probe_max)

    def probe_idle(self) -> None:
        """While idle, keep readiness true to the store: open it, ping it, notice it vanish.

        Healthy, the store is pinged every ``probe_interval`` seconds; failing, with a short
        backoff (``backoff_initial`` doubling up to ``probe_max``), so a store that comes back
        is known to be back within about ``probe_max`` seconds, with or without traffic.
        """
        if time.monotonic() < self._next_probe:
            return
        if self.probe():
            self._next_probe = time.monotonic() + self.probe_interval
            if self._idle_failures or self.failing:
                self._idle_failures = 0
                self.recovered()
            return
        self._idle_failures += 1
        self._next_probe = time.monotonic() + self.probe_delay(self._idle_failures)

    def probe(self) -> bool:
        """Open the store if needed and ping it; False (the store marked failing) if it fails."""
        try:
            store = self.timed(self._link.ensure)
            ping = getattr(store, "ping", None)
            if ping is not None:
                self.timed(ping)
            return True
        except Exception as exc:
            with self._cond:
                changed = type(exc) is not type(self.last_error)
                first = self.failed(exc)
            if isinstance(exc, (StoreReplaced, StoreVanished)):
                self._link.discard()
            (logger.warning if first or changed else logger.debug)(
                "audit store not answering (%d pending%s): %s: %s",
                self._pending(),
                self._kept,
                type(exc).__name__,
                exc,
            )
            return False

    def answers(self) -> bool:
        """True when the open store answers a ``ping`` now (False: no store, or no answer)."""
        store = self._link.store
        ping = getattr(store, "ping", None) if store is not None else None
        if ping is None:
            return False
        try:
            self.timed(ping)
            return True
        except Exception:
            return False

    def wait_to_retry(self, delay: float) -> None:
        """Wait ``delay`` before retrying a batch, cut short once a store that was down
        answers again (probed with a short backoff meanwhile), or the writer stops."""
        deadline = time.monotonic() + delay
        probes = 0
        was_down = False
        while not self._stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            probes += 1
            self._stop.wait(min(remaining, self.probe_delay(probes)))
            if self._stop.is_set() or time.monotonic() >= deadline:
                return
            if self.probe():
                if was_down:
                    self.recovered()
                    return  # back: retry now, not at the end of a long backoff
            else:
                was_down = True
