"""tracerag's configuration from the environment: every ``TRACERAG_*`` variable, read once.

``get_config()`` reads the environment the first time it is called and returns the same frozen
``Config`` afterwards; ``reset_config()`` forgets it (tests, or an app that changes the
environment on purpose before building pipelines). Nothing else in tracerag reads a
``TRACERAG_*`` variable, and stages never read the environment at all. Standard OpenTelemetry
variables (``OTEL_*``) are read by the OpenTelemetry SDK and its exporters, not here.

Every variable, with its meaning and default, is listed in ``docs/environment.md``; ``ENV_VARS``
maps each ``Config`` field to its variable.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["ENV_VARS", "Config", "get_config", "reset_config"]

T = TypeVar("T")

#: Every environment variable tracerag itself reads, by the ``Config`` field it fills.
ENV_VARS: Mapping[str, str] = {
    "store": "TRACERAG_STORE",
    "audit_journal": "TRACERAG_AUDIT_JOURNAL",
    "audit_commit_wait": "TRACERAG_AUDIT_COMMIT_WAIT",
    "audit_anchor": "TRACERAG_AUDIT_ANCHOR",
    "forwarded_allow_ips": "TRACERAG_FORWARDED_ALLOW_IPS",
    "chain_key": "TRACERAG_CHAIN_KEY",
    "calibration": "TRACERAG_CALIBRATION",
    "capture_content": "TRACERAG_CAPTURE_CONTENT",
    "capture_max_chars": "TRACERAG_CAPTURE_MAX_CHARS",
    "otlp_max_batch_bytes": "TRACERAG_OTLP_MAX_BATCH_BYTES",
    "export_shutdown_timeout": "TRACERAG_EXPORT_SHUTDOWN_TIMEOUT",
    "trace_ui": "TRACERAG_TRACE_UI",
    "prometheus_port": "TRACERAG_PROMETHEUS_PORT",
    "prometheus_addr": "TRACERAG_PROMETHEUS_ADDR",
    "minilm_model": "TRACERAG_MINILM_MODEL",
    "minilm_tokenizer": "TRACERAG_MINILM_TOKENIZER",
    "model": "TRACERAG_MODEL",
    "api_key": "TRACERAG_API_KEY",
    "feedback_key": "TRACERAG_FEEDBACK_KEY",
    "reviewer_token": "TRACERAG_REVIEWER_TOKEN",
    "reviewers_file": "TRACERAG_REVIEWERS_FILE",
    "operator_token": "TRACERAG_OPERATOR_TOKEN",
    "operators_file": "TRACERAG_OPERATORS_FILE",
    "cors_origins": "TRACERAG_CORS_ORIGINS",
    "decision_webhook": "TRACERAG_DECISION_WEBHOOK",
    "session_secret": "TRACERAG_SESSION_SECRET",
    "desk_config": "TRACERAG_DESK_CONFIG",
}


@dataclass(frozen=True)
class Config:
    """The ``TRACERAG_*`` environment as read once (empty strings become None)."""

    store: str | None = None
    audit_journal: str | None = None
    audit_commit_wait: str | None = None
    audit_anchor: str | None = None
    forwarded_allow_ips: str | None = None
    chain_key: str | None = field(default=None, repr=False)  # a secret
    calibration: str | None = None
    capture_content: str | None = None
    capture_max_chars: str | None = None
    otlp_max_batch_bytes: str | None = None
    export_shutdown_timeout: str | None = None
    trace_ui: str | None = None
    prometheus_port: str | None = None
    prometheus_addr: str | None = None
    minilm_model: str | None = None
    minilm_tokenizer: str | None = None
    model: str | None = None
    api_key: str | None = None
    feedback_key: str | None = field(default=None, repr=False)  # a secret
    reviewer_token: str | None = None
    reviewers_file: str | None = None
    operator_token: str | None = field(default=None, repr=False)  # a secret
    operators_file: str | None = None
    cors_origins: str | None = None
    decision_webhook: str | None = None
    session_secret: str | None = field(default=None, repr=False)  # a secret
    desk_config: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Config:
        """Read every variable in ``ENV_VARS`` from ``environ`` (default ``os.environ``)."""
        env = os.environ if environ is None else environ
        values: dict[str, str | None] = {}
        for field_name, var in ENV_VARS.items():
            raw = env.get(var, "").strip()
            values[field_name] = raw or None
        return cls(**values)


class Once(Generic[T]):
    """A value made by ``make`` on first use, once even when first uses race."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._value: T | None = None
        self._lock = threading.Lock()

    def get(self) -> T:
        """The value, made now if it was not yet."""
        value = self._value
        if value is None:
            with self._lock:
                if self._value is None:
                    self._value = self._make()
                value = self._value
        return value

    @property
    def made(self) -> T | None:
        """The value if it was made, without making it."""
        return self._value

    def reset(self) -> T | None:
        """Forget the value (the next ``get`` makes it again); returns what was forgotten."""
        with self._lock:
            value, self._value = self._value, None
        return value


_config: Once[Config] = Once(lambda: Config.from_env())


def get_config() -> Config:
    """The configuration, read from the environment on first use and kept."""
    return _config.get()


def reset_config() -> None:
    """Forget the configuration read so far; the next ``get_config()`` reads the environment."""
    _config.reset()
