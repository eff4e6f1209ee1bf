"""Attribution of an answer to its materials, tiers 1 and 2: no model call, every request.

Tier 1 explains retrieval and use: every candidate's score, the top-1 margin and the shape of
the scores (a clear winner, or a cluster of near-equal candidates), the question terms each
material shares with the question, each material's position in the prompt, and whether it was
used, with the reason when it was not. Tier 2 gives each material its attribution share — the
claims of the answer it supports, each claim weighing the same — and labels it ``key``,
``supporting`` or ``irrelevant``. Shares and labels compare materials within one request only.

Every function here is pure: plain inputs in (materials with ids, scores, text and metadata;
the question; the claims with their verdicts and supporting material ids; the prompt order),
frozen values out.

Score shape (``ShapeThresholds``, relative to the top score, so they hold for any score scale
whose higher is better):

- ``clear``: the top-1 margin is at least ``clear_margin`` (default 25 %) of the top score;
- ``clustered``: at least ``cluster_size`` (default 2) candidates, the top one included, score
  within ``cluster_band`` (default 10 %) of the top score — the knowledge base holds several
  near-equal answers to this question;
- ``moderate``: neither;
- ``single``, ``unscored``, ``empty``: one candidate, candidates without scores, none.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timezone
from functools import lru_cache
from typing import Any, Protocol

from tracerag.errors import ConfigurationError
from tracerag.text._words import content_terms, token_set

# the router's decisions (tracerag._routing), named here so signals import nothing above them
PASS = "pass"
REVIEW = "review"

__all__ = [
    "BELOW_FLOOR",
    "CITED_SUPPORTED",
    "CITED_UNSUPPORTED",
    "CLEAR",
    "CLUSTERED",
    "IRRELEVANT",
    "KEY",
    "NOT_CITED",
    "OUTSIDE_VALIDITY",
    "STALE",
    "SUPPORTING",
    "Attribution",
    "CandidateScore",
    "ClaimLink",
    "MaterialAttribution",
    "MaterialLike",
    "RetrievalExplanation",
    "ShapeThresholds",
    "SurfaceMatch",
    "apply_retrieval_shape",
    "attribute",
    "claim_links",
    "explain_retrieval",
    "surface_match",
    "validity_reason",
]

# -- score shape ---------------------------------------------------------------------------------

CLEAR = "clear"
MODERATE = "moderate"
CLUSTERED = "clustered"
SINGLE = "single"
UNSCORED = "unscored"
EMPTY = "empty"
SHAPES = (CLEAR, MODERATE, CLUSTERED, SINGLE, UNSCORED, EMPTY)


@dataclass(frozen=True)
class ShapeThresholds:
    """Where a top-1 margin is clear and where candidates are near-equal (shares of top score)."""

    clear_margin: float = 0.25
    cluster_band: float = 0.10
    cluster_size: int = 2

    def __post_init__(self) -> None:
        if not 0.0 <= self.cluster_band <= self.clear_margin:
            raise ConfigurationError("thresholds must satisfy 0 <= cluster_band <= clear_margin")
        if self.cluster_size < 2:
            raise ConfigurationError("a cluster has at least two candidates")


@dataclass(frozen=True)
class CandidateScore:
    """One retrieved candidate: its score, rank and distance below the top score."""

    material_id: str
    rank: int
    score: float | None
    gap: float | None  # (top - score) / |top|; 0 for the top candidate


@dataclass(frozen=True)
class RetrievalExplanation:
    """Every candidate's score, the top-1 margin and the shape of the scores."""

    candidates: tuple[CandidateScore, ...]
    top_score: float | None
    margin: float | None  # top score minus the second
    relative_margin: float | None  # margin as a share of |top score|
    shape: str
    near_top: tuple[str, ...]  # ids within the cluster band of the top score, top included
    thresholds: ShapeThresholds = ShapeThresholds()

    @property
    def clustered(self) -> bool:
        return self.shape == CLUSTERED

    def to_record(self) -> dict[str, Any]:
        """The JSON-able form kept in the audit record."""
        return {
            "shape": self.shape,
            "top_score": self.top_score,
            "margin": self.margin,
            "relative_margin": self.relative_margin,
            "near_top": list(self.near_top),
            "candidates": [
                {"id": c.material_id, "rank": c.rank, "score": c.score, "gap": c.gap}
                for c in self.candidates
            ],
            "thresholds": {
                "clear_margin": self.thresholds.clear_margin,
                "cluster_band": self.thresholds.cluster_band,
                "cluster_size": self.thresholds.cluster_size,
            },
        }


