"""Quality indicators over the audit store, for a time window: ``tracerag metrics``.

Read from the stored records of the requests created in ``[since, until)``:

- **citation coverage** — mean, over verified requests, of the answer's share of claims with at
  least one valid (retrieved) citation;
- **citation accuracy** — mean, over verified requests, of the share of (claim, cited id) pairs
  whose cited material supports the claim;
- **verifier interception rate** — share of verified requests where verification caught a bad
  citation: a fabricated id (cites a material that was not retrieved), an unsupported claim
  (the cited material does not say it) or a stale one (the cited material is superseded or
  expired);
- **human-review rate** — share of requests routed to ``review`` (answer returned, flagged);
- **escalation rate** — share of requests routed to ``escalate`` (answer withheld);
- **mean time to resolution** — for escalated requests a reviewer has decided, the mean of
  (review decision time − request start time);
- **tokens and cost per request**, and **cost per passed answer** (all money spent over the
  requests that passed), from the records' ``usage`` sections (cost only where the pipeline
  had a price table).

"Verified" requests are those whose verify stage ran (tier ``low`` does not verify). Replays
(``tracerag replay``) are counted apart and left out of every indicator; the requests of an
evaluation run (``tracerag eval``) are not counted at all.
"""

from __future__ import annotations

import argparse
import re
import statistics
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from tracerag._routing import Route
from tracerag.errors import InputError
from tracerag.store._base import AuditStore, to_iso
from tracerag.store._codec import RequestTrail
from tracerag.tools._command import (
    Subparsers,
    add_command,
    add_json_argument,
    add_store_argument,
    cli_store,
    emit,
)

INTERCEPTED_VERDICTS = ("fabricated_citation", "unsupported", "stale")
_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
DEFAULT_LIMIT = 100_000


