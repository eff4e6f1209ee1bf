"""The learned support backend: a calibrated logistic combination of lexical and structural
evidence (and, given sentence embeddings, similarities), with the lexical backend's hard checks
kept.

The lexical analysis of a claim against a material (term coverage, the sentence the claim
aligns to, quantities, negation, comparisons, coordinated parts, swapped names, attribution
preambles) is turned into the features named in ``FEATURES``; with ``embeddings``, the claim's
cosine similarity with the material's sentences adds ``SIMILARITY_FEATURES``. A logistic
regression fitted on human-labelled public data turns them into the probability that the
material supports the claim. That probability is the score; without similarities it is capped
by the coverage where the chosen sentences cover under ``min_cover`` of the claim's weighted
words. A claim is supported when the score reaches the threshold shipped with the coefficients
and no hard check fails (a quantity the material does not state where the claim says it, a
reversed comparison, an unsupported coordinated part, a swapped name, a negation flip).

The coefficients ship as ``tracerag/signals/models/support-learned-v2.json`` and
``support-learned-embeddings-v2.json`` (versioned like calibration files, with an id over their
content); ``benchmarks/verifier_fit.py`` reproduces them. Inference is plain Python. Registered
as ``"learned"`` and, where the MiniLM model is installed, ``"learned-embeddings"``.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from langchain_core.embeddings import Embeddings

from tracerag.errors import ConfigurationError
from tracerag.signals._embeddings import EmbeddingSupport, MiniLMEmbeddings, minilm_available
from tracerag.signals._lexical import (
    LexicalParams,
    LexicalSupport,
    _Analysis,
    _material_view,
    analyse,
)
from tracerag.signals._support import Support, SyncSupportBackend, check_inputs, register_backend

__all__ = [
    "DEFAULT_MODEL",
    "EMBEDDINGS_MODEL",
    "FEATURES",
    "SIMILARITY_FEATURES",
    "Combiner",
    "LearnedSupport",
    "features",
    "similarity_features",
]

#: The coefficients file shipped with the package (lexical and structural evidence).
DEFAULT_MODEL = "support-learned-v2.json"
#: The coefficients file for the combination with sentence embeddings.
EMBEDDINGS_MODEL = "support-learned-embeddings-v2.json"

#: The evidence the combiner weighs, in the order of its coefficients. Nothing here says how
#: long the material or the claim is: such features told the datasets apart rather than
#: supported claims from unsupported ones, and moved the threshold between domains.
FEATURES: tuple[str, ...] = (
    "coverage",  # weighted term coverage of the claim by the chosen sentences (blend)
    "union_cover",  # coverage by the union of the chosen sentences
    "aligned_cover",  # coverage by the single sentence the claim aligns to
    "adjusted",  # the lexical score after its penalties
    "uncovered",  # weight share of claim words no chosen sentence backs
    "foreign",  # ... of those, the share that other sentences or materials use
    "missing_names",  # capitalised names of the claim the chosen sentences lack (share)
    "unstated_quantities",  # claim quantities the material does not state (count, up to 2)
    "conflicting_quantities",  # ... stated elsewhere, with another value in the aligned one
    "negation_flip",
    "reversed_comparison",
    "missing_conjunct",
    "swapped_names",
    "preamble",
    "rarest_missing",  # weight of the rarest claim word no chosen sentence backs (relative)
    "missing_count_log",  # log(1 + claim words no chosen sentence backs)
    "pair_cover",  # share of the claim's neighbouring word pairs in the aligned sentence, in order
    "char_cover",  # share of the claim's character trigrams found in the aligned sentence
    "material_cover",  # weighted share of the claim's words found anywhere in the material
    "material_names",  # share of the claim's names found anywhere in the material
    "best_exact",  # weighted share of the claim's words one sentence states exactly
)

#: With sentence embeddings, the combiner also weighs the claim's cosine similarity with the
#: material's sentences.
SIMILARITY_FEATURES: tuple[str, ...] = (
    "similarity_max",  # the most similar sentence
    "similarity_top3",  # mean of the three most similar sentences
    "similarity_aligned",  # the sentence the claim aligns to by its words
)


def _trigrams(text: str) -> set[str]:
    t = " ".join("".join(ch if ch.isalnum() else " " for ch in text.lower()).split())
    return {t[i : i + 3] for i in range(len(t) - 2)}


def _pair_cover(claim_seq: list[str], sentence_seq: list[str]) -> float:
    pairs = list(itertools.pairwise(claim_seq))
    if not pairs:
        return 0.0
    where: dict[str, list[int]] = {}
    for i, tok in enumerate(sentence_seq):
        where.setdefault(tok, []).append(i)
    found = sum(
        1
        for x, y in pairs
        if any(0 < j - i <= 3 for i in where.get(x, ()) for j in where.get(y, ()))
    )
    return found / len(pairs)


def features(analysis: _Analysis, claim: str, material_text: str) -> list[float]:
    """The feature vector of one lexical analysis of ``claim`` against ``material_text``
    (``FEATURES`` order)."""
    a = analysis
    view = _material_view(material_text)
    conflicts = {raw for raw, _ in a.conflicts}
    unstated = sum(1 for q in a.mismatches if q.raw not in conflicts)
    names = [k for k, t in enumerate(a.terms) if t.entity]
    adjusted, _ = a.adjust(a.score, LexicalSupport().threshold)
    total = sum(t.weight for t in a.terms) or 1.0
    anywhere: set[int] = set()
    best_exact = 0.0
    for i, toks in enumerate(view.tokens):
        if view.question[i]:
            continue
        hit = {k for k, t in enumerate(a.terms) if t.token in toks}
        anywhere |= hit
        best_exact = max(best_exact, sum(a.terms[k].weight for k in hit) / total)
    return [
        a.score,
        a.union_cov,
        a.aligned_cover,
        adjusted,
        a.uncovered,
        a.foreign,
        len(a.missing_entities) / len(names) if names else 0.0,
        float(min(unstated, 2)),
        float(min(len(a.conflicts), 2)),
        float(a.negation_mismatch),
        float(bool(a.comparison)),
        float(bool(a.missing_conjunct)),
        float(min(len(a.swapped), 2)),
        float(bool(a.preamble)),
        *_missing(a),
        _pair_cover(_claim_sequence(a), view.token_seqs[a.chosen[0]]) if a.chosen else 0.0,
        _char_cover(claim, view.sentences[a.chosen[0]].text) if a.chosen else 0.0,
        sum(a.terms[k].weight for k in anywhere) / total,
        sum(1 for k in names if k in anywhere) / len(names) if names else 1.0,
        best_exact,
    ]


def similarity_features(cosines: Sequence[float], aligned: int | None) -> list[float]:
    """The similarity features (``SIMILARITY_FEATURES`` order) of the claim's cosine
    similarity with each sentence, ``aligned`` being the sentence its words align to."""
    if not cosines:
        return [0.0, 0.0, 0.0]
    top = sorted(cosines, reverse=True)[:3]
    return [
        top[0],
        sum(top) / len(top),
        cosines[aligned] if aligned is not None and 0 <= aligned < len(cosines) else 0.0,
    ]


def _missing(a: _Analysis) -> tuple[float, float]:
    weights = [t.weight for t in a.terms]
    missing = [t.weight for k, t in enumerate(a.terms) if a.covered.get(k, 0.0) <= 0.0]
    top = max(weights, default=0.0)
    return (max(missing, default=0.0) / top if top else 0.0, math.log1p(len(missing)))


def _claim_sequence(a: _Analysis) -> list[str]:
    return [tok for _, tok in sorted((s, t.token) for t in a.terms for s, _ in t.spans)]


def _char_cover(claim: str, sentence: str) -> float:
    grams = _trigrams(claim)
    return len(grams & _trigrams(sentence)) / len(grams) if grams else 0.0


@dataclass(frozen=True)
class Combiner:
    """A fitted logistic regression over standardised features."""

    version: str
    features: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    coef: tuple[float, ...]
    intercept: float
    threshold: float
    meta: dict[str, Any]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Combiner:
        """A combiner from its JSON form (as written by ``to_dict``)."""
        names = tuple(data["features"])
        if names not in (FEATURES, FEATURES + SIMILARITY_FEATURES):
            raise ConfigurationError(
                f"support model {data.get('version')!r} was fitted on features {list(names)}, "
                f"this version computes {list(FEATURES)} (and {list(SIMILARITY_FEATURES)} "
                "with embeddings); refit it with benchmarks/verifier_fit.py"
            )
        n = len(names)
        for key in ("mean", "scale", "coef"):
            if len(data[key]) != n:
                raise ConfigurationError(f"support model: {key} has {len(data[key])} values")
        return cls(
            version=str(data["version"]),
            features=names,
            mean=tuple(float(x) for x in data["mean"]),
            scale=tuple(float(x) or 1.0 for x in data["scale"]),
            coef=tuple(float(x) for x in data["coef"]),
            intercept=float(data["intercept"]),
            threshold=float(data["threshold"]),
            meta=dict(data.get("meta", {})),
        )

    @classmethod
    def load(cls, path: str | Path | None = None, *, embeddings: bool = False) -> Combiner:
        """The shipped combiner (the one over similarities too if ``embeddings``), or one
        from a JSON file."""
        if path is None:
            name = EMBEDDINGS_MODEL if embeddings else DEFAULT_MODEL
            text = (resources.files("tracerag.signals") / "models" / name).read_text(
                encoding="utf-8"
            )
        else:
            text = Path(path).read_text(encoding="utf-8")
        return cls.from_dict(json.loads(text))

    @property
    def uses_similarity(self) -> bool:
        """Whether the combiner weighs sentence-embedding similarities."""
        return len(self.features) > len(FEATURES)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "version": self.version,
            "features": list(self.features),
            "mean": list(self.mean),
            "scale": list(self.scale),
            "coef": list(self.coef),
            "intercept": self.intercept,
            "threshold": self.threshold,
            "meta": self.meta,
        }

    def probability(self, x: Sequence[float]) -> float:
        """The probability that the material supports the claim."""
        z = self.intercept + sum(
            c * (v - m) / s for c, v, m, s in zip(self.coef, x, self.mean, self.scale, strict=True)
        )
        if z >= 0:
            return 1.0 / (1.0 + math.exp(-z))
        e = math.exp(z)
        return e / (1.0 + e)


class LearnedSupport(SyncSupportBackend):
    """Support scored by the learned combiner over the lexical and structural evidence, and
    over sentence-embedding similarities when ``embeddings`` are given."""

    def __init__(
        self,
        combiner: Combiner | None = None,
        threshold: float | None = None,
        *,
        embeddings: Embeddings | None = None,
        params: LexicalParams | None = None,
        name: str = "learned",
        min_cover: float = 0.1,
    ) -> None:
        self.combiner = combiner or Combiner.load(embeddings=embeddings is not None)
        if self.combiner.uses_similarity and embeddings is None:
            raise ConfigurationError(
                f"support model {self.combiner.version!r} weighs sentence similarities: "
                "pass embeddings="
            )
        self.threshold = float(self.combiner.threshold if threshold is None else threshold)
        if not 0.0 < self.threshold <= 1.0:
            raise ConfigurationError(f"threshold must be in (0, 1], got {self.threshold!r}")
        self.params = params or LexicalParams()
        self.name = name
        self.min_cover = float(min_cover)
        self._lexical = LexicalSupport(params=self.params, name=name)
        self._similarity = (
            EmbeddingSupport(embeddings, lexical_params=self.params, name=name)
            if embeddings is not None and self.combiner.uses_similarity
            else None
        )

    def __repr__(self) -> str:
        return f"LearnedSupport({self.combiner.version}, threshold={self.threshold})"

    @property
    def embeddings(self) -> Embeddings | None:
        """The sentence embeddings whose similarities the combination weighs, if any."""
        return self._similarity.embeddings if self._similarity is not None else None

    def final_score(self, probability: float, analysis: _Analysis) -> tuple[float, bool]:
        """The score given the combiner's ``probability``, and whether a hard check failed
        (then the claim is not supported whatever the score)."""
        hard = analysis.hard_mismatch or analysis.negation_mismatch
        score = probability
        if analysis.union_cov < self.min_cover and self._similarity is None:
            # without similarities the combiner is not trusted where the material barely
            # covers the claim
            score = min(score, analysis.union_cov)
        if hard:
            score = min(score, self.params.mismatch_cap * self.threshold)
        return score, hard

    def __call__(
        self, claim: str, material_text: str, *, corpus: Sequence[str] | None = None
    ) -> Support:
        """Score how well ``material_text`` supports ``claim``."""
        check_inputs(claim, material_text)
        view = _material_view(material_text)
        analysis = analyse(claim, material_text, corpus, self.params)
        lexical = analysis.to_support(self._lexical, claim, view.sentences)
        x = features(analysis, claim, material_text)
        if self._similarity is not None:
            cosines = self._similarity.similarities(claim, material_text)
            x += similarity_features(cosines, analysis.chosen[0] if analysis.chosen else None)
        probability = self.combiner.probability(x)
        _, reasons = analysis.adjust(analysis.score, self._lexical.threshold)
        score, hard = self.final_score(probability, analysis)
        if score < probability and not hard:
            reasons = reasons or [f"low overlap: covers {analysis.union_cov:.0%} of the claim"]
        supported = score >= self.threshold and not hard
        if not reasons:
            reasons = [
                f"support probability {probability:.2f}"
                + (" " if supported else " (below threshold) ")
                + f"— {lexical.reason}"
            ]
        return Support(
            score=round(max(0.0, min(1.0, score)), 6),
            supported=supported,
            sentence=lexical.sentence,
            start=lexical.start,
            end=lexical.end,
            backend=self.name,
            reason="; ".join(reasons),
            mismatches=lexical.mismatches,
            candidates=lexical.candidates,
            unsupported_terms=lexical.unsupported_terms,
        )


def _with_minilm() -> LearnedSupport:
    return LearnedSupport(embeddings=MiniLMEmbeddings(), name="learned-embeddings")


register_backend("learned", LearnedSupport)
if minilm_available():
    register_backend("learned-embeddings", _with_minilm)
