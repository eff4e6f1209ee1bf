"""Citation verification: did the answer cite only what was retrieved, and does it say so?

For each claim of an answer: an id that was not retrieved is a fabricated citation; a stale or
superseded material is not support; otherwise the support backend scores the claim against each
cited material and the best one gives the verdict and the supporting sentence. Given the
question, a claim that a material backs only by a general sentence while the same material
states the question's own case with another value is not supported (see ``_specificity``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import TYPE_CHECKING, TypedDict

from tracerag._choices import check_options
from tracerag.signals._claims import Claim, split_claims
from tracerag.signals._specificity import check_specificity
from tracerag.signals._support import (
    Support,
    SupportBackend,
    SyncSupportBackend,
    acheck_support,
    get_backend,
)
from tracerag.signals._types import Material

if TYPE_CHECKING:
    from typing_extensions import Unpack

SUPPORTED = "supported"
UNSUPPORTED = "unsupported"
FABRICATED = "fabricated_citation"
STALE = "stale"
UNCITED = "uncited"


@dataclass
class ClaimVerdict:
    """The verdict on one claim, with the material sentence that best supports it."""

    text: str
    cited_ids: list[str]
    verdict: str
    score: float = 0.0
    material_id: str | None = None
    sentence: str | None = None
    start: int | None = None
    end: int | None = None
    reason: str = ""
    fabricated_ids: list[str] = field(default_factory=list)
    stale_ids: list[str] = field(default_factory=list)


@dataclass
class CitationReport:
    """Per-claim verdicts and the answer-level citation signals."""

    claims: list[ClaimVerdict] = field(default_factory=list)
    coverage: float = 0.0  # share of claims with at least one valid (retrieved) citation
    accuracy: float = 0.0  # share of (claim, cited id) pairs that verify
    score: float = 0.0  # share of claims supported
    fabricated: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    backend: str = ""

    @property
    def valid(self) -> bool:
        """True when nothing is fabricated and every claim is supported."""
        return bool(self.claims) and not self.fabricated and self.score == 1.0


IdResolver = Callable[[str], "str | None"]


class CitationOptions(TypedDict, total=False):
    """How ``verify_citations`` and ``averify_citations`` check an answer.

    ``backend`` ("lexical"): a support backend, or the name it is registered under.
    ``resolve`` maps a cited marker to a material id (e.g. ``"1"`` → the first retrieved
    material, for foreign chains); by default markers are material ids. ``today``: the date a
    material's validity is judged on (default: today). ``question``: the question the answer
    answers; with it, a claim backed only by a general sentence of a material that states the
    question's own case with another value is not supported.
    """

    backend: str | SupportBackend
    resolve: IdResolver | None
    today: date | None
    question: str | None


def verify_citations(
    answer: str, materials: Sequence[Material], **options: Unpack[CitationOptions]
) -> CitationReport:
    """Verify every claim of ``answer`` against the retrieved ``materials``."""
    return _verify(_backend("verify_citations", options), answer, materials, options)


async def averify_citations(
    answer: str, materials: Sequence[Material], **options: Unpack[CitationOptions]
) -> CitationReport:
    """``verify_citations`` for async callers: the backend is awaited (``acheck``), so a slow
    backend does not hold up the event loop. A backend that computes synchronously checks the
    whole answer in one worker thread, unless it says the checks are ``cheap`` (quicker than
    the hop to the thread)."""
    impl = _backend("averify_citations", options)
    plan = _plan(answer, materials, options)
    checks = plan.checks
    if _computes_synchronously(impl):
        cheap = getattr(impl, "cheap", None)
        if cheap is not None and cheap(checks, plan.corpus):
            return plan.check(impl)
        return await asyncio.to_thread(plan.check, impl)
    supports = [await acheck_support(impl, c, m, corpus=plan.corpus) for c, m in checks]
    return plan.finish(impl, supports)


def _backend(caller: str, options: CitationOptions) -> SupportBackend:
    """The support backend the options name; a keyword that is not an option is refused."""
    check_options(caller, options, CitationOptions.__optional_keys__)
    return get_backend(options.get("backend", "lexical"))


def _verify(
    impl: SupportBackend, answer: str, materials: Sequence[Material], options: CitationOptions
) -> CitationReport:
    return _plan(answer, materials, options).check(impl)


@dataclass
class _Plan:
    """What an answer needs checked: each claim's verdict so far, its materials to check and
    why other cited materials are not support."""

    corpus: list[str]
    claims: list[tuple[ClaimVerdict, list[Material], list[str]]]
    question: str | None = None

    @property
    def checks(self) -> list[tuple[str, str]]:
        """The (claim, material text) pairs the support backend scores, in order."""
        return [(verdict.text, m.text) for verdict, targets, _ in self.claims for m in targets]

    def check(self, backend: SupportBackend) -> CitationReport:
        """The report, each check scored by calling ``backend``."""
        corpus = self.corpus
        return self.finish(backend, [backend(c, m, corpus=corpus) for c, m in self.checks])

    def finish(self, backend: SupportBackend, supports: Sequence[Support]) -> CitationReport:
        """The report from the support of each check, in the order of ``checks``; with the
        question, a supported check whose material states the question's own case with another
        value is withdrawn."""
        results = iter(supports)
        question, threshold = self.question, backend.threshold
        said = [verdict.text for verdict, _, _ in self.claims]
        verdicts = [
            _conclude(
                verdict,
                [
                    (
                        check_specificity(
                            question,
                            verdict.text,
                            m.text,
                            next(results),
                            threshold=threshold,
                            others=tuple(said[:k] + said[k + 1 :]),
                        ),
                        m,
                    )
                    for m in targets
                ],
                stale,
            )
            for k, (verdict, targets, stale) in enumerate(self.claims)
        ]
        return _report(backend.name, verdicts)


def _plan(answer: str, materials: Sequence[Material], options: CitationOptions) -> _Plan:
    by_id = {m.id: m for m in materials}
    resolve, today = options.get("resolve"), options.get("today")
    claims = [_targets(claim, by_id, resolve, today) for claim in split_claims(answer)]
    return _Plan(
        corpus=[m.text for m in materials], claims=claims, question=options.get("question")
    )


def _computes_synchronously(backend: SupportBackend) -> bool:
    acheck = getattr(type(backend), "acheck", None)
    return acheck is None or acheck is SyncSupportBackend.acheck


def _report(backend_name: str, verdicts: list[ClaimVerdict]) -> CitationReport:
    report = CitationReport(backend=backend_name)
    pairs = verified_pairs = 0
    for verdict in verdicts:
        report.claims.append(verdict)
        pairs += len(verdict.cited_ids)
        if verdict.verdict == SUPPORTED:
            verified_pairs += _supporting_count(verdict)
        report.fabricated.extend(i for i in verdict.fabricated_ids if i not in report.fabricated)
        report.stale.extend(i for i in verdict.stale_ids if i not in report.stale)
    n = len(report.claims)
    if n:
        with_valid = sum(
            1 for c in report.claims if set(c.cited_ids) - set(c.fabricated_ids) and c.cited_ids
        )
        report.coverage = with_valid / n
        report.score = sum(1 for c in report.claims if c.verdict == SUPPORTED) / n
    report.accuracy = verified_pairs / pairs if pairs else 0.0
    return report


def _supporting_count(verdict: ClaimVerdict) -> int:
    # the cited ids that are retrieved and not stale; the best of them verified the claim
    return max(1, len(verdict.cited_ids) - len(verdict.fabricated_ids) - len(verdict.stale_ids))


def _targets(
    claim: Claim,
    by_id: dict[str, Material],
    resolve: IdResolver | None,
    today: date | None,
) -> tuple[ClaimVerdict, list[Material], list[str]]:
    """The claim's verdict so far, the materials to check it against and why others are not."""
    verdict = ClaimVerdict(text=claim.text, cited_ids=list(claim.cited_ids), verdict=UNCITED)
    if not claim.cited_ids:
        verdict.reason = "no citation"
        return verdict, [], []
    targets: list[Material] = []
    stale_reasons: list[str] = []
    for marker in claim.cited_ids:
        material_id = resolve(marker) if resolve else marker
        material = by_id.get(material_id) if material_id else None
        if material is None:
            verdict.fabricated_ids.append(marker)
            continue
        stale = material.stale_reason(today)
        if stale:
            verdict.stale_ids.append(marker)
            stale_reasons.append(f"{material.id} {stale}")
            continue
        targets.append(material)
    return verdict, targets, stale_reasons


def _conclude(
    verdict: ClaimVerdict, results: list[tuple[Support, Material]], stale_reasons: list[str]
) -> ClaimVerdict:
    """The verdict from the support of each checked material (the best one decides)."""
    if not verdict.cited_ids:
        return verdict
    best: tuple[Support, Material] | None = None
    for result, material in results:
        if best is None or result.score > best[0].score:
            best = (result, material)
    if verdict.fabricated_ids:
        verdict.verdict = FABRICATED
        verdict.reason = "cited but not retrieved: " + ", ".join(verdict.fabricated_ids)
    if best is not None:
        result, material = best
        verdict.score = round(float(result.score), 4)
        verdict.material_id = material.id
        verdict.sentence = result.sentence
        verdict.start, verdict.end = result.start, result.end
        if verdict.verdict != FABRICATED:
            verdict.verdict = SUPPORTED if result.supported else UNSUPPORTED
            verdict.reason = result.reason
    elif verdict.verdict != FABRICATED:
        verdict.verdict = STALE
        verdict.reason = "cited material is not valid support: " + "; ".join(stale_reasons)
    if stale_reasons and verdict.verdict != STALE:
        verdict.reason = "; ".join(filter(None, [verdict.reason, *stale_reasons]))
    return verdict
