"""tracerag → a real OpenTelemetry Collector → real Jaeger.

The Collector is the minimal distribution ``.ci/otelcol.sh`` builds with the Collector's own
builder (OTLP receiver, batch processor, OTLP exporters, debug exporter), from the Collector
release Jaeger is built on, run on 127.0.0.1 with a config written here: traces to Jaeger over
OTLP/gRPC, metrics to the debug exporter. The example stack's Collector config must also be
valid for that binary's components.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from jaeger_backend import Jaeger, check_request_trace, free_port, get, start_jaeger
from otlp_receiver import backend_missing
from pipeline_fixtures import REPO

from tracerag import RAGPipeline
from tracerag.demo.kb import build_retriever, load_questions
from tracerag.demo.models.extractive import ExtractiveChatModel
from tracerag.telemetry import _meters, _providers

pytestmark = pytest.mark.integration

ROOT = REPO
CACHE = Path(os.environ.get("TRACERAG_OTELCOL_CACHE") or Path.home() / ".cache/tracerag/otelcol")
MANIFEST = ROOT / ".ci" / "otelcol-builder.yaml"

CONFIG = """
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{grpc}
      http:
        endpoint: 127.0.0.1:{http}
processors:
  batch: {{}}
exporters:
  otlp/jaeger:
    endpoint: {jaeger}
    tls:
      insecure: true
  debug: {{}}
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [otlp/jaeger]
    metrics:
      receivers: [otlp]
      processors: [batch]
      exporters: [debug]
"""


def collector_binary() -> str | None:
    explicit = os.environ.get("TRACERAG_OTELCOL_BIN")
    if explicit:
        return explicit if Path(explicit).exists() else None
    import hashlib

    manifest = MANIFEST.read_bytes()
    version = yaml.safe_load(manifest)["dist"]["version"]
    cached = CACHE / f"otelcol-min-v{version}-{hashlib.sha256(manifest).hexdigest()[:12]}"
    return str(cached) if cached.exists() else None


@pytest.fixture(scope="module")
def jaeger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jaeger]:
    yield from start_jaeger(tmp_path_factory.mktemp("jaeger"))


@pytest.fixture(scope="module")
def collector(jaeger: Jaeger, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Collector's OTLP/HTTP endpoint."""
    binary = collector_binary()
    if binary is None:
        backend_missing("no Collector binary (run: bash .ci/otelcol.sh build)")
    workdir = tmp_path_factory.mktemp("otelcol")
    grpc, http = free_port(), free_port()
    config = workdir / "config.yaml"
    config.write_text(
        CONFIG.format(grpc=grpc, http=http, jaeger=jaeger.otlp_grpc.removeprefix("http://"))
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    log = (workdir / "otelcol.log").open("wb")
    process = subprocess.Popen(
        [binary, "--config", str(config)], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    endpoint = f"http://127.0.0.1:{http}"
    try:
        deadline = time.monotonic() + 60
        while True:  # the HTTP receiver answers 405 to a GET once it listens
            if process.poll() is not None:
                raise RuntimeError((workdir / "otelcol.log").read_text(errors="replace"))
            try:
                if get(f"{endpoint}/v1/traces", timeout=1)[0] in {200, 405}:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the Collector did not start"
            time.sleep(0.2)
        yield endpoint
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    _providers.reset_for_tests()
    _meters.reset()
    yield
    _providers.reset_for_tests()
    _meters.reset()


def test_through_the_collector_to_jaeger(
    collector: str, jaeger: Jaeger, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector)  # traces and metrics
    monkeypatch.setenv("OTEL_SERVICE_NAME", "tracerag-via-collector")
    rag = RAGPipeline(
        build_retriever(),
        ExtractiveChatModel(),
        prompt_version="p",
        model_version="extractive",
        n_samples=3,
        audit=None,
    )
    with caplog.at_level(logging.WARNING):
        responses = [rag.invoke(q["question"]) for q in load_questions()[:2]]
        assert _providers.force_flush(10_000)
        _meters.reset()  # the last metrics export, through the Collector
    assert len(responses) == 2
    for response in responses:
        spans = jaeger.wait_for_request(response.trace_id, 3)
        check_request_trace(spans, response.request_id, 3)
        assert spans[0].resource["service.name"] == "tracerag-via-collector"
    # the Collector has a metrics pipeline: no traces-only notice
    assert not [r for r in caplog.records if "does not accept OTLP metrics" in r.getMessage()]


def as_named_before_v0_144(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with its ``otlp_grpc`` exporters named ``otlp``, as before Collector v0.144.

    The example names the OTLP/gRPC exporter as the Collector it runs (contrib v0.150) does;
    the Collector Jaeger v1.76 is built on, and so the one built here, names it ``otlp``. Only
    that name changes: every component, setting and pipeline is validated as written.
    """

    def renamed(component_id: str) -> str:
        kind, _, name = component_id.partition("/")
        return ("otlp" if kind == "otlp_grpc" else kind) + ("/" + name if name else "")

    config = {**config, "exporters": {renamed(k): v for k, v in config["exporters"].items()}}
    pipelines = config["service"]["pipelines"]
    config["service"] = {
        **config["service"],
        "pipelines": {
            name: {**p, "exporters": [renamed(e) for e in p.get("exporters", [])]}
            for name, p in pipelines.items()
        },
    }
    return config


def test_renaming_for_the_older_collector_touches_only_the_otlp_grpc_exporters() -> None:
    example = yaml.safe_load((ROOT / "examples/observability/otel-collector.yaml").read_text())
    renamed = as_named_before_v0_144(example)
    assert [k for k in example["exporters"] if k.startswith("otlp_grpc")]  # not vacuous
    assert list(renamed["exporters"]) == [
        k.replace("otlp_grpc", "otlp", 1) for k in example["exporters"]
    ]
    assert list(renamed["exporters"].values()) == list(example["exporters"].values())
    for key in example:
        if key not in {"exporters", "service"}:
            assert renamed[key] == example[key]
    assert renamed["service"]["extensions"] == example["service"]["extensions"]
    for name, pipeline in example["service"]["pipelines"].items():
        again = renamed["service"]["pipelines"][name]
        assert again["receivers"] == pipeline["receivers"]
        assert again["processors"] == pipeline["processors"]
        assert again["exporters"] == [
            e.replace("otlp_grpc", "otlp", 1) for e in pipeline["exporters"]
        ]


def test_example_stack_collector_config_is_valid(tmp_path: Path) -> None:
    binary = collector_binary()
    if binary is None:
        backend_missing("no Collector binary (run: bash .ci/otelcol.sh build)")
    example = yaml.safe_load((ROOT / "examples/observability/otel-collector.yaml").read_text())
    config = tmp_path / "otel-collector.yaml"
    config.write_text(yaml.safe_dump(as_named_before_v0_144(example)))
    done = subprocess.run(
        [binary, "validate", "--config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # and the validation is real: a component the binary lacks is refused
    config.write_text(yaml.safe_dump(example))
    done = subprocess.run(
        [binary, "validate", "--config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert 'unknown type: "otlp_grpc"' in done.stderr, done.stderr[-2000:]
