"""The write gate: which new or changed materials must wait for a person before they are used.

Rules run first, in this order, and every one that matches adds a reason:

* ``hedge`` — hedged statements: 好像 / 可能 / 大概 / 也许 / 估计 / maybe / perhaps / probably /
  I think / I guess / not sure;
* ``question`` — questions: 是不是 / 是否 / …吗 / ``?`` / ``？``;
* ``instruction`` — instruction-like content: 记住 / 以后都要 / 必须 / 一律 / from now on / always /
  ignore (all) previous / you must / remember that;
* ``conflict`` — a stated quantity that differs from an active material's (``conflicts``).

A matching write goes to ``pending_review`` with the reasons; only an explicit approval makes it
active. An optional classifier (a callable returning reasons) runs after the rules and may add
reasons of its own; it cannot clear a rule's. Every verdict is logged (logger
``tracerag.materials.gate``) and kept with the version it judged.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tracerag.materials._conflicts import DEFAULT_MIN_OVERLAP, Conflict, find_conflicts

GATE_RULES_VERSION = "gate-rules@1"

log = logging.getLogger("tracerag.materials.gate")


@dataclass(frozen=True)
class GateReason:
    """One reason a write was held: the rule and the text that triggered it."""

    rule: str  # hedge | question | instruction | conflict | classifier
    match: str
    detail: str = ""

    def to_dict(self) -> dict[str, str]:
        """A JSON-able form."""
        return {"rule": self.rule, "match": self.match, "detail": self.detail}


@dataclass(frozen=True)
class GateVerdict:
    """The gate's decision on one write."""

    status: str  # "active" or "pending_review"
    reasons: tuple[GateReason, ...] = ()
    rules_version: str = GATE_RULES_VERSION
    classifier_version: str | None = None
    conflicts: tuple[Conflict, ...] = field(default=(), compare=False)

    @property
    def held(self) -> bool:
        """True when the write must wait for review."""
        return self.status == "pending_review"

    @property
    def reason_text(self) -> str:
        """The reasons in one line."""
        return "; ".join(f"{r.rule}: {r.match}" for r in self.reasons)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form."""
        return {
            "status": self.status,
            "reasons": [r.to_dict() for r in self.reasons],
            "rules_version": self.rules_version,
            "classifier_version": self.classifier_version,
        }


def _en(*phrases: str) -> list[re.Pattern[str]]:
    return [re.compile(rf"(?<![A-Za-z]){p}(?![A-Za-z])", re.IGNORECASE) for p in phrases]


def _zh(*phrases: str) -> list[re.Pattern[str]]:
    return [re.compile(p) for p in phrases]


RULES: dict[str, list[re.Pattern[str]]] = {
    "hedge": _zh("好像", "可能", "大概", "也许", "估计", "似乎")
    + _en(
        "maybe",
        "perhaps",
        "probably",
        r"i\s+think",
        r"i\s+guess",
        r"i\s+believe",
        r"not\s+sure",
        "might",
    ),
    "question": _zh("是不是", "是否", r"吗\s*(?:[。？?！!，,]|$)", r"[?？]"),
    "instruction": _zh("记住", "以后都要", "以后都", "必须", "一律", "从现在起", "忽略之前")
    + _en(
        r"from\s+now\s+on",
        "always",
        r"ignore\s+(?:all\s+|any\s+)?(?:the\s+)?previous",
        r"you\s+must",
        r"remember\s+that",
        r"disregard\s+(?:all\s+|any\s+)?(?:the\s+)?previous",
    ),
}

Classifier = Callable[[str], Sequence[GateReason]]


class WriteGate:
    """Rules first, then an optional classifier; ``check`` returns the verdict."""

    def __init__(
        self,
        *,
        classifier: Classifier | None = None,
        classifier_version: str | None = None,
        min_overlap: float = DEFAULT_MIN_OVERLAP,
        rules: dict[str, list[re.Pattern[str]]] | None = None,
        rules_version: str = GATE_RULES_VERSION,
    ) -> None:
        self.classifier = classifier
        self.classifier_version = classifier_version
        self.min_overlap = min_overlap
        self.rules = RULES if rules is None else rules
        self.rules_version = rules_version

    def rule_reasons(self, text: str) -> list[GateReason]:
        """The hedge, question and instruction reasons for a text."""
        reasons = []
        for rule, patterns in self.rules.items():
            for pattern in patterns:
                m = pattern.search(text)
                if m:
                    reasons.append(GateReason(rule, m.group(0).strip() or m.group(0)))
                    break
        return reasons

    def check(
        self,
        text: str,
        *,
        material_id: str = "",
        active: Iterable[tuple[str, str]] = (),
    ) -> GateVerdict:
        """Judge one write; ``active`` is ``(id, text)`` of the active materials to compare."""
        reasons = self.rule_reasons(text)
        conflicts = find_conflicts(material_id, text, active, self.min_overlap)
        for c in conflicts:
            reasons.append(
                GateReason(
                    "conflict",
                    f"{c.value_a} vs {c.value_b} in {c.material_b}",
                    c.key,
                )
            )
        if self.classifier is not None:
            reasons += list(self.classifier(text))
        verdict = GateVerdict(
            "pending_review" if reasons else "active",
            tuple(reasons),
            self.rules_version,
            self.classifier_version if self.classifier is not None else None,
            tuple(conflicts),
        )
        log.info(
            "write gate %s: %s %s",
            verdict.rules_version,
            material_id or "(new)",
            verdict.status + (f" ({verdict.reason_text})" if reasons else ""),
        )
        return verdict


__all__ = ["GATE_RULES_VERSION", "RULES", "GateReason", "GateVerdict", "WriteGate"]
