"""tracerag's metric instruments and what a request records into them (never raising)."""

from __future__ import annotations

import logging
import math
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from opentelemetry.metrics import Meter, MeterProvider

from tracerag import _semconv as semconv
from tracerag._choices import Route, RouteName, Tier, TierName
from tracerag._version import __version__
from tracerag.telemetry._meters import INSTRUMENTATION_NAME, get_meter_provider

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
# a request may take longer than any one stage
REQUEST_SECONDS_BUCKETS: tuple[float, ...] = (*STAGE_SECONDS_BUCKETS, 60.0, 120.0)
SAMPLES_BUCKETS: tuple[float, ...] = (0, 1, 2, 3, 4, 5, 6, 8, 10, 15, 20)
# a queued request waits for a person: minutes to days
REVIEW_SECONDS_BUCKETS: tuple[float, ...] = (
    60.0,
    300.0,
    900.0,
    1800.0,
    3600.0,
    7200.0,
    14400.0,
    28800.0,
    86400.0,
    172800.0,
    604800.0,
)
TOKENS_PER_REQUEST_BUCKETS: tuple[float, ...] = (
    250,
    500,
    1000,
    2000,
    4000,
    8000,
    16000,
    32000,
    64000,
    128000,
)

_lock = threading.Lock()

#: What paused a turn: an interrupt the wrapped app raised itself (``app``), or
#: ``TraceragMiddleware``'s review of a withheld answer (``answer_review``).
InterruptKind = Literal["app", "answer_review"]
INTERRUPT_KINDS: frozenset[str] = frozenset({"app", "answer_review"})
#: The actions a resume is counted under (LangChain's HumanInTheLoopMiddleware decisions and
#: the answer review's); a resume whose decisions differ is ``mixed``, anything else ``other``.
RESUME_ACTIONS: frozenset[str] = frozenset({"approve", "edit", "reject", "respond"})


@dataclass(frozen=True)
class _Spec:
    """One instrument: a histogram when it has buckets, else a counter (or up-down counter)."""

    name: str
    unit: str
    description: str
    buckets: Sequence[float] = ()
    up_down: bool = False


