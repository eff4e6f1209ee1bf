"""When to stop drawing samples: as soon as the ones not drawn are unlikely to change the route.

Every front door draws ``min_samples`` samples first, verifies them, and asks ``next_round``
whether to draw more (and how many) or to stop (and why). The rule is derived in
docs/confidence.md ("Adaptive sampling"); in short:

After ``k`` verified samples of which ``a`` agree with the candidate answer (the chosen one),
the probability ``p`` that a further sample agrees with it has the posterior
``Beta(alpha + a, beta + k - a)`` under the population prior ``Beta(alpha, beta)`` (fitted on
labelled requests with ``fit_agreement_prior``). The ``m = n - k`` samples not drawn would add
``X ~ BetaBinomial(m, alpha + a, beta + k - a)`` agreeing ones. Fixed-N sampling would route on
the share ``(a + X) / n``; stopping now routes on ``a / k``. The route could differ when
``route_at((a + x) / n) != route_at(a / k)``, or when another answer could take the lead
(``rival + m - x >= a + x``: then the candidate itself, its citations, rules and relevance,
could change). When the candidate does not verify fully, a further agreeing sample that does
would be chosen instead and route as ``best_route_at``: the chance that one of the ``x``
agreeing samples not drawn does, under ``Beta(gamma, delta + a)`` (``verify_prior``), adds to the
risk where ``best_route_at`` differs. ``risk`` is the posterior probability of any of these;
sampling stops once it is at most ``Settings.stop_risk``. ``route_at`` is the caller's: the
combiner and the router applied to the candidate's verified signals at a given share, so the
rule stops on the route, not on the majority alone.

The module is pure: no model, no span, no settings object; every front door calls it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType

from tracerag._choices import Route
from tracerag.errors import ConfigurationError

__all__ = [
    "DEFAULT_AGREEMENT_PRIOR",
    "DEFAULT_MIN_SAMPLES",
    "DEFAULT_STOP_RISK",
    "DEFAULT_VERIFY_PRIOR",
    "AgreementPrior",
    "StopReason",
    "StoppingRule",
    "Tally",
    "Verdict",
    "change_risk",
    "check_prior",
    "fit_agreement_prior",
    "next_round",
    "prior_for",
]

#: Samples drawn before the rule is first asked.
DEFAULT_MIN_SAMPLES = 2
#: The largest posterior probability, per request, that the samples not drawn would have
#: changed the route: 0.05, Adaptive-Consistency's stopping threshold (stop once the majority
#: holds with probability 0.95; Aggarwal et al., 2023), here on the route.
DEFAULT_STOP_RISK = 0.05
#: Beta(alpha, beta) priors on the chance that a further sample agrees with the candidate, by
#: the shape of the retrieval scores (``Retrieval.shape``; ``"*"``: any other or none), fitted
#: by ``fit_agreement_prior`` on the labelled calibration set at fixed N = 5
#: (``tracerag.tools.calibration.demo_calibration_rows``, 1,071 requests;
#: ``python benchmarks/cost.py --fit-prior`` refits them): near-equal top candidates
#: (``clustered``, 147 requests, 51 % with every sample agreeing) disagree far more often than
#: the rest (924 requests, 81 %). Refit them on your own requests.
#: A retrieval whose scores are unknown (``unscored``; ``empty``: a wrapped app's runs
#: retrieved the materials) could be clustered: it takes the clustered prior, the cautious one.
_CLUSTERED = (1.5605, 0.5287)
DEFAULT_AGREEMENT_PRIOR: Mapping[str, tuple[float, float]] = MappingProxyType(
    {"clustered": _CLUSTERED, "unscored": _CLUSTERED, "empty": _CLUSTERED, "*": (0.9842, 0.1162)}
)
#: Beta(gamma, delta) prior on the chance that a sample agreeing with the candidate verifies
#: fully (every claim supported by its citations), fitted as the agreement prior is, on the
#: members of the candidates' groups at fixed N = 5.
DEFAULT_VERIFY_PRIOR = (0.1218, 0.1104)
#: What ``Settings.agreement_prior`` takes: one (alpha, beta) for every request, or one per
#: retrieval shape with ``"*"`` for the rest.
AgreementPrior = tuple[float, float] | Mapping[str, tuple[float, float]]


def prior_for(prior: AgreementPrior, shape: str | None) -> tuple[float, float]:
    """The (alpha, beta) for a request whose retrieval scores have ``shape``."""
    if isinstance(prior, tuple):
        return prior
    found = prior.get(shape) if shape is not None else None
    chosen = found if found is not None else prior.get("*")
    if chosen is None:
        raise ConfigurationError(f"the agreement prior has no entry for {shape!r} and no '*'")
    return chosen


def check_prior(prior: AgreementPrior) -> None:
    """Refuse a prior that is not positive numbers (ConfigurationError)."""
    pairs = [prior] if isinstance(prior, tuple) else list(prior.values())
    if not isinstance(prior, tuple) and "*" not in prior:
        raise ConfigurationError("an agreement prior by retrieval shape needs a '*' entry")
    for pair in pairs:
        ok = isinstance(pair, tuple) and len(pair) == 2
        if not ok or not all(isinstance(v, (int, float)) and 0 < v < math.inf for v in pair):
            raise ConfigurationError(
                f"an agreement prior is two positive numbers (alpha, beta), got {pair!r}"
            )


class StopReason(str, Enum):
    """Why a request's sampling stopped."""

    #: ``min_samples`` is ``n_samples``: every sample was drawn (fixed mode).
    FIXED = "fixed"
    #: the samples not drawn could have changed the route with probability at most ``stop_risk``
    SETTLED = "settled"
    #: all ``n_samples`` were drawn while the route could still have changed
    EXHAUSTED = "exhausted"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class StoppingRule:
    """The adaptive sampling settings: ``min_samples`` first, then rounds while ``risk`` >
    ``stop_risk``, at most ``n_samples`` in all; ``prior``: the request's agreement prior
    (alpha, beta), see ``prior_for``."""

    n_samples: int
    min_samples: int = DEFAULT_MIN_SAMPLES
    stop_risk: float = DEFAULT_STOP_RISK
    prior: tuple[float, float] = (1.0, 1.0)
    verify_prior: tuple[float, float] = (1.0, 1.0)

    def __post_init__(self) -> None:
        if not isinstance(self.n_samples, int) or self.n_samples < 1:
            raise ConfigurationError(f"n_samples must be a positive int, got {self.n_samples!r}")
        if not isinstance(self.min_samples, int) or self.min_samples < 1:
            raise ConfigurationError(
                f"min_samples must be a positive int, got {self.min_samples!r}"
            )
        if not 0.0 <= float(self.stop_risk) < 1.0:
            raise ConfigurationError(f"stop_risk must be in [0, 1), got {self.stop_risk!r}")
        alpha, beta = self.prior
        if not (alpha > 0 and beta > 0 and math.isfinite(alpha) and math.isfinite(beta)):
            raise ConfigurationError(
                f"the agreement prior must be two positive numbers, got {self.prior!r}"
            )

    @property
    def first(self) -> int:
        """How many samples the first round draws."""
        return min(self.min_samples, self.n_samples)

    @property
    def fixed(self) -> bool:
        """Every sample is drawn at once (today's fixed mode)."""
        return self.first >= self.n_samples


