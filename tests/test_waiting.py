"""The helper that waits on a condition: it returns what held, and fails naming what did not."""

from __future__ import annotations

import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from server_fixtures import free_port
from waiting import WaitTimeout, await_until, responds, wait_until


def test_returns_the_value_once_the_condition_holds() -> None:
    done = threading.Event()
    box: list[int] = []
    threading.Timer(0.02, lambda: (box.append(7), done.set())).start()
    assert wait_until(lambda: box[:], "the timer's value", timeout=5) == [7]
    assert done.is_set()


def test_a_condition_that_never_holds_fails_naming_it() -> None:
    calls: list[int] = []

    def never() -> int:
        calls.append(1)
        return 0

    with pytest.raises(WaitTimeout, match=r"after 0.05 s waiting for the flag \(last value: 0\)"):
        wait_until(never, "the flag", timeout=0.05, interval=0.01)
    assert len(calls) >= 2  # it polled, and checked once more at the deadline
    assert issubclass(WaitTimeout, AssertionError)


def test_a_predicate_that_raises_is_not_swallowed() -> None:
    with pytest.raises(ZeroDivisionError):
        wait_until(lambda: 1 / 0, "nothing")


@pytest.mark.parametrize("kwargs", [{"timeout": 0}, {"interval": -1}])
def test_bad_bounds_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        wait_until(lambda: True, "anything", **kwargs)
    with pytest.raises(ValueError, match="must be positive"):
        asyncio.run(await_until(lambda: True, "anything", **kwargs))


def test_the_async_wait_lets_other_tasks_run() -> None:
    async def main() -> str:
        box: list[str] = []

        async def later() -> None:
            await asyncio.sleep(0.02)  # sleep is the behaviour: the value arrives later
            box.append("ready")

        task = asyncio.create_task(later())
        got = await await_until(lambda: box and box[0], "the task's value", timeout=5)
        await task
        return got

    assert asyncio.run(main()) == "ready"


def test_the_async_wait_fails_naming_what_it_waited_for() -> None:
    with pytest.raises(WaitTimeout, match="waiting for the queue to drain"):
        asyncio.run(await_until(lambda: False, "the queue to drain", timeout=0.03))


def test_without_a_name_the_failure_quotes_the_predicate() -> None:
    pending = {"job": "running"}
    with pytest.raises(WaitTimeout, match=r'pending\["job"\] == "done"'):
        wait_until(lambda: pending["job"] == "done", timeout=0.02)


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/healthz" else 503)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_responds_says_whether_a_server_answers_with_the_status() -> None:
    assert responds(f"http://127.0.0.1:{free_port()}/healthz", timeout=0.5) is False  # nobody
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        assert wait_until(lambda: responds(f"{base}/healthz"), "the health page") is True
        assert responds(f"{base}/readyz") is False
        assert responds(f"{base}/readyz", statuses=frozenset({503})) is True
    finally:
        server.shutdown()
        server.server_close()
