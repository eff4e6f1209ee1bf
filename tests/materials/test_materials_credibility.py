"""Credibility arithmetic: EMA steps and temporal decay, checked to exact values."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tracerag.materials._credibility import (
    CredibilityPolicy,
    age_days,
    credibility,
    ema_update,
    temporal_confidence,
)

NOW = datetime(2026, 6, 1, tzinfo=timezone.utc)


def test_ema_moves_by_rate_times_weight_toward_the_outcome() -> None:
    assert ema_update(0.5, 1.0, 0.2) == pytest.approx(0.6, abs=1e-12)
    assert ema_update(0.5, 0.0, 0.2) == pytest.approx(0.4, abs=1e-12)
    assert ema_update(0.5, 0.0, 0.2, weight=0.25) == pytest.approx(0.475, abs=1e-12)
    assert ema_update(0.8, 0.5, 1.0) == 0.5
    assert ema_update(0.8, 1.0, 0.3, weight=0.0) == 0.8


def test_ema_sequence_matches_the_closed_form() -> None:
    # n denials from e0 at rate r: e_n = e0 * (1 - r) ** n
    e = 0.6
    for _ in range(5):
        e = ema_update(e, 0.0, 0.2)
    assert e == pytest.approx(0.6 * 0.8**5, abs=1e-12)
    # n confirmations: e_n = 1 - (1 - e0) * (1 - r) ** n
    e = 0.6
    for _ in range(4):
        e = ema_update(e, 1.0, 0.2)
    assert e == pytest.approx(1 - 0.4 * 0.8**4, abs=1e-12)


def test_weight_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError):
        ema_update(0.5, 1.0, 0.2, weight=1.5)


def test_exponential_decay_halves_every_half_life() -> None:
    policy = CredibilityPolicy(schedule="exponential", half_life_days=100)
    assert temporal_confidence(0, policy) == 1.0
    assert temporal_confidence(100, policy) == pytest.approx(0.5, abs=1e-12)
    assert temporal_confidence(250, policy) == pytest.approx(0.5**2.5, abs=1e-12)


def test_linear_decay_reaches_zero_at_the_horizon() -> None:
    policy = CredibilityPolicy(schedule="linear", horizon_days=200)
    assert temporal_confidence(50, policy) == pytest.approx(0.75, abs=1e-12)
    assert temporal_confidence(200, policy) == 0.0
    assert temporal_confidence(500, policy) == 0.0


def test_step_decay_takes_the_last_step_reached() -> None:
    policy = CredibilityPolicy(schedule="step", steps=((0, 1.0), (30, 0.9), (90, 0.5)))
    assert temporal_confidence(29.9, policy) == 1.0
    assert temporal_confidence(30, policy) == 0.9
    assert temporal_confidence(365, policy) == 0.5


def test_credibility_is_ema_times_temporal_and_zero_when_expired() -> None:
    policy = CredibilityPolicy(schedule="exponential", half_life_days=10)
    confirmed = NOW - timedelta(days=20)
    assert age_days(confirmed, NOW) == 20.0
    assert credibility(0.8, confirmed_at=confirmed, now=NOW, policy=policy) == pytest.approx(
        0.2, abs=1e-12
    )
    assert credibility(0.8, confirmed_at=None, now=NOW, policy=policy) == 0.8
    assert credibility(0.8, confirmed_at=confirmed, now=NOW, policy=policy, expired=True) == 0.0


def test_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        CredibilityPolicy(rate=0)
    with pytest.raises(ValueError):
        CredibilityPolicy(schedule="cosine")
    with pytest.raises(ValueError):
        CredibilityPolicy(quarantine_after=0)


def test_quarantine_needs_n_denials_and_optionally_a_low_ema() -> None:
    from tracerag.materials._credibility import should_quarantine

    plain = CredibilityPolicy(quarantine_after=3)
    assert not should_quarantine(2, 0.0, plain)
    assert should_quarantine(3, 0.99, plain)
    guarded = CredibilityPolicy(quarantine_after=3, quarantine_below=0.4)
    assert not should_quarantine(5, 0.4, guarded)
    assert should_quarantine(3, 0.39, guarded)
    with pytest.raises(ValueError):
        CredibilityPolicy(quarantine_below=0)


def test_credibility_enters_confidence_only_when_asked() -> None:
    from tracerag.materials._credibility import confidence_with_credibility

    policy = CredibilityPolicy(prior=0.6)
    assert confidence_with_credibility(0.9, [0.3], policy) == 0.9  # off by default
    assert confidence_with_credibility(0.9, [0.3, 0.15], policy, weight=1.0) == pytest.approx(
        0.9 * 0.375, abs=1e-12
    )
    assert confidence_with_credibility(0.9, [0.8, 0.9], policy, weight=2.0) == 0.9
    assert confidence_with_credibility(0.9, [], policy, weight=1.0) == 0.9
