"""A real Jaeger v2 all-in-one for tests, read back through Jaeger's own query API.

Uses the instance ``.ci/jaeger.sh start`` exported (``TRACERAG_JAEGER_URL``,
``TRACERAG_JAEGER_OTLP_HTTP``, ``TRACERAG_JAEGER_OTLP_GRPC``) when there is one; otherwise starts
the binary (``TRACERAG_JAEGER_BIN``, else the one ``.ci/jaeger.sh build`` cached) with
``.ci/jaeger.yaml`` on free ports of 127.0.0.1. Traces come from ``/api/v3/traces/{id}`` (OTLP
JSON) and are decoded into the same ``WireSpan`` records as the OTLP receiver's.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.trace import SpanKind
from otlp_receiver import SpanTree, WireSpan, backend_missing, spans_of

from tracerag import _semconv as semconv

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / ".ci" / "jaeger.yaml"
VERSION = "v1.76.0"
CACHED = Path.home() / ".cache" / "tracerag" / "jaeger" / f"jaeger-{VERSION}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, timeout: float = 10) -> tuple[int, bytes, str]:
    """Status, body and content type of a GET (errors answered by the server included)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read(), response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers.get("Content-Type", "")


def _hex_ids_to_base64(node: Any) -> Any:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key in {"traceId", "spanId", "parentSpanId"} and isinstance(value, str):
                value = base64.b64encode(bytes.fromhex(value)).decode() if value else ""
            out[key] = _hex_ids_to_base64(value)
        return out
    if isinstance(node, list):
        return [_hex_ids_to_base64(v) for v in node]
    return node


