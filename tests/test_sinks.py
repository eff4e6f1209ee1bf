"""The core's audit seam: ``audit=`` resolved through registered and declared sink resolvers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from tracerag import _sinks
from tracerag.config import reset_config
from tracerag.errors import ConfigurationError

REPO = Path(__file__).resolve().parents[1]


class Recording:
    """A resolver that notes what it was asked and answers with ``sink`` (None: not mine)."""

    def __init__(self, sink=None):
        self.asked: list[object] = []
        self.sink = sink

    def __call__(self, audit):
        self.asked.append(audit)
        return self.sink


@pytest.fixture
def registered():
    undo: list = []

    def register(resolver):
        undo.append(_sinks.register_sink_resolver(resolver))
        return resolver

    yield register
    for unregister in undo:
        unregister()


def test_none_and_false_mean_no_audit_trail(registered):
    resolver = registered(Recording(sink=lambda record: True))
    assert _sinks.resolve_sink(None) is None
    assert _sinks.resolve_sink(False) is None
    assert resolver.asked == []


def test_a_plain_callable_is_the_sink_without_asking_any_resolver(registered):
    resolver = registered(Recording(sink=lambda record: False))
    records: list[dict] = []
    sink = records.append
    assert _sinks.resolve_sink(sink) is sink
    assert resolver.asked == []


def test_auto_without_a_configured_store_is_no_trail(monkeypatch, registered):
    monkeypatch.delenv("TRACERAG_STORE", raising=False)
    reset_config()
    resolver = registered(Recording(sink=lambda record: True))
    try:
        assert _sinks.resolve_sink("auto") is None
    finally:
        reset_config()
    assert resolver.asked == []


def test_auto_hands_the_configured_store_url_to_the_resolvers(monkeypatch, registered):
    monkeypatch.setenv("TRACERAG_STORE", "memo://audit")
    reset_config()

    def sink(record):
        return True

    resolver = registered(Recording(sink=sink))
    try:
        assert _sinks.resolve_sink("auto") is sink
    finally:
        reset_config()
    assert resolver.asked == ["memo://audit"]


def test_a_registered_resolver_is_asked_first_and_can_be_undone():
    def sink(record):
        return True

    first = Recording(sink=None)  # not mine: the next one is asked
    second = Recording(sink=sink)
    undo_second = _sinks.register_sink_resolver(second)
    undo_first = _sinks.register_sink_resolver(first)
    try:
        assert _sinks.sink_resolvers()[:2] == (first, second)
        assert _sinks.resolve_sink("memo://x") is sink
        assert first.asked == ["memo://x"] and second.asked == ["memo://x"]
    finally:
        undo_first()
        undo_second()
    assert first not in _sinks.sink_resolvers() and second not in _sinks.sink_resolvers()
    undo_first()  # a second undo is harmless


def test_a_value_no_resolver_knows_is_a_configuration_error():
    with pytest.raises(ConfigurationError, match=r"audit must be 'auto'.*got int"):
        _sinks.resolve_sink(42)  # type: ignore[arg-type]


def test_a_resolver_must_be_callable():
    with pytest.raises(ConfigurationError, match="must be callable, got str"):
        _sinks.register_sink_resolver("tracerag.store")  # type: ignore[arg-type]


def test_a_store_url_resolves_to_a_durable_writer_through_the_declared_resolver(tmp_path):
    sink = _sinks.resolve_sink(f"sqlite:///{tmp_path / 'audit.sqlite'}")
    assert sink is not None and callable(sink)
    writer = sink.writer  # type: ignore[attr-defined]
    assert type(writer).__name__ == "AuditWriter" and writer.healthy
    writer.close()


def test_the_declared_resolver_is_the_one_pyproject_declares():
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    declared = project["project"]["entry-points"][_sinks.ENTRY_POINT_GROUP]
    own = _sinks._OWN_ENTRY_POINT
    assert declared == {own.name: own.value}
    from tracerag.store._sink import store_sink

    assert own.load() is store_sink
    assert store_sink(object()) is None  # not a store, a writer, a URL or a callable


@pytest.mark.integration  # a fresh interpreter in a subprocess: an integration test
def test_building_a_pipeline_without_a_store_imports_no_application_package():
    code = (
        "import os, sys; os.environ.pop('TRACERAG_STORE', None)\n"
        "from tracerag import RAGPipeline\n"
        "from langchain_core.embeddings import DeterministicFakeEmbedding\n"
        "from langchain_core.vectorstores import InMemoryVectorStore\n"
        "from tracerag.testing import ScriptedChatModel\n"
        "store = InMemoryVectorStore(DeterministicFakeEmbedding(size=8))\n"
        "RAGPipeline(store.as_retriever(), ScriptedChatModel(responses=['x']),"
        " prompt_version='p', model_version='m', audit='auto')\n"
        "app = ('tracerag.store', 'tracerag.materials', 'tracerag.server', 'tracerag.tools',"
        " 'tracerag.demo')\n"
        "print(sorted(m for m in sys.modules if m.startswith(app)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout
    assert out.strip() == "[]"


def test_a_declared_resolver_that_cannot_be_loaded_is_a_configuration_error(monkeypatch):
    broken = _sinks.EntryPoint(
        name="broken", value="tracerag_no_such_module:resolve", group=_sinks.ENTRY_POINT_GROUP
    )
    monkeypatch.setattr(_sinks, "entry_points", lambda group: [broken])
    monkeypatch.setattr(_sinks, "_declared", None)
    with pytest.raises(ConfigurationError, match=r"'broken'.*could not be loaded.*ModuleNotFound"):
        _sinks.resolve_sink("sqlite:///nowhere.sqlite")
