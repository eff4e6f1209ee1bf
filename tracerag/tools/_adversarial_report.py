"""Scoring the adversarial self-test: interception per mutation kind and false alarms.

``run_adversarial`` verifies every mutated answer and every clean one; the report compares
the rates with their floors and renders them.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tracerag.errors import InputError
from tracerag.signals._citations import SUPPORTED, verify_citations
from tracerag.signals._claims import CITATION_RE, Claim
from tracerag.signals._support import SupportBackend, get_backend
from tracerag.tools._adversarial_cases import Case
from tracerag.tools._adversarial_mutations import (
    MUTATION_KINDS,
    Inventory,
    Mutation,
    claim_mutations,
    claim_segments,
)

__all__ = [
    "DEFAULT_FLOORS",
    "DEFAULT_MAX_FALSE_ALARM",
    "AdversarialReport",
    "KindResult",
    "run_adversarial",
]


#: The goals: every fabricated id, 95% of changed numbers and dates.
DEFAULT_FLOORS: dict[str, float] = {"fabricated": 1.0, "number": 0.95, "date": 0.95}
DEFAULT_MAX_FALSE_ALARM = 0.05
# ----------------------------------------------------------------------------------------------
# The self-test


@dataclass
class KindResult:
    """How often one mutation type was intercepted."""

    kind: str
    total: int = 0
    intercepted: int = 0
    floor: float | None = None
    misses: list[dict[str, Any]] = field(default_factory=list)
    by_language: dict[str, list[int]] = field(default_factory=dict)  # lang -> [caught, total]

    @property
    def rate(self) -> float | None:
        """Share of mutations intercepted (None when there were none)."""
        return self.intercepted / self.total if self.total else None

    @property
    def ok(self) -> bool:
        """Whether the rate meets the floor (no floor, or no mutation, is ok)."""
        return self.floor is None or self.rate is None or self.rate >= self.floor - 1e-12


@dataclass
class AdversarialReport:
    """Interception per mutation type and false alarms on the unmutated answers."""

    backend: str
    source: str
    cases: int = 0
    eligible: int = 0  # unmutated answers whose claims all cite retrieved, current materials
    claims: int = 0  # supported claims that were mutated
    false_alarms: int = 0
    max_false_alarm: float = DEFAULT_MAX_FALSE_ALARM
    excluded: dict[str, int] = field(default_factory=dict)
    kinds: dict[str, KindResult] = field(default_factory=dict)
    not_applicable: dict[str, int] = field(default_factory=dict)
    false_alarm_examples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def false_alarm_rate(self) -> float | None:
        """Share of eligible unmutated answers in which the verifier flagged a claim."""
        return self.false_alarms / self.eligible if self.eligible else None

    def failures(self) -> list[str]:
        """Each floor missed and the false-alarm limit if exceeded, for people."""
        out = [
            f"{k.kind}: intercepted {k.intercepted}/{k.total} ({k.rate:.1%}) < floor {k.floor:.1%}"
            for k in self.kinds.values()
            if not k.ok and k.rate is not None and k.floor is not None
        ]
        rate = self.false_alarm_rate
        if rate is not None and rate > self.max_false_alarm + 1e-12:
            out.append(
                f"false alarms: {self.false_alarms}/{self.eligible} ({rate:.1%}) > "
                f"{self.max_false_alarm:.1%}"
            )
        if not self.eligible:
            out.append("no eligible answers to test")
        return out

    def untested(self) -> list[str]:
        """Mutation kinds with a floor but no mutation made (e.g. answers without dates)."""
        return [k for k, r in self.kinds.items() if r.floor and not r.total]

    @property
    def ok(self) -> bool:
        """Whether every floor is met and false alarms are within the limit."""
        return not self.failures()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form."""
        return {
            "backend": self.backend,
            "source": self.source,
            "cases": self.cases,
            "eligible": self.eligible,
            "claims_mutated": self.claims,
            "excluded": self.excluded,
            "false_alarms": self.false_alarms,
            "false_alarm_rate": self.false_alarm_rate,
            "max_false_alarm": self.max_false_alarm,
            "false_alarm_examples": self.false_alarm_examples,
            "mutations": {
                k: {
                    "total": r.total,
                    "intercepted": r.intercepted,
                    "rate": r.rate,
                    "floor": r.floor,
                    "ok": r.ok,
                    "by_language": {
                        lang: {"intercepted": c[0], "total": c[1]}
                        for lang, c in sorted(r.by_language.items())
                    },
                    "misses": r.misses,
                }
                for k, r in self.kinds.items()
            },
            "not_applicable": self.not_applicable,
            "ok": self.ok,
            "failures": self.failures(),
            "untested": self.untested(),
        }

    def render(self, show_misses: int = 3) -> str:
        """A table for people, with a few missed mutations of each type."""
        lines = [
            f"adversarial self-test — backend {self.backend}, {self.cases} answers "
            f"({self.source}); {self.claims} supported claims mutated; {self.eligible} answers "
            "checked for false alarms",
            "",
            f"{'mutation':<16}{'intercepted':>13}{'rate':>9}{'floor':>9}  {'':<12}"
            f"{'en':>9}{'zh':>9}",
        ]
        for r in self.kinds.values():
            rate = f"{r.rate:.1%}" if r.rate is not None else "—"
            floor = f"{r.floor:.0%}" if r.floor is not None else "—"
            status = "ok" if r.ok else "BELOW FLOOR"
            if r.floor is None:
                status = ""
            langs = "".join(
                f"{'{}/{}'.format(*r.by_language.get(lang, [0, 0])):>9}" for lang in ("en", "zh")
            )
            lines.append(
                f"{r.kind:<16}{f'{r.intercepted}/{r.total}':>13}{rate:>9}{floor:>9}  "
                f"{status:<12}{langs}"
            )
        fa = self.false_alarm_rate
        fa_text = f"{fa:.1%}" if fa is not None else "—"
        fa_ok = "ok" if fa is not None and fa <= self.max_false_alarm + 1e-12 else "TOO HIGH"
        lines.append(
            f"{'false alarms':<16}{f'{self.false_alarms}/{self.eligible}':>13}{fa_text:>9}"
            f"{f'≤{self.max_false_alarm:.0%}':>9}  {fa_ok}"
        )
        if self.excluded:
            lines.append(
                "answers not checked for false alarms: "
                + ", ".join(f"{n} {why}" for why, n in sorted(self.excluded.items()))
            )
        if any(self.not_applicable.values()):
            lines.append(
                "claims with nothing to mutate: "
                + ", ".join(f"{k} {n}" for k, n in self.not_applicable.items() if n)
            )
        for r in self.kinds.values():
            for miss in r.misses[:show_misses]:
                lines.append(
                    f"  missed {r.kind} ({miss['detail']}): {miss['mutated']!r} → "
                    f"{miss['verdict']} {miss['score']:.2f} ({miss['reason']})"
                )
        for ex in self.false_alarm_examples[:show_misses]:
            lines.append(f"  false alarm: {ex['claim']!r} → {ex['verdict']} ({ex['reason']})")
        if self.untested():
            lines.append(
                "untested (no answer had anything to mutate): " + ", ".join(self.untested())
            )
        failures = self.failures()
        lines.append("")
        lines.append("result: " + ("PASS" if not failures else "FAIL — " + "; ".join(failures)))
        return "\n".join(lines)


