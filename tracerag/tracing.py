"""Where tracerag's spans go, how much content they carry, and how to open them in a trace UI.

Provider choice, in order:

1. the ``tracer_provider`` passed to ``get_tracer`` (and so to ``RAGPipeline``);
2. the provider made by ``configure(...)``, if the application called it;
3. a TracerProvider the application installed globally (``trace.set_tracer_provider``);
4. a provider built once from the standard environment variables (``configure_from_env``):
   ``OTEL_TRACES_EXPORTER`` (``otlp``, ``console``, ``none``), ``OTEL_EXPORTER_OTLP_ENDPOINT`` /
   ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, ``OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL``
   (``http/protobuf`` or ``grpc``), ``OTEL_EXPORTER_OTLP_(TRACES_)HEADERS``, ``_TIMEOUT``,
   ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_BSP_*``.
   When none of them names an exporter, spans are still real SDK spans (trace ids exist and
   appear on every Response) but nothing is exported; one warning (logger
   ``tracerag.tracing``) says so.

Every exporter tracerag sets up sits behind a batch processor, so a slow or unreachable
collector never delays a request. Spans that could not be delivered (failed exports, a full
batch queue, spans ended after shutdown) are counted: ``dropped_spans()`` in process and the
``tracerag.spans.dropped`` metric.

Content capture (``TRACERAG_CAPTURE_CONTENT`` or ``set_capture_content``): ``true`` keeps prompt,
answer and material text on spans, ``false`` omits it, ``redact`` masks personal data with the
redactor (``set_redactor``; ``default_redactor`` when none is set). Ids, scores and verdicts are
never affected. A redactor installed with ``set_redactor`` applies in ``true`` mode as well.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Literal
from urllib.parse import quote, urlsplit

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace import TracerProvider as SDKTracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import Tracer, TracerProvider

from tracerag import __version__

logger = logging.getLogger(__name__)

INSTRUMENTATION_NAME = "tracerag"
DEFAULT_SERVICE_NAME = "tracerag"
CAPTURE_ENV = "TRACERAG_CAPTURE_CONTENT"  # "true" (default) | "false" | "redact"
CaptureMode = Literal["true", "false", "redact"]
Protocol = Literal["http/protobuf", "grpc"]

_lock = threading.Lock()
_configured: TracerProvider | None = None  # made by configure() (explicit) or from the env
_explicit = False
_redactor: Callable[[str], str] | None = None
_capture_override: CaptureMode | None = None
_default_notice_logged = False
_dropped = 0
_dropped_lock = threading.Lock()


# ---------------------------------------------------------------------------------------------
# Provider selection


def _user_provider() -> TracerProvider | None:
    provider = trace.get_tracer_provider()
    if (
        isinstance(provider, trace.ProxyTracerProvider)
        or type(provider).__name__ == "NoOpTracerProvider"
    ):
        return None
    return provider


def get_tracer(tracer_provider: TracerProvider | None = None) -> Tracer:
    """The tracer tracerag's spans are made with (see the module docstring for the order)."""
    global _configured
    provider = tracer_provider
    if provider is None and _explicit:
        provider = _configured
    if provider is None:
        provider = _user_provider()
    if provider is None:
        with _lock:
            if _configured is None:
                _configured = configure_from_env()
            provider = _configured
    return provider.get_tracer(INSTRUMENTATION_NAME, __version__)


def default_provider() -> TracerProvider | None:
    """The provider tracerag made itself (by ``configure`` or from the env), if any yet."""
    return _configured


def force_flush(timeout_millis: int = 30_000) -> bool:
    """Export what tracerag's own provider still holds; True when there was nothing to fail."""
    provider = _configured
    if provider is None or not hasattr(provider, "force_flush"):
        return True
    return bool(provider.force_flush(timeout_millis))