@dataclass
class Jaeger:
    """Where a running Jaeger listens."""

    url: str
    otlp_http: str
    otlp_grpc: str

    def trace(self, trace_id: str) -> list[WireSpan]:
        """The spans Jaeger holds for ``trace_id`` (empty when it has none)."""
        status, body, _ = get(f"{self.url}/api/v3/traces/{trace_id}")
        if status == 404:
            return []
        assert status == 200, (status, body[:300])
        result = json.loads(body)["result"]
        data = json_format.ParseDict(
            _hex_ids_to_base64(result), trace_pb2.TracesData(), ignore_unknown_fields=True
        )
        return spans_of(data)

    def wait_for_trace(self, trace_id: str, spans: int, timeout: float = 30) -> list[WireSpan]:
        """The trace once it has ``spans`` spans (or what it has when ``timeout`` runs out)."""
        deadline = time.monotonic() + timeout
        found = self.trace(trace_id)
        while len(found) < spans and time.monotonic() < deadline:
            time.sleep(0.2)
            found = self.trace(trace_id)
        return found

    def wait_for_request(self, trace_id: str, most: int, timeout: float = 30) -> list[WireSpan]:
        """A request's trace once it holds its root, its six stages and one generation per
        sample drawn, as its sample span reports (adaptive sampling draws 2 to ``most``); what
        it has when ``timeout`` runs out."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.trace(trace_id)
            samples = [
                s for s in found if s.attributes.get(semconv.SPAN_NAME) == semconv.SPAN_SAMPLE
            ]
            drawn = samples[0].attributes.get(semconv.SAMPLES_DRAWN) if samples else most
            if len(found) >= 1 + 6 + int(drawn or most) or time.monotonic() > deadline:
                return found
            time.sleep(0.2)

    def services(self) -> list[str]:
        status, body, _ = get(f"{self.url}/api/services")
        assert status == 200
        return list(json.loads(body).get("data") or [])


def binary() -> str | None:
    explicit = os.environ.get("TRACERAG_JAEGER_BIN")
    if explicit:
        return explicit if Path(explicit).exists() else None
    return str(CACHED) if CACHED.exists() else None


def running_jaeger() -> Jaeger | None:
    """The instance named by the environment, if one answers."""
    url = os.environ.get("TRACERAG_JAEGER_URL")
    if not url:
        return None
    try:
        status, _, _ = get(f"{url}/api/services", timeout=3)
    except OSError:
        return None
    if status != 200:
        return None
    return Jaeger(
        url=url,
        otlp_http=os.environ["TRACERAG_JAEGER_OTLP_HTTP"],
        otlp_grpc=os.environ["TRACERAG_JAEGER_OTLP_GRPC"],
    )


def start_jaeger(workdir: Path) -> Iterator[Jaeger]:
    """Yield a Jaeger (the running one, or one started here and stopped after)."""
    found = running_jaeger()
    if found is not None:
        yield found
        return
    path = binary()
    if path is None:
        backend_missing(f"no Jaeger binary (run: bash .ci/jaeger.sh build); looked at {CACHED}")
    ports = {
        name: free_port()
        for name in (
            "JAEGER_OTLP_GRPC_PORT",
            "JAEGER_OTLP_HTTP_PORT",
            "JAEGER_QUERY_HTTP_PORT",
            "JAEGER_QUERY_GRPC_PORT",
            "JAEGER_HEALTH_PORT",
        )
    }
    env = {**os.environ, **{k: str(v) for k, v in ports.items()}}
    for name in list(env):
        if name.startswith("OTEL_"):
            env.pop(name)
    log = (workdir / "jaeger.log").open("wb")
    process = subprocess.Popen(
        [path, "--config", str(CONFIG)], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        health = f"http://127.0.0.1:{ports['JAEGER_HEALTH_PORT']}/status"
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    "Jaeger exited: " + (workdir / "jaeger.log").read_text(errors="replace")
                )
            try:
                if get(health, timeout=1)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("Jaeger did not become healthy in 60 s")
            time.sleep(0.2)
        yield Jaeger(
            url=f"http://127.0.0.1:{ports['JAEGER_QUERY_HTTP_PORT']}",
            otlp_http=f"http://127.0.0.1:{ports['JAEGER_OTLP_HTTP_PORT']}",
            otlp_grpc=f"http://127.0.0.1:{ports['JAEGER_OTLP_GRPC_PORT']}",
        )
    finally:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def check_request_trace(
    spans: list[WireSpan], request_id: str, n_samples: int, *, every: bool = False
) -> SpanTree:
    """One request's trace as issue 9 asks for it, with one generation per sample drawn: 2 to
    ``n_samples`` (adaptive sampling), exactly ``n_samples`` when ``every`` sample is drawn
    (``min_samples=n_samples``); returns the tree for further checks."""
    tree = SpanTree(spans)
    assert spans, "no spans"
    (root,) = tree.roots()
    assert root.attributes[semconv.SPAN_NAME] == semconv.SPAN_REQUEST
    assert root.name.startswith(("invoke_workflow tracerag [", "invoke_agent "))
    stages = tree.children(root)
    assert sorted(s.attributes[semconv.SPAN_NAME] for s in stages) == sorted(
        semconv.STAGE_SPANS.values()
    )
    (sample,) = tree.named(semconv.SPAN_SAMPLE)
    assert sample.attributes[semconv.SAMPLES_MAX] == n_samples
    drawn = sample.attributes[semconv.SAMPLES_DRAWN]
    assert isinstance(drawn, int) and 2 <= drawn <= n_samples, drawn
    if every:
        assert drawn == n_samples
    n_samples = drawn
    generations = tree.named(semconv.SPAN_SAMPLE_ONE)
    assert len(generations) == n_samples
    assert all(tree.parent(g) is sample for g in generations)
    assert len(spans) == 1 + 6 + n_samples
    for span in spans:
        assert span.attributes[semconv.REQUEST_ID] == request_id, span.name
    for generation in generations:  # model spans: OpenInference LLM, GenAI chat, CLIENT
        assert generation.kind == SpanKind.CLIENT.value + 1  # OTLP numbers kinds from 1
        assert generation.attributes[semconv.OI_SPAN_KIND] == semconv.OI_KIND_LLM
        assert generation.attributes[semconv.GENAI_OPERATION_NAME] == "chat"
        assert generation.attributes[semconv.GENAI_REQUEST_MODEL]
    (retrieve,) = tree.named(semconv.SPAN_RETRIEVE)
    count = retrieve.attributes[semconv.RETRIEVAL_COUNT]
    assert count > 0
    for i in range(count):
        assert retrieve.attributes[semconv.oi_document(i, "id")]
        assert isinstance(retrieve.attributes[semconv.oi_document(i, "score")], float)
    assert root.attributes[semconv.DECISION] in {"pass", "review", "escalate"}
    assert isinstance(root.attributes[semconv.CONFIDENCE], float)
    return tree
