"""The audit trail under load and faults: is every `audit_persisted: true` really kept?

Runs the pipeline (library mode, a zero-latency scripted model, no tracing) at concurrency
``--concurrency`` in a child process writing to a SQLite store, and side by side in one run, for
the code **before** this change (``--before REV``, a git revision unpacked to a temporary
directory) and **after** (this tree):

- ``throughput``: no fault; requests/s, CPU ms per request, writer records/s (stored over the
  load plus the final flush), and the same pipeline without an audit trail;
- ``kill -9``: the child is SIGKILLed at a random time during load (``--kills`` rounds), then
  restarted on the same store (recovery: the journal is drained);
- ``sqlite lock``: another process holds the store's write lock for ``--lock-seconds``
  (default 10 s; the issue's figure is 30 s) during load; p99 latency while it is held;
- ``poisoned``: every ``--poison-every``-th question carries a lone UTF-16 surrogate;
- ``postgresql`` (``--postgres``): a throwaway server started by ``.ci/postgres.sh`` is frozen
  (SIGSTOP of every server process) for ``--freeze-seconds``, or stopped and restarted after
  ``--outage-seconds`` (default 30 s; the issue's figure is 3 minutes), during load. After: the
  journal is in a temporary directory (``TRACERAG_AUDIT_JOURNAL``).

For each: requests answered, answers saying ``audit_persisted: true``, records durable (answered
and found in the store after the run and recovery), records lost (answered, not in the store),
and false claims (said true, not in the store; the goal is 0).

    python benchmarks/audit_faults.py [--seconds 6] [--kills 3] [--lock-seconds 10]
        [--concurrency 32] [--before REV] [--postgres]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "How long is the warranty on a laptop?"
POISONED = "How long is the warranty on a laptop? \ud800"
ANSWER = (
    "Under Clause 6.1, laptops and tablets are covered by an extended 24-month warranty. [warranty]"
)
PLAN = '{"material_ids": ["warranty"], "key_facts": ["24-month"]}'


# -- the child: a pipeline under load, one line per answer ------------------------------------


def child(args: argparse.Namespace) -> None:
    import asyncio
    import logging

    from opentelemetry.trace import NoOpTracerProvider

    from tracerag import RAGPipeline
    from tracerag.demo.kb import build_retriever
    from tracerag.testing import ScriptedChatModel

    logging.getLogger("tracerag").setLevel(logging.CRITICAL)  # the parent counts; no noise

    def respond(call):
        if call.task == "plan":
            return PLAN
        if call.task == "plan_and_answer":
            return f"PLAN: {PLAN}\nANSWER: {ANSWER}"
        return ANSWER

    model = ScriptedChatModel(responder=respond, latency=0.0, model_name="fast")
    pipeline = RAGPipeline(
        build_retriever(k=4),
        model,
        prompt_version="bench",
        model_version="fast",
        n_samples=3,
        tracer_provider=NoOpTracerProvider(),
        audit=args.store or None,
    )
    out = sys.stdout
    out.write("READY\n")
    out.flush()
    count = 0

    async def run() -> None:
        nonlocal count
        t0 = time.monotonic()
        deadline = t0 + args.seconds

        async def worker() -> None:
            nonlocal count
            while time.monotonic() < deadline:
                count += 1
                poison = args.poison_every and count % args.poison_every == 0
                start = time.monotonic()
                try:
                    r = await pipeline.ainvoke(POISONED if poison else QUESTION)
                except Exception as exc:  # an answer that never came
                    out.write(f"X {type(exc).__name__}\n")
                    continue
                end = time.monotonic()
                flag = {True: 1, False: 0, None: -1}[r.audit_persisted]
                out.write(f"R {r.request_id} {flag} {start - t0:.4f} {end - start:.5f}\n")
                out.flush()

        await asyncio.gather(*[worker() for _ in range(args.concurrency)])

    cpu0, wall0 = time.process_time(), time.monotonic()
    asyncio.run(run())
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    sink = pipeline.settings.record_sink
    writer = getattr(sink, "writer", None)
    backlog = writer.pending if writer is not None else 0
    t = time.monotonic()
    drained = writer.close() if writer is not None else True
    flush = time.monotonic() - t
    written = writer.written if writer is not None else 0
    summary = {"cpu": cpu, "wall": wall, "backlog": backlog, "flush": flush}
    summary |= {"written": written, "drained": bool(drained)}
    out.write("S " + json.dumps(summary) + "\n")
    out.flush()
    os._exit(0)


def recover(args: argparse.Namespace) -> None:
    """A restart after a crash: open the writer on the same store (and journal) and drain it."""
    import logging

    from tracerag.audit import writer_for

    logging.getLogger("tracerag").setLevel(logging.CRITICAL)
    writer = writer_for(args.store)
    writer.flush(60)
    writer.close()
    os._exit(0)


# -- the parent --------------------------------------------------------------------------------


@dataclass
class Run:
    answered: int = 0
    claimed: set[str] = field(default_factory=set)
    ids: set[str] = field(default_factory=set)
    latencies: list[tuple[float, float]] = field(default_factory=list)  # (start, latency)
    summary: dict = field(default_factory=dict)
    errors: int = 0


def spawn(
    pythonpath: str,
    store: str | None,
    seconds: float,
    conc: int,
    poison: int = 0,
    env: dict | None = None,
) -> subprocess.Popen:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        "--seconds",
        str(seconds),
        "--concurrency",
        str(conc),
        "--poison-every",
        str(poison),
    ]
    if store:
        cmd += ["--store", store]
    full_env = {**os.environ, "PYTHONPATH": pythonpath, **(env or {})}
    full_env.pop("TRACERAG_STORE", None)
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=full_env
    )


def collect(proc: subprocess.Popen, run: Run, on_ready=None) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        kind, _, rest = line.rstrip("\n").partition(" ")
        if kind == "READY":
            if on_ready:
                on_ready()
        elif kind == "R":
            rid, flag, start, lat = rest.split()
            run.answered += 1
            run.ids.add(rid)
            if flag == "1":
                run.claimed.add(rid)
            run.latencies.append((float(start), float(lat)))
        elif kind == "X":
            run.errors += 1
        elif kind == "S":
            run.summary = json.loads(rest)
    proc.wait()


def stored_ids(path: str) -> set[str]:
    if not Path(path).exists():
        return set()
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {r[0] for r in conn.execute("SELECT request_id FROM requests")}
    finally:
        conn.close()


def quarantined(path: str) -> int:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        try:
            return conn.execute(
                "SELECT COUNT(*) FROM audit_entries WHERE kind = 'quarantined'"
            ).fetchone()[0]
        except sqlite3.Error:
            return 0
    finally:
        conn.close()


def p99(values: list[float]) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, round(0.99 * (len(values) - 1)))]


def outcome(run: Run, stored: set[str]) -> dict:
    durable = run.ids & stored
    return {
        "answered": run.answered,
        "said true": len(run.claimed),
        "durable": len(durable),
        "lost": run.answered - len(durable),
        "false claims": len(run.claimed - stored),
    }


def unpack(rev: str) -> str:
    target = tempfile.mkdtemp(prefix="tracerag-before-")
    data = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "tracerag"], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(target, filter="data")
    return target


def scenario_throughput(code: str, args, tmp: Path) -> dict:
    store = str(tmp / "tp.sqlite")
    run = Run()
    collect(spawn(code, store, args.seconds, args.concurrency), run)
    s = run.summary
    stored = stored_ids(store)
    rps = run.answered / s["wall"] if s else 0
    res = outcome(run, stored)
    res |= {
        "req/s": round(rps, 1),
        "cpu ms/req": round(1000 * s["cpu"] / max(1, run.answered), 2),
        "backlog at end": s.get("backlog"),
        "writer rec/s": round(len(stored) / (s["wall"] + s["flush"]), 1) if s else None,
        "p99 ms": round(1000 * (p99([lat for _, lat in run.latencies]) or 0), 1),
    }
    return res


def scenario_no_audit(code: str, args) -> dict:
    run = Run()
    collect(spawn(code, None, args.seconds, args.concurrency), run)
    s = run.summary
    return {
        "answered": run.answered,
        "req/s": round(run.answered / s["wall"], 1),
        "cpu ms/req": round(1000 * s["cpu"] / max(1, run.answered), 2),
        "p99 ms": round(1000 * (p99([lat for _, lat in run.latencies]) or 0), 1),
    }


def scenario_kill(code: str, args, tmp: Path, rng: random.Random) -> dict:
    store = str(tmp / "kill.sqlite")
    total = Run()
    for _ in range(args.kills):
        run = Run()
        proc = spawn(code, store, args.seconds + 30, args.concurrency)
        started = threading.Event()
        reader = threading.Thread(target=collect, args=(proc, run, started.set))
        reader.start()
        started.wait(60)
        time.sleep(rng.uniform(1.0, args.seconds))
        os.kill(proc.pid, signal.SIGKILL)
        reader.join()
        # the restart after the crash drains what the crashed process left
        subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--recover", "--store", store],
            env={**os.environ, "PYTHONPATH": code},
            stderr=subprocess.DEVNULL,
            timeout=120,
            check=False,
        )
        total.answered += run.answered
        total.ids |= run.ids
        total.claimed |= run.claimed
    return outcome(total, stored_ids(store)) | {"rounds": args.kills}


def scenario_lock(code: str, args, tmp: Path) -> dict:
    store = str(tmp / "lock.sqlite")  # created by the child, before the lock is taken
    run = Run()
    held: list[float] = []

    def hold(start_at: float) -> None:
        while run.answered < 50:  # the writer is writing by then
            time.sleep(0.05)
        time.sleep(start_at)
        conn = sqlite3.connect(store, isolation_level=None, timeout=60)
        conn.execute("BEGIN EXCLUSIVE")
        held.append(time.monotonic())
        time.sleep(args.lock_seconds)
        conn.execute("ROLLBACK")
        conn.close()
        held.append(time.monotonic())

    proc = spawn(code, store, args.lock_seconds + 6, args.concurrency)
    t_ready: list[float] = []
    locker = threading.Thread(target=hold, args=(1.0,))

    def ready() -> None:
        t_ready.append(time.monotonic())
        locker.start()

    collect(proc, run, ready)
    locker.join()
    lock_from, lock_to = held[0] - t_ready[0], held[1] - t_ready[0]
    during = [lat for start, lat in run.latencies if lock_from <= start < lock_to]
    outside = [lat for start, lat in run.latencies if not lock_from <= start < lock_to]
    res = outcome(run, stored_ids(store))
    res |= {
        "lock s": args.lock_seconds,
        "answered during lock": len(during),
        "p99 ms during lock": round(1000 * (p99(during) or 0), 1),
        "max ms during lock": round(1000 * max(during, default=0), 1),
        "p99 ms outside lock": round(1000 * (p99(outside) or 0), 1),
    }
    return res


def scenario_poison(code: str, args, tmp: Path) -> dict:
    store = str(tmp / "poison.sqlite")
    run = Run()
    collect(spawn(code, store, args.seconds, args.concurrency, args.poison_every), run)
    stored = stored_ids(store)
    res = outcome(run, stored)
    res["quarantined"] = quarantined(store) if Path(store).exists() else 0
    res["poisoned sent"] = run.answered // args.poison_every
    res["answer errors"] = run.errors
    return res


def _pg_command(pg_dir: str, *args: str) -> None:
    """Run pg_ctl on the throwaway server, as its owner."""
    import pwd
    import shlex

    opts_file = Path(pg_dir) / "data" / "postmaster.opts"
    opts = shlex.split(opts_file.read_text())[1:] if opts_file.exists() else []
    opts = [o for i, o in enumerate(opts) if o != "-D" and (i == 0 or opts[i - 1] != "-D")]
    pg_ctl = subprocess.run(["bash", "-c", "command -v pg_ctl"], capture_output=True, text=True)
    cmd = [pg_ctl.stdout.strip() or "pg_ctl", "-D", f"{pg_dir}/data", "-w", *args]
    if args[0] == "start":
        cmd += ["-l", f"{pg_dir}/server.log", "-o", " ".join(shlex.quote(o) for o in opts)]
    owner = pwd.getpwuid(Path(pg_dir, "data").stat().st_uid).pw_name
    if os.geteuid() == 0 and owner != "root":
        cmd = ["runuser", "-u", owner, "--", *cmd]
    subprocess.run(cmd, capture_output=True, check=True, timeout=120)


def scenario_pg(code: str, args, tmp: Path, after: bool, fault: str) -> dict:
    """PostgreSQL frozen (SIGSTOP of every server process) or down (stopped, restarted)."""
    started = subprocess.run(
        ["bash", str(ROOT / ".ci/postgres.sh")], capture_output=True, text=True, check=True
    )
    env_lines = dict(
        line.removeprefix("export ").split("=", 1) for line in started.stdout.splitlines()
    )
    dsn = env_lines["TRACERAG_TEST_POSTGRES_DSN"].strip("'")
    pg_dir = env_lines["TRACERAG_TEST_POSTGRES_DIR"].strip("'")
    seconds = args.freeze_seconds if fault == "freeze" else args.outage_seconds
    try:
        run = Run()
        journal = tmp / f"pg-{fault}.journal"
        env = {"TRACERAG_AUDIT_JOURNAL": str(journal)} if after else {}
        proc = spawn(code, dsn, seconds + 8, args.concurrency, env=env)
        window: list[float] = []
        t_ready: list[float] = []

        def server_pids() -> list[int]:
            pids = subprocess.run(
                ["pgrep", "-f", f"postgres.*{pg_dir}"], capture_output=True, text=True
            ).stdout.split()
            children = subprocess.run(
                ["pgrep", "-P", ",".join(pids)], capture_output=True, text=True
            ).stdout.split()
            return [int(p) for p in [*pids, *children]]

        def fault_window() -> None:
            while run.answered < 50:
                time.sleep(0.05)
            time.sleep(1.0)
            if fault == "freeze":
                pids = server_pids()
                for pid in pids:
                    os.kill(pid, signal.SIGSTOP)
                window.append(time.monotonic())
                time.sleep(seconds)
                for pid in pids:
                    os.kill(pid, signal.SIGCONT)
            else:
                _pg_command(pg_dir, "stop", "-m", "immediate")
                window.append(time.monotonic())
                time.sleep(seconds)
                _pg_command(pg_dir, "start")
            window.append(time.monotonic())

        faulter = threading.Thread(target=fault_window)

        def ready() -> None:
            t_ready.append(time.monotonic())
            faulter.start()

        collect(proc, run, ready)
        faulter.join()
        if after:  # a restart drains whatever the journal still holds
            subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "--recover", "--store", dsn],
                env={**os.environ, "PYTHONPATH": code, **env},
                stderr=subprocess.DEVNULL,
                timeout=300,
                check=False,
            )
        import psycopg

        with psycopg.connect(dsn) as conn:
            stored = {r[0] for r in conn.execute("SELECT request_id FROM requests")}
        f0, f1 = window[0] - t_ready[0], window[1] - t_ready[0]
        during = [lat for start, lat in run.latencies if f0 <= start < f1]
        outside = [lat for start, lat in run.latencies if not f0 <= start < f1]
        res = outcome(run, stored)
        res |= {
            f"{fault} s": seconds,
            f"answered during {fault}": len(during),
            f"p99 ms during {fault}": round(1000 * (p99(during) or 0), 1),
            f"p99 ms outside {fault}": round(1000 * (p99(outside) or 0), 1),
        }
        return res
    finally:
        subprocess.run(
            ["bash", str(ROOT / ".ci/postgres.sh"), "stop", pg_dir],
            capture_output=True,
            check=False,
        )


def table(title: str, before: dict, after: dict) -> None:
    print(f"\n{title}")
    keys = list(dict.fromkeys([*before, *after]))
    print(f"  {'':24} {'before':>12} {'after':>12}")
    for k in keys:
        print(f"  {k:24} {before.get(k, '-')!s:>12} {after.get(k, '-')!s:>12}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--recover", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--store", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=6.0, help="load per run")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--poison-every", type=int, default=100)
    ap.add_argument("--kills", type=int, default=3, help="kill -9 rounds")
    ap.add_argument("--lock-seconds", type=float, default=10.0)
    ap.add_argument("--before", default="45b8324", help="git revision to compare with")
    ap.add_argument("--postgres", action="store_true", help="also freeze a PostgreSQL server")
    ap.add_argument("--freeze-seconds", type=float, default=10.0)
    ap.add_argument(
        "--outage-seconds", type=float, default=30.0, help="the issue's figure is 180 s"
    )
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--only", default=None, help="comma-separated scenarios to run")
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    if args.recover:
        recover(args)
        return
    rng = random.Random(args.seed)
    before_code, after_code = unpack(args.before), str(ROOT)
    only = set(args.only.split(",")) if args.only else None
    print(
        f"library mode, concurrency {args.concurrency}, {args.seconds:.0f} s of load per run, "
        f"{os.cpu_count()} CPUs; before = {args.before}, after = this tree"
    )

    def want(name: str) -> bool:
        return only is None or name in only

    with tempfile.TemporaryDirectory() as t:
        tmp_b, tmp_a = Path(t) / "before", Path(t) / "after"
        tmp_b.mkdir()
        tmp_a.mkdir()
        if want("throughput"):
            table(
                "no audit trail (the pipeline alone)",
                scenario_no_audit(before_code, args),
                scenario_no_audit(after_code, args),
            )
            table(
                "throughput, SQLite store, no fault",
                scenario_throughput(before_code, args, tmp_b),
                scenario_throughput(after_code, args, tmp_a),
            )
        if want("kill"):
            table(
                f"kill -9 at random times during load ({args.kills} rounds, then restart)",
                scenario_kill(before_code, args, tmp_b, rng),
                scenario_kill(after_code, args, tmp_a, rng),
            )
        if want("lock"):
            table(
                f"SQLite write lock held by another process for {args.lock_seconds:.0f} s",
                scenario_lock(before_code, args, tmp_b),
                scenario_lock(after_code, args, tmp_a),
            )
        if want("poison"):
            table(
                f"a poisoned record (lone surrogate) every {args.poison_every} requests",
                scenario_poison(before_code, args, tmp_b),
                scenario_poison(after_code, args, tmp_a),
            )
        if args.postgres and want("pg"):
            table(
                f"PostgreSQL frozen (SIGSTOP) for {args.freeze_seconds:.0f} s",
                scenario_pg(before_code, args, tmp_b, False, "freeze"),
                scenario_pg(after_code, args, tmp_a, True, "freeze"),
            )
        if args.postgres and want("outage"):
            table(
                f"PostgreSQL down (stopped, then restarted) for {args.outage_seconds:.0f} s",
                scenario_pg(before_code, args, tmp_b, False, "outage"),
                scenario_pg(after_code, args, tmp_a, True, "outage"),
            )


if __name__ == "__main__":
    main()
