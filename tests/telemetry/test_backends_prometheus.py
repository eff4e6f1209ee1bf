"""A real Prometheus (Debian's ``prometheus`` binary) scraping tracerag's /metrics endpoint.

After the demo has run (plus a flaky model, a dead model, a failing audit sink and a dead
collector, so that every counter moves), every PromQL expression in dashboards/ is evaluated
through Prometheus's HTTP API with the dashboard variables substituted, and must return data.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dashboard_queries import label_values_metric, promql_metric_names, queries
from opentelemetry.sdk.trace import TracerProvider as SDKTracerProvider
from otlp_receiver import backend_missing
from store_fixtures import make_record

from tracerag import RAGPipeline
from tracerag.demo.kb import build_retriever, load_questions
from tracerag.demo.models.extractive import ExtractiveChatModel
from tracerag.telemetry import _export, _instruments, _meters, _providers, _review
from tracerag.testing import ScriptedChatModel

pytestmark = pytest.mark.integration

SCRAPE_SECONDS = 1
SUBSTITUTIONS = {
    "$__rate_interval": "5m",
    "$__interval": "15s",
    "$__range": "10m",
    "$tier": ".*",
    "$job": ".*",
}


def prometheus_binary() -> str | None:
    explicit = os.environ.get("TRACERAG_PROMETHEUS_BIN")
    if explicit:
        return explicit if Path(explicit).exists() else None
    return shutil.which("prometheus") or (
        "/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def substitute(expr: str) -> str:
    for name in sorted(SUBSTITUTIONS, key=len, reverse=True):
        expr = expr.replace(name, SUBSTITUTIONS[name])
    assert "$" not in expr, f"unsubstituted variable in {expr!r}"
    return expr


class Prometheus:
    def __init__(self, base: str) -> None:
        self.base = base

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"Prometheus rejected {expr!r}: {exc.read().decode()}") from exc
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def wait(self, expr: str, ok: Any, timeout: float = 60) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if ok(result):
                return result
            assert time.monotonic() < deadline, f"timed out waiting for {expr!r}: {result}"
            time.sleep(0.5)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    binary = prometheus_binary()
    if binary is None:
        backend_missing("the prometheus binary is not installed (apt-get install prometheus)")
    _meters.reset()
    _providers.reset_for_tests()
    # the review gauges sum every queue this process watches: only this module's, so the
    # backlog the dashboards read is the one it makes (earlier tests' stores may still be open)
    _review.reset_for_tests()
    endpoint = _meters.start_prometheus_server(0)
    workdir = tmp_path_factory.mktemp("prometheus")
    config = workdir / "prometheus.yml"
    config.write_text(
        "global:\n"
        f"  scrape_interval: {SCRAPE_SECONDS}s\n"
        f"  evaluation_interval: {SCRAPE_SECONDS}s\n"
        "scrape_configs:\n"
        "  - job_name: tracerag\n"
        "    static_configs:\n"
        f"      - targets: ['127.0.0.1:{endpoint.port}']\n"
    )
    port = free_port()
    log = (workdir / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1h",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=workdir,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    try:
        while True:
            if process.poll() is not None:
                tail = (workdir / "prometheus.log").read_text(errors="replace")[-3000:]
                pytest.fail(f"prometheus exited with {process.returncode}:\n{tail}")
            try:
                with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            assert time.monotonic() < deadline, "prometheus did not become ready"
            time.sleep(0.3)
        prom = Prometheus(base)
        prom.wait('up{job="tracerag"} == 1', bool)
        yield prom
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()
        _meters.reset()
        _providers.reset_for_tests()


def failing_audit(record: dict[str, Any]) -> bool:
    raise OSError("audit store unavailable")


@pytest.fixture(scope="module")
def demo_ran(
    prometheus: Prometheus, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Prometheus]:
    # spans go to a collector that is not there: they are dropped and counted
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    provider = SDKTracerProvider(resource=_providers.make_resource("tracerag"))
    provider.add_span_processor(
        _export.batch_processor(
            _export.otlp_span_exporter(f"http://127.0.0.1:{dead}", timeout=0.5),
            schedule_delay_millis=50,
            on_drop=_instruments.record_spans_dropped,
        )
    )
    common = {
        "prompt_version": "demo-prompt-1",
        "model_version": "extractive-1",
        "tracer_provider": provider,
    }
    retriever = build_retriever()
    # an illustrative price table (tracerag ships none), so the cost panels have series
    prices = {"tracerag-extractive-1": {"input_per_1k": 0.00015, "output_per_1k": 0.0006}}
    demo = RAGPipeline(retriever, ExtractiveChatModel(), audit=None, prices=prices, **common)
    flaky = RAGPipeline(
        retriever, ScriptedChatModel(fail_first=1), n_samples=2, audit=failing_audit, **common
    )
    dead_model = RAGPipeline(
        retriever, ScriptedChatModel(always_fail=True), n_samples=2, audit=None, **common
    )
    questions = [q["question"] for q in load_questions()]
    half = len(questions) // 2
    for question in questions[:half]:
        demo.invoke(question)
    resume_app_turn = interrupted_turns(provider)  # one app turn and one answer review paused
    time.sleep(3 * SCRAPE_SECONDS)  # let Prometheus see the counters move between scrapes
    for question in questions[half:]:
        demo.invoke(question)
    resume_app_turn()  # the app's turn resumed: the answer review still waits
    # the first half's questions include answers that pass; one of them again after the first
    # scrapes, so per-passed-answer panels (cost per passed answer) see passes within the window
    for question in questions[:half]:
        if demo.invoke(question).decision == "pass":
            break
    flaky.invoke(questions[0])
    # how a request with a dead model ends is the pipeline's business; its errors are counted
    with contextlib.suppress(Exception):
        dead_model.invoke(questions[0])
    _instruments.record_audit_failure("store_down", dropped=True)  # as the audit writer reports it
    # a material registry with a pending write, a conflict, a quarantine and a denied material;
    # its gauges reach the endpoint because it is open (no wiring)
    prometheus.materials = materials_ran(tmp_path_factory.mktemp("materials"), retriever)
    # the review desk's queue in the registry's audit store: requests wait, reviewers decide
    # (one decision before the first scrapes see its series, one of the same series after)
    queue = prometheus.materials.store
    for i, decision in enumerate(("escalate", "review", "escalate", "review")):
        queue.append_record(make_record(f"queued-{i}", decision=decision))
    queue.decide("queued-0", "alice", "approve")
    time.sleep(3 * SCRAPE_SECONDS)
    queue.decide("queued-2", "bob", "approve")  # the same series again: its count moves
    provider.force_flush(10_000)
    provider.shutdown()
    prometheus.wait(
        "sum(tracerag_requests_total)", lambda r: r and float(r[0]["value"][1]) >= len(questions)
    )
    prometheus.wait("sum(tracerag_spans_dropped_total)", bool)
    prometheus.wait("sum(tracerag_materials_quarantined) > 0", bool)
    prometheus.wait("sum(tracerag_materials_conflicts) > 0", bool)
    prometheus.wait("sum(tracerag_review_backlog) == 2", bool)
    prometheus.wait("sum(tracerag_review_time_to_decision_seconds_count) == 2", bool)
    prometheus.wait("sum(tracerag_turns_interrupted_total) == 2", bool)
    prometheus.wait("sum(tracerag_turns_resumed_total) == 1", bool)
    time.sleep(3 * SCRAPE_SECONDS)
    yield prometheus
    prometheus.materials.close()


def interrupted_turns(provider: SDKTracerProvider) -> Any:
    """Pause a wrapped agent's turn at its own interrupt (HumanInTheLoopMiddleware) and a
    TraceragMiddleware agent's escalated turn for an answer review; return what resumes the
    first. Both count on the process's meter provider, which the endpoint reads."""
    from langchain.agents.middleware import HumanInTheLoopMiddleware
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command
    from pipeline_fixtures import FAST_RETRY
    from wrap_apps import AGENT_QUESTION, answering, rag_agent

    from tracerag import InMemoryEscalationHandler, TraceragMiddleware, wrap
    from tracerag.testing import ToolCallingChatModel

    def tool_model(claim: str | None = None) -> ToolCallingChatModel:
        return ToolCallingChatModel(
            responder=answering("24-month", claim=claim), model_name="tool-model-1"
        )

    gate = HumanInTheLoopMiddleware(interrupt_on={"retrieve_context": True})
    app = wrap(
        rag_agent(tool_model(), checkpointer=InMemorySaver(), middleware=[gate]),
        n_samples=2,
        retry=FAST_RETRY,
        audit=None,
        tracer_provider=provider,
    )
    app_thread = {"configurable": {"thread_id": "paused-app"}}
    assert app.invoke(AGENT_QUESTION, app_thread).interrupts
    review = TraceragMiddleware(
        n_samples=2,
        retry=FAST_RETRY,
        audit=None,
        escalation=InMemoryEscalationHandler(),
        tracer_provider=provider,
    )
    wrong = "Under Clause 6.1, laptops and tablets are covered by an extended 36-month warranty."
    agent = rag_agent(tool_model(wrong), middleware=[review], checkpointer=InMemorySaver())
    paused = agent.invoke(
        {"messages": [{"role": "user", "content": AGENT_QUESTION}]},
        {"configurable": {"thread_id": "paused-review"}},
    )
    assert paused["__interrupt__"][0].value["type"] == "answer_review"

    def resume() -> None:
        done = app.invoke(Command(resume={"decisions": [{"type": "approve"}]}), app_thread)
        assert not done.interrupts

    return resume


