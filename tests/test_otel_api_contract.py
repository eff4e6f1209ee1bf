"""tracerag instruments with the OpenTelemetry API, as instrumentation libraries do: spans and
metrics go to whatever provider the application has set when a request runs. Only the set-up
helpers, which configure providers for an application that asks them to, touch the SDK or an
exporter. Both halves are checked here: by reading every module's imports (a lazy import inside
a function counts), and by running a request with no SDK loaded."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from pipeline_fixtures import REPO

PACKAGE = REPO / "tracerag"
SDK = ("opentelemetry.sdk", "opentelemetry.exporter")

#: the modules that may import the SDK or an exporter, and why
SET_UP = {
    "tracerag/telemetry/_providers.py": "configure(): tracer providers and span processors",
    "tracerag/telemetry/_export.py": "the OTLP and console span exporters configure() sets up",
    "tracerag/telemetry/_lifecycle.py": "the Resource of every provider configure() makes",
    "tracerag/telemetry/_meters.py": "configure_metrics(), the Prometheus endpoint",
    "tracerag/telemetry/_phoenix.py": "sending evaluations to Phoenix over OTLP",
    "tracerag/testing.py": "the in-memory span exporter of the testing helpers",
    "tracerag/tools/_eval.py": "tracerag eval runs each arm under a tracer provider of its own",
}


def sdk_imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            if name.startswith(SDK) or name in ("opentelemetry.sdk", "opentelemetry.exporter"):
                found.append((node.lineno, name))
                break
    return sorted(found)


def test_only_the_set_up_helpers_import_the_sdk_or_an_exporter() -> None:
    offenders = []
    users = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        found = sdk_imports(path)
        if found:
            users.add(rel)
        if found and rel not in SET_UP:
            offenders += [f"{rel}:{line} imports {name}" for line, name in found]
    assert not offenders, "the SDK outside the set-up helpers:\n" + "\n".join(offenders)
    # the list names no module that no longer needs it (or no longer exists)
    assert users == set(SET_UP), set(SET_UP) ^ users


def test_the_walk_sees_a_lazy_import_inside_a_function(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "def f():\n    from opentelemetry.sdk.trace import TracerProvider\n"
        "from opentelemetry import trace\nfrom opentelemetry.exporter.otlp import x\n"
    )
    assert [name for _, name in sdk_imports(module)] == [
        "opentelemetry.sdk.trace",
        "opentelemetry.exporter.otlp",
    ]


def test_a_request_runs_on_the_api_alone() -> None:
    """An application that installs its own providers (here the API's no-op ones) gets a
    request answered through them with the SDK and the exporters not importable at all: the
    core is on the API. (With no provider installed, the set-up helper makes one from the OTEL_*
    variables, so that trace ids exist; that is the SDK's job, done in telemetry._providers.)"""
    code = """
import sys

class NoSDK:  # the SDK and the exporters cannot be imported at all
    def find_spec(self, name, path=None, target=None):
        if name.startswith(("opentelemetry.sdk", "opentelemetry.exporter")):
            raise ImportError(name + " is not installed")

sys.meta_path.insert(0, NoSDK())
from opentelemetry import metrics, trace
trace.set_tracer_provider(trace.NoOpTracerProvider())
metrics.set_meter_provider(metrics.NoOpMeterProvider())
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.language_models.fake_chat_models import FakeListChatModel
import tracerag

class Docs(BaseRetriever):
    def _get_relevant_documents(self, query, *, run_manager):
        return [Document(page_content="Returns are accepted within 30 days.",
                         metadata={"id": "returns"})]

model = FakeListChatModel(responses=["Returns are accepted within 30 days [returns]."] * 8)
pipeline = tracerag.RAGPipeline(Docs(), model, prompt_version="p1", model_version="m1",
                                audit=None)
response = pipeline.invoke("How long do I have to return an item?")
assert response.answer, response
print("ok", response.decision)
"""
    run = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith(("TRACERAG_", "OTEL_"))},
            "PYTHONPATH": str(REPO),
        },
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.startswith("ok ")
