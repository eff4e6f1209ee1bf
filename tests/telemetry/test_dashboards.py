"""The Grafana dashboards only query what tracerag really emits.

The real metrics code runs against the real Prometheus exporter; every PromQL expression in
dashboards/ is parsed and each metric it names must be among the exposed series. TraceQL
queries may only use span attributes defined in semconv.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from dashboard_queries import (
    DASHBOARDS,
    GRAFANA_GLOBALS,
    all_panels,
    dashboards,
    label_values_metric,
    promql_metric_names,
    queries,
)
from store_fixtures import make_record

from tracerag import _semconv as semconv
from tracerag.telemetry import _instruments, _review


def test_promql_parser_helper() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, stage) (rate(a_bucket{tier=~"$tier"}'
        "[$__rate_interval]))) / on(job) group_left sum(b_total) or vector(0)"
    )
    assert promql_metric_names(expr) == {"a_bucket", "b_total"}


@pytest.fixture(scope="module")
def exposed_names(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """Sample names the real Prometheus exporter exposes after every record_* function ran
    and a material registry's gauges were observed."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import CollectorRegistry

    from tracerag.materials import MaterialRegistry
    from tracerag.materials._gauges import observe_registry

    registry = CollectorRegistry()
    provider = MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)])
    materials = MaterialRegistry.open(
        str(tmp_path_factory.mktemp("materials") / "audit.sqlite"), metrics=False
    )
    materials.register("fee", "The fee is 10%.", operator="kb", written_by="import@1")
    observe_registry(materials, meter_provider=provider)
    for decision, confidence in (("pass", 0.92), ("review", 0.7), ("escalate", 0.3)):
        outcome = _instruments.RequestOutcome(
            tier="high",
            decision=decision,
            confidence=confidence,
            timings={stage: 0.01 for stage in semconv.STAGES} | {"request": 0.1},
            n_samples=5,
            citation_coverage=0.8,
            citation_accuracy=0.9,
            fabricated=["x"],
        )
        _instruments.record_request(outcome, meter_provider=provider)
        spent = {
            "total_tokens": 120,
            "by_stage": {"sample": {"calls": 1, "input_tokens": 100, "output_tokens": 20}},
            "cost": {"by_stage": {"sample": 0.01}},
        }
        _instruments.record_usage(outcome, spent, meter_provider=provider)
    _instruments.record_retry("sample", TimeoutError(), meter_provider=provider)
    _instruments.record_model_error("sample", TimeoutError(), meter_provider=provider)
    _instruments.record_audit_failure("OperationalError", dropped=True, meter_provider=provider)
    _instruments.record_spans_dropped(3, "export_failed", meter_provider=provider)
    _instruments.record_review_decision("escalate", "reject", 420.0, meter_provider=provider)
    _instruments.record_turn_interrupted("answer_review", meter_provider=provider)
    _instruments.record_turn_resumed("answer_review", "approve", meter_provider=provider)
    materials.store.append_record(make_record("queued-1", decision="escalate"))  # one waits
    _review.observe_review_queue(materials.store, provider)
    names = {sample.name for family in registry.collect() for sample in family.samples}
    provider.shutdown()
    materials.close()
    assert "tracerag_requests_total" in names
    return names


def test_every_dashboard_metric_is_emitted(exposed_names: set[str]) -> None:
    checked = 0
    for name, title, expr in queries("prometheus"):
        if expr.lstrip().startswith("label_values"):
            referenced = label_values_metric(expr)
        else:
            referenced = promql_metric_names(expr)
        assert referenced, f"{name}: {title!r}: no metric found in {expr!r}"
        missing = referenced - exposed_names
        assert not missing, f"{name}: panel {title!r} queries {sorted(missing)} not emitted"
        checked += 1
    assert checked >= 20


def test_quality_dashboard_covers_the_issue() -> None:
    exprs = " ".join(expr for _, _, expr in queries("prometheus"))
    titles = " ".join(title.lower() for _, title, _ in queries("prometheus"))
    for needle in (
        "sum by (decision) (rate(tracerag_requests_total",
        'decision="escalate"',
        'decision="review"',
        "tracerag_confidence_bucket",
        "tracerag_citation_coverage",
        "tracerag_citation_accuracy",
        "histogram_quantile(0.5, sum by (le, stage) (rate(tracerag_stage_duration_seconds_bucket",
        "histogram_quantile(0.95, sum by (le, stage) (rate(tracerag_stage_duration_seconds_bucket",
    ):
        assert needle in exprs, needle
    for word in ("decision", "confidence", "escalation", "review", "coverage", "latency"):
        assert word in titles, word


def test_quality_dashboard_has_a_materials_row() -> None:
    quality = json.loads((DASHBOARDS / "tracerag-quality.json").read_text())
    exprs = " ".join(t["expr"] for p in row_panels(quality, "Materials") for t in p["targets"])
    for name in (
        "tracerag_materials_credibility",
        "tracerag_materials_pending_writes",
        "tracerag_materials_conflicts",
        "tracerag_materials_quarantined",
        "sum by (status) (tracerag_materials",
        "sum by (bucket) (tracerag_materials_credibility",
    ):
        assert name in exprs, name