def materials_ran(directory: Path, retriever: Any) -> Any:
    """An open registry, fed by a reranking retriever and by feedback on stored answers."""
    from langchain_core.documents import Document

    from tracerag.materials import MaterialRegistry
    from tracerag.materials._rerank import CredibilityRetriever
    from tracerag.materials.feedback import record_feedback

    registry = MaterialRegistry.open(str(directory / "audit.sqlite"))
    ranked = CredibilityRetriever(retriever=retriever, registry=registry)
    docs = ranked.invoke("How many days do I have to return an item?")
    assert docs, "the demo knowledge base returned nothing"
    registry.register("memo-7", "可能是7天内退货吧？", operator="agent", written_by="memory@1")
    registry.observe(
        [
            Document(page_content="Gift cards expire after 12 months.", metadata={"id": "g12"}),
            Document(page_content="Gift cards expire after 24 months.", metadata={"id": "g24"}),
            Document(page_content="已拆封商品可在签收后7天内退货。", metadata={"id": "z7"}),
            Document(page_content="已拆封商品可在签收后30天内退货。", metadata={"id": "z30"}),
        ]
    )
    registry.quarantine("g24", operator="lead", reason="the partner feed is wrong")
    first = str(docs[0].metadata.get("id"))
    registry.store.append_record(
        {
            "request_id": "denied-1",
            "materials": [{"id": first, "text": docs[0].page_content}],
            "signals": {"citations": {"claims": [{"cited_ids": [first]}]}},
            "decision": "pass",
        }
    )
    record_feedback("denied-1", "deny", "wrong", registry=registry, operator="user:li")
    return registry