def explain_retrieval(
    scored: Sequence[tuple[str, float | None]],
    thresholds: ShapeThresholds = ShapeThresholds(),
) -> RetrievalExplanation:
    """The retrieval explanation of candidates given as ``(material_id, score)`` in rank order."""
    if not scored:
        return RetrievalExplanation((), None, None, None, EMPTY, (), thresholds)
    scores = [s for _, s in scored]
    if any(s is None or not math.isfinite(s) for s in scores):
        candidates = tuple(
            CandidateScore(mid, i, s, None) for i, (mid, s) in enumerate(scored, start=1)
        )
        return RetrievalExplanation(candidates, None, None, None, UNSCORED, (), thresholds)
    values = [float(s) for s in scores]  # type: ignore[arg-type]
    ordered = sorted(values, reverse=True)
    top = ordered[0]
    scale = abs(top) or 1.0
    candidates = tuple(
        CandidateScore(mid, i, v, round((top - v) / scale, 6))
        for i, ((mid, _), v) in enumerate(zip(scored, values, strict=True), start=1)
    )
    near = tuple(c.material_id for c in candidates if (c.gap or 0.0) <= thresholds.cluster_band)
    if len(values) == 1:
        return RetrievalExplanation(candidates, top, None, None, SINGLE, near, thresholds)
    margin = round(top - ordered[1], 6)
    relative = round(margin / scale, 6)
    if len(near) >= thresholds.cluster_size:
        shape = CLUSTERED
    elif relative >= thresholds.clear_margin:
        shape = CLEAR
    else:
        shape = MODERATE
    return RetrievalExplanation(candidates, top, margin, relative, shape, near, thresholds)


def apply_retrieval_shape(decision: str, shape: str, enabled: bool) -> tuple[str, str | None]:
    """The route after the score-shape signal, and why it changed (None when it did not).

    When ``enabled``, a passing answer whose retrieval is clustered goes to review: the
    knowledge base holds several near-equal candidates, so the answer may rest on the wrong one.
    """
    if enabled and decision == PASS and shape == CLUSTERED:
        return REVIEW, "retrieval clustered: several near-equal candidates for this question"
    return decision, None


# -- surface match -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SurfaceMatch:
    """The question's content terms a material shares, and their share of the question's terms."""

    shared_terms: tuple[str, ...]
    coverage: float


@lru_cache(maxsize=2048)
def _token_set(text: str) -> frozenset[str]:
    return token_set(text)


@lru_cache(maxsize=1024)
def question_terms(question: str) -> tuple[str, ...]:
    """The question's content terms (stemmed English words, numbers, Chinese bigrams), once each."""
    return tuple(dict.fromkeys(content_terms(question)))


def surface_match(question: str, material_text: str) -> SurfaceMatch:
    """Which content terms of the question occur in the material (the verifier's tokeniser)."""
    terms = question_terms(question)
    if not terms:
        return SurfaceMatch((), 0.0)
    tokens = _token_set(material_text)
    shared = tuple(t for t in terms if t in tokens)
    return SurfaceMatch(shared, round(len(shared) / len(terms), 4))


# -- use and rejection ---------------------------------------------------------------------------

CITED_SUPPORTED = "cited_supported"
CITED_UNSUPPORTED = "cited_unsupported"
NOT_CITED = "not_cited"
STALE = "stale_or_superseded"
OUTSIDE_VALIDITY = "outside_validity_window"
BELOW_FLOOR = "below_relevance_floor"
REASONS = (CITED_SUPPORTED, CITED_UNSUPPORTED, NOT_CITED, STALE, OUTSIDE_VALIDITY, BELOW_FLOOR)
# Which reason explains an unused material first: what the material is, then how it was used.
_PRECEDENCE = (STALE, OUTSIDE_VALIDITY, BELOW_FLOOR, CITED_UNSUPPORTED, NOT_CITED)

KEY = "key"
SUPPORTING = "supporting"
IRRELEVANT = "irrelevant"
ROLES = (KEY, SUPPORTING, IRRELEVANT)
#: a material is ``key`` when its share is at least this fraction of the largest share
KEY_RATIO = 0.75

_STALE_STATUSES = frozenset({"superseded", "stale", "withdrawn"})


