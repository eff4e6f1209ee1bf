"""The route so far: what the stopping rule (``tracerag._adaptive``) is told after each round.

Between rounds, every front door verifies the samples drawn so far as the verify stage would
(each distinct answer's citations once, kept for the verify stage), groups them by conclusion,
chooses the candidate as the verify stage chooses it, and gives ``next_round`` a ``Tally``: how
many agree with the candidate, the largest rival group, and the route the candidate would get
at any share of agreeing samples (the settings' combiner and thresholds applied to its citation
report, rules and plan). ``draw_adaptive`` runs the rounds.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from opentelemetry.trace import Span

from tracerag._adaptive import StopReason, Tally, Verdict, next_round
from tracerag._choices import Route
from tracerag._routing import decide
from tracerag._settings import Settings
from tracerag._state import ErrorLog, RequestState, Retrieval, Sample
from tracerag.signals._citations import CitationReport
from tracerag.signals._confidence import Signals
from tracerag.signals._consistency import score_consistency
from tracerag.signals._rules import run_rules
from tracerag.signals._support import usage_scope
from tracerag.signals._types import Material
from tracerag.stages._verify import _verified, select

__all__ = ["FULLY_VERIFIED", "Stopped", "Verifier", "draw_adaptive", "first_round", "route_at_for"]


@dataclass(frozen=True)
class Stopped:
    """How a request's sampling ended: the rounds drawn, why it stopped, and the risk then;
    the rule's first round and risk bound (``min_samples``, ``stop_risk``)."""

    rounds: int
    reason: StopReason
    risk: float | None
    min_samples: int = 0
    bound: float | None = None


class Verifier:
    """Verifies samples between rounds, each distinct answer once; ``reports`` by index."""

    def __init__(
        self,
        state: RequestState,
        settings: Settings,
        span: Span,
        errors: ErrorLog,
        *,
        positional: bool = False,
        kept: int | None = None,
    ) -> None:
        self.state = state
        self.settings = settings
        self.span = span
        self.errors = errors
        self.positional = positional
        self.kept = kept
        self.reports: dict[int, CitationReport] = {}
        self._seen: dict[tuple[str, tuple[str, ...]], CitationReport] = {}
        self._materials: tuple[str, ...] | None = None

    async def tally(self, samples: Sequence[Sample], materials: Sequence[Material]) -> Tally:
        """The candidate's standing over ``samples``, verified against ``materials``."""
        question = self.state.question
        shown = tuple(m.id for m in materials)
        if shown != self._materials:  # more materials (a wrapped app's runs found them): anew
            self._materials = shown
            self.reports.clear()
            self._seen.clear()
        with usage_scope() as usage:
            for s in samples:
                if not s.ok or s.index in self.reports:
                    continue
                key = (s.answer or "", tuple(s.material_order))
                if key not in self._seen:
                    self._seen[key] = await _verified(
                        question,
                        materials,
                        s,
                        self.positional,
                        self.settings,
                        self.span,
                        self.errors,
                    )
                self.reports[s.index] = self._seen[key]
        if usage.calls or usage.cached:
            self.span.set_attributes(usage.attributes())
        consistency = score_consistency(
            [s.answer if s.ok else None for s in samples],
            equivalence=self.settings.equivalence,
        )
        chosen = select(samples, self.reports, consistency, self.kept)
        by_index = {s.index: s for s in samples}
        if chosen.sample_index is None:
            return Tally(len(samples), 0, 0, lambda share: Route.ESCALATE)
        # indices in groups are positions in ``samples``
        position = chosen.sample_index
        candidate = samples[position] if position < len(samples) else by_index[position]
        report = self.reports.get(candidate.index, CitationReport())
        agreeing = len(chosen.group)
        rival = max((len(g) for g in consistency.groups if g is not chosen.group), default=0)
        rules = tuple(
            run_rules(self.settings.rules, question, candidate.answer, materials)
            if candidate.answer
            else ()
        )
        perfect = report.valid and report.score >= 1.0 and report.coverage >= 1.0
        best = None if perfect else self._route_at(FULLY_VERIFIED, rules, len(samples))
        return Tally(
            len(samples), agreeing, rival, self._route_at(report, rules, len(samples)), best
        )

    def _route_at(
        self, report: CitationReport | _Perfect, rules: tuple[object, ...], drawn: int
    ) -> Callable[[float], Route]:
        state = self.state
        plan_ok = state.plan.ok if state.plan is not None else None
        return route_at_for(self.settings, state.retrieval, plan_ok, report, rules, drawn)


