"""``tracerag serve`` killed with SIGKILL under load, while another process holds the SQLite
store locked: every answer that said ``audit_persisted: true`` is in the store after a restart
(committed, or journaled beside the store and replayed), and the chain is intact."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from pipeline_fixtures import REPO
from server_fixtures import free_port
from waiting import responds, wait_until

from tracerag.store._sqlite import SQLiteAuditStore

pytestmark = pytest.mark.integration

QUESTIONS = [
    "How long is the warranty on a laptop?",
    "How many days do I have to return an item?",
    "订单签收后多久内可以申请开具发票？",
    "How fast are refunds paid?",
]


def serve(store: Path, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("TRACERAG_STORE", None)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tracerag.cli",
            "serve",
            "--store",
            str(store),
            "--port",
            str(port),
            "--no-review-desk",
            "--samples",
            "2",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def wait_ready(base: str, timeout: float = 60.0) -> None:
    wait_until(lambda: responds(f"{base}/healthz"), "tracerag serve to start", timeout=timeout)


def test_kill_9_under_load_loses_no_answer_reported_persisted(tmp_path) -> None:
    store_path = tmp_path / "audit.sqlite"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = serve(store_path, port)
    persisted: list[str] = []
    answered: list[str] = []
    stop = threading.Event()

    def client(offset: int) -> None:
        with httpx.Client(timeout=30) as http:
            n = offset
            while not stop.is_set():
                try:
                    reply = http.post(
                        f"{base}/v1/answer", json={"question": QUESTIONS[n % len(QUESTIONS)]}
                    )
                except httpx.HTTPError:
                    return  # the server is gone
                n += 1
                if reply.status_code != 200:
                    continue
                body = reply.json()
                answered.append(body["request_id"])
                if body["audit_persisted"] is True:
                    persisted.append(body["request_id"])

    try:
        wait_ready(base)
        threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        wait_until(lambda: len(answered) >= 20, "20 answers", timeout=60, interval=0.05)
        # another process locks the store: answers must now be journaled to say persisted
        lock = sqlite3.connect(str(store_path), timeout=30, isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")
        during = len(persisted)
        # kill it with journaled answers outstanding
        more = "10 more answers said persisted"
        left = deadline + 60 - time.monotonic()
        wait_until(lambda: len(persisted) >= during + 10, more, timeout=left, interval=0.05)
        server.send_signal(signal.SIGKILL)
        server.wait(timeout=10)
        stop.set()
        for t in threads:
            t.join(timeout=30)
    finally:
        stop.set()
        if server.poll() is None:
            server.kill()
    assert persisted, "no answer said persisted"
    journaled = persisted[during:]
    lock.execute("ROLLBACK")
    lock.close()
    peek = sqlite3.connect(str(store_path))
    stored_before = {rid for (rid,) in peek.execute("SELECT request_id FROM requests")}
    peek.close()
    assert set(journaled) - stored_before, "the lock made no answer wait in the journal"
    # restart: the journal is replayed into the store at start
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    again = serve(store_path, port)
    try:
        wait_ready(base)
        wait_until(
            lambda: httpx.get(f"{base}/readyz", timeout=5).json()["store"].get("backlog", 0) == 0,
            "the journal to be drained into the store",
            timeout=60,
            interval=0.2,
        )
    finally:
        again.send_signal(signal.SIGTERM)
        again.wait(timeout=30)
    store = SQLiteAuditStore(str(store_path))
    try:
        stored = {s.request_id for s in store.list_requests(limit=100_000)}
        lost = [rid for rid in persisted if rid not in stored]
        assert lost == [], f"{len(lost)} of {len(persisted)} answers said persisted and are gone"
        assert set(journaled) <= stored  # the ones the lock kept out came from the journal
        assert store.verify_chain().ok
    finally:
        store.close()