def _env(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value is not None and value.strip():
            return value.strip()
    return None


def _env_exporters() -> list[str] | None:
    """The trace exporters the environment asks for, or None when it does not say."""
    names = _env("OTEL_TRACES_EXPORTER")
    if names is not None:
        return [n.strip().lower() for n in names.split(",") if n.strip()]
    if _env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        return ["otlp"]
    return None


def configure_from_env() -> TracerProvider:
    """A TracerProvider built from the standard OTEL_* variables (batch processor per exporter).

    With no exporter named by the environment the provider records spans (so trace ids exist)
    but exports none; this is logged once.
    """
    global _default_notice_logged
    wanted = _env_exporters()
    if wanted is None:
        if not _default_notice_logged:
            _default_notice_logged = True
            logger.warning(
                "tracerag: no TracerProvider was set and no OTLP endpoint is configured "
                "(OTEL_EXPORTER_OTLP_ENDPOINT); spans get trace ids but are not exported. "
                "Call tracerag.tracing.configure(endpoint=...) or set the OTEL_* variables."
            )
        return _build_provider(otlp=False)
    unknown = [n for n in wanted if n not in {"otlp", "console", "none"}]
    if unknown:
        logger.warning("tracerag: unsupported OTEL_TRACES_EXPORTER value(s) %s ignored", unknown)
    return _build_provider(otlp="otlp" in wanted, console="console" in wanted)


def configure(
    endpoint: str | None = None,
    *,
    protocol: Protocol | str | None = None,
    headers: Mapping[str, str] | str | None = None,
    service_name: str | None = None,
    resource_attributes: Mapping[str, Any] | None = None,
    console: bool = False,
    file: str | os.PathLike[str] | IO[str] | None = None,
    otlp: bool | None = None,
    timeout: float | None = None,
    max_queue_size: int | None = None,
    schedule_delay_millis: float | None = None,
    set_global: bool = False,
) -> SDKTracerProvider:
    """Make (and use from now on) a TracerProvider exporting tracerag's spans.

    ``endpoint``: OTLP endpoint; for ``http/protobuf`` a base URL (``http://host:4318``, the
    ``/v1/traces`` path is added) or a full URL with a path, for ``grpc`` ``http://host:4317``.
    Anything left as None falls back to the ``OTEL_*`` variables. ``headers`` as a mapping or
    the ``k=v,k2=v2`` form. ``console`` prints spans to stderr; ``file`` appends one JSON span
    per line to a path or text stream. ``otlp`` defaults to True unless only ``console`` or
    ``file`` was asked for. ``timeout`` is the per-export timeout in seconds. ``set_global``
    also installs the provider as the OpenTelemetry global one.
    """
    global _configured, _explicit
    if otlp is None:
        otlp = (
            endpoint is not None
            or _env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT") is not None
            or not (console or file is not None)
        )
    provider = _build_provider(
        otlp=otlp,
        endpoint=endpoint,
        protocol=protocol,
        headers=headers,
        service_name=service_name,
        resource_attributes=resource_attributes,
        console=console,
        file=file,
        timeout=timeout,
        max_queue_size=max_queue_size,
        schedule_delay_millis=schedule_delay_millis,
    )
    with _lock:
        _configured = provider
        _explicit = True
    if set_global:
        trace.set_tracer_provider(provider)
    return provider


def reset_for_tests() -> None:
    """Shut down and forget tracerag's own TracerProvider and capture settings (test isolation)."""
    global _configured, _explicit, _capture_override, _redactor, _default_notice_logged
    with _lock:
        provider, _configured, _explicit = _configured, None, False
    if provider is not None and hasattr(provider, "shutdown"):
        provider.shutdown()
    _capture_override = None
    _redactor = None
    _default_notice_logged = False


def make_resource(
    service_name: str | None = None, attributes: Mapping[str, Any] | None = None
) -> Any:
    """The SDK Resource for tracerag's providers: OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME,
    then the given values; ``service.name`` falls back to ``tracerag``."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    attrs: dict[str, Any] = dict(attributes or {})
    if service_name:
        attrs[SERVICE_NAME] = service_name
    resource = Resource.create(attrs)
    name = str(resource.attributes.get(SERVICE_NAME, ""))
    if not name or name.startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    return resource


def _protocol(protocol: str | None) -> str:
    value = (
        protocol
        or _env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).lower()
    if value in {"http", "http/protobuf", "http/proto"}:
        return "http/protobuf"
    if value == "grpc":
        return "grpc"
    raise ValueError(f"unsupported OTLP protocol {value!r}: use 'http/protobuf' or 'grpc'")


def _parse_headers(headers: Mapping[str, str] | str | None) -> dict[str, str] | None:
    if headers is None:
        return None
    if isinstance(headers, str):
        from urllib.parse import unquote

        out: dict[str, str] = {}
        for part in headers.split(","):
            if "=" in part:
                key, value = part.split("=", 1)
                out[unquote(key.strip()).lower()] = unquote(value.strip())
        return out
    return {str(k): str(v) for k, v in headers.items()}


def otlp_span_exporter(
    endpoint: str | None = None,
    *,
    protocol: Protocol | str | None = None,
    headers: Mapping[str, str] | str | None = None,
    timeout: float | None = None,
) -> SpanExporter:
    """An OTLP span exporter (HTTP or gRPC); unset arguments come from the OTEL_* variables."""
    proto = _protocol(protocol)
    kwargs: dict[str, Any] = {}
    parsed_headers = _parse_headers(headers)
    if parsed_headers is not None:
        kwargs["headers"] = parsed_headers
    if timeout is not None:
        kwargs["timeout"] = timeout
    if proto == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter(endpoint=endpoint, **kwargs)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    if endpoint is not None:
        endpoint = _http_traces_url(endpoint)
    return HttpExporter(endpoint=endpoint, **kwargs)


def _http_traces_url(endpoint: str) -> str:
    parts = urlsplit(endpoint)
    if parts.path in {"", "/"}:
        return endpoint.rstrip("/") + "/v1/traces"
    return endpoint


def _build_provider(
    *,
    otlp: bool,
    endpoint: str | None = None,
    protocol: str | None = None,
    headers: Mapping[str, str] | str | None = None,
    service_name: str | None = None,
    resource_attributes: Mapping[str, Any] | None = None,
    console: bool = False,
    file: str | os.PathLike[str] | IO[str] | None = None,
    timeout: float | None = None,
    max_queue_size: int | None = None,
    schedule_delay_millis: float | None = None,
) -> SDKTracerProvider:
    provider = SDKTracerProvider(resource=make_resource(service_name, resource_attributes))
    exporters: list[SpanExporter] = []
    if otlp:
        exporters.append(
            otlp_span_exporter(endpoint, protocol=protocol, headers=headers, timeout=timeout)
        )
    if console:
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        exporters.append(ConsoleSpanExporter())
    if file is not None:
        exporters.append(JsonLinesSpanExporter(file))
    for exporter in exporters:
        provider.add_span_processor(
            batch_processor(
                exporter,
                max_queue_size=max_queue_size,
                schedule_delay_millis=schedule_delay_millis,
            )
        )
    return provider


# ---------------------------------------------------------------------------------------------
# Export that never blocks and counts what it loses


def dropped_spans() -> int:
    """How many spans this process failed to deliver through tracerag's processors."""
    return _dropped


def _count_dropped(count: int, reason: str) -> None:
    global _dropped
    if count <= 0:
        return
    with _dropped_lock:
        _dropped += count
    try:
        from tracerag import metrics

        metrics.record_spans_dropped(count, reason)
    except Exception:  # metrics must never break export
        logger.debug("tracerag: could not record dropped spans", exc_info=True)


class DropCountingSpanExporter(SpanExporter):
    """Wraps an exporter; spans of a failed or raising export are counted as dropped."""

    def __init__(self, exporter: SpanExporter) -> None:
        self.exporter = exporter

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.exporter.export(spans)
        except Exception:
            logger.warning(
                "tracerag: span export raised; %d spans dropped", len(spans), exc_info=True
            )
            _count_dropped(len(spans), "export_failed")
            return SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            _count_dropped(len(spans), "export_failed")
        return result

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.exporter.force_flush(timeout_millis)


class DropCountingBatchSpanProcessor(BatchSpanProcessor):
    """A BatchSpanProcessor that also counts spans lost to a full queue or to shutdown."""

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is not None and span.context.trace_flags.sampled:
            inner = getattr(self, "_batch_processor", None)
            queue = getattr(inner, "_queue", None)
            if getattr(inner, "_shutdown", False):
                _count_dropped(1, "shutdown")
            elif queue is not None and queue.maxlen is not None and len(queue) >= queue.maxlen:
                _count_dropped(1, "queue_full")
        super().on_end(span)


def batch_processor(
    exporter: SpanExporter,
    *,
    max_queue_size: int | None = None,
    schedule_delay_millis: float | None = None,
    max_export_batch_size: int | None = None,
) -> BatchSpanProcessor:
    """A batch processor around ``exporter`` that counts every span it cannot deliver.

    Use it to add tracerag's drop accounting to a TracerProvider of your own.
    """
    if max_export_batch_size is None and max_queue_size is not None:
        default_batch = int(os.environ.get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "512"))
        max_export_batch_size = min(default_batch, max_queue_size)
    return DropCountingBatchSpanProcessor(
        DropCountingSpanExporter(exporter),
        max_queue_size=max_queue_size,
        schedule_delay_millis=schedule_delay_millis,
        max_export_batch_size=max_export_batch_size,
    )


