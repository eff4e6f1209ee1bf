"""What the audit trail costs: store writes per second, and latency added to each request.

For each backend (SQLite always; PostgreSQL when ``TRACERAG_TEST_POSTGRES_DSN`` is set — start
one with ``eval "$(bash .ci/postgres.sh)"``), in one run:

- synchronous writes: ``store.append_record`` on the caller's thread, one record at a time
  (what a request would pay if it wrote its own audit record);
- background drain: records submitted to an ``AuditWriter`` at once, then flushed;
- journaled: durable submits (journal append + fdatasync, so ``audit_persisted`` may say true)
  from 1 and from 32 threads (group commit), and the rate the journal is drained into the store;
- added latency per request, side by side: a simulated request (building its record from a
  RequestState, as the pipeline does) with no store at all, versus the same request ending with
  ``AuditWriter.submit`` while the writer thread is busy writing the round's records (in
  batches). Rounds alternate between the two so drift hits both equally; before each baseline
  round the writer is drained, so the baseline shares the process with an idle writer only.

    python benchmarks/audit_store.py [--requests 2000] [--rounds 5] [--backend all]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

from tracerag._state import (
    ErrorLog,
    PlanResult,
    Registration,
    RequestInput,
    RequestState,
    Retrieval,
    RunVersions,
    Sample,
    SampleSet,
)
from tracerag.signals._types import Material, Plan
from tracerag.store import AuditWriter
from tracerag.store._sql import SQLAuditStore

PG_ENV = "TRACERAG_TEST_POSTGRES_DSN"


def build_record(request_id: str) -> dict[str, Any]:
    """A realistic record: 4 materials, a plan, 3 raw samples, citation signals, one retry."""
    errors = ErrorLog()
    errors.record_error("sample", TimeoutError("model call timed out"), attempt=1)
    answer = "You can return a damaged item within 30 days of delivery [M00]. We pay [M01]."
    state = RequestState(
        input=RequestInput(
            question="I received a damaged kettle. How long do I have to return it?",
            request_id=request_id,
            channel="helpdesk",
        ),
        trace_id=uuid.uuid4().hex,
        registration=Registration(
            request_id=request_id,
            tier="high",
            versions=RunVersions("support-answer@3f9c2a1", "gpt-4o-mini", "0.1.0"),
            n_samples=3,
            temperature=0.7,
            plan_mode="separate",
        ),
        retrieval=Retrieval.of(
            tuple(
                Material(
                    id=f"M{i:02d}",
                    text="Items that arrive damaged may be returned within 30 days of delivery. "
                    * 4,
                    title=f"Policy {i}",
                    score=0.9 - i / 10,
                    rank=i + 1,
                )
                for i in range(4)
            )
        ),
        planning=PlanResult(
            Plan(material_ids=("M00", "M01"), key_facts=("30 days", "we pay shipping"))
        ),
        samples=SampleSet(
            samples=tuple(
                Sample(index=i, raw=answer, answer=answer, attempts=1, latency_s=1.2)
                for i in range(3)
            ),
            temperature=0.7,
            errors=errors.freeze(),
        ),
        errors=errors.freeze(),
        timings={"request": 3.2},
    )
    record = state.to_record(response={"answer": answer, "status": "answered"})
    record["signals"] = {
        "citations": {
            "claims": [
                {
                    "text": "You can return a damaged item within 30 days of delivery.",
                    "cited_ids": ["M00"],
                    "verdict": "supported",
                    "score": 0.93,
                    "sentence": "Items that arrive damaged may be returned within 30 days.",
                    "material_id": "M00",
                }
            ]
            * 2,
            "coverage": 1.0,
            "accuracy": 1.0,
            "fabricated": [],
        },
        "consistency": {"agreement": 1.0, "groups": 1, "entropy": 0.0},
        "rules": [{"name": "no_personal_data", "passed": True, "required": True, "detail": ""}],
    }
    record["confidence"], record["decision"] = 0.91, "pass"
    return record


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def us(seconds: float) -> str:
    return f"{seconds * 1e6:8.1f} µs"


def sync_writes(store: SQLAuditStore, n: int, tag: str) -> tuple[float, list[float]]:
    records = [build_record(f"sync-{tag}-{i}") for i in range(n)]
    times = []
    start = time.perf_counter()
    for record in records:
        t0 = time.perf_counter()
        store.append_record(record)
        times.append(time.perf_counter() - t0)
    return n / (time.perf_counter() - start), times


def drain(store: SQLAuditStore, n: int, tag: str) -> float:
    records = [build_record(f"drain-{tag}-{i}") for i in range(n)]
    writer = AuditWriter(store, max_buffer=n + 1)
    try:
        start = time.perf_counter()
        for record in records:
            writer.submit(record)
        if not writer.flush(600):
            raise RuntimeError("writer did not drain")
        elapsed = time.perf_counter() - start
        assert writer.dropped == 0
    finally:
        writer.close()
    return n / elapsed


def journaled(store: SQLAuditStore, n: int, tag: str, threads: int) -> tuple[float, float, list]:
    """Durable submits (journal append + fdatasync) from ``threads`` threads, then the drain.

    Returns durable submits/s, journal-to-store records/s, and each submit's latency.
    """
    import concurrent.futures

    records = [build_record(f"journal-{tag}-{threads}-{i}") for i in range(n)]
    latencies: list[float] = []
    with tempfile.TemporaryDirectory() as journal:
        writer = AuditWriter(store, journal=journal)
        try:

            def one(record: dict[str, Any]) -> None:
                t0 = time.perf_counter()
                if not writer.submit_durable(record):
                    raise RuntimeError("a durable submit was refused")
                latencies.append(time.perf_counter() - t0)

            start = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(threads) as pool:
                list(pool.map(one, records))
            submitted = time.perf_counter() - start
            if not writer.flush(600):
                raise RuntimeError("writer did not drain")
            drained = time.perf_counter() - start
            assert writer.dropped == 0
        finally:
            writer.close()
    return n / submitted, n / drained, latencies


def request_loop(n: int, tag: str, submit: Callable[[dict[str, Any]], Any]) -> tuple[list, list]:
    """Per-request wall time and the time spent in submit alone."""
    totals, submits = [], []
    for i in range(n):
        t0 = time.perf_counter()
        record = build_record(f"{tag}-{i}")
        t1 = time.perf_counter()
        submit(record)
        t2 = time.perf_counter()
        totals.append(t2 - t0)
        submits.append(t2 - t1)
    return totals, submits


def added_latency(store: SQLAuditStore, n: int, rounds: int, tag: str) -> dict[str, Any]:
    writer = AuditWriter(store, max_buffer=n * rounds + 1)
    base_tot: list[float] = []
    base_sub: list[float] = []
    with_tot: list[float] = []
    with_sub: list[float] = []
    try:
        request_loop(min(n, 200), f"warm-{tag}", writer.submit)
        writer.flush(600)
        for r in range(rounds):
            writer.flush(600)  # the baseline runs with the writer idle, as with no store at all
            t, s = request_loop(n, f"base-{tag}-{r}", lambda record: None)
            base_tot += t
            base_sub += s
            t, s = request_loop(n, f"with-{tag}-{r}", writer.submit)
            with_tot += t
            with_sub += s
        backlog = writer.pending
        start = time.perf_counter()
        writer.flush(600)
        drain_s = time.perf_counter() - start
        dropped = writer.dropped
    finally:
        writer.close()
    return {
        "base_tot": base_tot,
        "base_sub": base_sub,
        "with_tot": with_tot,
        "with_sub": with_sub,
        "backlog": backlog,
        "drain_s": drain_s,
        "dropped": dropped,
    }


def run(name: str, open_store: Callable[[], SQLAuditStore], args: argparse.Namespace) -> None:
    tag = uuid.uuid4().hex[:6]
    store = open_store()
    try:
        print(f"\n== {name} ==")
        rate, times = sync_writes(store, args.requests, tag)
        print(
            f"synchronous append_record: {rate:8.0f} records/s   "
            f"p50 {us(pct(times, 0.5))}  p99 {us(pct(times, 0.99))}   "
            f"({len(build_record('x')['samples'])} samples → 10 entries per record)"
        )
        print(f"AuditWriter drain:         {drain(store, args.requests, tag):8.0f} records/s")
        for threads in (1, 32):
            durable, drained, lat = journaled(store, args.requests, tag, threads)
            print(
                f"journaled, {threads:2d} thread(s): {durable:8.0f} durable submits/s "
                f"(p50 {us(pct(lat, 0.5))}, p99 {us(pct(lat, 0.99))}); "
                f"journal → store {drained:6.0f} records/s"
            )
        res = added_latency(store, args.requests, args.rounds, tag)
        bt, wt = res["base_tot"], res["with_tot"]
        bs, ws = res["base_sub"], res["with_sub"]
        print(f"per request ({len(bt)} per side)     no store      with AuditWriter   ratio")
        for label, fn in (("mean", statistics.fmean), ("p50", lambda v: pct(v, 0.5))):
            print(
                f"  request {label:<4}            {us(fn(bt))}   {us(fn(wt))}     "
                f"{fn(wt) / fn(bt):5.2f}x"
            )
        print(
            f"  request p99             {us(pct(bt, 0.99))}   {us(pct(wt, 0.99))}     "
            f"{pct(wt, 0.99) / pct(bt, 0.99):5.2f}x"
        )
        print(f"  submit alone mean       {us(statistics.fmean(bs))}   {us(statistics.fmean(ws))}")
        print(f"  submit alone p99        {us(pct(bs, 0.99))}   {us(pct(ws, 0.99))}")
        added = statistics.fmean(wt) - statistics.fmean(bt)
        print(
            f"  added per request: {added * 1e6:.1f} µs mean "
            f"(= {added / 3.0 * 100:.4f}% of a 3 s answer); backlog at end {res['backlog']}, "
            f"drained in {res['drain_s']:.2f}s, dropped {res['dropped']}"
        )
        report = store.verify_chain()
        print(f"verify_chain over {report.checked} entries: {'ok' if report.ok else 'BROKEN'}")
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backend", choices=["all", "sqlite", "postgres"], default="all")
    parser.add_argument(
        "--synchronous",
        default="FULL",
        help="SQLite synchronous level (FULL, the default, survives power loss; NORMAL is faster)",
    )
    args = parser.parse_args()

    if args.backend in ("all", "sqlite"):
        from tracerag.store._sqlite import SQLiteAuditStore

        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "audit.sqlite")
            run(
                f"SQLite (WAL, synchronous={args.synchronous})",
                lambda: SQLiteAuditStore(path, synchronous=args.synchronous),
                args,
            )
    if args.backend in ("all", "postgres"):
        dsn = os.environ.get(PG_ENV)
        if not dsn:
            print(f"\n== PostgreSQL: skipped ({PG_ENV} not set) ==")
            return
        import psycopg

        from tracerag.store._postgres import PostgresAuditStore

        schema = "bench_" + uuid.uuid4().hex[:8]
        try:
            run("PostgreSQL", lambda: PostgresAuditStore(dsn, schema=schema), args)
        finally:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


if __name__ == "__main__":
    main()
