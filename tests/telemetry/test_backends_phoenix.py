"""Arize Phoenix as a real OTLP backend: the demo's traces read back through Phoenix's REST API.

Phoenix runs as ``phoenix serve`` in a subprocess on 127.0.0.1 (free ports, temp working dir,
telemetry off) from the interpreter named by ``TRACERAG_PHOENIX_PYTHON``, else the venv at
``TRACERAG_PHOENIX_VENV`` (default ``~/.cache/tracerag/phoenix-venv``, made by
``.ci/observability.sh``), else this interpreter if it has Phoenix installed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider as SDKTracerProvider
from otlp_receiver import backend_missing

from tracerag import RAGPipeline
from tracerag import _semconv as semconv
from tracerag.demo.kb import build_retriever, load_questions
from tracerag.demo.models.extractive import ExtractiveChatModel
from tracerag.telemetry import _export, _instruments, _links, _phoenix, _providers

pytestmark = pytest.mark.integration

PROJECT = "tracerag-demo"
DEFAULT_VENV = Path.home() / ".cache" / "tracerag" / "phoenix-venv"


def phoenix_python() -> str | None:
    explicit = os.environ.get("TRACERAG_PHOENIX_PYTHON")
    if explicit:
        return explicit if Path(explicit).exists() else None
    venv = Path(os.environ.get("TRACERAG_PHOENIX_VENV") or DEFAULT_VENV)
    candidate = venv / "bin" / "python"
    if candidate.exists():
        return str(candidate)
    import importlib.util

    if importlib.util.find_spec("phoenix") is not None:
        return sys.executable
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    python = phoenix_python()
    if python is None:
        backend_missing("arize-phoenix is not installed (see .ci/observability.sh)")
    workdir = tmp_path_factory.mktemp("phoenix")
    port, grpc_port = free_port(), free_port()
    env = {
        **os.environ,
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(grpc_port),
        "PHOENIX_WORKING_DIR": str(workdir),
        "PHOENIX_TELEMETRY_ENABLED": "false",
    }
    for name in list(env):
        if name.startswith("OTEL_"):
            env.pop(name)  # Phoenix must not export its own telemetry anywhere
    log = (workdir / "phoenix.log").open("wb")
    process = subprocess.Popen(
        [python, "-m", "phoenix.server.main", "serve"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=workdir,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    try:
        while True:
            if process.poll() is not None:
                tail = (workdir / "phoenix.log").read_text(errors="replace")[-3000:]
                pytest.fail(f"phoenix serve exited with {process.returncode}:\n{tail}")
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                pytest.fail("phoenix serve did not become healthy within 180 s")
            time.sleep(0.5)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        log.close()


@pytest.fixture(scope="module")
def demo_run(phoenix: str) -> dict[str, Any]:
    _providers.reset_for_tests()
    provider = SDKTracerProvider(
        resource=_providers.make_resource("tracerag-demo", {"openinference.project.name": PROJECT})
    )
    provider.add_span_processor(
        _export.batch_processor(
            _export.otlp_span_exporter(f"{phoenix}/v1/traces"),
            schedule_delay_millis=100,
            on_drop=_instruments.record_spans_dropped,
        )
    )
    provider.add_span_processor(_phoenix.phoenix_evaluations(phoenix))
    rag = RAGPipeline(
        build_retriever(),
        ExtractiveChatModel(),
        prompt_version="demo-prompt-1",
        model_version="extractive-1",
        n_samples=5,
        temperature=0.7,
        tracer_provider=provider,
        audit=None,
    )
    responses = [rag.invoke(q["question"]) for q in load_questions()]
    assert provider.force_flush(30_000)
    provider.shutdown()

    spans: dict[str, list[dict[str, Any]]] = {}
    deadline = time.monotonic() + 60
    pending = {r.trace_id for r in responses}
    while pending and time.monotonic() < deadline:
        for trace_id in sorted(pending):
            query = urllib.parse.urlencode({"trace_id": trace_id, "limit": 100})
            try:
                data = get_json(f"{phoenix}/v1/projects/{PROJECT}/spans?{query}")["data"]
            except urllib.error.HTTPError as exc:  # the project appears with the first span
                if exc.code != 404:
                    raise
                data = []
            if len(data) >= 1 + 6 + drawn(data):
                spans[trace_id] = data
                pending.discard(trace_id)
        if pending:
            time.sleep(0.5)
    assert not pending, f"Phoenix did not return the spans of {len(pending)} traces"
    return {"base": phoenix, "responses": responses, "spans": spans}


def drawn(spans: list[dict[str, Any]]) -> int:
    """How many samples the request drew, as its sample span says (adaptive sampling stops
    once the route is settled); the most allowed while that span has not arrived."""
    for span in by_name(spans, semconv.SPAN_SAMPLE):
        return int(span["attributes"][semconv.SAMPLES_DRAWN])
    return 5


def by_name(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The spans whose tracerag name (``tracerag.span``) is ``name``."""
    return [s for s in spans if s["attributes"].get(semconv.SPAN_NAME, s["name"]) == name]