def row_panels(dashboard: dict[str, Any], title: str) -> list[dict[str, Any]]:
    """The panels under the row ``title`` (up to the next row)."""
    panels = dashboard["panels"]
    start = next(i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == title)
    found = []
    for panel in panels[start + 1 :]:
        if panel["type"] == "row":
            break
        found.append(panel)
    assert found, f"the row {title!r} has no panels"
    return found


def test_quality_dashboard_has_a_samples_and_review_row() -> None:
    quality = json.loads((DASHBOARDS / "tracerag-quality.json").read_text())
    panels = row_panels(quality, "Samples and review")
    exprs = " ".join(t["expr"] for p in panels for t in p["targets"])
    titles = " ".join(p["title"].lower() for p in panels)
    for name in (
        "tracerag_samples_bucket",
        "max by (status, route) (tracerag_review_backlog",
        "tracerag_review_oldest_wait_seconds",
        "tracerag_review_time_to_decision_seconds_bucket",
        "tracerag_turns_interrupted_total",
        "tracerag_turns_resumed_total",
    ):
        assert name in exprs, name
    for word in ("samples drawn", "backlog", "time to decision", "interrupted turns waiting"):
        assert word in titles, word


def test_traceql_uses_only_known_attributes() -> None:
    known = {v for k, v in vars(semconv).items() if k.isupper() and isinstance(v, str)}
    traceql = [q for q in queries("tempo") if q[2] != "$trace_id"]
    assert any('{ span.tracerag.request_id = "$request_id" }' in query for _, _, query in traceql)
    for name, title, query in traceql:
        for attr in re.findall(r"\bspan\.([\w.]+)", query):
            assert attr in known, f"{name}: {title!r} uses unknown span attribute {attr!r}"
        for span_name in re.findall(r'\bname\s*=\s*"([^"]+)"', query):
            assert span_name in known, f"{name}: {title!r} uses unknown span name {span_name!r}"


def test_variables_are_defined_and_datasources_templated() -> None:
    for name, dash in dashboards():
        defined = {v["name"] for v in dash["templating"]["list"]}
        text = json.dumps(dash)
        used = set(re.findall(r"\$\{?([A-Za-z_][\w]*)", text))
        unknown = {u for u in used if u not in defined and u not in GRAFANA_GLOBALS}
        assert not unknown, f"{name}: undefined variables {sorted(unknown)}"
        for panel in all_panels(dash.get("panels", [])):
            if panel.get("type") in {"row", "text"}:
                continue
            uid = (panel.get("datasource") or {}).get("uid", "")
            assert uid.startswith("${DS_"), f"{name}: {panel['title']!r} has a fixed datasource"
        inputs = {i["name"] for i in dash.get("__inputs", [])}
        assert inputs and inputs <= defined
        assert dash["uid"] and dash["title"]


def test_dashboard_uids_and_panel_ids_unique() -> None:
    uids = [d["uid"] for _, d in dashboards()]
    assert len(uids) == len(set(uids))
    for name, dash in dashboards():
        ids = [p["id"] for p in all_panels(dash["panels"])]
        assert len(ids) == len(set(ids)), name


def test_jaeger_link_present() -> None:
    traces = json.loads((DASHBOARDS / "tracerag-traces.json").read_text())
    urls = [link["url"] for link in traces["links"]]
    assert any("/trace/${trace_id}" in url for url in urls)
    assert any("tracerag.request_id" in url for url in urls)


EXAMPLE = DASHBOARDS.parent / "examples" / "observability"


def test_example_stack_is_consistent() -> None:
    import shutil
    import subprocess

    import yaml

    compose = yaml.safe_load((EXAMPLE / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"otel-collector", "jaeger", "tempo", "prometheus", "grafana"} <= set(services)
    for name, service in services.items():
        assert ":latest" not in service["image"] and ":" in service["image"], name
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)
    grafana_mounts = {
        m.split(":")[1]: m.split(":")[0] for m in services["grafana"]["volumes"] if ":" in m
    }
    provider = yaml.safe_load(
        (EXAMPLE / "grafana/provisioning/dashboards/tracerag.yaml").read_text()
    )["providers"][0]
    assert grafana_mounts[provider["options"]["path"]] == "../../dashboards"
    assert (EXAMPLE / "../../dashboards").resolve() == DASHBOARDS
    datasources = yaml.safe_load(
        (EXAMPLE / "grafana/provisioning/datasources/datasources.yaml").read_text()
    )["datasources"]
    assert {d["type"]: d["uid"] for d in datasources}["tempo"] == "tempo"  # trace_link default
    collector = yaml.safe_load((EXAMPLE / "otel-collector.yaml").read_text())
    pipelines = collector["service"]["pipelines"]
    for pipeline in pipelines.values():
        for exporter in pipeline["exporters"]:
            assert exporter in collector["exporters"], exporter
        for receiver in pipeline["receivers"]:
            assert receiver in collector["receivers"], receiver
    assert set(pipelines) == {"traces", "metrics"}
    promtool = shutil.which("promtool")
    if promtool:
        result = subprocess.run(
            [promtool, "check", "config", "--syntax-only", str(EXAMPLE / "prometheus.yml")],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr
