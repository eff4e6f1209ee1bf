"""Requests per second of ``POST /v1/answer`` under concurrent load, on this machine only.

The server (``tracerag.server.create_app`` over the demo knowledge base, the offline
extractive model, 5 samples per question, review desk off) runs in its own process under
uvicorn on 127.0.0.1 and a free port; an async httpx client keeps ``--concurrency`` requests
in flight, cycling the bundled demo questions, until ``--requests`` have completed or
``--seconds`` have passed, whichever comes first. Both bounds are enforced (at most 5,000
requests and 300 s per run).

Two runs by default:

- ``discard`` — records are handed to a store that throws them away: the pipeline and HTTP cost;
- ``sqlite`` — every record is written to a fresh SQLite audit store before the answer goes out
  (the default store of ``tracerag serve``), and the run checks that each request was stored.

Usage: python benchmarks/server_load.py [--requests 400] [--concurrency 16] [--seconds 60]
       [--store discard|sqlite|both] [--samples 5] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HOST = "127.0.0.1"
MAX_REQUESTS = 5000
MAX_SECONDS = 300.0


class DiscardStore:
    """An audit store that keeps nothing: to measure the server without storage."""

    def append_record(self, record: Any) -> None:
        return None

    def close(self) -> None:
        return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def serve(port: int, store: str, samples: int) -> None:
    """Run the server in this process (the benchmark starts it as a child)."""
    import logging

    import uvicorn

    from tracerag.server._asgi import create_app, demo_pipeline

    logging.getLogger("tracerag.escalation").setLevel(logging.ERROR)
    target: Any = DiscardStore() if store == "discard" else store
    app = create_app(demo_pipeline("extractive", n_samples=samples), target, review_desk=False)
    uvicorn.run(app, host=HOST, port=port, log_level="error", access_log=False)


def start_server(store: str, samples: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ, OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none")
    child = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--serve",
            str(port),
            "--store-target",
            store,
            "--samples",
            str(samples),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    return child, f"http://{HOST}:{port}"


async def wait_ready(base: str, child: subprocess.Popen, timeout: float = 60.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            if child.poll() is not None:
                err = child.stderr.read().decode() if child.stderr else ""
                raise RuntimeError(f"the server exited: {err[-2000:]}")
            try:
                if (await client.get(f"{base}/healthz", timeout=1.0)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError("the server did not start in time")


async def load(
    base: str, questions: list[str], total: int, concurrency: int, seconds: float
) -> dict[str, Any]:
    """Keep ``concurrency`` requests in flight until ``total`` are done or time is up."""
    import httpx

    latencies: list[float] = []
    errors: dict[str, int] = {}
    decisions: dict[str, int] = {}
    request_ids: list[str] = []
    issued = 0
    deadline = 0.0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30.0) as client:
        for q in questions[:concurrency]:  # warm up: imports, caches, connections
            await client.post("/v1/answer", json={"question": q})

        async def worker() -> None:
            nonlocal issued
            while issued < total and time.monotonic() < deadline:
                question = questions[issued % len(questions)]
                issued += 1
                started = time.perf_counter()
                try:
                    reply = await client.post("/v1/answer", json={"question": question})
                except httpx.HTTPError as exc:
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                    continue
                if reply.status_code != 200:
                    errors[str(reply.status_code)] = errors.get(str(reply.status_code), 0) + 1
                    continue
                latencies.append(time.perf_counter() - started)
                body = reply.json()
                decisions[body["decision"]] = decisions.get(body["decision"], 0) + 1
                request_ids.append(body["request_id"])

        began = time.perf_counter()
        deadline = time.monotonic() + seconds
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - began

    ordered = sorted(latencies)

    def pct(p: float) -> float | None:
        if not ordered:
            return None
        return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]

    return {
        "completed": len(latencies),
        "errors": errors,
        "elapsed_s": round(elapsed, 3),
        "rps": round(len(latencies) / elapsed, 2) if elapsed else None,
        "latency_ms": {
            "mean": round(statistics.fmean(ordered) * 1000, 1) if ordered else None,
            "p50": round(pct(50) * 1000, 1) if ordered else None,
            "p95": round(pct(95) * 1000, 1) if ordered else None,
            "p99": round(pct(99) * 1000, 1) if ordered else None,
        },
        "decisions": decisions,
        "request_ids": request_ids,
        "hit_time_limit": len(latencies) + sum(errors.values()) < total,
    }


def count_stored(path: str, request_ids: list[str]) -> int:
    from tracerag.store._sqlite import SQLiteAuditStore

    store = SQLiteAuditStore(path)
    try:
        stored = {s.request_id for s in store.list_requests(limit=len(request_ids) + 100)}
        return sum(1 for rid in request_ids if rid in stored)
    finally:
        store.close()


async def run_one(mode: str, args: argparse.Namespace, questions: list[str]) -> dict[str, Any]:
    workdir = tempfile.mkdtemp(prefix="tracerag-load-")
    target = "discard" if mode == "discard" else str(Path(workdir) / "audit.sqlite")
    child, base = start_server(target, args.samples)
    try:
        await wait_ready(base, child)
        result = await load(base, questions, args.requests, args.concurrency, args.seconds)
    finally:
        child.terminate()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
    result["store"] = mode
    if mode == "sqlite":
        result["stored"] = count_stored(target, result["request_ids"])
    del result["request_ids"]
    return result


def render(result: dict[str, Any], args: argparse.Namespace) -> str:
    lat = result["latency_ms"]
    lines = [
        f"store={result['store']:<8} {result['completed']} requests in {result['elapsed_s']} s "
        f"at concurrency {args.concurrency}: {result['rps']} requests/s",
        f"    latency ms: mean {lat['mean']}  p50 {lat['p50']}  p95 {lat['p95']}  p99 {lat['p99']}",
        f"    decisions: {result['decisions']}  errors: {result['errors'] or 'none'}",
    ]
    if "stored" in result:
        lines.append(f"    stored in SQLite: {result['stored']} of {result['completed']}")
    if result["hit_time_limit"]:
        lines.append(f"    (stopped by the {args.seconds} s limit)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--store", choices=["discard", "sqlite", "both"], default="both")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--store-target", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.store_target, args.samples)
        return 0
    args.requests = max(1, min(args.requests, MAX_REQUESTS))
    args.seconds = max(1.0, min(args.seconds, MAX_SECONDS))
    args.concurrency = max(1, min(args.concurrency, 256))

    from tracerag.demo.kb import load_questions

    questions = [q["question"] for q in load_questions()]
    modes = ["discard", "sqlite"] if args.store == "both" else [args.store]
    results = []
    if not args.json:
        print(
            f"POST /v1/answer on {HOST}: extractive model, {args.samples} samples, "
            f"{len(questions)} demo questions cycled, up to {args.requests} requests "
            f"or {args.seconds:g} s per run; {os.cpu_count()} CPUs"
        )
    for mode in modes:
        result = asyncio.run(run_one(mode, args, questions))
        results.append(result)
        if not args.json:
            print(render(result, args))
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
