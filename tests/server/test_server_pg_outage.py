"""``tracerag serve`` over PostgreSQL: what holds while the database is unreachable.

Issue 22: with the default configuration there was no journal; killed during an outage, the
server lost 557 of 659 answered requests (they said ``audit_persisted: false``, honestly, but the
README said a down store is journaled). Now a store that can be down needs a journal: without
one ``tracerag serve`` refuses to start (or runs without on purpose, ``--no-journal``, and says
so); with one, every answer given during the outage is durable and survives ``kill -9``.

The outage is a real one for the client: the server reaches PostgreSQL through a TCP relay in
this process that the test cuts (connections reset, new ones refused) and restores.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from pipeline_fixtures import REPO
from server_fixtures import free_port
from store_fixtures import postgres_dsn
from waiting import responds, wait_until

from tracerag import cli

pytestmark = pytest.mark.integration

QUESTION = "How long is the warranty on a laptop?"


class Relay:
    """A TCP relay to PostgreSQL that can be cut (as a network or server outage) and restored."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    def up(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # ends the accept() in progress
            listener.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def pg(tmp_path) -> Iterator[tuple[str, Relay]]:
    """A fresh schema on the test server, reached through a relay: (store URL, relay)."""
    import psycopg

    dsn = postgres_dsn()
    parts = urlsplit(dsn)
    relay = Relay(parts.hostname or "127.0.0.1", parts.port or 5432)
    relay.up()
    schema = "t_" + uuid.uuid4().hex[:12]
    netloc = parts.netloc.replace(f":{parts.port}", f":{relay.port}")
    query = (parts.query + "&" if parts.query else "") + f"options=-csearch_path%3D{schema}"
    url = parts._replace(netloc=netloc, query=query).geturl()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield url, relay
    finally:
        relay.down()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def serve(url: str, port: int, log: Path, *options: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for name in ("TRACERAG_STORE", "TRACERAG_AUDIT_JOURNAL", "TRACERAG_AUDIT_ANCHOR"):
        env.pop(name, None)
    command = [sys.executable, "-m", "tracerag.cli", "serve", "--store", url]
    command += ["--port", str(port), "--no-review-desk", "--samples", "2", *options]
    with log.open("a") as err:
        return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=err)


def wait_up(base: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    def up() -> bool:
        if responds(f"{base}/healthz"):
            return True
        assert proc.poll() is None, log.read_text()
        return False

    wait_until(up, "tracerag serve to start", timeout=60, interval=0.2)


def wait_readyz(base: str, ready: bool, timeout: float) -> dict:
    def reached() -> dict | None:
        reply = httpx.get(f"{base}/readyz", timeout=10)
        body = reply.json()
        if (reply.status_code == 200) is ready and (not ready or body["store"]["backlog"] == 0):
            return body
        return None

    want = "ready with the backlog written" if ready else "not ready"
    return wait_until(reached, f"/readyz to say {want}", timeout=timeout, interval=0.2)


def ask(base: str, n: int) -> list[dict]:
    out = []
    with httpx.Client(timeout=60) as http:
        for _ in range(n):
            reply = http.post(f"{base}/v1/answer", json={"question": QUESTION})
            assert reply.status_code == 200, reply.text
            out.append(reply.json())
    return out


def stored_ids(url: str) -> set[str]:
    from tracerag.store import open_store

    store = open_store(url, create=False)
    try:
        return {s.request_id for s in store.list_requests(limit=10_000)}
    finally:
        store.close()


def test_serve_refuses_a_postgresql_store_without_a_journal(pg, tmp_path) -> None:
    url, _ = pg
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for name in ("TRACERAG_STORE", "TRACERAG_AUDIT_JOURNAL"):
        env.pop(name, None)
    command = [sys.executable, "-m", "tracerag.cli", "serve", "--store", url]
    done = subprocess.run(
        [*command, "--no-review-desk", "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "TRACERAG_AUDIT_JOURNAL" in done.stderr and "--no-journal" in done.stderr
    assert "password" not in done.stderr


def test_answers_during_an_outage_are_journaled_and_survive_kill_9(pg, tmp_path) -> None:
    url, relay = pg
    journal = tmp_path / "journal"
    log = tmp_path / "serve.log"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = serve(url, port, log, "--journal", str(journal))
    try:
        wait_up(base, proc, log)
        before = ask(base, 3)
        assert all(b["audit_persisted"] is True for b in before)
        relay.down()  # the database is unreachable from here on
        during = ask(base, 20)
        # every answer of the outage is durable in the journal, and says so
        assert all(b["audit_persisted"] is True for b in during)
        assert httpx.get(f"{base}/readyz", timeout=10).status_code == 503
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    relay.up()
    answered = {b["request_id"] for b in before + during}
    assert not (answered - {b["request_id"] for b in before}) & stored_ids(url)

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = serve(url, port, log, "--journal", str(journal))
    try:
        wait_up(base, proc, log)
        wait_readyz(base, True, 60)  # the journal replayed into the store
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    assert answered <= stored_ids(url)
    assert cli.main(["audit", "verify", "--store", url, "--expect-head", str(journal)]) == 0


def test_no_journal_is_said_and_readiness_follows_the_database(pg, tmp_path) -> None:
    url, relay = pg
    log = tmp_path / "serve.log"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = serve(url, port, log, "--no-journal")
    try:
        wait_up(base, proc, log)
        assert "--no-journal" in log.read_text()
        wait_readyz(base, True, 30)
        relay.down()
        (during,) = ask(base, 1)
        assert during["audit_persisted"] is False  # not durable, and it says so
        wait_readyz(base, False, 10)
        relay.up()
        # back within seconds, with no request at all
        wait_readyz(base, True, 15)
        (after,) = ask(base, 1)
        assert after["audit_persisted"] is True
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    assert {during["request_id"], after["request_id"]} <= stored_ids(url)
