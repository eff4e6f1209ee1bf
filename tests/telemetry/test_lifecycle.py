"""The telemetry lifecycle helpers: exporter options, the resource, and a bounded shutdown."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from tracerag.config import reset_config
from tracerag.telemetry import _lifecycle


class Provider:
    """A provider whose shutdown can hang (until ``release``) or raise."""

    def __init__(self, *, hang: bool = False, fail: bool = False) -> None:
        self.release = threading.Event()
        self.shut = threading.Event()
        self.hang, self.fail = hang, fail

    def shutdown(self) -> None:
        self.shut.set()
        if self.fail:
            raise RuntimeError("exporter gone")
        if self.hang:
            self.release.wait(30)


@pytest.fixture
def configured(monkeypatch: pytest.MonkeyPatch):
    def set_env(value: str | None) -> None:
        if value is None:
            monkeypatch.delenv(_lifecycle.SHUTDOWN_TIMEOUT_ENV, raising=False)
        else:
            monkeypatch.setenv(_lifecycle.SHUTDOWN_TIMEOUT_ENV, value)
        reset_config()

    yield set_env
    monkeypatch.delenv(_lifecycle.SHUTDOWN_TIMEOUT_ENV, raising=False)
    reset_config()


def test_exporter_options_parse_the_header_form_and_keep_the_timeout() -> None:
    options = _lifecycle.otlp_exporter_options("Api-Key=a%20b, x-tenant = t1", 1.5)
    assert options == {"headers": {"api-key": "a b", "x-tenant": "t1"}, "timeout": 1.5}
    assert _lifecycle.otlp_exporter_options({"K": 1}, None) == {"headers": {"K": "1"}}  # type: ignore[dict-item]
    assert _lifecycle.otlp_exporter_options(None, None) == {}


@pytest.mark.parametrize(
    ("value", "seconds"), [(None, 2.0), ("0.5", 0.5), ("-1", 2.0), ("0", 2.0), ("soon", 2.0)]
)
def test_the_shutdown_timeout_comes_from_the_environment_or_the_default(
    configured, caplog: pytest.LogCaptureFixture, value: str | None, seconds: float
) -> None:
    configured(value)
    with caplog.at_level(logging.WARNING, logger="tracerag.tracing"):
        assert _lifecycle.default_shutdown_timeout() == seconds
    assert ("is not a number" in caplog.text) == (value == "soon")


def test_the_resource_names_tracerag_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    assert _lifecycle.make_resource().attributes["service.name"] == "tracerag"
    named = _lifecycle.make_resource("kb-desk", {"deployment.environment": "test"})
    assert named.attributes["service.name"] == "kb-desk"
    assert named.attributes["deployment.environment"] == "test"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    assert _lifecycle.make_resource().attributes["service.name"] == "from-env"


def test_shutdown_waits_a_bounded_time_and_never_raises() -> None:
    hung, failing, fine, forgotten = (
        Provider(hang=True),
        Provider(fail=True),
        Provider(),
        Provider(),
    )
    for provider in (hung, failing, fine, forgotten):
        _lifecycle.shutdown_at_exit(provider)
    _lifecycle.forget_at_exit(forgotten)
    started = time.monotonic()
    try:
        _lifecycle.shutdown_providers(timeout=0.2)
        elapsed = time.monotonic() - started
    finally:
        hung.release.set()
    assert elapsed < 5  # bounded by the timeout (plus a margin), not by the hung provider
    assert hung.shut.is_set() and failing.shut.is_set() and fine.shut.is_set()
    assert not forgotten.shut.is_set()
    # every provider was taken off the list: a second shutdown touches none of them
    fine.shut.clear()
    _lifecycle.shutdown_providers(timeout=0.2)
    assert not fine.shut.is_set()