class JsonLinesSpanExporter(SpanExporter):
    """Appends each span as one line of JSON (the SDK's ``to_json`` form) to a file or stream."""

    def __init__(self, target: str | os.PathLike[str] | IO[str]) -> None:
        self._lock = threading.Lock()
        if isinstance(target, (str, os.PathLike)):
            self._stream: IO[str] = Path(target).open("a", encoding="utf-8")  # noqa: SIM115
            self._owned = True
        else:
            self._stream = target
            self._owned = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(
            json.dumps(json.loads(s.to_json()), ensure_ascii=False) + "\n" for s in spans
        )
        with self._lock:
            self._stream.write(lines)
            self._stream.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        if self._owned:
            with self._lock:
                self._stream.close()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


class PhoenixEvaluationExporter(SpanExporter):
    """Sends tracerag's evaluations to Arize Phoenix as span annotations (REST API).

    Each ``gen_ai.evaluation.result`` event (citation validity, self-consistency, ...) becomes
    an annotation of its span, and each ``tracerag.request`` root gets a ``confidence``
    annotation (score = confidence, label = decision), so they show in Phoenix's evaluation
    columns. Spans themselves still go to Phoenix over OTLP; add both to the provider.
    """

    def __init__(
        self,
        base_url: str = "http://localhost:6006",
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float = 5.0,
    ) -> None:
        self.url = base_url.rstrip("/") + "/v1/span_annotations"
        self.headers = {"Content-Type": "application/json", **dict(headers or {})}
        self.timeout = timeout

    @staticmethod
    def annotations(spans: Sequence[ReadableSpan]) -> list[dict[str, Any]]:
        """The Phoenix span-annotation records for ``spans``."""
        from tracerag import semconv

        out: list[dict[str, Any]] = []
        for span in spans:
            if span.context is None:
                continue
            span_id = f"{span.context.span_id:016x}"
            attrs = dict(span.attributes or {})
            metadata = {}
            if semconv.REQUEST_ID in attrs:
                metadata["request_id"] = attrs[semconv.REQUEST_ID]
            for event in span.events:
                if event.name != semconv.GENAI_EVALUATION_EVENT:
                    continue
                ev = dict(event.attributes or {})
                name = ev.get(semconv.GENAI_EVALUATION_NAME)
                if not name:
                    continue
                result: dict[str, Any] = {}
                score = ev.get(semconv.GENAI_EVALUATION_SCORE_VALUE)
                if isinstance(score, (int, float)) and not isinstance(score, bool):
                    result["score"] = float(score)
                if ev.get(semconv.GENAI_EVALUATION_SCORE_LABEL) is not None:
                    result["label"] = str(ev[semconv.GENAI_EVALUATION_SCORE_LABEL])
                if ev.get(semconv.GENAI_EVALUATION_EXPLANATION) is not None:
                    result["explanation"] = str(ev[semconv.GENAI_EVALUATION_EXPLANATION])
                out.append(
                    {
                        "span_id": span_id,
                        "name": str(name),
                        "annotator_kind": "CODE",
                        "result": result,
                        "metadata": metadata,
                        "identifier": "tracerag",
                    }
                )
            if span.name == semconv.SPAN_REQUEST and semconv.CONFIDENCE in attrs:
                result = {"score": float(attrs[semconv.CONFIDENCE])}  # type: ignore[arg-type]
                if semconv.DECISION in attrs:
                    result["label"] = str(attrs[semconv.DECISION])
                out.append(
                    {
                        "span_id": span_id,
                        "name": "confidence",
                        "annotator_kind": "CODE",
                        "result": result,
                        "metadata": metadata,
                        "identifier": "tracerag",
                    }
                )
        return out

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        import urllib.request

        records = self.annotations(spans)
        if not records:
            return SpanExportResult.SUCCESS
        body = json.dumps({"data": records}).encode()
        request = urllib.request.Request(self.url, data=body, headers=self.headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                ok = 200 <= response.status < 300
        except Exception as exc:
            logger.warning("tracerag: Phoenix annotations failed: %s", exc)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def phoenix_evaluations(
    base_url: str = "http://localhost:6006", *, headers: Mapping[str, str] | None = None
) -> BatchSpanProcessor:
    """A span processor that sends evaluations to Phoenix as annotations (add it to a provider)."""
    return BatchSpanProcessor(PhoenixEvaluationExporter(base_url, headers=headers))


# ---------------------------------------------------------------------------------------------
# Content capture


def set_capture_content(mode: bool | str | None) -> None:
    """Set the capture policy in code (True/"true", False/"false", "redact"); None: use env."""
    global _capture_override
    if mode is None:
        _capture_override = None
        return
    _capture_override = _normalise_mode(mode, strict=True)


def capture_content_mode() -> CaptureMode:
    """The capture policy in force: "true", "false" or "redact"."""
    if _capture_override is not None:
        return _capture_override
    return _normalise_mode(os.environ.get(CAPTURE_ENV, "true"), strict=False)


def _normalise_mode(mode: bool | str, *, strict: bool) -> CaptureMode:
    if isinstance(mode, bool):
        return "true" if mode else "false"
    value = str(mode).strip().lower()
    if value in {"true", "1", "yes", "on", "full", ""}:
        return "true"
    if value in {"false", "0", "no", "off", "omit", "none"}:
        return "false"
    if value in {"redact", "redacted", "mask"}:
        return "redact"
    if strict:
        raise ValueError(f"capture mode must be true, false or redact, not {mode!r}")
    logger.warning("tracerag: %s=%r not understood; omitting content", CAPTURE_ENV, mode)
    return "false"


def set_redactor(redactor: Callable[[str], str] | None) -> None:
    """Install a function applied to all captured text (e.g. to mask personal data)."""
    global _redactor
    _redactor = redactor


def capture(text: str | None) -> str | None:
    """Text as it may appear on a span under the capture policy, or None when it is omitted."""
    if text is None:
        return None
    mode = capture_content_mode()
    if mode == "false":
        return None
    if _redactor is not None:
        return _redactor(text)
    if mode == "redact":
        return default_redactor(text)
    return text


def capture_enabled() -> bool:
    """Whether any content (possibly redacted) goes onto spans."""
    return capture_content_mode() != "false"


_CN_ID = re.compile(
    r"(?<![0-9A-Za-z])[1-9]\d{5}(?:18|19|20)\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])\d{3}"
    r"[\dXx](?![0-9A-Za-z])"
)
_EMAIL = re.compile(r"(?<![\w.+-])[\w.+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
_CARD = re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])")
_CN_MOBILE = re.compile(r"(?<![\d+])(?:(?:\+|00)86[ -]?)?1[3-9]\d(?:[ -]?\d{4}){2}(?!\d)")
_PHONE_INTL = re.compile(r"(?<![\w+])\+\d{1,3}(?:[ .-]?\(?\d{1,4}\)?){2,5}(?!\d)")
_PHONE_LOCAL = re.compile(r"(?<!\d)(?:\(\d{2,4}\)[ .-]?|\d{3,4}[ .-])\d{3,4}[ .-]\d{4}(?!\d)")

