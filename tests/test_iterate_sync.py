"""iterate_sync: an async iterator read from sync code (``stream`` over ``astream``), item by item.

Where no loop runs, inside a running loop, and on the background loop itself: the caller's
context is seen, the iteration is one task whose context lasts from the first item to the last
(a contextvar it sets is reset in the same context), an error raised after some items reaches the
caller after them, and a caller that stops early cancels the iteration.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import AsyncIterator, Callable

import pytest

from tracerag._sync import iterate_sync, run_sync

marker: contextvars.ContextVar[str] = contextvars.ContextVar("iterate_marker", default="unset")
inside: contextvars.ContextVar[int] = contextvars.ContextVar("iterate_inside", default=0)


class Probe:
    """An async iterator factory that tells what it saw and whether it ran to its end."""

    def __init__(self, n: int = 3, fail_after: int | None = None) -> None:
        self.n = n
        self.fail_after = fail_after
        self.finished = threading.Event()
        self.cancelled = threading.Event()
        self.threads: set[str] = set()

    async def items(self) -> AsyncIterator[tuple[int, str, int]]:
        token = inside.set(42)  # set in the iteration's context, reset at its end
        try:
            for i in range(self.n):
                if self.fail_after is not None and i == self.fail_after:
                    raise LookupError(f"failed after {i} items")
                await asyncio.sleep(0.002)  # sleep is the behaviour: items arrive over time
                self.threads.add(threading.current_thread().name)
                yield i, marker.get(), inside.get()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        finally:
            inside.reset(token)  # raises ValueError if the context changed between items
            self.finished.set()


def read(factory: Callable[[], AsyncIterator[tuple[int, str, int]]]) -> list[tuple]:
    return list(iterate_sync(factory))


def test_where_no_loop_runs_items_come_in_the_callers_context():
    probe = Probe()
    token = marker.set("caller")
    try:
        assert read(probe.items) == [(0, "caller", 42), (1, "caller", 42), (2, "caller", 42)]
    finally:
        marker.reset(token)
    assert probe.finished.is_set() and not probe.cancelled.is_set()
    assert probe.threads == {threading.current_thread().name}
    assert inside.get() == 0  # the iteration's own context did not leak into the caller's


def test_inside_a_running_loop_items_come_from_the_background_loop():
    probe = Probe()

    async def main() -> list[tuple]:
        marker.set("async caller")
        return read(probe.items)

    assert asyncio.run(main()) == [(i, "async caller", 42) for i in range(3)]
    assert probe.threads == {"tracerag-sync-bridge"}


def test_on_the_background_loop_itself_items_come_from_a_fresh_thread():
    probe = Probe()

    async def on_bridge() -> list[tuple]:
        marker.set("on the bridge")
        return read(probe.items)  # waiting on the bridge loop here would block it

    async def main() -> list[tuple]:
        return run_sync(on_bridge)

    assert asyncio.run(main()) == [(i, "on the bridge", 42) for i in range(3)]
    assert probe.threads == {"tracerag-sync-nested"}


@pytest.mark.parametrize("where", ["no loop", "in a loop", "on the bridge"])
def test_an_error_reaches_the_caller_after_the_items_before_it(where):
    probe = Probe(n=5, fail_after=2)
    got: list[int] = []

    def consume() -> None:
        for i, _, _ in iterate_sync(probe.items):
            got.append(i)

    async def in_loop() -> None:
        consume()

    async def on_bridge() -> None:
        consume()

    with pytest.raises(LookupError, match="failed after 2 items"):
        if where == "no loop":
            consume()
        elif where == "in a loop":
            asyncio.run(in_loop())
        else:
            asyncio.run(_on_bridge(on_bridge))
    assert got == [0, 1]
    assert probe.finished.wait(5)


async def _on_bridge(coroutine_function: Callable[[], object]) -> object:
    return run_sync(coroutine_function)  # type: ignore[arg-type]


@pytest.mark.parametrize("where", ["no loop", "in a loop", "on the bridge"])
def test_stopping_early_cancels_the_iteration(where):
    probe = Probe(n=1000)

    def first_two() -> list[int]:
        stream = iterate_sync(probe.items)
        got = [next(stream)[0], next(stream)[0]]
        stream.close()
        return got

    async def in_loop() -> list[int]:
        return first_two()

    if where == "no loop":
        assert first_two() == [0, 1]
    elif where == "in a loop":
        assert asyncio.run(in_loop()) == [0, 1]
    else:
        assert asyncio.run(_on_bridge(in_loop)) == [0, 1]
    assert probe.cancelled.wait(5) and probe.finished.wait(5)