def test_every_dashboard_expression_returns_data(demo_ran: Prometheus) -> None:
    checked = 0
    for name, title, expr in queries("prometheus"):
        if expr.lstrip().startswith("label_values"):
            continue
        result = demo_ran.query(substitute(expr))
        assert result, f"{name}: panel {title!r}: no data for {expr!r}"
        values = [float(r["value"][1]) for r in result]
        assert any(math.isfinite(v) for v in values), f"{name}: {title!r}: {values} for {expr!r}"
        checked += 1
    assert checked >= 20


def test_every_referenced_metric_has_real_series(demo_ran: Prometheus) -> None:
    referenced: set[str] = set()
    for _, _, expr in queries("prometheus"):
        if expr.lstrip().startswith("label_values"):
            referenced |= label_values_metric(expr)
        else:
            referenced |= promql_metric_names(expr)
    present = {
        r["metric"]["__name__"]
        for r in demo_ran.query('count by (__name__) ({__name__=~"tracerag_.+"})')
    }
    assert referenced <= present, sorted(referenced - present)


def test_dashboard_variables_have_values(demo_ran: Prometheus) -> None:
    tiers = {
        r["metric"]["tier"] for r in demo_ran.query("group by (tier) (tracerag_requests_total)")
    }
    assert "high" in tiers
    jobs = {r["metric"]["job"] for r in demo_ran.query("group by (job) (tracerag_requests_total)")}
    assert jobs == {"tracerag"}
    decisions = {
        r["metric"]["decision"]
        for r in demo_ran.query("group by (decision) (tracerag_requests_total)")
    }
    assert {"pass", "review", "escalate"} <= decisions