REDACTION_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("[EMAIL]", _EMAIL),
    ("[ID_NUMBER]", _CN_ID),
    ("[PHONE]", _CN_MOBILE),
    ("[CARD_NUMBER]", _CARD),
    ("[PHONE]", _PHONE_INTL),
    ("[PHONE]", _PHONE_LOCAL),
)


def default_redactor(text: str) -> str:
    """Mask e-mail addresses, Chinese ID numbers, phone numbers (incl. Chinese mobiles) and
    card-like numbers (13-19 digits, spaces or dashes allowed) with ``[EMAIL]``,
    ``[ID_NUMBER]``, ``[PHONE]`` and ``[CARD_NUMBER]``."""
    for token, pattern in REDACTION_PATTERNS:
        text = pattern.sub(token, text)
    return text


# ---------------------------------------------------------------------------------------------
# OpenInference helpers for stages (content under the capture policy)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str, sort_keys=True)


def set_span_io(
    span: Any,
    input: str | Mapping[str, Any] | None = None,
    output: str | Mapping[str, Any] | None = None,
) -> None:
    """Set OpenInference ``input.value`` / ``output.value`` (with mime types) on a span, as the
    capture policy allows; mappings are sent as JSON."""
    from tracerag import semconv

    for value, key, mime_key in (
        (input, semconv.OI_INPUT_VALUE, semconv.OI_INPUT_MIME),
        (output, semconv.OI_OUTPUT_VALUE, semconv.OI_OUTPUT_MIME),
    ):
        if value is None:
            continue
        is_json = not isinstance(value, str)
        text = capture(_json(value) if is_json else value)  # type: ignore[arg-type]
        if text is None:
            continue
        span.set_attribute(key, text)
        span.set_attribute(mime_key, "application/json" if is_json else "text/plain")