def test_six_stage_tree_in_phoenix(demo_run: dict[str, Any]) -> None:
    assert demo_run["responses"]
    for response in demo_run["responses"]:
        spans = demo_run["spans"][response.trace_id]
        (root,) = [s for s in spans if s["parent_id"] is None]
        assert root["name"] == f"invoke_workflow tracerag [{response.decision}]"
        assert root["attributes"][semconv.SPAN_NAME] == semconv.SPAN_REQUEST
        assert root["span_kind"] == "CHAIN"
        children = {
            s["attributes"][semconv.SPAN_NAME]
            for s in spans
            if s["parent_id"] == root["context"]["span_id"]
        }
        assert children == set(semconv.STAGE_SPANS.values())
        assert all(s["attributes"][semconv.REQUEST_ID] == response.request_id for s in spans)
        assert root["attributes"][semconv.DECISION] == response.decision
        assert root["attributes"][semconv.OI_INPUT_VALUE]


def test_retrieve_span_shows_documents_with_ids_and_scores(demo_run: dict[str, Any]) -> None:
    response = demo_run["responses"][0]
    (retrieve,) = by_name(demo_run["spans"][response.trace_id], semconv.SPAN_RETRIEVE)
    assert retrieve["span_kind"] == "RETRIEVER"
    attrs = retrieve["attributes"]
    ids = list(attrs[semconv.RETRIEVAL_MATERIAL_IDS])
    assert ids
    for i, material_id in enumerate(ids):
        assert attrs[semconv.oi_document(i, "id")] == material_id
        assert isinstance(attrs[semconv.oi_document(i, "score")], float)
        assert attrs[semconv.oi_document(i, "content")]
    cited = {e.material_id for e in response.evidence} if response.evidence else set()
    assert cited <= set(ids)


def test_sample_spans_show_model_and_temperature(demo_run: dict[str, Any]) -> None:
    response = demo_run["responses"][0]
    spans = demo_run["spans"][response.trace_id]
    (sample,) = by_name(spans, semconv.SPAN_SAMPLE)
    assert sample["attributes"][semconv.SAMPLES_MAX] == 5
    assert 2 <= drawn(spans) <= 5
    generations = by_name(spans, semconv.SPAN_SAMPLE_ONE)
    assert len(generations) == drawn(spans)
    for span in generations:
        attrs = span["attributes"]
        assert span["span_kind"] == "LLM"
        assert attrs[semconv.OI_LLM_MODEL_NAME] == "tracerag-extractive-1"
        assert attrs[semconv.GENAI_REQUEST_TEMPERATURE] == pytest.approx(0.7)
        params = json.loads(attrs[semconv.OI_LLM_INVOCATION_PARAMETERS])
        assert params["temperature"] == pytest.approx(0.7)
        assert attrs[semconv.oi_output_message(0, "content")]


def test_evaluations_visible_in_phoenix(demo_run: dict[str, Any]) -> None:
    base = demo_run["base"]
    assert demo_run["responses"]
    for response in demo_run["responses"]:
        spans = demo_run["spans"][response.trace_id]
        (verify,) = by_name(spans, semconv.SPAN_VERIFY)
        assert verify["span_kind"] == "EVALUATOR"
        events = [e for e in verify["events"] if e["name"] == semconv.GENAI_EVALUATION_EVENT]
        names = {e["attributes"][semconv.GENAI_EVALUATION_NAME] for e in events}
        assert {"citation_validity", "self_consistency"} <= names
        (root,) = [s for s in spans if s["parent_id"] is None]
        wanted = {
            verify["context"]["span_id"]: names,
            root["context"]["span_id"]: {"confidence"},
        }
        query = urllib.parse.urlencode({"span_ids": list(wanted), "limit": 100}, doseq=True)
        deadline = time.monotonic() + 30
        while True:
            data = get_json(f"{base}/v1/projects/{PROJECT}/span_annotations?{query}")["data"]
            got: dict[str, set[str]] = {}
            for a in data:
                got.setdefault(a["span_id"], set()).add(a["name"])
            if all(need <= got.get(sid, set()) for sid, need in wanted.items()):
                break
            assert time.monotonic() < deadline, f"annotations missing: {got} vs {wanted}"
            time.sleep(0.5)
        confidence = [a for a in data if a["name"] == "confidence"]
        assert confidence[0]["result"]["label"] == response.decision
        assert confidence[0]["result"]["score"] == pytest.approx(response.confidence)


def test_phoenix_trace_link_resolves(demo_run: dict[str, Any]) -> None:
    response = demo_run["responses"][0]
    url = _links.trace_link(response.trace_id, "phoenix", demo_run["base"])
    with urllib.request.urlopen(url, timeout=10) as page:
        assert page.status == 200
        assert b"<html" in page.read(4096).lower()
