"""tracerag's metric instruments and what a request records into them (never raising)."""

from __future__ import annotations

import logging
import math
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry.metrics import Meter, MeterProvider

from tracerag import __version__, semconv
from tracerag.telemetry.meters import INSTRUMENTATION_NAME, get_meter_provider

if TYPE_CHECKING:
    from tracerag.context import RequestContext

logger = logging.getLogger("tracerag.metrics")

RATIO_BUCKETS: tuple[float, ...] = (
    0.1,
    0.2,
    0.3,
    0.4,
    0.5,
    0.6,
    0.7,
    0.8,
    0.85,
    0.9,
    0.95,
    1.0,
)
STAGE_SECONDS_BUCKETS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    30.0,
)
REQUEST_SECONDS_BUCKETS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    30.0,
    60.0,
    120.0,
)
SAMPLES_BUCKETS: tuple[float, ...] = (0, 1, 2, 3, 4, 5, 6, 8, 10, 15, 20)

_lock = threading.Lock()


@dataclass
class _Instruments:
    requests: Any
    confidence: Any
    request_duration: Any
    stage_duration: Any
    samples: Any
    coverage: Any
    accuracy: Any
    fabricated: Any
    retries: Any
    model_errors: Any
    audit_failures: Any
    audit_dropped: Any
    spans_dropped: Any


def _histogram(
    meter: Meter, name: str, unit: str, description: str, buckets: Sequence[float]
) -> Any:
    try:
        return meter.create_histogram(
            name,
            unit=unit,
            description=description,
            explicit_bucket_boundaries_advisory=list(buckets),
        )
    except TypeError:  # an API without advisory parameters
        return meter.create_histogram(name, unit=unit, description=description)


def _make_instruments(meter: Meter) -> _Instruments:
    return _Instruments(
        requests=meter.create_counter(
            semconv.METRIC_REQUESTS,
            unit="{request}",
            description="Requests answered, by routing decision and tier",
        ),
        confidence=_histogram(
            meter,
            semconv.METRIC_CONFIDENCE,
            "1",
            "Confidence of answered requests",
            RATIO_BUCKETS,
        ),
        request_duration=_histogram(
            meter,
            semconv.METRIC_REQUEST_DURATION,
            "s",
            "Whole-request duration",
            REQUEST_SECONDS_BUCKETS,
        ),
        stage_duration=_histogram(
            meter,
            semconv.METRIC_STAGE_DURATION,
            "s",
            "Duration of each pipeline stage",
            STAGE_SECONDS_BUCKETS,
        ),
        samples=_histogram(
            meter,
            semconv.METRIC_SAMPLES,
            "{sample}",
            "Samples drawn per request",
            SAMPLES_BUCKETS,
        ),
        coverage=_histogram(
            meter,
            semconv.METRIC_CITATION_COVERAGE,
            "1",
            "Share of answer claims carrying a citation",
            RATIO_BUCKETS,
        ),
        accuracy=_histogram(
            meter,
            semconv.METRIC_CITATION_ACCURACY,
            "1",
            "Share of citations supported by the cited material",
            RATIO_BUCKETS,
        ),
        fabricated=meter.create_counter(
            semconv.METRIC_FABRICATED,
            unit="{citation}",
            description="Citations of material that was not retrieved",
        ),
        retries=meter.create_counter(
            semconv.METRIC_RETRIES,
            unit="{retry}",
            description="Model call retries, by stage and error type",
        ),
        model_errors=meter.create_counter(
            semconv.METRIC_MODEL_ERRORS,
            unit="{error}",
            description="Model calls that failed after retries, by stage and error type",
        ),
        audit_failures=meter.create_counter(
            semconv.METRIC_AUDIT_FAILURES,
            unit="{failure}",
            description="Failed attempts to persist an audit record",
        ),
        audit_dropped=meter.create_counter(
            semconv.METRIC_AUDIT_DROPPED,
            unit="{record}",
            description="Audit records given up on",
        ),
        spans_dropped=meter.create_counter(
            semconv.METRIC_SPANS_DROPPED,
            unit="{span}",
            description="Spans that could not be exported (failed export, full queue, shutdown)",
        ),
    )


_instrument_cache: weakref.WeakKeyDictionary[Any, _Instruments] = weakref.WeakKeyDictionary()


def _instruments(meter_provider: MeterProvider | None) -> _Instruments:
    provider = get_meter_provider(meter_provider)
    with _lock:
        found = _instrument_cache.get(provider)
        if found is None:
            found = _make_instruments(provider.get_meter(INSTRUMENTATION_NAME, __version__))
            _instrument_cache[provider] = found
    return found


# ---------------------------------------------------------------------------------------------
# What the pipeline records