def route_at_for(
    settings: Settings,
    retrieval: Retrieval | None,
    plan_ok: bool | None,
    report: CitationReport | _Perfect,
    rules: tuple[object, ...],
    drawn: int,
) -> Callable[[float], Route]:
    """The route a candidate with these citation signals, rules and plan would get at a given
    share of ``drawn`` samples agreeing with it: the settings' combiner and thresholds."""
    known: dict[float, Route] = {}
    informative = settings.temperature != 0.0

    def route_at(share: float) -> Route:
        share = round(share, 6)
        if share not in known:
            rest = [p for p in (share, 1.0 - share) if p > 0]
            signals = Signals(
                citation_score=report.score,
                fabricated=bool(report.fabricated),
                self_consistency=share,
                consistency_informative=informative,
                plan_ok=plan_ok,
                rules=rules,  # type: ignore[arg-type]
                retrieval_margin=retrieval.score_margin if retrieval is not None else None,
                retrieval_top_score=retrieval.top_score if retrieval is not None else None,
                samples_ok=max(1, drawn),
                n_samples=drawn,
                semantic_entropy=-sum(p * math.log(p) for p in rest),
                citation_coverage=report.coverage,
            )
            value = settings.combiner(signals, cap=settings.thresholds.cap).value
            known[share] = decide(value, settings.thresholds, tier=settings.tier)
        return known[share]

    return route_at


@dataclass(frozen=True)
class _Perfect:
    """The citation signals of an answer whose every claim its cited materials support."""

    score: float = 1.0
    coverage: float = 1.0
    fabricated: tuple[str, ...] = ()
    valid: bool = True


FULLY_VERIFIED = _Perfect()

DrawRound = Callable[[Sequence[int]], Awaitable[tuple[Sample, ...]]]
Judge = Callable[[tuple[Sample, ...]], Awaitable[Tally]]


def first_round(
    settings: Settings,
    wanted: int,
    retrieval: Retrieval | None,
    plan_ok: bool | None,
    *,
    shape: str | None = None,
) -> int:
    """How many samples the first round draws: ``min_samples``, or more where fewer could not
    settle even the best case — the fewest ``k`` after which ``k`` samples, every one agreeing
    and fully verified, would let sampling stop (docs/confidence.md, "The first round"). A
    passing request then settles in one round instead of waiting for a second; the samples
    drawn at once are ones the rule would have asked for next anyway."""
    if retrieval is not None:  # ``shape``: the one expected where nothing is retrieved yet
        shape = retrieval.shape
    rule = settings.stopping_rule(wanted, shape)
    least = rule.first
    if rule.fixed:
        return least
    for k in range(least, wanted):
        best = route_at_for(settings, retrieval, plan_ok, FULLY_VERIFIED, (), k)
        if next_round(Tally(k, k, 0, best), rule).more == 0:
            return k
    return wanted


async def draw_adaptive(
    state: RequestState, settings: Settings, wanted: int, draw_round: DrawRound, judge: Judge
) -> tuple[tuple[Sample, ...], Stopped]:
    """Draw ``min_samples`` concurrently, then rounds while the rule says the route could
    still change, up to ``wanted`` in all (the agreement prior is the one for the request's
    retrieval shape)."""
    shape = state.retrieval.shape if state.retrieval is not None else None
    rule = settings.stopping_rule(wanted, shape)
    plan_ok = state.plan.ok if state.plan is not None else None
    first = first_round(settings, wanted, state.retrieval, plan_ok)
    drawn: tuple[Sample, ...] = await draw_round(range(first))
    rounds = 1
    if rule.fixed:
        return drawn, Stopped(rounds, StopReason.FIXED, 0.0, rule.first, rule.stop_risk)
    last: float | None = None
    while True:
        verdict: Verdict = next_round(await judge(drawn), rule)
        if verdict.more <= 0:
            reason = verdict.reason or StopReason.EXHAUSTED
            risk = verdict.risk if verdict.risk is not None else last
            return drawn, Stopped(rounds, reason, risk, rule.first, rule.stop_risk)
        last = verdict.risk
        start = len(drawn)
        drawn = drawn + await draw_round(range(start, start + verdict.more))
        rounds += 1
