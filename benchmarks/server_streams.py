"""What resumable streams, idempotency keys and decision streams cost, on this machine only.

Runs ``tracerag serve --app examples.serve_langgraph_app:app`` (the wrapped LangGraph example,
offline extractive model, 5 samples) on 127.0.0.1 over a fresh SQLite store and measures, side
by side in one run (the machine is shared and noisy: compare the ratios, not the figures):

- ``throughput`` — requests/s of ``POST /v1/answer`` plain, with a fresh ``Idempotency-Key``
  (a row in the ``answer_runs`` table, claimed then finished), as ``POST /v1/answer/stream``
  (resumable: a row too), and a key sent again (a replay: no pipeline run); ``control``
  repeats the plain arm, to show how far two identical arms drift apart. The arms take turns
  in rounds so drift hits them alike; the figure per arm is its median round, and the
  server's CPU per request (steadier than requests/s here).
- ``resume`` — a reconnect with ``Last-Event-ID`` after the third event of a finished stream:
  time to its last event on the replica that ran it (memory) and on a second replica on the
  same store (the table, the response read from the audit record).
- ``decision`` — a request escalated to a reviewer, followed by a stream on the replica where
  the reviewer decides and one on the other replica: time from the decision's reply to the
  ``decision`` event on each (the other replica polls the store once a second).
- ``memory`` — bytes the server keeps per finished run (its events, as measured by
  ``tracemalloc``) at the default bound of 1,000 runs, and the bytes of a stored row;
- ``table`` — CPU and wall time of a key's claim and of storing a run's events, in process.

Usage: python benchmarks/server_streams.py [--rounds 5] [--batch 24] [--concurrency 4]
       [--decisions 8] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HOST = "127.0.0.1"
TOKEN = "benchmark-reviewer-token-0123456789"
APP = "examples.serve_langgraph_app:app"
ESCALATES = "What is the capital of Mars?"
MAX_ROUNDS = 20


def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def start(store: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = dict(os.environ, TRACERAG_REVIEWER_TOKEN=TOKEN, PYTHONPATH=str(ROOT))
    env.pop("TRACERAG_API_KEY", None)
    script = Path(sys.executable).parent / "tracerag"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "tracerag.cli"]
    with open(log, "ab") as err:
        child = subprocess.Popen(
            [*command, "serve", "--app", APP, "--store", store, "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    return child, f"http://{HOST}:{port}"


async def ready(base: str, child: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as client:
        while time.monotonic() < deadline:
            if child.poll() is not None:
                raise RuntimeError("the server exited")
            try:
                if (await client.get(f"{base}/healthz", timeout=1.0)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError("the server did not start in time")


def sse_events(text: str) -> list[tuple[str, str, Any]]:
    out = []
    for block in text.strip().split("\n\n"):
        lines = [line for line in block.split("\n") if not line.startswith(":")]
        fields = dict(line.split(": ", 1) for line in lines)
        if "event" in fields:
            out.append((fields["event"], fields["id"], json.loads(fields["data"])))
    return out


# -- throughput --------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def throughput(
    base: str, pid: int, questions: list[str], rounds: int, batch: int, concurrency: int
) -> dict[str, Any]:
    import httpx

    used_keys: list[tuple[str, str]] = []
    captured: list[list[tuple[str, str, Any]]] = []

    async def one(client: httpx.AsyncClient, arm: str, i: int) -> None:
        question = questions[i % len(questions)]
        if arm in ("plain", "control"):
            reply = await client.post("/v1/answer", json={"question": question})
        elif arm == "keyed":
            key = uuid.uuid4().hex
            reply = await client.post(
                "/v1/answer", json={"question": question}, headers={"Idempotency-Key": key}
            )
            used_keys.append((key, question))
        elif arm == "stream":
            reply = await client.post("/v1/answer/stream", json={"question": question})
            captured.append(sse_events(reply.text))
        else:
            key, question = used_keys[i % len(used_keys)]
            reply = await client.post(
                "/v1/answer", json={"question": question}, headers={"Idempotency-Key": key}
            )
            assert reply.headers.get("idempotency-replayed") == "true"
        assert reply.status_code == 200, reply.text

    # "control" repeats "plain": how far two identical arms drift apart on this machine
    arms = ["plain", "keyed", "stream", "control", "replay"]
    rates: dict[str, list[float]] = {arm: [] for arm in arms}
    cpu: dict[str, float] = dict.fromkeys(arms, 0.0)
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, timeout=120, limits=limits) as client:
        for q in questions[:concurrency]:  # warm up
            await client.post("/v1/answer", json={"question": q})
        for r in range(rounds):
            order = arms if r % 2 == 0 else [*arms[:4][::-1], "replay"]
            for arm in order:
                counter = iter(range(batch))

                async def worker(arm: str = arm, counter: Any = counter, r: int = r) -> None:
                    for i in counter:
                        await one(client, arm, r * batch + i)

                began, used = time.perf_counter(), cpu_seconds(pid)
                await asyncio.gather(*(worker() for _ in range(concurrency)))
                rates[arm].append(batch / (time.perf_counter() - began))
                cpu[arm] += cpu_seconds(pid) - used
    medians = {arm: statistics.median(v) for arm, v in rates.items()}
    return {
        "requests_per_arm": rounds * batch,
        "rps_median": {arm: round(v, 2) for arm, v in medians.items()},
        "ratio_to_plain": {arm: round(v / medians["plain"], 3) for arm, v in medians.items()},
        # the server's CPU per request: steadier than requests/s on a shared machine
        "server_cpu_ms_per_request": {
            arm: round(1000 * v / (rounds * batch), 2) for arm, v in cpu.items()
        },
        "rounds": {arm: [round(x, 2) for x in v] for arm, v in rates.items()},
        "_captured": captured,
    }


# -- resume and decision -------------------------------------------------------------------------


async def resume(a: str, b: str, questions: list[str], n: int) -> dict[str, Any]:
    import httpx

    timings: dict[str, list[float]] = {"same_replica_ms": [], "other_replica_ms": []}
    async with httpx.AsyncClient(timeout=120) as client:
        for i in range(n):
            reply = await client.post(
                f"{a}/v1/answer/stream", json={"question": questions[i % len(questions)]}
            )
            got = sse_events(reply.text)
            last_seen = got[2][1]
            for name, base in (("same_replica_ms", a), ("other_replica_ms", b)):
                began = time.perf_counter()
                again = await client.post(
                    f"{base}/v1/answer/stream",
                    json={"question": questions[i % len(questions)]},
                    headers={"Last-Event-ID": last_seen},
                )
                rest = sse_events(again.text)
                timings[name].append((time.perf_counter() - began) * 1000)
                assert rest == got[3:], (name, rest[:1], got[3:4])
    return {
        k: {"median": round(statistics.median(v), 1), "max": round(max(v), 1)}
        for k, v in timings.items()
    }


async def decision(a: str, b: str, n: int) -> dict[str, Any]:
    import httpx

    lat: dict[str, list[float]] = {"same_replica_ms": [], "other_replica_ms": []}
    async with httpx.AsyncClient(timeout=120) as client:
        for _i in range(n):
            ticket = (await client.post(f"{a}/v1/requests", json={"question": ESCALATES})).json()
            arrived: dict[str, float] = {}

            async def follow(
                name: str,
                base: str,
                ticket: dict[str, Any] = ticket,
                arrived: dict[str, float] = arrived,
            ) -> None:
                async with client.stream("GET", f"{base}{ticket['events_url']}") as stream:
                    async for chunk in stream.aiter_text():
                        if "event: decision" in chunk:
                            arrived[name] = time.perf_counter()

            followers = [
                asyncio.create_task(follow("same_replica_ms", a)),
                asyncio.create_task(follow("other_replica_ms", b)),
            ]
            # wait for the response on the record, then decide on a
            for _ in range(600):
                status = (await client.get(f"{a}/v1/requests/{ticket['request_id']}")).json()
                if status.get("decision"):
                    break
                await asyncio.sleep(0.05)
            assert status["decision"] == "escalate", status
            await asyncio.sleep(0.5)  # both streams are waiting now
            reply = await client.post(
                f"{a}/review/api/items/{ticket['request_id']}/decision",
                json={"action": "reject", "reason": "off topic", "reviewer": "bench"},
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
            assert reply.status_code == 200, reply.text
            replied = time.perf_counter()
            await asyncio.wait_for(asyncio.gather(*followers), 30)
            for name, at in arrived.items():
                lat[name].append(max(0.0, (at - replied)) * 1000)
    return {
        k: {"median": round(statistics.median(v), 1), "max": round(max(v), 1), "n": len(v)}
        for k, v in lat.items()
    }


# -- the table alone -----------------------------------------------------------------------------


def table_ops(captured: list[list[tuple[str, str, Any]]], n: int = 500) -> dict[str, Any]:
    """CPU and wall time of one key claim and one run's events stored, on a SQLite table."""
    from tracerag.server._run_book import encode
    from tracerag.server._run_table import open_run_table
    from tracerag.store._sqlite import SQLiteAuditStore

    shape = [(name, encode(data)) for name, _, data in captured[0]]
    with tempfile.TemporaryDirectory() as work:
        store = SQLiteAuditStore(str(Path(work) / "audit.sqlite"))
        table = open_run_table(store)
        assert table is not None
        try:
            out: dict[str, Any] = {}
            for op in ("claim", "finish"):
                cpu, wall = time.process_time(), time.perf_counter()
                for i in range(n):
                    if op == "claim":
                        table.claim(f"r{i}", f"k{i}", "fp", time.time(), 600)
                    else:
                        table.finish(f"r{i}", shape)
                out[f"{op}_cpu_ms"] = round((time.process_time() - cpu) / n * 1000, 3)
                out[f"{op}_wall_ms"] = round((time.perf_counter() - wall) / n * 1000, 3)
            return out
        finally:
            table.close()
            store.close()


