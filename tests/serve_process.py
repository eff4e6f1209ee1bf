"""Real ``tracerag serve`` processes for the tests, and a proxy that drops a stream midway.

``serve_process(*args)`` runs the ``tracerag`` command (``serve --port N *args``) from the
repository root, waits until it answers ``/healthz`` and stops it afterwards (SIGTERM, then
SIGKILL). ``CuttingProxy`` forwards TCP to a server and cuts the first response that carries
``cut_after`` events right after the last of them, as a dropped mobile connection or a proxy
timeout would; it records the head of every request it forwarded.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from pipeline_fixtures import REPO
from server_fixtures import free_port
from waiting import WaitTimeout, responds, wait_until

TOKEN = "reviewer-token-for-tests-0123456789"
API_KEY = "frontend-key-for-tests-0123"
EXAMPLE_APP = "examples.serve_langgraph_app:app"
METHODS = {b"GET", b"POST", b"OPTIONS", b"HEAD", b"PUT", b"DELETE"}


def tracerag_command() -> list[str]:
    """The installed ``tracerag`` command (the module when no script is installed)."""
    script = Path(sys.executable).parent / "tracerag"
    return [str(script)] if script.exists() else [sys.executable, "-m", "tracerag.cli"]


@contextmanager
def serve_process(
    *args: str, log: Path, env: dict[str, str] | None = None, timeout: float = 120.0
) -> Iterator[str]:
    """``tracerag serve`` on a free 127.0.0.1 port; yields its base URL."""
    port = free_port()
    environ = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    environ.pop("TRACERAG_STORE", None)
    with open(log, "ab") as err:
        proc = subprocess.Popen(
            [*tracerag_command(), "serve", "--port", str(port), *args],
            cwd=REPO,
            env=environ,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    base = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"tracerag serve exited ({proc.returncode}):\n"
                    + log.read_text("utf-8", "replace")[-3000:]
                )
            return responds(f"{base}/healthz")

        try:
            wait_until(up, "tracerag serve to start", timeout=timeout, interval=0.2)
        except WaitTimeout as exc:
            raise RuntimeError(f"tracerag serve did not start in time: {exc}") from exc
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


class CuttingProxy:
    """TCP to ``upstream_port``; the first response with ``cut_after`` events is cut after them."""

    def __init__(self, upstream_port: int, cut_after: int) -> None:
        self.upstream_port = upstream_port
        self.cut_after = cut_after
        self.requests: list[bytes] = []  # the head of each request forwarded
        self.cuts = 0
        self._lock = threading.Lock()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self._open: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, name="test-proxy", daemon=True)
        self._thread.start()

    def heads(self, path_part: str) -> list[str]:
        """Request heads (text) whose request line contains ``path_part``."""
        with self._lock:
            heads = [h.decode("latin-1") for h in self.requests]
        return [h for h in heads if path_part in h.split("\r\n", 1)[0]]

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
        with self._lock:
            self._open += [client, upstream]

        def up() -> None:
            try:
                while True:
                    data = client.recv(65536)
                    if not data:
                        break
                    if data.split(b" ", 1)[0] in METHODS:  # a request starts here
                        with self._lock:
                            self.requests.append(data.split(b"\r\n\r\n", 1)[0])
                    upstream.sendall(data)
            except OSError:
                pass
            finally:
                _close(upstream)

        threading.Thread(target=up, daemon=True).start()
        seen = b""
        try:
            while True:
                data = upstream.recv(65536)
                if not data:
                    break
                with self._lock:
                    cutting = self.cuts == 0
                if cutting:
                    seen += data
                    end = _after_events(seen, self.cut_after)
                    if end is not None:
                        keep = len(data) - (len(seen) - end)
                        client.sendall(data[:keep])
                        with self._lock:
                            self.cuts += 1
                        # the events arrived; then the connection drops (FIN, not a reset
                        # that could discard them before the page read them)
                        time.sleep(0.5)  # sleep is the behaviour: the drop comes a moment later
                        client.shutdown(socket.SHUT_WR)
                        break
                client.sendall(data)
        except OSError:
            pass
        finally:
            _close(client)
            _close(upstream)

    def close(self) -> None:
        self._sock.close()
        with self._lock:
            for s in self._open:
                _close(s)


def _after_events(data: bytes, n: int) -> int | None:
    """The offset just after the ``n``-th event (and its chunk's CRLF), or None."""
    at = -1
    for _ in range(n):
        at = data.find(b"\nevent: ", at + 1)
        if at < 0:
            return None
    end = data.find(b"\n\n", at + 1)
    if end < 0:
        return None
    end += 2
    if data[end : end + 2] == b"\r\n":
        end += 2
    return end


def _close(sock: socket.socket) -> None:
    with suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