def set_span_metadata(span: Any, metadata: Mapping[str, Any]) -> None:
    """Set OpenInference ``metadata`` (JSON): ids, versions, tier; never prompt or answer text."""
    from tracerag import semconv

    span.set_attribute(semconv.OI_METADATA, _json(dict(metadata)))


def set_prompt_template(
    span: Any,
    version: str | None,
    template: str | None = None,
    variables: Mapping[str, Any] | None = None,
) -> None:
    """Set OpenInference ``llm.prompt_template.*``; template and variables under capture."""
    from tracerag import semconv

    if version:
        span.set_attribute(semconv.OI_PROMPT_TEMPLATE_VERSION, version)
    if template is not None:
        text = capture(template)
        if text is not None:
            span.set_attribute(semconv.OI_PROMPT_TEMPLATE, text)
    if variables is not None:
        text = capture(_json(dict(variables)))
        if text is not None:
            span.set_attribute(semconv.OI_PROMPT_TEMPLATE_VARIABLES, text)


# ---------------------------------------------------------------------------------------------
# Links into trace UIs

Backend = Literal["jaeger", "tempo", "phoenix"]
DEFAULT_BASE_URLS = {
    "jaeger": "http://localhost:16686",
    "tempo": "http://localhost:3000",
    "phoenix": "http://localhost:6006",
}


