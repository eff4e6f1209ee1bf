"""tracerag's configuration from the environment: every ``TRACERAG_*`` variable, read once.

``get_config()`` reads the environment the first time it is called and returns the same frozen
``Config`` afterwards; ``reset_config()`` forgets it (tests, or an app that changes the
environment on purpose before building pipelines). Nothing else in tracerag reads a
``TRACERAG_*`` variable, and stages never read the environment at all. Standard OpenTelemetry
variables (``OTEL_*``) are read by the OpenTelemetry SDK and its exporters, not here.

Variables (each is optional):

.. envvar:: TRACERAG_STORE

   Where the audit trail is written, for pipelines built with ``audit="auto"`` (the default)
   and for the CLI's ``--store``: a path (``/var/lib/app/audit.sqlite``), ``sqlite:///…`` or
   ``postgresql://…``. Unset: a library pipeline keeps no audit trail (``audit_persisted`` is
   null) and writes no file; the CLI asks for ``--store``.

.. envvar:: TRACERAG_AUDIT_JOURNAL

   The directory of the audit journal (records are fsynced there before a Response says
   ``audit_persisted: true``, then drained into the store). Unset: next to a SQLite store
   (``<store file>.journal``); a library pipeline over PostgreSQL then has no journal, and a
   Response says true only once the record is committed to the database; ``tracerag serve``
   over PostgreSQL refuses to start without one (or ``--no-journal``).

.. envvar:: TRACERAG_AUDIT_ANCHOR

   Where the audit writer exports the chain head (a file, or a directory for its
   ``head.json``), only ever forward, and where ``tracerag audit verify`` looks for it. Put it
   where whoever can change the database cannot (another disk, a mount only this service
   writes, a synced location). Unset: ``head.json`` in the audit journal's directory; without
   a journal, no head is exported.

.. envvar:: TRACERAG_AUDIT_COMMIT_WAIT

   ``tracerag serve``: the longest an answer waits (seconds, default 1) for its record to be
   committed to the store. A store that is locked, frozen or slow past it does not hold the
   answer: the record goes to the audit journal (``audit_persisted`` says whether it is
   durable there) and is written to the store later.

.. envvar:: TRACERAG_CHAIN_KEY

   A secret that seals every new audit entry with HMAC-SHA256 (chain version 3) and the chain
   head with a MAC. Keep it outside the database: whoever can write the database but does
   not hold the key cannot rewrite, forge, re-hash or truncate the chain undetected.
   ``tracerag audit verify`` uses it to check keyed entries. Unset: unkeyed SHA-256 chain.

.. envvar:: TRACERAG_CALIBRATION

   A calibration file written by ``tracerag calibrate``; pipelines built without ``combiner=``
   use it. Unset: the ``heuristic-v1`` combiner.

.. envvar:: TRACERAG_CAPTURE_CONTENT

   Whether spans carry content (questions, prompts, answers, materials): ``true`` (default),
   ``false`` or ``redact``.

.. envvar:: TRACERAG_CAPTURE_MAX_CHARS

   The longest content attribute tracerag puts on a span, in characters (default 8192; ``0``:
   no cap of tracerag's own). ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`` lowers it. A cut value ends
   with ``…[truncated N chars]``.

.. envvar:: TRACERAG_OTLP_MAX_BATCH_BYTES

   The largest OTLP export request tracerag's own exporters send, in bytes (default 3 MiB, under
   the 4 MiB gRPC default of receivers such as Jaeger); larger batches are split.

.. envvar:: TRACERAG_EXPORT_SHUTDOWN_TIMEOUT

   Seconds tracerag's own providers may take to flush and shut down at exit (default 2); what is
   not exported by then is counted as dropped.

.. envvar:: TRACERAG_TRACE_UI

   The trace viewer that links point to: ``jaeger``, ``tempo`` or ``phoenix``, optionally
   ``=BASE_URL`` (``jaeger=http://127.0.0.1:16686``). Used by ``tracerag demo``, ``tracerag
   serve`` and the review desk.

.. envvar:: TRACERAG_PROMETHEUS_PORT / TRACERAG_PROMETHEUS_ADDR

   Serve ``/metrics`` for Prometheus on this port and address (default address 127.0.0.1),
   when metrics are configured by tracerag's own ``configure_metrics()``.

.. envvar:: TRACERAG_MINILM_MODEL / TRACERAG_MINILM_TOKENIZER

   Paths to the MiniLM ONNX model and ``tokenizer.json`` for the embeddings support backend.
   Unset: the files shipped by the ``embeddings`` extra's packages.

.. envvar:: TRACERAG_MODEL

   The chat model ``tracerag serve`` and ``tracerag replay`` build: ``extractive`` (default)
   or ``local``.

.. envvar:: TRACERAG_API_KEY

   ``tracerag serve``: the key callers send as ``Authorization: Bearer …`` to the answer API.
   Unset: the answer API is open (bind it to 127.0.0.1 only).

.. envvar:: TRACERAG_REVIEWER_TOKEN

   ``tracerag serve``: the review desk's shared sign-in token.

.. envvar:: TRACERAG_REVIEWERS_FILE

   ``tracerag serve``: a file of named reviewer tokens, stored as SHA-256 hashes (``tracerag serve
   --hash-token NAME`` prints a line for it); the name a reviewer signs in with is audited.

.. envvar:: TRACERAG_OPERATOR_TOKEN

   ``tracerag materials`` changes (edit, approve, reject, quarantine, restore, delete,
   rollback-batch): the operator's own named token. The change is recorded under the name the
   token belongs to; without a known token the change is refused.

.. envvar:: TRACERAG_OPERATORS_FILE

   The operators' named tokens (same format as the reviewers file). Unset: the reviewers file.

.. envvar:: TRACERAG_CORS_ORIGINS

   ``tracerag serve``: comma-separated exact origins (``https://app.example.com``) whose pages
   may call the answer API from a browser. Unset: no cross-origin calls.

.. envvar:: TRACERAG_DECISION_WEBHOOK

   ``tracerag serve``: a URL that receives every reviewer decision as JSON.

.. envvar:: TRACERAG_FORWARDED_ALLOW_IPS

   ``tracerag serve``: comma-separated addresses (or ``*``) of the reverse proxies whose
   ``X-Forwarded-For`` / ``X-Forwarded-Proto`` headers are believed. Unset: none are; the
   client address is the TCP peer's.
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
    "reviewer_token": "TRACERAG_REVIEWER_TOKEN",
    "reviewers_file": "TRACERAG_REVIEWERS_FILE",
    "operator_token": "TRACERAG_OPERATOR_TOKEN",
    "operators_file": "TRACERAG_OPERATORS_FILE",
    "cors_origins": "TRACERAG_CORS_ORIGINS",
    "decision_webhook": "TRACERAG_DECISION_WEBHOOK",
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
    reviewer_token: str | None = None
    reviewers_file: str | None = None
    operator_token: str | None = field(default=None, repr=False)  # a secret
    operators_file: str | None = None
    cors_origins: str | None = None
    decision_webhook: str | None = None

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
