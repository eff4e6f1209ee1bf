"""Tracerag's evaluations as Arize Phoenix span annotations."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from tracerag import _semconv as semconv

logger = logging.getLogger("tracerag.tracing")


class PhoenixEvaluationExporter(SpanExporter):
    """Sends tracerag's evaluations to Arize Phoenix as span annotations (REST API).

    Each ``gen_ai.evaluation.result`` event (citation validity, self-consistency, ...) becomes
    an annotation of its span, and each request's root (``tracerag.span`` =
    ``tracerag.request``) gets a ``confidence`` annotation (score = confidence, label =
    decision: the root's ``tracerag.verdict`` evaluation), so they show in Phoenix's evaluation
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
                if not name or name == semconv.EVALUATION_VERDICT:
                    continue  # the verdict is the root's ``confidence`` annotation below
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
            is_root = attrs.get(semconv.SPAN_NAME, span.name) == semconv.SPAN_REQUEST
            if is_root and semconv.CONFIDENCE in attrs:
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
