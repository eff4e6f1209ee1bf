"""Credibility: how far a material has earned trust, and how far that trust has aged.

``credibility = ema × temporal``:

* ``ema`` — an exponential moving average of outcomes (1 good, 0 bad), starting at ``prior``:
  ``ema' = ema + rate × weight × (outcome − ema)``, where ``weight`` is the material's share of
  the answer (1 when it alone carried it);
* ``temporal`` — a confidence that decays with the age since ``last_confirmed`` (else since the
  version was written) on a schedule: ``exponential`` (halves every ``half_life_days``),
  ``linear`` (falls to 0 over ``horizon_days``) or ``step`` (``steps``: ``(days, factor)``
  pairs, the factor of the last step reached). An expired material has temporal confidence 0:
  it is stale.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from tracerag.errors import ConfigurationError, InputError

#: outcome value of each verdict or reviewer action
OUTCOMES: dict[str, float] = {
    "confirm": 1.0,
    "approve": 1.0,
    "clarify": 0.5,
    "edit": 0.5,
    "deny": 0.0,
    "reject": 0.0,
}
SCHEDULES = ("exponential", "linear", "step")


@dataclass(frozen=True)
class CredibilityPolicy:
    """The configurable parts of credibility."""

    rate: float = 0.2
    prior: float = 0.6
    schedule: str = "exponential"
    half_life_days: float = 365.0
    horizon_days: float = 730.0
    steps: tuple[tuple[float, float], ...] = ((0.0, 1.0), (180.0, 0.8), (365.0, 0.5))
    quarantine_after: int = 3  # denials (since the last restore) that quarantine a material
    # and, when set, only while the EMA is below this (a material that is mostly confirmed
    # but shares denied answers with a wrong one is not quarantined for them)
    quarantine_below: float | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.rate <= 1.0:
            raise ConfigurationError("rate must be in (0, 1]")
        if not 0.0 <= self.prior <= 1.0:
            raise ConfigurationError("prior must be in [0, 1]")
        if self.schedule not in SCHEDULES:
            raise ConfigurationError(f"schedule must be one of {SCHEDULES}")
        if self.half_life_days <= 0 or self.horizon_days <= 0:
            raise ConfigurationError("half-life and horizon must be positive")
        if self.quarantine_after < 1:
            raise ConfigurationError("quarantine_after must be at least 1")
        if self.quarantine_below is not None and not 0.0 < self.quarantine_below <= 1.0:
            raise ConfigurationError("quarantine_below must be in (0, 1]")


def should_quarantine(denials: int, ema: float, policy: CredibilityPolicy) -> bool:
    """True when a material has been denied often enough (and, if set, trusted little enough)."""
    if denials < policy.quarantine_after:
        return False
    return policy.quarantine_below is None or ema < policy.quarantine_below


def ema_update(ema: float, outcome: float, rate: float, weight: float = 1.0) -> float:
    """One EMA step toward ``outcome``, scaled by the material's ``weight`` in [0, 1]."""
    if not 0.0 <= weight <= 1.0:
        raise InputError("weight must be in [0, 1]")
    return ema + rate * weight * (outcome - ema)


def age_days(since: datetime | None, now: datetime) -> float:
    """Days from ``since`` to ``now`` (0 when ``since`` is unknown or in the future)."""
    if since is None:
        return 0.0
    return max(0.0, (now - since).total_seconds() / 86400.0)


def temporal_confidence(age: float, policy: CredibilityPolicy) -> float:
    """The schedule's confidence after ``age`` days."""
    if policy.schedule == "exponential":
        return float(0.5 ** (age / policy.half_life_days))
    if policy.schedule == "linear":
        return max(0.0, 1.0 - age / policy.horizon_days)
    factor = 1.0
    for days, value in sorted(policy.steps):
        if age >= days:
            factor = value
    return factor


def credibility(
    ema: float,
    *,
    confirmed_at: datetime | None,
    now: datetime,
    policy: CredibilityPolicy,
    expired: bool = False,
) -> float:
    """``ema × temporal``; 0 for an expired material."""
    if expired:
        return 0.0
    return ema * temporal_confidence(age_days(confirmed_at, now), policy)


def confidence_with_credibility(
    confidence: float,
    credibilities: Sequence[float],
    policy: CredibilityPolicy,
    weight: float = 0.0,
) -> float:
    """Confidence lowered when the cited materials are trusted less than a new one.

    ``confidence × min(1, mean(credibilities) / prior) ** weight``. ``weight`` 0 (the default)
    leaves confidence unchanged; with no cited materials it is unchanged too.
    """
    if weight <= 0 or not credibilities:
        return confidence
    factor = min(1.0, (sum(credibilities) / len(credibilities)) / policy.prior)
    adjusted: float = confidence * factor**weight
    return adjusted


__all__ = [
    "OUTCOMES",
    "SCHEDULES",
    "CredibilityPolicy",
    "age_days",
    "confidence_with_credibility",
    "credibility",
    "ema_update",
    "should_quarantine",
    "temporal_confidence",
]
