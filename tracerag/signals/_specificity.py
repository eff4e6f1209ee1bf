"""Specificity: a general sentence does not answer a question the material answers specifically.

"How long is the warranty on a laptop?" answered with "All new devices carry a 12-month
warranty" is backed word for word by the material's general sentence — while the same material
says laptops get 24 months. The check looks at the question's own subject (its content words
that the claim does not repeat and the material uses, less the words that only ask: "how long",
"多长") and, for each amount, percentage, date or duration of the claim, at the cited material's
sentences: one that names the subject more fully than the claim's own sentence, speaks of the
same thing as the claim (shares one of its words) and states another value of the same kind —
without also stating the claim's value — is a rival, and the claim is not supported, with that
sentence as the reason. A sentence about the subject that states the claim's value, or no value
of that kind, leaves the claim supported.

It works for every support backend: the verdict of a backend is the input, and only a supported
verdict can be withdrawn.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import lru_cache

from tracerag.signals._lexical import _material_view
from tracerag.signals._support import Support
from tracerag.text._quantities import Quantity, extract_quantities, quantities_match
from tracerag.text._tokens import content_terms, tokenize_spans

__all__ = ["SpecificityConflict", "check_specificity", "question_subject"]

# Words that ask rather than name: stemmed as ``tokenize`` stems them.
_EN_ASKING_TEXT = """
how long much many often far big old soon late early what which who whom whose when where why
whether tell know explain describe get need want like please can could would should may might
"""
_EN_ASKING = frozenset(_EN_ASKING_TEXT.split())
# A Chinese bigram holding one of these characters asks (多长, 多久, 几个, 什么, 哪里, 怎么 ...).
_ZH_ASKING = frozenset("多少几哪什么怎谁吗呢久啥如何")
# Claim quantities that can have a rival value (plain numbers say too little).
_RIVAL_KINDS = frozenset({"money", "percent", "date", "duration"})
# Clause breaks inside a sentence that states two values ("phones 12 months, laptops 24").
_CLAUSE_RE = re.compile(r"[,;:，；：、]|\band\b|\bwhile\b|\bwhereas\b|\bbut\b|而|但")


@dataclass(frozen=True)
class SpecificityConflict:
    """A material sentence about the question's subject that states another value."""

    sentence: str
    start: int
    end: int
    claim_value: str  # the claim's quantity, as written
    rival_value: str  # the sentence's value of the same kind, as written
    subject: tuple[str, ...]  # the question's subject terms the sentence names

    @property
    def reason(self) -> str:
        """Why the claim is not supported, for people."""
        return (
            f"the material states the question's case ({', '.join(self.subject)}) differently: "
            f"{self.rival_value}, not {self.claim_value}, in {self.sentence.strip()!r}"
        )


def _asks(term: str) -> bool:
    if term.isascii():
        return term in _EN_ASKING
    return any(ch in _ZH_ASKING for ch in term)


@lru_cache(maxsize=1024)
def question_subject(question: str, claim: str) -> tuple[str, ...]:
    """The question's content terms that the claim does not repeat and that do not only ask
    (stemmed English words, Chinese bigrams), once each, in question order."""
    said = {t.text for t in tokenize_spans(claim)}
    return tuple(
        dict.fromkeys(
            t
            for t in content_terms(question)
            if t not in said and not _asks(t) and not t.replace(".", "").isdigit()
        )
    )


def _same_kind(a: Quantity, b: Quantity) -> bool:
    if a.kind != b.kind:
        return False
    if a.kind in {"duration", "money"}:
        return a.unit == b.unit
    return True


def _clauses(text: str, offset: int) -> list[tuple[int, int]]:
    """``[start, end)`` offsets (shifted by ``offset``) of the clauses of a sentence."""
    out, at = [], 0
    for m in _CLAUSE_RE.finditer(text):
        if m.start() > at:
            out.append((offset + at, offset + m.start()))
        at = m.end()
    if at < len(text):
        out.append((offset + at, offset + len(text)))
    return out or [(offset, offset + len(text))]


def _terms_in(text: str) -> frozenset[str]:
    return frozenset(t.text for t in tokenize_spans(text))


def _share(subject: tuple[str, ...], terms: frozenset[str]) -> float:
    return sum(1 for t in subject if t in terms) / len(subject) if subject else 0.0


def find_conflict(question: str, claim: str, material_text: str) -> SpecificityConflict | None:
    """The material sentence that states the question's specific case with another value than
    the claim, or None."""
    claim_qs = [q for q in extract_quantities(claim) if q.kind in _RIVAL_KINDS]
    if not claim_qs or not question.strip():
        return None
    view = _material_view(material_text)
    used = frozenset().union(*view.tokens) if view.tokens else frozenset()
    subject = tuple(t for t in question_subject(question, claim) if t in used)
    if not subject:
        return None  # the claim repeats the question's subject, or the material never names it
    inside = [(q.start, q.end) for q in claim_qs]
    about = frozenset(
        t.text
        for t in tokenize_spans(claim)
        if t.text in set(content_terms(claim))
        and not any(a <= t.start < b for a, b in inside)
        and not t.text.replace(".", "").isdigit()
    )
    for q in claim_qs:
        own = 0.0  # how fully the sentences (or clauses) stating the claim's value name it
        rivals: list[tuple[float, int, Quantity]] = []
        for i, sentence in enumerate(view.sentences):
            if not view.declarative[i] or not view.tokens[i] & about:
                continue  # a heading, a question, or a sentence about something else
            same = [m for m in view.sentence_quantities[i] if _same_kind(q, m)]
            if not same:
                continue
            if not quantities_match(q, same):
                rivals.append((_share(subject, view.tokens[i]), i, same[0]))
                continue
            if all(quantities_match(m, [q]) for m in same):
                own = max(own, _share(subject, view.tokens[i]))
                continue
            # one sentence, several values of the kind: each clause speaks for its own
            for a, b in _clauses(sentence.text, sentence.start):
                here = [m for m in same if a <= m.start < b]
                if not here:
                    continue
                share = _share(subject, _terms_in(material_text[a:b]))
                if quantities_match(q, here):
                    own = max(own, share)
                else:
                    rivals.append((share, i, here[0]))
        rivals = [r for r in rivals if r[0] >= 0.5 and r[0] > own]
        if rivals:
            _, i, rival = max(rivals, key=lambda r: (r[0], -r[1]))
            s = view.sentences[i]
            named = tuple(t for t in subject if t in view.tokens[i])
            return SpecificityConflict(s.text, s.start, s.end, q.raw, rival.raw, named)
    return None


def check_specificity(
    question: str | None,
    claim: str,
    material_text: str,
    support: Support,
    *,
    threshold: float,
    cap: float = 0.8,
) -> Support:
    """``support`` withdrawn when the material states the question's own case with another
    value than the claim (score capped at ``cap`` times ``threshold``, the rival sentence as
    the supporting sentence and in the reason); unchanged otherwise."""
    if not question or not support.supported:
        return support
    conflict = find_conflict(question, claim, material_text)
    if conflict is None:
        return support
    return replace(
        support,
        score=round(min(support.score, cap * threshold), 6),
        supported=False,
        sentence=conflict.sentence,
        start=conflict.start,
        end=conflict.end,
        reason="; ".join(filter(None, [conflict.reason, support.reason])),
    )