def _label(value: Any, default: str = "none") -> str:
    if value is None:
        return default
    value = getattr(value, "value", value)  # enums
    text = str(value).strip()
    return text or default


def _ratio(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    if math.isnan(number) or math.isinf(number):
        return None
    return min(1.0, max(0.0, number))


def _field(obj: Any, name: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _error_type(error: BaseException | str | None) -> str:
    if error is None:
        return "none"
    if isinstance(error, BaseException):
        return type(error).__name__
    return str(error) or "error"


def record_request(ctx: RequestContext, *, meter_provider: MeterProvider | None = None) -> None:
    """Record one finished request: decision, confidence, durations, samples and citations."""
    try:
        inst = _instruments(meter_provider)
        tier = _label(getattr(ctx, "tier", None))
        decision = _label(getattr(ctx, "decision", None))
        attrs = {semconv.METRIC_ATTR_DECISION: decision, semconv.METRIC_ATTR_TIER: tier}
        tier_only = {semconv.METRIC_ATTR_TIER: tier}
        inst.requests.add(1, attrs)
        confidence = _ratio(getattr(ctx, "confidence", None))
        if confidence is not None:
            inst.confidence.record(confidence, attrs)
        timings = getattr(ctx, "timings", None) or {}
        for stage, seconds in dict(timings).items():
            try:
                value = float(seconds)
            except (TypeError, ValueError):
                continue
            if math.isnan(value) or value < 0:
                continue
            if stage == "request":
                inst.request_duration.record(value, attrs)
            else:
                inst.stage_duration.record(
                    value, {semconv.METRIC_ATTR_STAGE: str(stage), semconv.METRIC_ATTR_TIER: tier}
                )
        samples = getattr(ctx, "samples", None)
        if samples is not None:
            inst.samples.record(len(samples), tier_only)
        signals = getattr(ctx, "signals", None) or {}
        citations = signals.get("citations") if isinstance(signals, Mapping) else None
        if citations is not None:
            coverage = _ratio(_field(citations, "coverage"))
            if coverage is not None:
                inst.coverage.record(coverage, tier_only)
            accuracy = _ratio(_field(citations, "accuracy"))
            if accuracy is not None:
                inst.accuracy.record(accuracy, tier_only)
            fabricated = _field(citations, "fabricated")
            count = 0
            if isinstance(fabricated, (int, float)) and not isinstance(fabricated, bool):
                count = int(fabricated)
            elif fabricated is not None:
                try:
                    count = len(fabricated)
                except TypeError:
                    count = 0
            inst.fabricated.add(max(0, count), tier_only)
    except Exception:
        logger.warning("tracerag: could not record request metrics", exc_info=True)


def record_retry(
    stage: str, error: BaseException, *, meter_provider: MeterProvider | None = None
) -> None:
    """Count one retried model call in ``stage``."""
    try:
        _instruments(meter_provider).retries.add(
            1,
            {
                semconv.METRIC_ATTR_STAGE: _label(stage),
                semconv.METRIC_ATTR_ERROR_TYPE: _error_type(error),
            },
        )
    except Exception:
        logger.warning("tracerag: could not record a retry", exc_info=True)


def record_model_error(
    stage: str, error: BaseException, *, meter_provider: MeterProvider | None = None
) -> None:
    """Count one model call in ``stage`` that failed for good."""
    try:
        _instruments(meter_provider).model_errors.add(
            1,
            {
                semconv.METRIC_ATTR_STAGE: _label(stage),
                semconv.METRIC_ATTR_ERROR_TYPE: _error_type(error),
            },
        )
    except Exception:
        logger.warning("tracerag: could not record a model error", exc_info=True)


def record_audit_failure(
    reason: str, dropped: bool = False, *, meter_provider: MeterProvider | None = None
) -> None:
    """Count a failed audit persist; ``dropped`` when the record was given up on."""
    try:
        inst = _instruments(meter_provider)
        attrs = {semconv.METRIC_ATTR_REASON: _label(reason, "unknown")}
        inst.audit_failures.add(1, attrs)
        if dropped:
            inst.audit_dropped.add(1, attrs)
    except Exception:
        logger.warning("tracerag: could not record an audit failure", exc_info=True)


def record_spans_dropped(
    count: int, reason: str, *, meter_provider: MeterProvider | None = None
) -> None:
    """Count spans that could not be exported (reason: export_failed, queue_full, shutdown)."""
    if count <= 0:
        return
    try:
        _instruments(meter_provider).spans_dropped.add(
            count, {semconv.METRIC_ATTR_REASON: _label(reason, "unknown")}
        )
    except Exception:
        logger.debug("tracerag: could not record dropped spans", exc_info=True)