def format_trace_id(trace_id: str | int) -> str:
    """A trace id as 32 lower-case hex digits."""
    if isinstance(trace_id, int):
        return f"{trace_id:032x}"
    value = trace_id.strip().lower()
    value = value.removeprefix("0x")
    if not re.fullmatch(r"[0-9a-f]{1,32}", value):
        raise ValueError(f"not a trace id: {trace_id!r}")
    return value.rjust(32, "0")


def trace_link(
    trace_id: str | int,
    backend: Backend | str = "jaeger",
    base_url: str | None = None,
    *,
    datasource_uid: str = "tempo",
    org_id: int = 1,
    time_range: tuple[str, str] = ("now-1h", "now"),
    project: str | None = None,
) -> str:
    """A URL that opens one trace in a trace UI.

    - ``jaeger``: ``{base}/trace/{trace_id}`` (base default ``http://localhost:16686``);
    - ``tempo``: Grafana Explore on the Tempo datasource ``datasource_uid`` with the trace id
      as the TraceQL query (``{base}/explore?schemaVersion=1&panes=...&orgId=1``; base default
      ``http://localhost:3000``);
    - ``phoenix``: ``{base}/redirects/traces/{trace_id}`` (Phoenix finds the project; base
      default ``http://localhost:6006``), or ``{base}/projects/{project}/traces/{trace_id}``
      when the Phoenix ``project`` id is given.
    """
    tid = format_trace_id(trace_id)
    backend = backend.lower()
    if backend not in DEFAULT_BASE_URLS:
        raise ValueError(f"unknown trace backend {backend!r}: jaeger, tempo or phoenix")
    base = (base_url or DEFAULT_BASE_URLS[backend]).rstrip("/")
    if backend == "jaeger":
        return f"{base}/trace/{tid}"
    if backend == "phoenix":
        if project:
            return f"{base}/projects/{quote(project, safe='')}/traces/{tid}"
        return f"{base}/redirects/traces/{tid}"
    panes = {
        "t": {
            "datasource": datasource_uid,
            "queries": [
                {
                    "refId": "A",
                    "datasource": {"type": "tempo", "uid": datasource_uid},
                    "queryType": "traceql",
                    "limit": 20,
                    "query": tid,
                }
            ],
            "range": {"from": time_range[0], "to": time_range[1]},
        }
    }
    encoded = quote(json.dumps(panes, separators=(",", ":")), safe="")
    return f"{base}/explore?schemaVersion=1&panes={encoded}&orgId={org_id}"
