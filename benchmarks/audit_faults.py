"""The audit trail under load and faults: is every `audit_persisted: true` really kept?

Runs the pipeline with a zero-latency scripted model (no tracing) at concurrency
``--concurrency``, in two modes side by side in one run:

- **library**: ``RAGPipeline.ainvoke`` in a child process writing through its audit sink;
- **server**: ``tracerag serve`` (uvicorn on 127.0.0.1, the same scripted model in place of the
  demo model) in a child process, loaded over HTTP by a light client process.

Throughput is compared with the code **before** the change (``--before PATH``: a checkout of
the older tree, run through ``PYTHONPATH``). Scenarios (``--only``, comma-separated):

- ``throughput``: no fault, SQLite store; requests/s answered, records/s the store received
  during the load, the backlog left when the load ended and how long it took to drain, CPU per
  request; library mode also without an audit trail;
- ``kill``: SIGKILL at a random time during load (``--kills`` rounds), then a restart on the
  same store (library: the writer opens the journal and drains it; server: ``tracerag serve``
  starts again and replays the journal, and the run waits for ``/readyz`` to report no backlog);
- ``lock``: another process holds the SQLite write lock for ``--lock-seconds`` during load
  (the issue's figure: 30 s); p99 and max latency while it is held, and outside it (the
  requests caught as it began wait up to the server's commit wait, ``TRACERAG_AUDIT_COMMIT_WAIT``);
- ``poison``: every ``--poison-every``-th model answer carries a lone UTF-16 surrogate;
- ``freeze`` (``--postgres``): a throwaway PostgreSQL server (``.ci/postgres.sh``) is frozen
  (SIGSTOP of every server process) for ``--freeze-seconds``; p99 latency while frozen;
- ``outage`` (``--postgres``): that server is stopped and restarted after ``--outage-seconds``
  (the issue's figure: 180 s). The journal is in a temporary directory
  (``TRACERAG_AUDIT_JOURNAL``), and a restart drains it before the store is counted;
- ``pgkill`` (``--postgres``): ``tracerag serve`` over PostgreSQL as an operator would start it
  — with no journal configured (its default: it refuses to start; ``--before`` shows the old
  default), with ``--no-journal`` and with ``--journal DIR`` — is killed with SIGKILL after
  ``--pg-kill-outage`` seconds of load with the database stopped; the database and the server
  are then started again;
- ``tamper``: each change an intruder with database (or journal file) access but without the
  chain key can make, and what ``tracerag audit verify`` says of it: plain, with the exported
  anchor, with the key, with both (SQLite; PostgreSQL too with ``--postgres``).

For each: requests answered, answers saying ``audit_persisted: true``, records durable
(answered and in the store after the run and the restart), records lost (said true, not in
the store: the goal is 0), answers not durable (answered, not in the store, whatever they said)
and, after the restart, answers that said false but were kept anyway.

    python benchmarks/audit_faults.py --before ../old-checkout [--seconds 6] [--kills 3]
        [--lock-seconds 30] [--concurrency 32] [--postgres] [--outage-seconds 180]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HERE = str(Path(__file__).resolve())
SERVE = [sys.executable, HERE, "--serve"]
QUESTION = "How long is the warranty on a laptop?"
ANSWER = (
    "Under Clause 6.1, laptops and tablets are covered by an extended 24-month warranty. [warranty]"
)
PLAN = '{"material_ids": ["warranty"], "key_facts": ["24-month"]}'
SAMPLES = 3


def scripted_model(poison_every: int) -> Any:
    """A zero-latency model; every ``poison_every``-th answer ends in a lone surrogate."""
    from tracerag.testing import ScriptedChatModel

    calls = [0]

    def respond(call: Any) -> str:
        if call.task == "plan":
            return PLAN
        answer = ANSWER
        if call.task != "plan":
            calls[0] += 1
            if poison_every and calls[0] % poison_every == 0:
                answer = ANSWER + " \ud800"
        if call.task == "plan_and_answer":
            return f"PLAN: {PLAN}\nANSWER: {answer}"
        return answer

    return ScriptedChatModel(responder=respond, latency=0.0, model_name="fast")


# -- children: the pipeline under load (library), the server, the HTTP client -----------------


def library_child(args: argparse.Namespace) -> None:
    import asyncio
    import logging

    from opentelemetry.trace import NoOpTracerProvider

    from tracerag import RAGPipeline
    from tracerag.demo.kb import build_retriever

    logging.getLogger("tracerag").setLevel(logging.CRITICAL)  # the parent counts; no noise
    pipeline = RAGPipeline(
        build_retriever(k=4),
        scripted_model(args.poison_every),
        prompt_version="bench",
        model_version="fast",
        n_samples=SAMPLES,
        tracer_provider=NoOpTracerProvider(),
        audit=args.store or None,
    )
    out = sys.stdout
    out.write("READY\n")
    out.flush()

    async def run() -> None:
        t0 = time.monotonic()
        deadline = t0 + args.seconds

        async def worker() -> None:
            while time.monotonic() < deadline:
                start = time.monotonic()
                try:
                    r = await pipeline.ainvoke(QUESTION)
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
    written = writer.written if writer is not None else 0
    t = time.monotonic()
    drained = writer.close(120) if writer is not None else True
    flush = time.monotonic() - t
    summary = {"cpu": cpu, "wall": wall, "backlog": backlog, "flush": flush}
    summary |= {"written_in_load": written, "drained": bool(drained)}
    out.write("S " + json.dumps(summary) + "\n")
    out.flush()
    os._exit(0)


def recover(args: argparse.Namespace) -> None:
    """A library restart after a crash: open the writer on the same store and drain it."""
    import logging

    from tracerag.store._sink import writer_for

    logging.getLogger("tracerag").setLevel(logging.CRITICAL)
    writer = writer_for(args.store)
    writer.flush(300)
    writer.close()
    os._exit(0)


def serve_child(args: argparse.Namespace) -> None:
    """``tracerag serve`` with the scripted model in place of the demo's offline model."""
    import tracerag.demo._run as demo_run
    from tracerag.cli import main as cli_main

    model = scripted_model(args.poison_every)
    demo_run.build_model = lambda name, seed=None: model  # type: ignore[assignment]
    argv = ["serve", "--store", args.store, "--port", str(args.port), "--no-review-desk"]
    argv += ["--samples", str(SAMPLES), "--log-level", "warning"]
    if args.serve_journal == "none":
        argv.append("--no-journal")
    elif args.serve_journal:
        argv += ["--journal", args.serve_journal]
    sys.exit(cli_main(argv))


