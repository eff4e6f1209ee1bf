"""Delivering a reviewer's decision to whoever waits for it.

``on_decision`` is a callable (called with the decision payload) or an http(s) URL that the
payload is POSTed to as JSON (env ``TRACERAG_DECISION_WEBHOOK``), retried a few times. Each
delivery, successful or not, is written to the request's audit trail as a ``note``. Frontends
can also wait on the request's event stream (``GET /v1/requests/{id}/events``, which ends with
the decision) or read ``GET /v1/requests/{id}``, which returns the final answer once decided.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from tracerag.errors import ConfigurationError
from tracerag.store._base import KIND_NOTE, AuditStore, ReviewDecision

logger = logging.getLogger("tracerag.server")

WEBHOOK_ENV = "TRACERAG_DECISION_WEBHOOK"
DELIVERY_ACTOR = "tracerag-server"

DecisionHook = Callable[[dict[str, Any]], Any]


def decision_payload(decision: ReviewDecision, record: Mapping[str, Any]) -> dict[str, Any]:
    """What a frontend is told about a decision."""
    response: Mapping[str, Any] = (
        record["response"] if isinstance(record.get("response"), Mapping) else {}
    )
    return {
        "event": "review.decided",
        "request_id": decision.request_id,
        "ticket_id": response.get("ticket_id"),
        "trace_id": record.get("trace_id"),
        "action": decision.action,
        "final_answer": decision.final_answer,
        "reason": decision.reason,
        "reviewer": decision.reviewer,
        "decided_at": decision.decided_at,
        "original_decision": record.get("decision"),
        # the conversation (an agent's thread) the request belongs to: where it resumes
        "session_id": record.get("session_id"),
    }


class Delivery:
    """Sends decisions to a callable or a webhook URL and audits each attempt."""

    def __init__(
        self,
        target: DecisionHook | str | None,
        *,
        timeout: float = 5.0,
        attempts: int = 3,
        backoff: float = 0.5,
    ) -> None:
        if isinstance(target, str) and not target.lower().startswith(("http://", "https://")):
            raise ConfigurationError(f"a decision webhook must be an http(s) URL, got {target!r}")
        self.target = target
        self.timeout = timeout
        self.attempts = max(1, attempts)
        self.backoff = backoff

    @property
    def enabled(self) -> bool:
        return self.target is not None

    def describe(self) -> str:
        """Where decisions go, without secrets (a URL's query is left out)."""
        if self.target is None:
            return "none"
        if isinstance(self.target, str):
            return "webhook " + self.target.split("?", 1)[0]
        return "callback " + getattr(self.target, "__qualname__", type(self.target).__name__)

    def _post(self, payload: dict[str, Any]) -> int:
        import httpx
        import tenacity

        assert isinstance(self.target, str)
        url = self.target

        def once() -> int:
            reply = httpx.post(url, json=payload, timeout=self.timeout)
            if reply.status_code >= 500 or reply.status_code == 429:
                reply.raise_for_status()
            return reply.status_code

        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.attempts),
            wait=tenacity.wait_exponential(multiplier=self.backoff, max=5.0),
            retry=tenacity.retry_if_exception_type(httpx.HTTPError),
            reraise=True,
        )
        return retrying(once)

    def deliver(self, store: AuditStore, payload: dict[str, Any]) -> bool:
        """Send one decision; audit the outcome on the request. Never raises."""
        if self.target is None:
            return False
        outcome: dict[str, Any] = {"to": self.describe(), "action": payload.get("action")}
        try:
            if isinstance(self.target, str):
                status = self._post(payload)
                outcome["http_status"] = status
                outcome["ok"] = 200 <= status < 300
            else:
                self.target(dict(payload))
                outcome["ok"] = True
        except Exception as exc:
            outcome["ok"] = False
            outcome["error"] = f"{type(exc).__name__}: {exc}"
            logger.warning(
                "decision for request %s not delivered to %s: %s",
                payload.get("request_id"),
                self.describe(),
                outcome["error"],
            )
        try:
            store.append_action(
                str(payload["request_id"]),
                KIND_NOTE,
                DELIVERY_ACTOR,
                {"delivery": outcome},
                reason="review decision delivered"
                if outcome["ok"]
                else "review decision NOT delivered",
            )
        except Exception:
            logger.exception("could not audit the delivery for %s", payload.get("request_id"))
        return bool(outcome["ok"])