# tracerag's instruments by the key its recorders use, in two groups each created on first use
_GROUPS: dict[str, dict[str, _Spec]] = {
    "request": {
        "requests": _Spec(
            semconv.METRIC_REQUESTS, "{request}", "Requests answered, by routing decision and tier"
        ),
        "confidence": _Spec(
            semconv.METRIC_CONFIDENCE, "1", "Confidence of answered requests", RATIO_BUCKETS
        ),
        "request_duration": _Spec(
            semconv.METRIC_REQUEST_DURATION, "s", "Whole-request duration", REQUEST_SECONDS_BUCKETS
        ),
        "stage_duration": _Spec(
            semconv.METRIC_STAGE_DURATION,
            "s",
            "Duration of each pipeline stage",
            STAGE_SECONDS_BUCKETS,
        ),
        "samples": _Spec(
            semconv.METRIC_SAMPLES, "{sample}", "Samples drawn per request", SAMPLES_BUCKETS
        ),
        "coverage": _Spec(
            semconv.METRIC_CITATION_COVERAGE,
            "1",
            "Share of answer claims carrying a citation",
            RATIO_BUCKETS,
        ),
        "accuracy": _Spec(
            semconv.METRIC_CITATION_ACCURACY,
            "1",
            "Share of citations supported by the cited material",
            RATIO_BUCKETS,
        ),
        "fabricated": _Spec(
            semconv.METRIC_FABRICATED,
            "{citation}",
            "Citations of material that was not retrieved",
        ),
        "retries": _Spec(
            semconv.METRIC_RETRIES, "{retry}", "Model call retries, by stage and error type"
        ),
        "model_errors": _Spec(
            semconv.METRIC_MODEL_ERRORS,
            "{error}",
            "Model calls that failed after retries, by stage and error type",
        ),
        "audit_failures": _Spec(
            semconv.METRIC_AUDIT_FAILURES, "{failure}", "Failed attempts to persist an audit record"
        ),
        "audit_dropped": _Spec(
            semconv.METRIC_AUDIT_DROPPED, "{record}", "Audit records given up on"
        ),
        "audit_backlog": _Spec(
            semconv.METRIC_AUDIT_BACKLOG,
            "{record}",
            "Audit records accepted and not yet stored",
            up_down=True,
        ),
        "spans_dropped": _Spec(
            semconv.METRIC_SPANS_DROPPED,
            "{span}",
            "Spans that could not be exported (failed export, full queue, shutdown)",
        ),
    },
    # The review desk: seconds from a request's queueing to its reviewer's final decision
    # (Prometheus: tracerag_review_time_to_decision_seconds_*{route, action})
    "review": {
        "time_to_decision": _Spec(
            semconv.METRIC_REVIEW_TIME_TO_DECISION,
            "s",
            "Time from a request's queueing for review to the reviewers' decision",
            REVIEW_SECONDS_BUCKETS,
        ),
    },
    # Turns paused for a person and turns resumed (Prometheus: tracerag_turns_interrupted_total
    # {kind}, tracerag_turns_resumed_total{kind, action}): interrupted minus resumed is what
    # waits, as far as the counters' window reaches
    "turns": {
        "interrupted": _Spec(
            semconv.METRIC_TURNS_INTERRUPTED,
            "{turn}",
            "Turns paused for a person (an interrupt), by kind",
        ),
        "resumed": _Spec(
            semconv.METRIC_TURNS_RESUMED,
            "{turn}",
            "Interrupted turns resumed and finished, by kind and action",
        ),
    },
    # Token usage and cost (see tracerag.usage): tokens, model calls and money per request, by
    # tier, stage, prompt and model version and decision. Prometheus: tracerag_usage_tokens_total
    # {direction="input|output"}, tracerag_usage_calls_total, tracerag_usage_cost_total (in the
    # price table's currency; only requests with a price table), and the per-request histogram
    # tracerag_usage_request_tokens_* (its _count counts requests by prompt and model version).
    # Cost per request is cost_total / requests_total; per passed answer, over requests{pass}.
    "usage": {
        "tokens": _Spec(
            semconv.METRIC_USAGE_TOKENS,
            "{token}",
            "Model tokens read (input) and written (output), by stage",
        ),
        "calls": _Spec(
            semconv.METRIC_USAGE_CALLS, "{call}", "Model calls that returned a reply, by stage"
        ),
        "cost": _Spec(
            semconv.METRIC_USAGE_COST,
            "{currency}",
            "Money spent on model calls, from the user's price table",
        ),
        "request_tokens": _Spec(
            semconv.METRIC_USAGE_REQUEST_TOKENS,
            "{token}",
            "Tokens (input + output) per request, by tier and version",
            TOKENS_PER_REQUEST_BUCKETS,
        ),
    },
}


def _create(meter: Meter, spec: _Spec) -> Any:
    if spec.buckets:
        try:
            return meter.create_histogram(
                spec.name,
                unit=spec.unit,
                description=spec.description,
                explicit_bucket_boundaries_advisory=list(spec.buckets),
            )
        except TypeError:  # an API without advisory parameters
            return meter.create_histogram(spec.name, unit=spec.unit, description=spec.description)
    create = meter.create_up_down_counter if spec.up_down else meter.create_counter
    return create(spec.name, unit=spec.unit, description=spec.description)


_instrument_cache: weakref.WeakKeyDictionary[Any, dict[str, dict[str, Any]]] = (
    weakref.WeakKeyDictionary()
)


def _instruments(meter_provider: MeterProvider | None, group: str = "request") -> dict[str, Any]:
    """The instruments of ``group`` on the provider in force, created once per provider."""
    provider = get_meter_provider(meter_provider)
    with _lock:
        groups = _instrument_cache.setdefault(provider, {})
        found = groups.get(group)
        if found is None:
            meter = provider.get_meter(INSTRUMENTATION_NAME, __version__)
            found = {key: _create(meter, spec) for key, spec in _GROUPS[group].items()}
            groups[group] = found
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


def _error_type(error: BaseException | str | None) -> str:
    if error is None:
        return "none"
    if isinstance(error, BaseException):
        return type(error).__name__
    return str(error) or "error"


@dataclass(frozen=True)
class RequestOutcome:
    """What the metrics record of one finished request (None: not measured); a request's is
    ``RequestState.outcome_fields()``, from what its stage outputs declare (``metric=``)."""

    tier: Tier | TierName | None = None
    decision: Route | RouteName | None = None
    confidence: float | None = None
    timings: Mapping[str, float] = field(default_factory=dict)
    n_samples: int | None = None
    #: why the request's sampling stopped (tracerag._adaptive.StopReason), if it was recorded
    stop_reason: str | None = None
    citation_coverage: float | None = None
    citation_accuracy: float | None = None
    #: the fabricated citation ids, or their count; None when citations were not verified
    fabricated: Sequence[str] | int | None = None
    prompt_version: str | None = None
    model_version: str | None = None