# -- memory -------------------------------------------------------------------------------------


def memory(captured: list[list[tuple[str, str, Any]]], runs: int = 1000) -> dict[str, Any]:
    """Fill a run book to its bound with runs shaped like the captured streams."""
    from tracerag.server._run_book import Run, RunBook

    samples = [c for c in captured if c and c[-1][0] == "response"]
    book = RunBook(store=None, table=None, max_runs=runs)  # type: ignore[arg-type]
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for i in range(runs * 3):
        shape = samples[i % len(samples)]
        rid = uuid.uuid4().hex
        run = Run(rid, uuid.uuid4().hex, local=True)
        for name, _, data in shape:
            copy = json.loads(json.dumps(data))
            copy["request_id"] = rid
            run.add(name, copy)
        book._keep(run, None)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    kept = sum(s.size_diff for s in after.compare_to(before, "filename"))
    stored = [
        len(json.dumps([[n, None if n == "response" else d] for n, _, d in s])) for s in samples
    ]
    return {
        "runs_added": runs * 3,
        "runs_kept": len(book.runs),
        "kept_bytes": kept,
        "bytes_per_run": round(kept / len(book.runs)),
        "json_bytes_per_run": round(statistics.fmean(r.size() for r in book.runs.values())),
        "table_row_events_bytes": round(statistics.fmean(stored)),
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from tracerag.demo.kb import load_questions

    questions = [q["question"] for q in load_questions()]
    work = Path(tempfile.mkdtemp(prefix="tracerag-streams-"))
    store = str(work / "audit.sqlite")
    a_proc, a = start(store, work / "a.log")
    b_proc, b = start(store, work / "b.log")
    try:
        await ready(a, a_proc)
        await ready(b, b_proc)
        result: dict[str, Any] = {
            "throughput": await throughput(
                a, a_proc.pid, questions, args.rounds, args.batch, args.concurrency
            )
        }
        captured = result["throughput"].pop("_captured")
        result["resume"] = await resume(a, b, questions, args.decisions)
        result["decision"] = await decision(a, b, args.decisions)
        result["memory"] = memory(captured)
        result["table"] = table_ops(captured)
    finally:
        for child in (a_proc, b_proc):
            child.terminate()
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                child.kill()
    result["settings"] = {
        "rounds": args.rounds,
        "batch": args.batch,
        "concurrency": args.concurrency,
        "decisions": args.decisions,
        "cpus": os.cpu_count(),
    }
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--decisions", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.rounds = max(1, min(args.rounds, MAX_ROUNDS))
    result = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    t = result["throughput"]
    print(f"throughput ({t['requests_per_arm']} requests per arm, median round):")
    for arm, rps in t["rps_median"].items():
        cpu = t["server_cpu_ms_per_request"][arm]
        print(
            f"  {arm:7s} {rps:7.2f} req/s  x{t['ratio_to_plain'][arm]:.3f} of plain, "
            f"server CPU {cpu:.2f} ms/request"
        )
    for name in ("resume", "decision"):
        print(f"{name}:")
        for k, v in result[name].items():
            print(f"  {k}: median {v['median']} ms, max {v['max']} ms")
    tb = result["table"]
    print(
        f"table (SQLite, in process): claim {tb['claim_cpu_ms']} ms CPU "
        f"({tb['claim_wall_ms']} ms wall), finish {tb['finish_cpu_ms']} ms CPU "
        f"({tb['finish_wall_ms']} ms wall)"
    )
    m = result["memory"]
    print(
        f"memory: {m['runs_kept']} runs kept of {m['runs_added']} added, "
        f"{m['bytes_per_run']} B per run ({m['json_bytes_per_run']} B as JSON), "
        f"table row events {m['table_row_events_bytes']} B"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
