"""Business rules: user callables ``(question, answer, materials) -> RuleResult``.

A rule may return a ``RuleResult`` or a bool. A rule that raises is recorded as failed with the
error; it never fails the request. A failed ``required`` rule caps the confidence below the
escalation threshold.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tracerag.signals._types import Material


@dataclass(frozen=True)
class RuleResult:
    """The outcome of one rule on one answer."""

    name: str
    passed: bool
    required: bool = False
    detail: str = ""


Rule = Callable[[str, str, Sequence[Material]], "RuleResult | bool"]


def rule(name: str | None = None, *, required: bool = False) -> Callable[[Rule], Rule]:
    """Decorator naming a rule and saying whether it is required."""

    def mark(fn: Rule) -> Rule:
        fn.rule_name = name or getattr(fn, "__name__", "rule")  # type: ignore[attr-defined]
        fn.rule_required = required  # type: ignore[attr-defined]
        return fn

    return mark


def run_rules(
    rules: Sequence[Rule], question: str, answer: str, materials: Sequence[Material]
) -> list[RuleResult]:
    """Run every rule on the answer; exceptions become failed results, never crashes."""
    results: list[RuleResult] = []
    for fn in rules:
        name = str(getattr(fn, "rule_name", None) or getattr(fn, "__name__", type(fn).__name__))
        required = bool(getattr(fn, "rule_required", False))
        try:
            outcome = fn(question, answer, materials)
        except Exception as exc:  # a broken rule is a failed rule, with its error kept
            results.append(RuleResult(name, False, required, f"rule raised {exc!r}"))
            continue
        if isinstance(outcome, RuleResult):
            results.append(outcome)
        elif isinstance(outcome, bool):
            results.append(RuleResult(name, outcome, required))
        else:
            results.append(
                RuleResult(name, False, required, f"rule returned {type(outcome).__name__}")
            )
    return results