@dataclass(frozen=True)
class Tally:
    """What the verified samples so far show: ``drawn`` samples, ``agreeing`` of them in the
    candidate's group, ``rival`` in the largest other group; ``route_at(share)``: the route the
    candidate would get at that share of agreeing samples; ``best_route_at(share)``: the route
    if a further agreeing sample verified fully (every claim supported), which would then be
    chosen instead (None: the candidate already verifies fully, none could do better)."""

    drawn: int
    agreeing: int
    rival: int
    route_at: Callable[[float], Route]
    best_route_at: Callable[[float], Route] | None = None


@dataclass(frozen=True)
class Verdict:
    """Draw ``more`` samples (0: stop, for ``reason``); ``risk``: the posterior probability that
    the samples not drawn would change the route (None: not assessed)."""

    more: int
    reason: StopReason | None = None
    risk: float | None = None


def _log_beta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def _beta_binomial(m: int, alpha: float, beta: float) -> list[float]:
    """P(X = x) for x = 0..m, X ~ BetaBinomial(m, alpha, beta)."""
    base = _log_beta(alpha, beta)
    return [
        math.exp(
            math.lgamma(m + 1)
            - math.lgamma(x + 1)
            - math.lgamma(m - x + 1)
            + _log_beta(x + alpha, m - x + beta)
            - base
        )
        for x in range(m + 1)
    ]