def client_child(args: argparse.Namespace) -> None:
    """Load ``POST /v1/answer`` at ``--concurrency`` for ``--seconds``; one line per answer.

    A plain HTTP/1.1 keep-alive client on asyncio streams (lighter on the CPU than a full
    client library, which would compete with the server for the same cores).
    """
    import asyncio

    body = json.dumps({"question": QUESTION}).encode()
    request = (
        b"POST /v1/answer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    ) + body
    out = sys.stdout
    gone = asyncio.Event()

    async def exchange(reader: Any, writer: Any) -> tuple[int, bytes]:
        writer.write(request)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        return status, await reader.readexactly(length)

    async def run() -> None:
        t0 = time.monotonic()
        deadline = t0 + args.seconds

        async def worker() -> None:
            conn = None
            while time.monotonic() < deadline and not gone.is_set():
                start = time.monotonic()
                try:
                    if conn is None:
                        conn = await asyncio.open_connection("127.0.0.1", args.port)
                    status, data = await asyncio.wait_for(exchange(*conn), args.request_timeout)
                except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
                    out.write(f"X {type(exc).__name__}\n")
                    gone.set()  # the server is gone (killed): stop loading
                    return
                except TimeoutError:
                    out.write("X timeout\n")
                    conn[1].close()  # type: ignore[index]
                    conn = None
                    continue
                end = time.monotonic()
                if status != 200:
                    out.write(f"N {status}\n")
                    continue
                reply = json.loads(data)
                flag = {True: 1, False: 0, None: -1}[reply.get("audit_persisted")]
                out.write(f"R {reply['request_id']} {flag} {start - t0:.4f} {end - start:.5f}\n")
            if conn is not None:
                conn[1].close()

        await asyncio.gather(*[worker() for _ in range(args.concurrency)])

    out.write("READY\n")
    out.flush()
    wall0 = time.monotonic()
    asyncio.run(run())
    out.write("S " + json.dumps({"wall": time.monotonic() - wall0}) + "\n")
    out.flush()
    os._exit(0)


# -- the parent --------------------------------------------------------------------------------


@dataclass
class Run:
    answered: int = 0
    claimed: set[str] = field(default_factory=set)
    ids: set[str] = field(default_factory=set)
    latencies: list[tuple[float, float]] = field(default_factory=list)  # (start, latency)
    summary: dict = field(default_factory=dict)
    errors: int = 0  # no answer (exception, connection lost, client timeout)
    refused: int = 0  # an HTTP error status


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(code: str, env: dict | None) -> dict:
    full = {**os.environ, "PYTHONPATH": code, **(env or {})}
    full.pop("TRACERAG_STORE", None)
    return full


def spawn_child(role: str, code: str, *options: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, HERE, f"--{role}", *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=child_env(code, env),
    )


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def http_get(port: int, path: str, timeout: float = 5.0) -> tuple[int, dict]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        reply = conn.getresponse()
        data = reply.read()
        try:
            return reply.status, json.loads(data)
        except ValueError:
            return reply.status, {}
    finally:
        conn.close()


@dataclass
class Server:
    proc: subprocess.Popen
    port: int
    log: Path

    def wait_up(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tracerag serve exited: {self.log.read_text()[-2000:]}")
            try:
                if http_get(self.port, "/healthz", 2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError("tracerag serve did not start")

    def wait_drained(self, timeout: float = 600.0) -> bool:
        """Wait for ``/readyz`` to report no backlog (the journal replayed into the store)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                _, state = http_get(self.port, "/readyz", 5)
                store = state.get("store", {})
                if store.get("backlog", 1) == 0 and not store.get("failing"):
                    return True
            except OSError:
                pass
            time.sleep(0.3)
        return False

    def stop(self, timeout: float = 300.0) -> float:
        """SIGTERM (the writer drains what it can); the seconds it took to exit."""
        t = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return time.monotonic() - t


def start_server(
    code: str,
    store: str,
    tmp: Path,
    poison: int = 0,
    env: dict | None = None,
    journal: str | None = None,
):
    """``tracerag serve`` in a child; ``journal``: None (its default), "none" or a directory."""
    port = free_port()
    log = tmp / f"serve-{port}.log"
    extra = ["--serve-journal", journal] if journal else []
    proc = subprocess.Popen(
        [*SERVE, "--store", store, "--port", str(port), "--poison-every", str(poison), *extra],
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
        env=child_env(code, env),
        cwd=tmp,
    )
    server = Server(proc, port, log)
    server.wait_up()
    return server


@dataclass
class Load:
    """One load run: the process whose lines are read, and the one a fault hits."""

    lines: subprocess.Popen
    victim: subprocess.Popen
    server: Server | None = None


def start_load(
    mode: str,
    code: str,
    store: str,
    seconds: float,
    args: argparse.Namespace,
    tmp: Path,
    poison: int = 0,
    env: dict | None = None,
    journal: str | None = None,
) -> Load:
    common = ["--seconds", str(seconds), "--concurrency", str(args.concurrency)]
    if mode == "library":
        opts = [*common, "--poison-every", str(poison)] + (["--store", store] if store else [])
        proc = spawn_child("child", code, *opts, env=env)
        return Load(proc, proc)
    server = start_server(code, store, tmp, poison, env, journal)
    opts = [*common, "--port", str(server.port), "--request-timeout", str(args.request_timeout)]
    client = spawn_child("client", code, *opts)
    return Load(client, server.proc, server)


def collect(proc: subprocess.Popen, run: Run, on_ready=None, on_summary=None) -> None:
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
        elif kind == "N":
            run.refused += 1
        elif kind == "S":
            run.summary = json.loads(rest)
            if on_summary:
                on_summary()
    proc.wait()


def stored_ids(store: str) -> set[str]:
    if store.startswith("postgresql"):
        import psycopg

        with psycopg.connect(store) as conn:
            return {r[0] for r in conn.execute("SELECT request_id FROM requests")}
    if not Path(store).exists():
        return set()
    conn = sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=30)
    try:
        return {r[0] for r in conn.execute("SELECT request_id FROM requests")}
    finally:
        conn.close()


def quarantined(store: str) -> int:
    conn = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        try:
            return conn.execute(
                "SELECT COUNT(*) FROM audit_entries WHERE kind = 'quarantined'"
            ).fetchone()[0]
        except sqlite3.Error:
            return 0
    finally:
        conn.close()


def replaced(store: str) -> int:
    """Requests whose stored entries carry U+FFFD (a lone surrogate replaced at the boundary)."""
    conn = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        return conn.execute(
            "SELECT COUNT(DISTINCT request_id) FROM audit_entries WHERE payload LIKE ?",
            ("%\ufffd%",),
        ).fetchone()[0]
    finally:
        conn.close()


def chain_ok(code: str, store: str, env: dict | None = None) -> str:
    """``tracerag audit verify`` on the store: "intact" (exit 0), or what it exited with (3:
    nothing found, but no anchor or no key to check everything with)."""
    done = subprocess.run(
        [sys.executable, "-m", "tracerag.cli", "audit", "verify", "--store", store],
        capture_output=True,
        env=child_env(code, env),
        timeout=600,
        check=False,
    )
    return {0: "intact", 3: "no finding (3)"}.get(done.returncode, f"rc {done.returncode}")


def p99(values: list[float]) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, round(0.99 * (len(values) - 1)))]


def ms(value: float | None) -> float:
    return round(1000 * (value or 0), 1)


def outcome(run: Run, stored: set[str]) -> dict:
    durable = run.ids & stored
    return {
        "answered": run.answered,
        "no answer / http error": f"{run.errors} / {run.refused}",
        "said persisted": len(run.claimed),
        "durable": len(durable),
        "LOST (said persisted)": len(run.claimed - stored),
        "not durable (any)": run.answered - len(durable),
        "said false, kept": len(durable - run.claimed),
    }


def restart(
    mode: str, code: str, store: str, tmp: Path, env: dict | None = None, journal: str | None = None
) -> dict:
    """The restart after a fault: the journal drained into the store; how long it took."""
    t = time.monotonic()
    if mode == "library":
        subprocess.run(
            [sys.executable, HERE, "--recover", "--store", store],
            env=child_env(code, env),
            stderr=subprocess.DEVNULL,
            timeout=900,
            check=False,
        )
        return {"replay s": round(time.monotonic() - t, 1)}
    server = start_server(code, store, tmp, 0, env, journal)
    drained = server.wait_drained()
    server.stop()
    return {"replay s": round(time.monotonic() - t, 1), "replayed": drained}


def scenario_throughput(mode: str, code: str, args, tmp: Path) -> dict:
    store = str(tmp / f"tp-{mode}.sqlite")
    run = Run()
    at_end: list[int] = []
    load = start_load(mode, code, store, args.seconds, args, tmp)
    cpu0 = cpu_seconds(load.victim.pid)

    def load_ended() -> None:
        at_end.append(len(stored_ids(store)))
        at_end.append(int(1000 * cpu_seconds(load.victim.pid)))

    collect(load.lines, run, on_summary=load_ended if mode == "server" else None)
    s = run.summary
    wall = s.get("wall") or args.seconds
    if mode == "server":
        stored_in_load, cpu = at_end[0], at_end[1] / 1000 - cpu0
        drain = load.server.stop() if load.server else 0.0
    else:
        stored_in_load, cpu, drain = s.get("written_in_load", 0), s.get("cpu", 0.0), s["flush"]
    stored = stored_ids(store)
    res = outcome(run, stored)
    res |= {
        "req/s answered": round(run.answered / wall, 1),
        "rec/s stored in load": round(stored_in_load / wall, 1),
        "store/answer ratio": round(stored_in_load / max(1, run.answered), 3),
        "backlog at end": run.answered - stored_in_load,
        "drain s after load": round(drain, 1),
        "cpu ms/req": round(1000 * cpu / max(1, run.answered), 2),
        "p99 ms": ms(p99([lat for _, lat in run.latencies])),
        "chain": chain_ok(code, store) if stored else "-",
    }
    return res


def median_run(results: list[dict]) -> dict:
    """The run with the median requests/s, with the spread of all runs."""
    ordered = sorted(results, key=lambda r: r["req/s answered"])
    chosen = dict(ordered[len(ordered) // 2])
    if len(ordered) > 1:
        chosen["req/s all runs"] = "/".join(f"{r['req/s answered']:.0f}" for r in results)
    return chosen


def scenario_no_audit(code: str, args, tmp: Path) -> dict:
    run = Run()
    load = start_load("library", code, "", args.seconds, args, tmp)
    collect(load.lines, run)
    s = run.summary
    return {
        "answered": run.answered,
        "req/s answered": round(run.answered / s["wall"], 1),
        "cpu ms/req": round(1000 * s["cpu"] / max(1, run.answered), 2),
        "p99 ms": ms(p99([lat for _, lat in run.latencies])),
    }


def scenario_kill(mode: str, code: str, args, tmp: Path, rng: random.Random) -> dict:
    store = str(tmp / f"kill-{mode}.sqlite")
    total = Run()
    replay = 0.0
    for _ in range(args.kills):
        run = Run()
        load = start_load(mode, code, store, args.seconds + 60, args, tmp)
        started = threading.Event()
        reader = threading.Thread(target=collect, args=(load.lines, run, started.set))
        reader.start()
        started.wait(120)
        time.sleep(rng.uniform(1.0, args.seconds))
        os.kill(load.victim.pid, signal.SIGKILL)
        load.victim.wait()
        reader.join()
        replay += restart(mode, code, store, tmp)["replay s"]
        total.answered += run.answered
        total.errors += run.errors
        total.refused += run.refused
        total.ids |= run.ids
        total.claimed |= run.claimed
    res = outcome(total, stored_ids(store))
    return res | {
        "rounds": args.kills,
        "replay s": round(replay, 1),
        "chain": chain_ok(code, store),
    }


def windowed(run: Run, t_ready: float, window: list[float], label: str) -> dict:
    f0, f1 = window[0] - t_ready, window[1] - t_ready
    during = [lat for start, lat in run.latencies if f0 <= start < f1]
    outside = [lat for start, lat in run.latencies if not f0 <= start < f1]
    return {
        f"answered during {label}": len(during),
        f"p99 ms during {label}": ms(p99(during)),
        f"max ms during {label}": ms(max(during, default=0)),
        f"p99 ms outside {label}": ms(p99(outside)),
        f"max ms outside {label}": ms(max(outside, default=0)),
    }


def scenario_lock(mode: str, code: str, args, tmp: Path) -> dict:
    store = str(tmp / f"lock-{mode}.sqlite")  # created by the code under test
    run = Run()
    held: list[float] = []

    def hold() -> None:
        while run.answered < 50:  # the store is being written by then
            time.sleep(0.05)
        time.sleep(1.0)
        conn = sqlite3.connect(store, isolation_level=None, timeout=60)
        conn.execute("BEGIN EXCLUSIVE")
        held.append(time.monotonic())
        time.sleep(args.lock_seconds)
        conn.execute("ROLLBACK")
        conn.close()
        held.append(time.monotonic())

    load = start_load(mode, code, store, args.lock_seconds + 8, args, tmp)
    t_ready: list[float] = []
    locker = threading.Thread(target=hold)

    def ready() -> None:
        t_ready.append(time.monotonic())
        locker.start()

    collect(load.lines, run, ready)
    locker.join()
    if load.server is not None:
        load.server.stop()
    res = restart(mode, code, store, tmp)
    return (
        outcome(run, stored_ids(store))
        | {"lock s": args.lock_seconds}
        | windowed(run, t_ready[0], held, "lock")
        | res
        | {"chain": chain_ok(code, store)}
    )


def scenario_poison(mode: str, code: str, args, tmp: Path) -> dict:
    store = str(tmp / f"poison-{mode}.sqlite")
    run = Run()
    load = start_load(mode, code, store, args.seconds, args, tmp, args.poison_every)
    collect(load.lines, run)
    if load.server is not None:
        load.server.stop()
    res = outcome(run, stored_ids(store))
    res["quarantined"] = quarantined(store) if Path(store).exists() else 0
    res["poisoned model answers"] = f"1 in {args.poison_every}"
    res["stored with U+FFFD"] = replaced(store)
    return res | {"chain": chain_ok(code, store)}


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


def start_postgres() -> tuple[str, str]:
    """A throwaway PostgreSQL server (``.ci/postgres.sh``): its DSN and directory."""
    started = subprocess.run(
        ["bash", str(ROOT / ".ci/postgres.sh")], capture_output=True, text=True, check=True
    )
    env_lines = dict(
        line.removeprefix("export ").split("=", 1) for line in started.stdout.splitlines()
    )
    dsn = env_lines["TRACERAG_TEST_POSTGRES_DSN"].strip("'")
    return dsn, env_lines["TRACERAG_TEST_POSTGRES_DIR"].strip("'")


def stop_postgres(pg_dir: str) -> None:
    subprocess.run(
        ["bash", str(ROOT / ".ci/postgres.sh"), "stop", pg_dir], capture_output=True, check=False
    )


def scenario_pg_kill(code: str, args, tmp: Path, journal: str | None) -> dict:
    """``tracerag serve`` over PostgreSQL as configured (``journal``: None for its default,
    "none" for ``--no-journal``, or a directory), killed with SIGKILL while the database is
    down; then the database and the server are started again."""
    dsn, pg_dir = start_postgres()
    try:
        run = Run()
        try:
            load = start_load(
                "server", code, dsn, args.pg_kill_outage + 60, args, tmp, journal=journal
            )
        except RuntimeError as exc:  # refused to start
            said = "needs a journal" if "TRACERAG_AUDIT_JOURNAL" in str(exc) else "failed"
            return {"starts": f"no: {said}"} | outcome(run, set())
        started = threading.Event()
        reader = threading.Thread(target=collect, args=(load.lines, run, started.set))
        reader.start()
        started.wait(120)
        while run.answered < 50 and reader.is_alive():
            time.sleep(0.05)
        _pg_command(pg_dir, "stop", "-m", "immediate")
        down_at = run.answered
        time.sleep(args.pg_kill_outage)
        os.kill(load.victim.pid, signal.SIGKILL)
        load.victim.wait()
        reader.join()
        _pg_command(pg_dir, "start")
        res = restart("server", code, dsn, tmp, None, journal)
        stored = stored_ids(dsn)
        return (
            {"starts": "yes"}
            | outcome(run, stored)
            | {"answered while down": run.answered - down_at, "outage s": args.pg_kill_outage}
            | res
        )
    finally:
        stop_postgres(pg_dir)


def scenario_pg(mode: str, code: str, args, tmp: Path, fault: str) -> dict:
    """PostgreSQL frozen (SIGSTOP of every server process) or down (stopped, restarted)."""
    dsn, pg_dir = start_postgres()
    seconds = args.freeze_seconds if fault == "freeze" else args.outage_seconds
    try:
        run = Run()
        env = {"TRACERAG_AUDIT_JOURNAL": str(tmp / f"pg-{fault}-{mode}.journal")}
        load = start_load(mode, code, dsn, seconds + 8, args, tmp, env=env)
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

        collect(load.lines, run, ready)
        faulter.join()
        if load.server is not None:
            load.server.stop()
        res = restart(mode, code, dsn, tmp, env)  # drains whatever the journal still holds
        return (
            outcome(run, stored_ids(dsn))
            | {f"{fault} s": seconds}
            | windowed(run, t_ready[0], window, fault)
            | res
            | {"chain": chain_ok(code, dsn, env)}
        )
    finally:
        stop_postgres(pg_dir)


# -- tampering: what `tracerag audit verify` says after each change -----------------------------

TAMPER_KEY = "a chain key kept outside the database"
TAMPER_LEGEND = """
  DETECTED: exit 1, the change is named.  not checked (3): exit 3, nothing found but verify says
  what it could not check (no anchor; keyed entries without the key).  PASSES: exit 0, intact.
  plain: no anchor, no key; anchor: the head the writer exported (--expect-head); key:
  TRACERAG_CHAIN_KEY (the store was written with it), no anchor; key + anchor: both."""


class TamperDB:
    """One store under attack: a SQLite file or a PostgreSQL schema, changed as an intruder with
    database access (and, for the journal cases, file access) but without the chain key would."""

    def __init__(self, kind: str, directory: Path, dsn: str | None = None) -> None:
        import uuid

        self.kind, self.dir = kind, directory
        directory.mkdir(parents=True, exist_ok=True)
        self.journal = directory / "journal"
        self.anchor = directory / "anchor.json"
        if kind == "sqlite":
            self.path = str(directory / "audit.sqlite")
            self.url = self.path
        else:
            assert dsn is not None
            self.dsn = dsn
            self.schema = "tamper_" + uuid.uuid4().hex[:10]
            sep = "&" if "?" in dsn else "?"
            self.url = f"{dsn}{sep}options=-csearch_path%3D{self.schema}"
            self._create_schema()

    def _create_schema(self) -> None:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{self.schema}"')

    def execute(self, sql: str, params: tuple = ()) -> list:
        """SQL straight against the database, with the append-only guards off."""
        if self.kind == "sqlite":
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=30)
            try:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("DROP TRIGGER IF EXISTS audit_entries_no_update")
                conn.execute("DROP TRIGGER IF EXISTS audit_entries_no_delete")
                rows = conn.execute(sql.replace("%s", "?"), params).fetchall()
                conn.execute("COMMIT")
                return rows
            finally:
                conn.close()
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{self.schema}"')
            with conn.transaction(), conn.cursor() as cur:
                cur.execute("ALTER TABLE audit_entries DISABLE TRIGGER USER")
                cur.execute(sql.replace("?", "%s"), params or None)
                rows = cur.fetchall() if cur.description else []
                cur.execute("ALTER TABLE audit_entries ENABLE TRIGGER USER")
                return rows

    TABLES = ("audit_entries", "requests", "review_queue", "chain_head")

    def snapshot(self) -> None:
        """Keep a copy of the whole database as it is now (an old backup)."""
        if self.kind == "sqlite":
            src = sqlite3.connect(self.path)
            dst = sqlite3.connect(str(self.dir / "backup.sqlite"))
            src.backup(dst)
            src.close()
            dst.close()
            return
        for table in self.TABLES:
            self.execute(f"CREATE TABLE backup_{table} AS SELECT * FROM {table}")

    def restore(self) -> None:
        """Put the old copy back in place of the database."""
        if self.kind == "sqlite":
            for suffix in ("-wal", "-shm"):
                Path(self.path + suffix).unlink(missing_ok=True)
            Path(self.dir / "backup.sqlite").replace(self.path)
            return
        for table in reversed(self.TABLES):  # those referring to others first
            self.execute(f"DELETE FROM {table}")
        for table in self.TABLES:
            self.execute(f"INSERT INTO {table} SELECT * FROM backup_{table}")

    def replace(self) -> None:
        """A new, empty store where this one was."""
        from tracerag.store import open_store

        if self.kind == "sqlite":
            for suffix in ("", "-wal", "-shm"):
                Path(self.path + suffix).unlink(missing_ok=True)
        else:
            import psycopg

            with psycopg.connect(self.dsn, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA "{self.schema}" CASCADE')
            self._create_schema()
        open_store(self.url).close()

    def cleanup(self) -> None:
        if self.kind == "postgres":
            import psycopg

            with psycopg.connect(self.dsn, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')


def _tamper_record(rid: str, decision: str) -> dict:
    return {
        "request_id": rid,
        "question": "How long is the warranty on a laptop?",
        "decision": decision,
        "confidence": 0.9 if decision == "pass" else 0.7,
        "response": {"answer": ANSWER, "decision": decision, "status": "answered"},
        "samples": [{"index": i, "answer": ANSWER} for i in range(3)],
    }


def _tamper_build(db: TamperDB, key: str | None) -> None:
    """Three requests and a review decision, written by the audit writer; an older copy of the
    database kept after the first; the head exported to ``db.anchor``."""
    from tracerag.store import AuditWriter, open_store

    def opener(create: bool = True):
        return open_store(db.url, create=create, chain_key=key)

    writer = AuditWriter(
        opener, journal=db.journal, anchor=db.anchor, chain_key=key, head_export_interval=0.0
    )
    try:
        assert writer.submit_durable(_tamper_record("r0", "review"))
        assert writer.flush(30)
        db.snapshot()
        assert writer.submit_durable(_tamper_record("r1", "review"))
        assert writer.flush(30)
        store = opener()
        store.decide("r0", "alice", "reject", reason="cites a superseded policy")
        store.close()
        assert writer.submit_durable(_tamper_record("r2", "pass"))  # the newest request
        assert writer.flush(30)
    finally:
        assert writer.close()


def _drain(db: TamperDB, key: str | None) -> None:
    """The next start of the writer: it drains whatever the journal holds."""
    from tracerag.store import AuditWriter, open_store

    writer = AuditWriter(
        lambda create=True: open_store(db.url, create=create, chain_key=key),
        journal=db.journal,
        anchor=db.anchor,  # and moves the anchor forward, as a restarted server does
        chain_key=key,
        head_export_interval=0.0,
    )
    writer.flush(30)
    writer.close()


def _head(db: TamperDB) -> tuple[int, str]:
    ((seq, digest),) = db.execute("SELECT last_seq, last_hash FROM chain_head WHERE id = 1")
    return int(seq), str(digest)


def _move_head_to_last(db: TamperDB) -> None:
    rows = db.execute("SELECT seq, hash FROM audit_entries ORDER BY seq DESC LIMIT 1")
    seq, digest = rows[0] if rows else (0, _genesis(db))
    db.execute("UPDATE chain_head SET last_seq = ?, last_hash = ? WHERE id = 1", (seq, digest))


def _genesis(db: TamperDB) -> str:
    return str(db.execute("SELECT value FROM store_meta WHERE key = 'genesis'")[0][0])


def _reseal_from(db: TamperDB, seq: int) -> None:
    """Re-hash every entry from ``seq`` on, as someone without the key can (version 2)."""
    from tracerag.store._chain import CHAIN_V2, entry_hash

    prev = (
        db.execute("SELECT hash FROM audit_entries WHERE seq = ?", (seq - 1,))[0][0]
        if seq > 1
        else _genesis(db)
    )
    rows = db.execute(
        "SELECT seq, request_id, kind, payload, actor, created_at FROM audit_entries "
        "WHERE seq >= ? ORDER BY seq",
        (seq,),
    )
    for s, rid, kind, payload, actor, created in rows:
        new = entry_hash(prev, s, rid, kind, payload, actor, created, CHAIN_V2)
        db.execute(
            "UPDATE audit_entries SET prev_hash = ?, hash = ?, chain_version = ? WHERE seq = ?",
            (prev, new, CHAIN_V2, s),
        )
        prev = new
    db.execute(
        "UPDATE chain_head SET last_seq = ?, last_hash = ?, mac = NULL WHERE id = 1",
        (rows[-1][0], prev),
    )


def _response_seq(db: TamperDB, rid: str) -> tuple[int, str]:
    ((seq, payload),) = db.execute(
        "SELECT seq, payload FROM audit_entries WHERE request_id = ? AND kind = 'response'",
        (rid,),
    )
    return int(seq), str(payload)


def _edit_payload(db: TamperDB, key: str | None) -> None:
    seq, payload = _response_seq(db, "r1")
    db.execute(
        "UPDATE audit_entries SET payload = ? WHERE seq = ?",
        (payload.replace("24-month", "36-month"), seq),
    )


def _delete_middle(db: TamperDB, key: str | None) -> None:
    seq, _ = _response_seq(db, "r1")
    db.execute("DELETE FROM audit_entries WHERE seq = ?", (seq,))


def _rewrite_and_reseal(db: TamperDB, key: str | None) -> None:
    _edit_payload(db, key)
    _reseal_from(db, _response_seq(db, "r1")[0])


def _change_decision(db: TamperDB, key: str | None) -> None:
    db.execute("UPDATE requests SET decision = 'pass' WHERE request_id = 'r1'")


def _rewrite_review(db: TamperDB, key: str | None) -> None:
    db.execute(
        "UPDATE review_queue SET action = 'approve', decision_reason = 'fine' "
        "WHERE request_id = 'r0'"
    )


def _truncate_tail(db: TamperDB, key: str | None) -> None:
    for table in ("review_queue", "audit_entries", "requests"):
        db.execute(f"DELETE FROM {table} WHERE request_id = 'r2'")
    last = db.execute("SELECT MAX(seq) FROM audit_entries")[0][0]
    db.execute("DELETE FROM audit_entries WHERE seq > ?", (last,))
    _move_head_to_last(db)


def _truncate_after_export(db: TamperDB, key: str | None) -> None:
    """Entries sealed after the newest exported head (by a writer that died before its next
    export, at most ``head_export_interval`` later) are removed again."""
    from tracerag.store import open_store

    store = open_store(db.url, chain_key=key)
    for rid in ("late-1", "late-2"):
        store.append_record(_tamper_record(rid, "pass"))
    store.close()
    for table in ("review_queue", "audit_entries", "requests"):
        db.execute(f"DELETE FROM {table} WHERE request_id IN ('late-1', 'late-2')")
    _move_head_to_last(db)


def _empty(db: TamperDB, key: str | None) -> None:
    for table in ("review_queue", "audit_entries", "requests"):
        db.execute(f"DELETE FROM {table}")
    db.execute(
        "UPDATE chain_head SET last_seq = 0, last_hash = ?, mac = NULL WHERE id = 1",
        (_genesis(db),),
    )


def _append_forged(db: TamperDB, key: str | None) -> None:
    from tracerag.store._chain import CHAIN_V2, entry_hash

    seq, prev = _head(db)
    seq += 1
    payload = '{"action":"approve","final_answer":"all fine","reason":null}'
    created = "2030-01-01T00:00:00.000000+00:00"
    new = entry_hash(prev, seq, "r1", "note", payload, "mallory", created, CHAIN_V2)
    db.execute(
        "INSERT INTO audit_entries (seq, request_id, kind, payload, actor, created_at, "
        "prev_hash, hash, chain_version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (seq, "r1", "note", payload, "mallory", created, prev, new, CHAIN_V2),
    )
    db.execute("UPDATE requests SET n_entries = n_entries + 1 WHERE request_id = 'r1'")
    db.execute("UPDATE chain_head SET last_seq = ?, last_hash = ? WHERE id = 1", (seq, new))


def _restore_old_copy(db: TamperDB, key: str | None) -> None:
    db.restore()


def _replace_store(db: TamperDB, key: str | None) -> None:
    db.replace()


def _frame(payload: bytes) -> bytes:
    """An untagged journal frame with a correct CRC (the format is public)."""
    import struct
    import zlib

    return struct.pack(">2sccII", b"TJ", b"R", b"\x00", len(payload), zlib.crc32(payload)) + (
        payload
    )


def _forge_journal(db: TamperDB, key: str | None) -> None:
    forged = _tamper_record("forged", "pass")
    segment = db.journal / f"{999:020d}.seg"
    segment.write_bytes(_frame(json.dumps(forged).encode()))
    _drain(db, key)


def _alter_journaled(db: TamperDB, key: str | None) -> None:
    """A genuine record left in the journal (by a crash) has its answer changed, CRC fixed."""
    import struct
    import zlib

    from tracerag.store._journal import Journal

    journal = Journal(db.journal, key=key)
    journal.append(b"R", json.dumps(_tamper_record("crashed", "pass")).encode())
    journal.close()
    (segment,) = [p for p in db.journal.glob("*.seg") if p.stat().st_size]
    data = segment.read_bytes()
    header = struct.Struct(">2sccII")
    magic, ftype, auth, length, _ = header.unpack_from(data)
    body = data[header.size : header.size + length].replace(b"24-month", b"36-month")
    tag = data[header.size + length :]
    crc = zlib.crc32(tag, zlib.crc32(body))
    segment.write_bytes(header.pack(magic, ftype, auth, len(body), crc) + body + tag)
    _drain(db, key)


TAMPER_CASES = [
    ("no change (control)", None),
    ("edit an entry (no re-hash)", _edit_payload),
    ("delete a middle entry", _delete_middle),
    ("rewrite + re-hash after it", _rewrite_and_reseal),
    ("change requests.decision", _change_decision),
    ("rewrite a decided review", _rewrite_review),
    ("delete newest, move head", _truncate_tail),
    ("delete after last export", _truncate_after_export),
    ("empty, reset head", _empty),
    ("append forged, move head", _append_forged),
    ("restore an older copy", _restore_old_copy),
    ("replace by an empty store", _replace_store),
    ("forge a journal record", _forge_journal),
    ("alter a journaled record", _alter_journaled),
]


def _verify_says(db: TamperDB, key: str | None, anchored: bool) -> str:
    """Run ``tracerag audit verify`` (in this process) and name its verdict."""
    import contextlib
    import io

    from tracerag.cli import main as cli_main
    from tracerag.config import reset_config

    saved = {k: os.environ.get(k) for k in ("TRACERAG_CHAIN_KEY", "TRACERAG_AUDIT_JOURNAL")}
    saved["TRACERAG_AUDIT_ANCHOR"] = os.environ.pop("TRACERAG_AUDIT_ANCHOR", None)
    os.environ["TRACERAG_AUDIT_JOURNAL"] = str(db.journal)
    if key:
        os.environ["TRACERAG_CHAIN_KEY"] = key
    else:
        os.environ.pop("TRACERAG_CHAIN_KEY", None)
    reset_config()
    argv = ["audit", "verify", "--store", db.url]
    if anchored:
        argv += ["--expect-head", str(db.anchor)]
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                code = cli_main(argv)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        reset_config()
    return {0: "PASSES", 1: "DETECTED", 3: "not checked (3)"}.get(code, f"exit {code}")


def tamper_table(kind: str, tmp: Path, dsn: str | None = None) -> dict[str, dict]:
    """Each change, on an unkeyed store (plain, anchor) and a keyed one (key, key + anchor)."""
    import logging

    logging.getLogger("tracerag").setLevel(logging.CRITICAL)  # the refusals are expected
    columns: dict[str, dict] = {
        "plain": {},
        "anchor": {},
        "key": {},
        "key + anchor": {},
    }
    for i, (name, attack) in enumerate(TAMPER_CASES):
        for key in (None, TAMPER_KEY):
            db = TamperDB(kind, tmp / f"tamper-{kind}-{i}-{'k' if key else 'u'}", dsn)
            try:
                _tamper_build(db, key)
                if attack is not None:
                    attack(db, key)
                if key is None:
                    columns["plain"][name] = _verify_says(db, None, False)
                    columns["anchor"][name] = _verify_says(db, None, True)
                else:
                    columns["key"][name] = _verify_says(db, key, False)
                    columns["key + anchor"][name] = _verify_says(db, key, True)
            finally:
                db.cleanup()
    return columns


def table(title: str, columns: dict[str, dict]) -> None:
    print(f"\n{title}")
    keys = list(dict.fromkeys(k for col in columns.values() for k in col))
    cells = [str(v) for col in columns.values() for v in col.values()]
    width = max(14, *(len(c) + 2 for c in [*columns, *cells]))
    label = max(26, *(len(k) + 1 for k in keys))
    print(f"  {'':{label}}" + "".join(f"{c:>{width}}" for c in columns))
    for k in keys:
        row = "".join(f"{col.get(k, '-')!s:>{width}}" for col in columns.values())
        print(f"  {k:{label}}" + row)
    sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for role in ("child", "recover", "serve", "client"):
        ap.add_argument(f"--{role}", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--store", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--serve-journal", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=6.0, help="load per run")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--request-timeout", type=float, default=120.0, help="client's wait")
    ap.add_argument("--poison-every", type=int, default=100)
    ap.add_argument("--kills", type=int, default=3, help="kill -9 rounds")
    ap.add_argument("--lock-seconds", type=float, default=30.0)
    ap.add_argument("--before", default=None, help="a checkout of the code before the change")
    ap.add_argument("--modes", default="library,server")
    ap.add_argument("--postgres", action="store_true", help="also the PostgreSQL faults")
    ap.add_argument("--freeze-seconds", type=float, default=20.0)
    ap.add_argument("--outage-seconds", type=float, default=180.0)
    ap.add_argument(
        "--pg-kill-outage", type=float, default=10.0, help="load while PostgreSQL is down"
    )
    ap.add_argument("--repeat", type=int, default=3, help="throughput runs per column")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--only", default=None, help="comma-separated scenarios to run")
    args = ap.parse_args()
    for role, fn in (
        ("child", library_child),
        ("recover", recover),
        ("serve", serve_child),
        ("client", client_child),
    ):
        if getattr(args, role):
            fn(args)
            return
    rng = random.Random(args.seed)
    after = str(ROOT)
    before = str(Path(args.before).resolve()) if args.before else None
    modes = args.modes.split(",")
    only = set(args.only.split(",")) if args.only else None
    rev = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    old = (
        subprocess.run(
            ["git", "-C", before, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        if before
        else None
    )
    print(
        f"concurrency {args.concurrency}, {args.seconds:.0f} s of load per run, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; after = {rev}"
        + (f", before = {old}" if old else "")
    )

    def want(name: str) -> bool:
        return only is None or name in only

    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        if want("throughput"):
            # the columns run interleaved, ``--repeat`` times; each shows its median run
            runs: dict[str, list[dict]] = {}
            (tmp / "before").mkdir(exist_ok=True)
            for _ in range(args.repeat):
                if before:
                    runs.setdefault("library before", []).append(
                        scenario_no_audit(before, args, tmp)
                    )
                runs.setdefault("library after", []).append(scenario_no_audit(after, args, tmp))
            table(
                "library mode without an audit trail (the pipeline alone)",
                {k: median_run(v) for k, v in runs.items()},
            )
            runs = {}
            for i in range(args.repeat):
                for mode in modes:
                    for name, code, where in (
                        ("before", before, tmp / "before"),
                        ("after", after, tmp),
                    ):
                        if code is None:
                            continue
                        (where / f"r{i}").mkdir(exist_ok=True)
                        runs.setdefault(f"{mode} {name}", []).append(
                            scenario_throughput(mode, code, args, where / f"r{i}")
                        )
            cols = {k: median_run(v) for k, v in runs.items()}
            for mode in modes:
                b, a = cols.get(f"{mode} before"), cols.get(f"{mode} after")
                if b and a:
                    a["req/s after / before"] = round(a["req/s answered"] / b["req/s answered"], 2)
            table(
                f"throughput at concurrency {args.concurrency}, SQLite store, no fault "
                f"(median of {args.repeat} interleaved runs)",
                cols,
            )
        if want("kill"):
            table(
                f"kill -9 at random times during load ({args.kills} rounds, then restart)",
                {m: scenario_kill(m, after, args, tmp, rng) for m in modes},
            )
        if want("lock"):
            table(
                f"SQLite write lock held by another process for {args.lock_seconds:.0f} s",
                {m: scenario_lock(m, after, args, tmp) for m in modes},
            )
        if want("poison"):
            table(
                f"a poisoned record (lone surrogate in 1 of {args.poison_every} model answers)",
                {m: scenario_poison(m, after, args, tmp) for m in modes},
            )
        if args.postgres and want("freeze"):
            table(
                f"PostgreSQL frozen (SIGSTOP) for {args.freeze_seconds:.0f} s",
                {m: scenario_pg(m, after, args, tmp, "freeze") for m in modes},
            )
        if args.postgres and want("pgkill"):
            cols = {}
            if before:
                (tmp / "before").mkdir(exist_ok=True)
                cols["default, before"] = scenario_pg_kill(before, args, tmp / "before", None)
            cols["default"] = scenario_pg_kill(after, args, tmp, None)
            cols["--no-journal"] = scenario_pg_kill(after, args, tmp, "none")
            cols["--journal DIR"] = scenario_pg_kill(after, args, tmp, str(tmp / "pgkill.journal"))
            table(
                f"tracerag serve over PostgreSQL, killed (SIGKILL) after "
                f"{args.pg_kill_outage:.0f} s of load with the database down",
                cols,
            )
        if want("tamper"):
            table("tampering, SQLite: what tracerag audit verify says", tamper_table("sqlite", tmp))
            if args.postgres:
                dsn, pg_dir = start_postgres()
                try:
                    table(
                        "tampering, PostgreSQL: what tracerag audit verify says",
                        tamper_table("postgres", tmp, dsn),
                    )
                finally:
                    stop_postgres(pg_dir)
            print(TAMPER_LEGEND)
        if args.postgres and want("outage"):
            table(
                f"PostgreSQL down (stopped, then restarted) for {args.outage_seconds:.0f} s",
                {m: scenario_pg(m, after, args, tmp, "outage") for m in modes},
            )


if __name__ == "__main__":
    main()