def _eligibility(case: Case, claims: Sequence[Claim]) -> str | None:
    by_id = {m.id: m for m in case.materials}
    cited = [c for claim in claims for c in claim.cited_ids]
    if not claims or not cited:
        return "uncited or refusal"
    if any(not claim.cited_ids for claim in claims):
        return "with an uncited claim"
    if any(c not in by_id for c in cited):
        return "citing an unretrieved id"
    if any(by_id[c].stale_reason() for c in cited):
        return "citing an outdated material"
    return None


def run_adversarial(
    cases: Sequence[Case],
    backend: str | SupportBackend = "lexical",
    *,
    kinds: Sequence[str] = MUTATION_KINDS,
    floors: Mapping[str, float] | None = None,
    max_false_alarm: float = DEFAULT_MAX_FALSE_ALARM,
    entity_groups: Sequence[Sequence[str]] | None = None,
    seed: int = 0,
    source: str | None = None,
    keep_misses: int = 20,
) -> AdversarialReport:
    """Mutate every supported claim of every eligible case and count what the verifier catches."""
    impl = get_backend(backend)
    floors = DEFAULT_FLOORS if floors is None else floors
    unknown = set(floors) - set(MUTATION_KINDS)
    if unknown:
        raise InputError(f"unknown mutation kinds in floors: {', '.join(sorted(unknown))}")
    inventory = Inventory.from_cases(cases, entity_groups)
    report = AdversarialReport(
        backend=impl.name,
        source=source if source is not None else (cases[0].source if cases else ""),
        cases=len(cases),
        max_false_alarm=max_false_alarm,
        kinds={k: KindResult(k, floor=floors.get(k)) for k in kinds},
        not_applicable={k: 0 for k in kinds},
    )
    for case in cases:
        claims = claim_segments(case.answer)
        base = verify_citations(case.answer, case.materials, backend=impl)
        why = _eligibility(case, claims)
        if why:
            report.excluded[why] = report.excluded.get(why, 0) + 1
        else:
            report.eligible += 1
            flagged = [c for c in base.claims if c.verdict != SUPPORTED]
            if flagged:
                report.false_alarms += 1
                if len(report.false_alarm_examples) < keep_misses:
                    c = flagged[0]
                    report.false_alarm_examples.append(
                        {
                            "case": case.case_id,
                            "claim": c.text,
                            "verdict": c.verdict,
                            "score": c.score,
                            "reason": c.reason,
                        }
                    )
        if len(base.claims) != len(claims):
            continue
        current = {m.id for m in case.materials if not m.stale_reason()}
        for index, (claim, verdict) in enumerate(zip(claims, base.claims, strict=True)):
            # only claims that cite current, retrieved materials and verify are mutated
            if verdict.verdict != SUPPORTED or not set(claim.cited_ids) <= current:
                continue
            report.claims += 1
            for kind in kinds:
                key = case.case_id.split("-", 1)[-1]  # the content hash: same answer, same rng
                rng = random.Random(f"{seed}:{key}:{index}:{kind}")
                mutations = claim_mutations(
                    kind, case.answer, index, case.materials, inventory, rng
                )
                if not mutations:
                    report.not_applicable[kind] += 1
                for mutation in mutations:
                    _score(report.kinds[kind], mutation, case, impl, keep_misses)
    return report


def _language(text: str) -> str:
    plain = CITATION_RE.sub(" ", text)
    chinese = len(re.findall(r"[\u4e00-\u9fff]", plain))
    return "zh" if chinese > len(re.findall(r"[A-Za-z]+", plain)) else "en"


def _score(
    result: KindResult, mutation: Mutation, case: Case, backend: SupportBackend, keep: int
) -> None:
    checked = verify_citations(mutation.answer, case.materials, backend=backend)
    verdict = checked.claims[mutation.claim_index]
    result.total += 1
    counts = result.by_language.setdefault(_language(mutation.original), [0, 0])
    counts[1] += 1
    if verdict.verdict != SUPPORTED:
        result.intercepted += 1
        counts[0] += 1
    elif len(result.misses) < keep:
        result.misses.append(
            {
                "case": case.case_id,
                "question": case.question,
                "original": mutation.original,
                "mutated": mutation.mutated,
                "detail": mutation.detail,
                "verdict": verdict.verdict,
                "score": verdict.score,
                "reason": verdict.reason,
            }
        )
