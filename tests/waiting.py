"""Waiting on a condition instead of a clock.

``wait_until`` polls a predicate until it holds and fails, naming what it waited for (``what``,
else the predicate's source line), when it does not hold within ``timeout``; ``await_until`` is
the same inside an event loop. Both return the predicate's truthy value, to wait for a thing and
use it. ``responds`` is the predicate of a server that is up.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """The condition did not hold in time (an AssertionError: pytest reports it as a failure)."""


def _describe(predicate: Callable[[], object]) -> str:
    try:
        return inspect.getsource(predicate).strip()
    except (OSError, TypeError):
        return repr(predicate)


def _message(
    what: str | None, predicate: Callable[[], object], timeout: float, last: object
) -> str:
    name = what if what is not None else _describe(predicate)
    return f"timed out after {timeout:g} s waiting for {name} (last value: {last!r})"


def wait_until(
    predicate: Callable[[], T],
    what: str | None = None,
    *,
    timeout: float = 10.0,
    interval: float = 0.01,
) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns a truthy value; return it."""
    if timeout <= 0 or interval <= 0:
        raise ValueError("timeout and interval must be positive")
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise WaitTimeout(_message(what, predicate, timeout, value))
        time.sleep(interval)


async def await_until(
    predicate: Callable[[], T],
    what: str | None = None,
    *,
    timeout: float = 10.0,
    interval: float = 0.01,
) -> T:
    """``wait_until`` inside an event loop: other tasks run while the predicate does not hold."""
    if timeout <= 0 or interval <= 0:
        raise ValueError("timeout and interval must be positive")
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise WaitTimeout(_message(what, predicate, timeout, value))
        await asyncio.sleep(interval)


def responds(url: str, statuses: frozenset[int] = frozenset({200}), timeout: float = 2.0) -> bool:
    """Whether a GET of ``url`` answers with one of ``statuses`` (False while nothing listens)."""
    import httpx  # the server extra's client: the waits above need no HTTP stack

    try:
        return httpx.get(url, timeout=timeout).status_code in statuses
    except httpx.HTTPError:
        return False
