"""Run a coroutine to completion from sync code, in the caller's context (``run_sync``).

The sync entry points (``invoke``, ``batch``, the command line's helpers) answer through the
async run loop. Called where no event loop runs, the coroutine runs on this thread's own event
loop, made on first use and kept for the thread's life. Called inside a running event loop
(which it cannot re-enter), it runs on one long-lived loop in a daemon thread while the caller
waits; from that background loop itself, on a loop in a fresh thread. After ``fork`` the child
starts afresh. ``iterate_sync`` does the same for an async iterator (``stream`` over ``astream``):
the whole iteration is one task, so the context it sets stays its own from item to item.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import os
import queue
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, TypeVar

__all__ = ["iterate_sync", "run_sync"]

T = TypeVar("T")


def run_sync(coro_factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion from sync code, in the caller's context.

    The coroutine sees the caller's contextvars (the current OpenTelemetry span, LangChain's
    run config and callbacks). Called where no event loop runs, it runs on this thread's own
    event loop, made on first use and kept for the thread's life. Called inside a running
    event loop (which it cannot re-enter), it runs on one long-lived loop in a background thread
    while the caller waits; from that background loop itself, on a loop in a fresh thread.
    """
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        return _run_here(coro_factory())
    context = contextvars.copy_context()
    if running is _bridge.loop:  # nested: waiting here would block the loop it needs
        return _run_in_new_thread(coro_factory(), context)
    return _bridge.run(coro_factory(), context)


def iterate_sync(factory: Callable[[], AsyncIterator[T]]) -> Iterator[T]:
    """Iterate an async iterator from sync code, in the caller's context, item by item.

    The iteration runs as one task (its context is one from the first item to the last). Where
    no event loop runs, it runs on this thread's loop, and advances only while the caller asks
    for the next item; inside a running loop, on the background loop (from that loop itself, on
    a fresh thread's), handing items over as they come. Stopping early (``close()``, ``break``)
    cancels it.
    """
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        yield from _iterate_here(factory)
        return
    context = contextvars.copy_context()
    if running is _bridge.loop:
        yield from _iterate_in_thread(factory, context, None)
    else:
        yield from _iterate_in_thread(factory, context, _bridge.loop or _bridge._start())


#: what a producer hands over: an item, the end, or the error that ended it
_ITEM, _END, _ERROR = "item", "end", "error"


async def _produce(
    factory: Callable[[], AsyncIterator[T]], put: Callable[[tuple[str, Any]], None]
) -> None:
    try:
        async for item in factory():
            put((_ITEM, item))
    except BaseException as error:  # handed to the consumer, which raises it
        put((_ERROR, error))
        if isinstance(error, asyncio.CancelledError):
            raise
    else:
        put((_END, None))


def _iterate_here(factory: Callable[[], AsyncIterator[T]]) -> Iterator[T]:
    loop = _thread_loop()
    items: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
    task = loop.create_task(_produce(factory, items.put_nowait))
    try:
        while True:
            kind, value = loop.run_until_complete(items.get())
            if kind == _END:
                break
            if kind == _ERROR:
                raise value
            yield value
    finally:
        if not task.done():  # stopped early: do not leave the iteration half-run
            task.cancel()
            with contextlib.suppress(BaseException):
                loop.run_until_complete(task)


def _iterate_in_thread(
    factory: Callable[[], AsyncIterator[T]],
    context: contextvars.Context,
    loop: asyncio.AbstractEventLoop | None,
) -> Iterator[T]:
    """On ``loop`` (a long-lived one in another thread), or on a fresh thread's own loop."""
    items: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
    tasks: list[asyncio.Task[None]] = []
    thread: threading.Thread | None = None
    if loop is None:
        fresh = asyncio.new_event_loop()

        def target() -> None:
            try:
                task = context.run(fresh.create_task, _produce(factory, items.put))
                tasks.append(task)
                with contextlib.suppress(BaseException):
                    fresh.run_until_complete(task)
            finally:
                fresh.close()

        thread = threading.Thread(target=target, name="tracerag-sync-nested")
        thread.start()
        loop = fresh
    else:
        target_loop = loop

        def start() -> None:
            tasks.append(context.run(target_loop.create_task, _produce(factory, items.put)))

        loop.call_soon_threadsafe(start)
    try:
        while True:
            kind, value = items.get()
            if kind == _END:
                break
            if kind == _ERROR:
                raise value
            yield value
    finally:
        if not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(lambda: [t.cancel() for t in tasks])
        if thread is not None:
            thread.join()


def _run_here(coro: Coroutine[Any, Any, T]) -> T:
    loop = _thread_loop()
    task = loop.create_task(coro)  # the task runs in a copy of the caller's context
    try:
        return loop.run_until_complete(task)
    except BaseException:
        if not task.done():  # interrupted (KeyboardInterrupt): do not leave it half-run
            task.cancel()
            with contextlib.suppress(BaseException):
                loop.run_until_complete(task)
        raise


class _ThreadLoop:
    """One thread's event loop for sync calls; closed when the thread ends or at exit."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        weakref.finalize(self, _close_loop, self.loop)


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    if not loop.is_running() and not loop.is_closed():
        loop.close()


_local = threading.local()


def _thread_loop() -> asyncio.AbstractEventLoop:
    holder: _ThreadLoop | None = getattr(_local, "holder", None)
    if holder is None or holder.loop.is_closed():
        holder = _ThreadLoop()
        _local.holder = holder
    return holder.loop


class _Bridge:
    """A long-lived event loop in a daemon thread, for sync calls made inside a running loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None

    def _start(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self.loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="tracerag-sync-bridge", daemon=True
                )
                thread.start()
                self.loop = loop
            return self.loop

    def run(self, coro: Coroutine[Any, Any, T], context: contextvars.Context) -> T:
        loop = self.loop or self._start()
        done: concurrent.futures.Future[T] = concurrent.futures.Future()
        tasks: list[asyncio.Task[T]] = []

        def start() -> None:
            if not done.set_running_or_notify_cancel():
                coro.close()
                return
            task = context.run(loop.create_task, coro)
            tasks.append(task)
            task.add_done_callback(lambda t: _settle(done, t))

        loop.call_soon_threadsafe(start)
        try:
            return done.result()
        except BaseException:
            if not done.done():  # the caller was interrupted: stop the work it waited for
                done.cancel()
                loop.call_soon_threadsafe(lambda: [t.cancel() for t in tasks])
            raise

    def forget(self) -> None:
        """After fork: the thread is gone in the child, so start afresh on next use."""
        self._lock = threading.Lock()
        self.loop = None


def _settle(done: concurrent.futures.Future[T], task: asyncio.Task[T]) -> None:
    if done.done():
        return
    if task.cancelled():
        done.cancel()
    elif (error := task.exception()) is not None:
        done.set_exception(error)
    else:
        done.set_result(task.result())


def _run_in_new_thread(coro: Coroutine[Any, Any, T], context: contextvars.Context) -> T:
    outcome: list[Any] = []

    def target() -> None:
        try:
            outcome.append(("ok", context.run(asyncio.run, coro)))
        except BaseException as exc:
            outcome.append(("error", exc))

    thread = threading.Thread(target=target, name="tracerag-sync-nested")
    thread.start()
    thread.join()
    kind, value = outcome[0]
    if kind == "error":
        raise value
    result: T = value
    return result


_bridge = _Bridge()


def _after_fork_in_child() -> None:
    global _local
    _local = threading.local()
    _bridge.forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