def change_risk(
    tally: Tally,
    n: int,
    prior: tuple[float, float],
    verify_prior: tuple[float, float] = (1.0, 1.0),
) -> float:
    """The posterior probability that drawing all ``n`` samples would route differently from
    stopping at ``tally.drawn`` (see the module docstring); ``verify_prior``: Beta prior on the
    chance that an agreeing sample verifies fully, when the candidate does not."""
    k, a, rival = tally.drawn, tally.agreeing, tally.rival
    m = n - k
    if m <= 0:
        return 0.0
    if k <= 0:
        return 1.0
    now = tally.route_at(a / k)
    alpha, beta = prior
    gamma, delta = verify_prior
    best = tally.best_route_at
    risk = 0.0
    for x, p in enumerate(_beta_binomial(m, alpha + a, beta + k - a)):
        share = (a + x) / n
        if rival + (m - x) >= a + x or tally.route_at(share) != now:
            risk += p  # another answer could lead, or the share carries the route across a line
        elif best is not None and x > 0 and best(share) != now:
            # one of the x agreeing samples could verify fully and be chosen instead: none of
            # the a agreeing so far did, so q ~ Beta(gamma, delta + a); P(none of x) = E[(1-q)^x]
            none = math.exp(_log_beta(gamma, delta + a + x) - _log_beta(gamma, delta + a))
            risk += p * (1.0 - none)
    return min(1.0, risk)


def next_round(tally: Tally, rule: StoppingRule) -> Verdict:
    """Stop, or how many samples to draw next: the fewest that, all agreeing with the
    candidate, would let sampling stop (every remaining one when none would)."""
    n = rule.n_samples
    if tally.drawn >= n:
        if rule.fixed:
            return Verdict(0, StopReason.FIXED, 0.0)
        return Verdict(0, StopReason.EXHAUSTED, None)
    if tally.agreeing == 0:  # no sample answered yet: nothing to judge the rest by
        return Verdict(n - tally.drawn, None, 1.0)
    risk = change_risk(tally, n, rule.prior, rule.verify_prior)
    if risk <= rule.stop_risk:
        return Verdict(0, StopReason.SETTLED, risk)
    remaining = n - tally.drawn
    for more in range(1, remaining):
        ahead = Tally(
            tally.drawn + more,
            tally.agreeing + more,
            tally.rival,
            tally.route_at,
            tally.best_route_at,
        )
        if change_risk(ahead, n, rule.prior, rule.verify_prior) <= rule.stop_risk:
            return Verdict(more, None, risk)
    return Verdict(remaining, None, risk)


def fit_agreement_prior(counts: Sequence[tuple[int, int]]) -> tuple[float, float]:
    """The Beta(alpha, beta) prior on a request's agreement rate, by the method of moments of
    the beta-binomial, from ``(agreeing, drawn)`` per request (drawn all alike, fixed N).

    With ``n`` the number drawn, the mean agreeing share ``mu`` and its variance ``s2`` over
    requests: ``rho = (s2 / (mu (1 - mu)) - 1/n) / (1 - 1/n)`` is the intra-request
    correlation, and ``alpha + beta = 1/rho - 1``. A sample with no spread beyond binomial
    noise gives a weak prior (alpha + beta = 2 at the observed mean)."""
    rows = [(a, k) for a, k in counts if k > 0]
    if not rows:
        raise ConfigurationError("fitting the agreement prior needs at least one request")
    sizes = {k for _, k in rows}
    if len(sizes) != 1:
        raise ConfigurationError("fit the agreement prior on requests that drew alike (fixed N)")
    n = sizes.pop()
    shares = [a / k for a, k in rows]
    mu = sum(shares) / len(shares)
    mu = min(max(mu, 1e-3), 1 - 1e-3)
    s2 = sum((s - mu) ** 2 for s in shares) / max(1, len(shares) - 1)
    total = 2.0
    if n > 1:
        rho = (s2 / (mu * (1 - mu)) - 1 / n) / (1 - 1 / n)
        if rho > 0:
            total = max(1e-3, 1 / rho - 1)
    return (round(mu * total, 4), round((1 - mu) * total, 4))
