"""Requests/s and chain appends/s as server processes are added (1, 2, 3) on one PostgreSQL.

Needs ``TRACERAG_TEST_POSTGRES_DSN`` (``eval "$(bash .ci/postgres.sh)"``). Everything runs on
127.0.0.1 and is bounded (at most 120 s per measurement, 3 processes). Each measurement gets a
fresh schema. Two workloads per process count N, in one run so the ratios are side by side:

- ``serve``: N server processes (``create_app`` over the demo knowledge base, the offline
  extractive model, ``--samples`` samples, review desk on — what ``tracerag serve`` runs), and
  a load generator in this process keeping ``--concurrency`` answer requests in flight, spread
  round-robin over the N processes. Reported: answers/s, and the chain's appends/s (entries,
  from the chain head's seq) and records/s.
- ``append``: N writer processes, each with ``--threads`` threads calling
  ``store.append_record`` in a loop (a realistic record: 4 materials, 3 samples, a plan): the
  hash chain alone, without HTTP or pipelines. Reported: records/s, entries/s, the
  transactions that carried them (group commits) and records per transaction, how long a
  transaction holds the chain head, and the share of the time the head was held by some
  writer (``head busy``: near 1.0, the single chain is what limits; well below, something
  else is) with the records/s it could carry held back to back (``ceiling``). Two arms,
  interleaved in every round: ``shipped`` (the store as it is: once a group's transaction holds
  the chain head, the records that queued while it waited join it, and a record's entries go
  to the database in one statement) and ``previous`` (the group fixed before waiting for the
  head, one INSERT round trip per entry: the append path before this benchmark existed).

The machine is shared and noisy: each figure is the median of ``--rounds`` rounds, and the arms
and process counts alternate within each round.

Every appended entry takes the one chain head row's lock (``SELECT ... FOR UPDATE``) until its
transaction commits, so appends from all processes are serialised; each process batches the
records its threads write at the same moment into one transaction (group commit). The
``append`` workload shows where that serialisation is the limit on this machine.

    python benchmarks/replicas.py [--seconds 10] [--rounds 3] [--processes 1,2,3]
        [--concurrency 12] [--threads 4] [--samples 2] [--workload both|serve|append] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

HOST = "127.0.0.1"
PG_ENV = "TRACERAG_TEST_POSTGRES_DSN"
MAX_SECONDS = 120.0
MAX_PROCESSES = 3
TOKEN = "benchmark-reviewer-token-0123456789"
QUESTIONS = [
    "How many days do I have to return an item?",
    "How long is the warranty on a laptop?",
    "How fast are refunds paid?",
    "Is the warranty transferable to another owner?",
    "订单签收后多久内可以申请开具发票？",
    "Can I pay with bitcoin?",
]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def schema_url(dsn: str, schema: str) -> str:
    sep = "&" if "?" in dsn else "?"
    return f"{dsn}{sep}options=-csearch_path%3D{schema}"


def make_schema(dsn: str) -> str:
    import psycopg

    schema = "bench_" + uuid.uuid4().hex[:10]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    return schema


def drop_schema(dsn: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def head_seq(url: str) -> int:
    import psycopg

    from tracerag.store._postgres import PostgresAuditStore

    PostgresAuditStore(url).close()  # the tables exist (migrated) before anyone measures
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT last_seq FROM chain_head WHERE id = 1").fetchone()
    return int(row[0])


def requests_stored(url: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM requests").fetchone()[0])


# -- children -------------------------------------------------------------------------------


def child_serve(port: int, url: str, samples: int) -> None:
    """One server process (what ``tracerag serve --store URL --samples N`` runs)."""
    import logging

    import uvicorn

    from tracerag.server._asgi import create_app, demo_pipeline

    logging.getLogger("tracerag").setLevel(logging.ERROR)
    app = create_app(demo_pipeline("extractive", n_samples=samples), url, reviewer_token=TOKEN)
    uvicorn.run(app, host=HOST, port=port, log_level="error", access_log=False)


class _OneByOne:
    """A cursor that sends ``executemany`` as one INSERT per row (the previous append path)."""

    def __init__(self, cur: Any) -> None:
        self._cur = cur

    def executemany(self, sql: str, rows: Any) -> None:
        for row in rows:
            self._cur.execute(sql, row)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cur, name)


def child_append(
    url: str,
    seconds: float,
    threads: int,
    start_at: float,
    one_by_one: bool = False,
    no_late: bool = False,
) -> None:
    """Append records from ``threads`` threads until ``seconds`` after ``start_at``; print
    what was appended as JSON."""
    import threading

    from audit_store import build_record

    from tracerag.store._chain_log import ChainLog
    from tracerag.store._group_commit import GroupCommit
    from tracerag.store._postgres import PostgresAuditStore

    if one_by_one or no_late:
        shipped = ChainLog.seal

        def _seal(self: Any, cur: Any, head: Any, entries: Any) -> Any:
            return shipped(self, _OneByOne(cur), head, entries)

        if one_by_one:
            ChainLog.seal = _seal  # type: ignore[method-assign]
        if no_late:
            GroupCommit._join_late = lambda self, batch: None  # type: ignore

    # time each write transaction from the moment it holds the chain head (its first
    # statement, SELECT ... FOR UPDATE) to the end of its commit: the head is busy meanwhile
    held = [0.0, 0]
    locked = PostgresAuditStore._write

    @contextlib.contextmanager
    def timed(self: Any) -> Any:
        with locked(self) as (cur, head):
            began = time.perf_counter()
            yield cur, head
        held[0] += time.perf_counter() - began
        held[1] += 1

    PostgresAuditStore._write = timed  # type: ignore[method-assign]
    store = PostgresAuditStore(url, max_connections=threads + 1)
    template = build_record("template")
    done = [0] * threads
    while time.time() < start_at:
        time.sleep(0.005)
    commits0 = store.group_commits
    held[0], held[1] = 0.0, 0
    began = time.perf_counter()
    deadline = began + seconds

    def work(i: int) -> None:
        while time.perf_counter() < deadline:
            record = dict(template, request_id=uuid.uuid4().hex)
            store.append_record(record)
            done[i] += 1

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    elapsed = time.perf_counter() - began
    print(
        json.dumps(
            {
                "records": sum(done),
                "commits": store.group_commits - commits0,
                "elapsed": elapsed,
                "held": held[0],
                "transactions": held[1],
            }
        )
    )
    store.close()


# -- the parent -----------------------------------------------------------------------------


def spawn(args: list[str]) -> subprocess.Popen[bytes]:
    env = dict(
        os.environ,
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        PYTHONPATH=str(ROOT),
    )
    env.pop("TRACERAG_STORE", None)
    return subprocess.Popen(
        [sys.executable, __file__, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def stop(children: list[subprocess.Popen[bytes]]) -> None:
    for child in children:
        if child.poll() is None:
            child.terminate()
    for child in children:
        try:
            child.wait(15)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


async def wait_ready(bases: list[str], children: list[subprocess.Popen[bytes]]) -> None:
    import httpx

    deadline = time.monotonic() + 90
    async with httpx.AsyncClient() as client:
        for base, child in zip(bases, children, strict=True):
            while True:
                if child.poll() is not None:
                    err = child.stderr.read().decode() if child.stderr else ""
                    raise RuntimeError(f"a server exited: {err[-2000:]}")
                try:
                    if (await client.get(f"{base}/readyz", timeout=1.0)).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("a server did not start in time")
                await asyncio.sleep(0.1)


async def load(bases: list[str], concurrency: int, seconds: float) -> dict[str, Any]:
    """Keep ``concurrency`` answer requests in flight, round-robin over ``bases``."""
    import httpx

    completed = 0
    errors = 0
    turn = 0
    limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=60.0) as client:
        for base in bases:  # warm up every process (imports, caches, connections)
            for q in QUESTIONS:
                await client.post(f"{base}/v1/answer", json={"question": q})

        deadline = 0.0

        async def worker() -> None:
            nonlocal completed, errors, turn
            while time.monotonic() < deadline:
                base = bases[turn % len(bases)]
                question = QUESTIONS[turn % len(QUESTIONS)]
                turn += 1
                try:
                    reply = await client.post(f"{base}/v1/answer", json={"question": question})
                except httpx.HTTPError:
                    errors += 1
                    continue
                if reply.status_code == 200:
                    completed += 1
                else:
                    errors += 1

        began = time.perf_counter()
        deadline = time.monotonic() + seconds
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    return {"completed": completed, "errors": errors, "elapsed": elapsed}


def measure_serve(dsn: str, n: int, args: argparse.Namespace) -> dict[str, Any]:
    schema = make_schema(dsn)
    url = schema_url(dsn, schema)
    children: list[subprocess.Popen[bytes]] = []
    try:
        head_seq(url)
        ports = [free_port() for _ in range(n)]
        children = [
            spawn(["--child-serve", str(p), "--url", url, "--samples", str(args.samples)])
            for p in ports
        ]
        bases = [f"http://{HOST}:{p}" for p in ports]
        asyncio.run(wait_ready(bases, children))
        seq0, stored0 = head_seq(url), requests_stored(url)
        began = time.perf_counter()
        result = asyncio.run(load(bases, args.concurrency, args.seconds))
        elapsed = time.perf_counter() - began
        seq1, stored1 = head_seq(url), requests_stored(url)
    finally:
        stop(children)
        drop_schema(dsn, schema)
    return {
        "processes": n,
        "answers_per_s": round(result["completed"] / result["elapsed"], 2),
        "entries_per_s": round((seq1 - seq0) / elapsed, 1),
        "records_per_s": round((stored1 - stored0) / elapsed, 2),
        "errors": result["errors"],
        "answers": result["completed"],
    }


def measure_append(
    dsn: str, n: int, args: argparse.Namespace, previous: bool = False
) -> dict[str, Any]:
    schema = make_schema(dsn)
    url = schema_url(dsn, schema)
    children: list[subprocess.Popen[bytes]] = []
    try:
        head_seq(url)
        start_at = time.time() + 3.0  # every writer is connected and warm by then
        children = [
            spawn(
                [
                    "--child-append",
                    "--url",
                    url,
                    "--seconds",
                    str(args.seconds),
                    "--threads",
                    str(args.threads),
                    "--start-at",
                    str(start_at),
                    *(["--one-by-one", "--no-late"] if previous else []),
                ]
            )
            for _ in range(n)
        ]
        outputs = []
        for child in children:
            out, err = child.communicate(timeout=args.seconds + 120)
            if child.returncode != 0:
                raise RuntimeError(f"a writer failed: {err.decode()[-2000:]}")
            outputs.append(json.loads(out.decode().strip().splitlines()[-1]))
        seq = head_seq(url)
    finally:
        stop(children)
        drop_schema(dsn, schema)
    records = sum(o["records"] for o in outputs)
    commits = sum(o["commits"] for o in outputs)
    elapsed = max(o["elapsed"] for o in outputs)
    held = sum(o["held"] for o in outputs)
    transactions = sum(o["transactions"] for o in outputs)
    hold = held / transactions if transactions else None
    per_commit = records / commits if commits else None
    return {
        # the share of the time the chain head was held by some writer: near 1.0, the single
        # chain is the limit; well below, something else is (CPU, the writers themselves)
        "head_busy": round(held / elapsed, 3),
        "hold_ms": round(hold * 1000, 2) if hold else None,
        # what the head could carry if it were held back to back with groups of this size
        "ceiling_records_per_s": round(per_commit / hold, 1) if hold and per_commit else None,
        "processes": n,
        "arm": "previous" if previous else "shipped",
        "records_per_s": round(records / elapsed, 1),
        "entries_per_s": round(seq / elapsed, 1),
        "commits_per_s": round(commits / elapsed, 1),
        "records_per_commit": round(records / commits, 2) if commits else None,
    }


def median_rows(runs: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, Any]:
    """The median of each key over the rounds of one configuration."""
    import statistics

    out = dict(runs[0])
    for key in keys:
        values = [r[key] for r in runs if r.get(key) is not None]
        out[key] = round(statistics.median(values), 2) if values else None
    out["rounds"] = len(runs)
    return out


def ratios(rows: list[dict[str, Any]], key: str) -> list[float | None]:
    base = rows[0][key] if rows else None
    return [round(r[key] / base, 2) if base and r[key] is not None else None for r in rows]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--processes", default="1,2,3")
    p.add_argument("--concurrency", type=int, default=12)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--samples", type=int, default=2)
    p.add_argument("--workload", choices=("both", "serve", "append"), default="both")
    p.add_argument("--json", action="store_true")
    # children
    p.add_argument("--child-serve", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-append", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--one-by-one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--no-late", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--url", default=None, help=argparse.SUPPRESS)
    p.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child_serve is not None:
        child_serve(args.child_serve, args.url, args.samples)
        return 0
    if args.child_append:
        child_append(
            args.url, args.seconds, args.threads, args.start_at, args.one_by_one, args.no_late
        )
        return 0

    dsn = os.environ.get(PG_ENV)
    if not dsn:
        print(f'set {PG_ENV} (eval "$(bash .ci/postgres.sh)")', file=sys.stderr)
        return 2
    args.seconds = min(args.seconds, MAX_SECONDS)
    args.rounds = max(1, min(args.rounds, 5))
    counts = [int(x) for x in args.processes.split(",") if x.strip()]
    if not counts or any(not 1 <= c <= MAX_PROCESSES for c in counts):
        print(f"--processes: counts from 1 to {MAX_PROCESSES}", file=sys.stderr)
        return 2
    results: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "seconds": args.seconds,
        "rounds": args.rounds,
        "load_before": os.getloadavg()[0],
    }
    if args.workload in ("both", "serve"):
        runs: dict[int, list[dict[str, Any]]] = {n: [] for n in counts}
        for r in range(args.rounds):
            for n in counts if r % 2 == 0 else counts[::-1]:
                runs[n].append(measure_serve(dsn, n, args))
        rows = [
            median_rows(runs[n], ("answers_per_s", "entries_per_s", "records_per_s"))
            for n in counts
        ]
        results["serve"] = {
            "rows": rows,
            "answers_ratio": ratios(rows, "answers_per_s"),
            "entries_ratio": ratios(rows, "entries_per_s"),
        }
    if args.workload in ("both", "append"):
        keys = (
            "records_per_s",
            "entries_per_s",
            "commits_per_s",
            "records_per_commit",
            "head_busy",
            "hold_ms",
            "ceiling_records_per_s",
        )
        arms: dict[tuple[int, bool], list[dict[str, Any]]] = {}
        for r in range(args.rounds):
            for n in counts if r % 2 == 0 else counts[::-1]:
                for prev in (False, True) if (r + n) % 2 == 0 else (True, False):
                    arms.setdefault((n, prev), []).append(measure_append(dsn, n, args, prev))
        shipped = [median_rows(arms[(n, False)], keys) for n in counts]
        previous = [median_rows(arms[(n, True)], keys) for n in counts]
        results["append"] = {
            "shipped": shipped,
            "previous": previous,
            "shipped_ratio": ratios(shipped, "records_per_s"),
            "previous_ratio": ratios(previous, "records_per_s"),
            "shipped_over_previous": [
                round(a["records_per_s"] / b["records_per_s"], 2) if b["records_per_s"] else None
                for a, b in zip(shipped, previous, strict=True)
            ],
        }
    results["load_after"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(
        f"{results['cpus']} CPUs (load {results['load_before']:.1f} before, "
        f"{results['load_after']:.1f} after), {args.seconds:.0f} s per measurement, median of "
        f"{args.rounds} rounds, PostgreSQL on loopback"
    )
    if "serve" in results:
        print("\nserve: answer requests spread over N server processes")
        print(f"{'N':>3} {'answers/s':>10} {'ratio':>6} {'entries/s':>10} {'records/s':>10}")
        for row, r in zip(results["serve"]["rows"], results["serve"]["answers_ratio"], strict=True):
            print(
                f"{row['processes']:>3} {row['answers_per_s']:>10} {r:>6} "
                f"{row['entries_per_s']:>10} {row['records_per_s']:>10}"
            )
    if "append" in results:
        a = results["append"]
        print(f"\nappend: N writer processes x {args.threads} threads, the chain alone")
        print(
            f"{'N':>3} {'arm':>9} {'records/s':>10} {'ratio':>6} {'entries/s':>10} "
            f"{'commits/s':>10} {'rec/commit':>10} {'head busy':>9} {'hold ms':>8} "
            f"{'ceiling':>8}"
        )
        for name, rows_, rat in (
            ("shipped", a["shipped"], a["shipped_ratio"]),
            ("previous", a["previous"], a["previous_ratio"]),
        ):
            for row, r in zip(rows_, rat, strict=True):
                print(
                    f"{row['processes']:>3} {name:>9} {row['records_per_s']:>10} {r:>6} "
                    f"{row['entries_per_s']:>10} {row['commits_per_s']:>10} "
                    f"{row['records_per_commit']:>10} {row['head_busy']:>9} "
                    f"{row['hold_ms']:>8} {row['ceiling_records_per_s']:>8}"
                )
        print("shipped / previous records/s:", a["shipped_over_previous"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