def _decision(outcome: RequestOutcome, interrupted: bool) -> str:
    """The ``decision`` label of a request: its route, ``interrupted`` (a turn paused for a
    person: neither routed nor failed), or ``none`` (failed)."""
    if interrupted:
        return semconv.INTERRUPTED
    return _label(getattr(outcome, "decision", None))


def record_request(
    outcome: RequestOutcome,
    *,
    interrupted: bool = False,
    meter_provider: MeterProvider | None = None,
) -> None:
    """Record one finished request: decision, confidence, durations, samples and citations;
    ``interrupted``: a turn paused for a person, counted under ``decision="interrupted"``."""
    try:
        inst = _instruments(meter_provider)
        tier = _label(getattr(outcome, "tier", None))
        decision = _decision(outcome, interrupted)
        attrs = {semconv.METRIC_ATTR_DECISION: decision, semconv.METRIC_ATTR_TIER: tier}
        tier_only = {semconv.METRIC_ATTR_TIER: tier}
        inst["requests"].add(1, attrs)
        confidence = _ratio(getattr(outcome, "confidence", None))
        if confidence is not None:
            inst["confidence"].record(confidence, attrs)
        timings = getattr(outcome, "timings", None) or {}
        for stage, seconds in dict(timings).items():
            try:
                value = float(seconds)
            except (TypeError, ValueError):
                continue
            if math.isnan(value) or value < 0:
                continue
            if stage == "request":
                inst["request_duration"].record(value, attrs)
            else:
                inst["stage_duration"].record(
                    value, {semconv.METRIC_ATTR_STAGE: str(stage), semconv.METRIC_ATTR_TIER: tier}
                )
        samples = getattr(outcome, "n_samples", None)
        if samples is not None:
            stop = getattr(outcome, "stop_reason", None)
            inst["samples"].record(
                samples, {**tier_only, semconv.METRIC_ATTR_STOP: str(stop)} if stop else tier_only
            )
        coverage = _ratio(getattr(outcome, "citation_coverage", None))
        if coverage is not None:
            inst["coverage"].record(coverage, tier_only)
        accuracy = _ratio(getattr(outcome, "citation_accuracy", None))
        if accuracy is not None:
            inst["accuracy"].record(accuracy, tier_only)
        fabricated = getattr(outcome, "fabricated", None)
        if fabricated is not None:
            count = 0
            if isinstance(fabricated, (int, float)) and not isinstance(fabricated, bool):
                count = int(fabricated)
            else:
                try:
                    count = len(fabricated)
                except TypeError:
                    count = 0
            inst["fabricated"].add(max(0, count), tier_only)
    except Exception:
        logger.warning("tracerag: could not record request metrics", exc_info=True)


def _add(
    meter_provider: MeterProvider | None,
    instrument: str,
    value: int,
    attrs: Mapping[str, str] | None,
    what: str,
    level: int = logging.WARNING,
) -> None:
    """Add ``value`` to one of tracerag's instruments; a failure is logged, never raised."""
    try:
        _instruments(meter_provider)[instrument].add(value, attrs)
    except Exception:
        logger.log(level, "tracerag: could not record %s", what, exc_info=True)


def _call_error(stage: str, error: BaseException) -> dict[str, str]:
    return {
        semconv.METRIC_ATTR_STAGE: _label(stage),
        semconv.METRIC_ATTR_ERROR_TYPE: _error_type(error),
    }


def record_retry(
    stage: str, error: BaseException, *, meter_provider: MeterProvider | None = None
) -> None:
    """Count one retried model call in ``stage``."""
    _add(meter_provider, "retries", 1, _call_error(stage, error), "a retry")


def record_model_error(
    stage: str, error: BaseException, *, meter_provider: MeterProvider | None = None
) -> None:
    """Count one model call in ``stage`` that failed for good."""
    _add(meter_provider, "model_errors", 1, _call_error(stage, error), "a model error")


def record_audit_failure(
    reason: str, dropped: bool = False, *, meter_provider: MeterProvider | None = None
) -> None:
    """Count a failed audit persist; ``dropped`` when the record was given up on."""
    attrs = {semconv.METRIC_ATTR_REASON: _label(reason, "unknown")}
    _add(meter_provider, "audit_failures", 1, attrs, "an audit failure")
    if dropped:
        _add(meter_provider, "audit_dropped", 1, attrs, "a dropped audit record")