def parse_since(value: str | None, now: datetime | None = None) -> datetime | None:
    """A window bound from ISO-8601 text or a relative span (``30m``, ``1h``, ``7d``, ``2w``).

    Naive ISO times are taken as UTC. ``None`` or ``""`` means unbounded. Raises InputError on
    anything else.
    """
    if value is None or not str(value).strip():
        return None
    text = str(value).strip()
    match = _RELATIVE.match(text)
    if match:
        amount, unit = float(match.group(1)), match.group(2).lower()
        now = now or datetime.now(timezone.utc)
        return now - timedelta(**{_UNITS[unit]: amount})
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(
            f"cannot read {value!r} as a time: use ISO-8601 (2025-03-04T09:00:00Z) "
            "or a span such as 30m, 1h, 7d, 2w"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


@dataclass
class Indicators:
    """The indicators over one window, with the counts they are computed from."""

    since: str | None
    until: str | None
    requests: int = 0
    replays: int = 0
    verified: int = 0
    citation_coverage: float | None = None
    citation_accuracy: float | None = None
    verifier_interception_rate: float | None = None
    intercepted: int = 0
    intercepted_by: dict[str, int] = field(default_factory=dict)
    human_review_rate: float | None = None
    escalation_rate: float | None = None
    by_decision: dict[str, int] = field(default_factory=dict)
    escalations_resolved: int = 0
    escalations_open: int = 0
    mean_time_to_resolution_s: float | None = None
    median_time_to_resolution_s: float | None = None
    # token usage and cost, over the requests whose record has a usage section
    requests_with_usage: int = 0
    tokens_per_request: float | None = None
    model_calls_per_request: float | None = None
    cost_per_request: float | None = None
    cost_per_passed_answer: float | None = None
    truncated: bool = False

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form of the indicators."""
        return asdict(self)

    def render(self) -> str:
        """The indicators as a short plain-text report."""
        window = f"{self.since or 'the beginning'} .. {self.until or 'now'}"
        lines = [
            f"tracerag metrics over {window}",
            f"  requests                      {self.requests}"
            + (f"  ({_counts(self.by_decision)})" if self.by_decision else ""),
            f"  verified requests             {self.verified}"
            + (f"  (replays not counted: {self.replays})" if self.replays else ""),
            f"  citation coverage             {_pct(self.citation_coverage)}",
            f"  citation accuracy             {_pct(self.citation_accuracy)}",
            f"  verifier interception rate    {_pct(self.verifier_interception_rate)}"
            + (
                f"  ({self.intercepted} requests: {_counts(self.intercepted_by)})"
                if self.intercepted
                else ""
            ),
            f"  human-review rate             {_pct(self.human_review_rate)}",
            f"  escalation rate               {_pct(self.escalation_rate)}",
            f"  mean time to resolution       {_duration(self.mean_time_to_resolution_s)}"
            f"  ({self.escalations_resolved} escalations resolved, "
            f"{self.escalations_open} open)",
        ]
        if self.requests_with_usage:
            lines.append(
                f"  tokens per request            {_num(self.tokens_per_request, 0)}"
                f"  ({_num(self.model_calls_per_request, 1)} model calls)"
            )
        if self.cost_per_request is not None:
            lines.append(
                f"  cost per request              {_num(self.cost_per_request, 6)}"
                f"  (per passed answer {_num(self.cost_per_passed_answer, 6)})"
            )
        if self.truncated:
            lines.append("  (window truncated: narrow it or raise --limit)")
        return "\n".join(lines) + "\n"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def interception_reasons(trail: RequestTrail) -> list[str] | None:
    """Why verification intercepted this request's answer (empty: it did not); None: unverified."""
    rec = trail.audit
    citations = rec.signals.citations
    if citations is None:
        return None
    reasons: set[str] = set()
    if citations.fabricated:
        reasons.add("fabricated_citation")
    if citations.stale:
        reasons.add("stale")
    for claim in rec.claims:
        if claim.verdict in INTERCEPTED_VERDICTS:
            reasons.add(str(claim.verdict))
    return sorted(reasons)


def compute(
    store: AuditStore,
    since: datetime | str | None = None,
    until: datetime | str | None = None,
    *,
    limit: int = DEFAULT_LIMIT,
) -> Indicators:
    """The indicators over the requests stored in ``[since, until)`` (at most ``limit``)."""
    out = Indicators(since=_iso(since), until=_iso(until))
    summaries = store.list_requests(since=since, until=until, limit=limit + 1)
    if len(summaries) > limit:
        out.truncated = True
        summaries = summaries[:limit]

    def trails() -> Iterator[tuple[RequestTrail, Any]]:
        for summary in summaries:
            try:
                trail = store.get(summary.request_id)
            except KeyError:  # removed between listing and reading: verify_chain reports it
                continue
            if trail.audit.evaluation_run:
                continue  # a release check (tracerag eval), not a customer request
            yield trail, summary

    return _accumulate(out, trails())


def from_trails(trails: Iterable[RequestTrail]) -> Indicators:
    """The indicators over the given request trails (e.g. one configuration's evaluation run)."""
    return _accumulate(Indicators(since=None, until=None), ((t, None) for t in trails))


def _accumulate(out: Indicators, trails: Iterable[tuple[RequestTrail, Any]]) -> Indicators:
    coverage: list[float] = []
    accuracy: list[float] = []
    resolution: list[float] = []
    tokens: list[float] = []
    calls: list[float] = []
    costs: list[float] = []
    for trail, summary in trails:
        rec = trail.audit
        if rec.replay_of:
            out.replays += 1  # an operator's replay, not a customer request
            continue
        out.requests += 1
        spent = rec.usage
        if spent is not None:
            out.requests_with_usage += 1
            tokens.append(_number(spent.get("total_tokens")) or 0.0)
            calls.append(_number(spent.get("calls")) or 0.0)
            money = _number((spent.get("cost") or {}).get("total"))
            if money is not None:
                costs.append(money)
        decision = str(trail.decision or getattr(summary, "decision", None) or "none")
        out.by_decision[decision] = out.by_decision.get(decision, 0) + 1
        reasons = interception_reasons(trail)
        if reasons is not None:
            out.verified += 1
            cov, acc = _number(rec.citations.coverage), _number(rec.citations.accuracy)
            if cov is not None:
                coverage.append(cov)
            if acc is not None:
                accuracy.append(acc)
            if reasons:
                out.intercepted += 1
                for reason in reasons:
                    out.intercepted_by[reason] = out.intercepted_by.get(reason, 0) + 1
        if decision == Route.ESCALATE:
            decided = trail.review_decision
            started = _parse_time(rec.started_at) or _parse_time(
                getattr(summary, "created_at", None)
            )
            decided_at = _parse_time(decided.created_at) if decided is not None else None
            if decided_at is not None and started is not None:
                out.escalations_resolved += 1
                resolution.append(max(0.0, (decided_at - started).total_seconds()))
            else:
                out.escalations_open += 1
    if out.requests:
        out.human_review_rate = out.by_decision.get("review", 0) / out.requests
        out.escalation_rate = out.by_decision.get("escalate", 0) / out.requests
    if out.verified:
        out.verifier_interception_rate = out.intercepted / out.verified
    out.citation_coverage = statistics.fmean(coverage) if coverage else None
    out.citation_accuracy = statistics.fmean(accuracy) if accuracy else None
    out.mean_time_to_resolution_s = statistics.fmean(resolution) if resolution else None
    out.median_time_to_resolution_s = statistics.median(resolution) if resolution else None
    out.tokens_per_request = statistics.fmean(tokens) if tokens else None
    out.model_calls_per_request = statistics.fmean(calls) if calls else None
    if costs:
        out.cost_per_request = statistics.fmean(costs)
        passed = out.by_decision.get("pass", 0)
        out.cost_per_passed_answer = sum(costs) / passed if passed else None
    return out


def _iso(value: datetime | str | None) -> str | None:
    return to_iso(value)


# -- the command ----------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    """Print the indicators over the window."""
    try:
        since = parse_since(args.since)
        until = parse_since(args.until)
    except ValueError as exc:
        print(f"tracerag metrics: {exc}")
        return 2
    with cli_store(args) as store:
        result = compute(store, since, until, limit=args.limit)
    return emit(result, as_json=args.json)


def add_parser(subparsers: Subparsers) -> None:
    """Register ``tracerag metrics``."""
    p = add_command(
        subparsers,
        "metrics",
        run,
        help="citation coverage and accuracy, interception, review and escalation rates",
        description="Quality indicators over the requests stored in a time window.",
    )
    p.add_argument(
        "--since",
        default="7d",
        help="start of the window: ISO-8601 time or a span back from now (30m, 1h, 7d; "
        "default 7d; '' for everything)",
    )
    p.add_argument("--until", default=None, help="end of the window (default: now)")
    add_store_argument(p)
    p.add_argument(
        "--limit", type=int, default=DEFAULT_LIMIT, help="most requests read (default 100000)"
    )
    add_json_argument(p, "print the indicators as JSON")