class MaterialLike(Protocol):
    """What attribution reads of a retrieved material."""

    @property
    def id(self) -> str: ...

    @property
    def text(self) -> str: ...

    @property
    def score(self) -> float | None: ...

    @property
    def metadata(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class ClaimLink:
    """One claim of the answer: its verdict, the retrieved ids it cites, the id supporting it."""

    verdict: str
    cited_ids: tuple[str, ...] = ()
    material_id: str | None = None

    @property
    def supported(self) -> bool:
        return self.verdict == "supported" and self.material_id is not None


def claim_links(claims: Iterable[Any], resolve: Any = None) -> tuple[ClaimLink, ...]:
    """ClaimLinks from verifier verdicts (``verdict``, ``cited_ids``, ``material_id``).

    ``resolve`` maps a cited marker to a material id (None for one not retrieved); by default
    markers are ids. Fabricated markers are left out.
    """
    links = []
    for c in claims:
        fabricated_ids = getattr(c, "fabricated_ids", None)
        fabricated = frozenset(fabricated_ids) if fabricated_ids else frozenset()
        ids = []
        for marker in c.cited_ids:
            if marker in fabricated:
                continue
            mid = resolve(marker) if resolve is not None else marker
            if mid is not None and mid not in ids:
                ids.append(mid)
        links.append(ClaimLink(str(c.verdict), tuple(ids), c.material_id))
    return tuple(links)


def _as_date(value: Any) -> date | None:
    if type(value) is str:
        return _date_of_text(value[:10])
    if isinstance(value, datetime):
        return value.date()
    if isinstance(value, date):
        return value
    try:
        return date.fromisoformat(str(value)[:10])
    except ValueError:
        return None


@lru_cache(maxsize=1024)
def _date_of_text(text: str) -> date | None:
    try:
        return date.fromisoformat(text)
    except ValueError:
        return None


def validity_reason(metadata: Mapping[str, Any], today: date) -> tuple[str, str] | None:
    """``(reason, detail)`` when the metadata disqualifies a material, else None.

    Superseded or withdrawn (``superseded_by``, ``status``) is ``stale_or_superseded``; past its
    ``valid_until``, before its ``effective_from`` or ``status: expired`` is
    ``outside_validity_window``. The first two are what the verifier refuses as support.
    """
    superseded_by = metadata.get("superseded_by")
    if superseded_by:
        return STALE, f"superseded by {superseded_by}"
    status = metadata.get("status")
    if status in _STALE_STATUSES:
        return STALE, f"marked {status}"
    if status == "expired":
        return OUTSIDE_VALIDITY, "marked expired"
    valid_until = metadata.get("valid_until")
    until = _as_date(valid_until) if valid_until else None
    if until is not None and until < today:
        return OUTSIDE_VALIDITY, f"valid until {until.isoformat()}, now past"
    effective_from = metadata.get("effective_from")
    start = _as_date(effective_from) if effective_from else None
    if start is not None and start > today:
        return OUTSIDE_VALIDITY, f"effective from {start.isoformat()}, not yet"
    return None


@dataclass(frozen=True)
class MaterialAttribution:
    """One retrieved material: where it stood, whether it was used and why, and what it carries."""

    material_id: str
    rank: int
    score: float | None
    prompt_position: int | None  # 1-based position in the prompt; None if not in the prompt
    surface: SurfaceMatch
    cited_by: tuple[int, ...]  # 0-based indices of the claims citing it
    supports: tuple[int, ...]  # 0-based indices of the claims it supports
    used: bool
    reason: str  # the first of ``reasons`` that explains it
    reasons: tuple[str, ...]
    detail: str
    share: float  # claims it supports, each claim weighing 1/len(claims)
    role: str  # key | supporting | irrelevant

    def to_record(self) -> dict[str, Any]:
        return {
            "id": self.material_id,
            "rank": self.rank,
            "score": self.score,
            "prompt_position": self.prompt_position,
            "shared_terms": list(self.surface.shared_terms),
            "term_coverage": self.surface.coverage,
            "cited_by": list(self.cited_by),
            "supports": list(self.supports),
            "used": self.used,
            "reason": self.reason,
            "reasons": list(self.reasons),
            "detail": self.detail,
            "share": self.share,
            "role": self.role,
        }

    def summary(self) -> dict[str, Any]:
        """The caller's view: ids, role, reason, share and position; no material text."""
        return {
            "material_id": self.material_id,
            "used": self.used,
            "reason": self.reason,
            "detail": self.detail,
            "role": self.role,
            "share": self.share,
            "position": self.prompt_position,
            "score": self.score,
        }


def _material_attribution(**values: Any) -> MaterialAttribution:
    """The MaterialAttribution with these field values (every field named)."""
    # what the frozen __init__ makes, without its object.__setattr__ per field: attribute()
    # makes one for every retrieved material of every request
    made = object.__new__(MaterialAttribution)
    made.__dict__.update(values)
    return made


@dataclass(frozen=True)
class Attribution:
    """Tier 1 and tier 2 attribution of one answer."""

    retrieval: RetrievalExplanation
    materials: tuple[MaterialAttribution, ...]
    n_claims: int
    unattributed: float  # share of claims no retrieved material supports
    relevance_floor: float | None = None

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(m.material_id for m in self.materials if m.role == KEY)

    @property
    def used_ids(self) -> tuple[str, ...]:
        return tuple(m.material_id for m in self.materials if m.used)

    def get(self, material_id: str) -> MaterialAttribution | None:
        return next((m for m in self.materials if m.material_id == material_id), None)

    def to_record(self) -> dict[str, Any]:
        """The JSON-able form kept in the audit record."""
        return {
            "retrieval": self.retrieval.to_record(),
            "materials": [m.to_record() for m in self.materials],
            "n_claims": self.n_claims,
            "unattributed": self.unattributed,
            "relevance_floor": self.relevance_floor,
            "key": list(self.key_ids),
        }

    def summary(self) -> list[dict[str, Any]]:
        """The compact caller view of every retrieved material."""
        return [m.summary() for m in self.materials]


def _detail(
    reason: str,
    validity: tuple[str, str] | None,
    score: float | None,
    floor: float | None,
    n_cited: int,
    n_supported: int,
) -> str:
    if reason in (STALE, OUTSIDE_VALIDITY) and validity is not None:
        return validity[1]
    if reason == BELOW_FLOOR:
        return f"score {score:.3f} below the floor {floor:.3f}"
    if reason == CITED_SUPPORTED:
        return f"supports {n_supported} claim(s)"
    if reason == CITED_UNSUPPORTED:
        return f"cited by {n_cited} claim(s), supports none"
    return "retrieved, never cited"


def attribute(
    question: str,
    materials: Sequence[MaterialLike],
    claims: Sequence[ClaimLink],
    *,
    prompt_order: Sequence[str] | None = None,
    relevance_floor: float | None = None,
    today: date | None = None,
    retrieval: RetrievalExplanation | None = None,
    thresholds: ShapeThresholds = ShapeThresholds(),
) -> Attribution:
    """Tier 1 and tier 2 attribution of an answer's claims to the retrieved ``materials``.

    ``materials`` are in retrieved order; ``prompt_order`` is the order of material ids in the
    prompt (default: retrieved order); ``relevance_floor`` is the lowest score accepted as
    relevant; ``today`` dates validity windows (default: today, UTC).
    """
    today = today or datetime.now(timezone.utc).date()
    if retrieval is None:
        retrieval = explain_retrieval([(m.id, m.score) for m in materials], thresholds)
    order = list(prompt_order) if prompt_order is not None else [m.id for m in materials]
    positions: dict[str, int] = {}
    for i, mid in enumerate(order, start=1):
        positions.setdefault(mid, i)  # the first place it holds
    n = len(claims)
    weight = 1.0 / n if n else 0.0
    cited: dict[str, list[int]] = {}
    supports: dict[str, list[int]] = {}
    for i, claim in enumerate(claims):
        for mid in claim.cited_ids:
            cited.setdefault(mid, []).append(i)
        if claim.supported:
            supports.setdefault(claim.material_id, []).append(i)  # type: ignore[arg-type]
    shares = {
        m.id: round(len(supports[m.id]) * weight, 6) if m.id in supports else 0.0 for m in materials
    }
    top_share = max(shares.values(), default=0.0)

    out = []
    for rank, m in enumerate(materials, start=1):
        mid, score = m.id, m.score
        validity = validity_reason(m.metadata or {}, today)
        supported_by = tuple(supports.get(mid, ()))
        cited_by = tuple(cited.get(mid, ()))
        below = relevance_floor is not None and score is not None and score < relevance_floor
        reasons = [CITED_SUPPORTED] if supported_by else []
        if validity is not None:
            reasons.append(validity[0])
        if below:
            reasons.append(BELOW_FLOOR)
        if cited_by and not supported_by:
            reasons.append(CITED_UNSUPPORTED)
        if not cited_by:
            reasons.append(NOT_CITED)
        used = bool(supported_by)
        # the first reason in _PRECEDENCE order that applies
        if used:
            reason = CITED_SUPPORTED
        elif validity is not None:
            reason = validity[0]
        elif below:
            reason = BELOW_FLOOR
        else:
            reason = CITED_UNSUPPORTED if cited_by else NOT_CITED
        share = shares[mid]
        if share <= 0.0:
            role = IRRELEVANT
        elif share >= KEY_RATIO * top_share:
            role = KEY
        else:
            role = SUPPORTING
        out.append(
            _material_attribution(
                material_id=mid,
                rank=rank,
                score=score,
                prompt_position=positions.get(mid),
                surface=surface_match(question, m.text),
                cited_by=cited_by,
                supports=supported_by,
                used=used,
                reason=reason,
                reasons=tuple(reasons),
                detail=_detail(
                    reason, validity, score, relevance_floor, len(cited_by), len(supported_by)
                ),
                share=share,
                role=role,
            )
        )
    attributed = sum(1 for c in claims if c.supported and c.material_id in shares)
    return Attribution(
        retrieval=retrieval,
        materials=tuple(out),
        n_claims=n,
        unattributed=round(1.0 - attributed * weight, 6) if n else 0.0,
        relevance_floor=relevance_floor,
    )