def record_audit_backlog(delta: int, *, meter_provider: MeterProvider | None = None) -> None:
    """Move the audit backlog by ``delta`` records (accepted: +1, stored or given up: -1)."""
    _add(meter_provider, "audit_backlog", delta, None, "the audit backlog")


def record_spans_dropped(
    count: int, reason: str, *, meter_provider: MeterProvider | None = None
) -> None:
    """Count spans that could not be exported (reason: export_failed, queue_full, shutdown)."""
    if count <= 0:
        return
    attrs = {semconv.METRIC_ATTR_REASON: _label(reason, "unknown")}
    _add(meter_provider, "spans_dropped", count, attrs, "dropped spans", logging.DEBUG)


def record_review_decision(
    route: str, action: str, seconds: float, *, meter_provider: MeterProvider | None = None
) -> None:
    """Record how long a queued request (``route``: review, escalate) waited for its decision
    (``action``: approve, edit, reject); never raises."""
    try:
        if not math.isfinite(seconds) or seconds < 0:
            return
        _instruments(meter_provider, "review")["time_to_decision"].record(
            seconds,
            {
                semconv.METRIC_ATTR_ROUTE: _label(route, "unknown"),
                semconv.METRIC_ATTR_ACTION: _label(action, "unknown"),
            },
        )
    except Exception:
        logger.warning("tracerag: could not record a review decision", exc_info=True)


def _kind(kind: str) -> str:
    return kind if kind in INTERRUPT_KINDS else "other"


def record_turn_interrupted(
    kind: InterruptKind, *, meter_provider: MeterProvider | None = None
) -> None:
    """Count one turn paused for a person (``kind``: app, answer_review); never raises."""
    try:
        _instruments(meter_provider, "turns")["interrupted"].add(
            1, {semconv.METRIC_ATTR_KIND: _kind(kind)}
        )
    except Exception:
        logger.warning("tracerag: could not record an interrupted turn", exc_info=True)


def resume_action(actions: Sequence[str]) -> str:
    """The ``action`` a resume is counted under: the one action its decisions take, ``mixed``
    when they differ, ``other`` for none or one outside ``RESUME_ACTIONS`` (a bounded label)."""
    found = {a if a in RESUME_ACTIONS else "other" for a in actions}
    if not found:
        return "other"
    if len(found) > 1:
        return "mixed"
    return found.pop()


def record_turn_resumed(
    kind: InterruptKind, action: str, *, meter_provider: MeterProvider | None = None
) -> None:
    """Count one interrupted turn resumed and finished (``action``: approve, edit, reject,
    respond, mixed, other); never raises."""
    try:
        label = action if action == "mixed" else resume_action([action])
        _instruments(meter_provider, "turns")["resumed"].add(
            1, {semconv.METRIC_ATTR_KIND: _kind(kind), semconv.METRIC_ATTR_ACTION: label}
        )
    except Exception:
        logger.warning("tracerag: could not record a resumed turn", exc_info=True)


def record_usage(
    outcome: RequestOutcome,
    section: Mapping[str, Any],
    *,
    interrupted: bool = False,
    meter_provider: MeterProvider | None = None,
) -> None:
    """Record one request's ``usage`` section (``tracerag.usage.usage_section``) per stage."""
    try:
        inst = _instruments(meter_provider, "usage")
        base = {
            semconv.METRIC_ATTR_TIER: _label(outcome.tier),
            semconv.METRIC_ATTR_DECISION: _decision(outcome, interrupted),
            semconv.METRIC_ATTR_PROMPT_VERSION: _label(outcome.prompt_version),
            semconv.METRIC_ATTR_MODEL_VERSION: _label(outcome.model_version),
        }
        inst["request_tokens"].record(int(section.get("total_tokens") or 0), base)
        cost_by_stage = (section.get("cost") or {}).get("by_stage") or {}
        for stage, totals in (section.get("by_stage") or {}).items():
            attrs = {**base, semconv.METRIC_ATTR_STAGE: _label(stage)}
            for direction in ("input", "output"):
                count = int(totals.get(f"{direction}_tokens") or 0)
                inst["tokens"].add(count, {**attrs, semconv.METRIC_ATTR_DIRECTION: direction})
            inst["calls"].add(int(totals.get("calls") or 0), attrs)
            money = cost_by_stage.get(stage)
            if isinstance(money, (int, float)) and money >= 0:
                inst["cost"].add(float(money), attrs)
    except Exception:
        logger.warning("tracerag: could not record usage metrics", exc_info=True)
