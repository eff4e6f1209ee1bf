"""Specificity: a general sentence does not answer a question the material answers specifically.

"How long is the warranty on a laptop?" answered with "All new devices carry a 12-month
warranty" is backed word for word by the material's general sentence — while the same material
says laptops get 24 months. For each amount, percentage, date or duration of the claim, the
check compares the sentence (or clause) of the cited material the claim rests on — the one
stating the claim's value that shares most of its words — with the material's other statements
of a value of that kind about the claim's thing. One of them is a rival when it is about the
question's case more specifically: of the question's naming words (less the words that only
ask, "how long", "多长", and its numbers), it names every one the claim's sentence names and
more (at least half of the rest), one of the words it adds occurring in no other sentence of the
material (a word several sentences share names the topic, not one case of it).

Only a question that asks for a value of the claim's kind (or states one) is checked: an open
question is answered by any true case of it. A rival whose value the claim states itself, or
whose case another claim of the same answer gives, is no rival. So a claim quoting the sentence
that answers the question stays supported, whatever the material says of other cases.

It works for every support backend: the verdict of a backend is the input, and only a supported
verdict can be withdrawn, with the rival sentence as the claim's sentence and a reason naming
the question's words, both values and both sentences.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import lru_cache

from tracerag.signals._lexical import _material_view, _MaterialView
from tracerag.signals._support import Support
from tracerag.text._asking import asks, asks_for
from tracerag.text._quantities import Quantity, extract_quantities, quantities_match
from tracerag.text._words import content_terms, stem, tokenize_spans

__all__ = ["SpecificityConflict", "check_specificity", "question_subject"]

# Claim quantities that can have a rival value (plain numbers say too little).
_RIVAL_KINDS = frozenset({"money", "percent", "date", "duration"})
# Nouns that name a value a question asks for ("what discount", "the minimum order"), beyond
# the wordings ``asks_for`` reads.
_VALUE_NOUN_RE = re.compile(
    r"\b(?:discount|rate|price|fee|cost|charge|amount|percentage|period|duration|term|limit"
    r"|minimum|maximum|threshold|deadline|window)s?\b"
    r"|折扣|优惠|几折|费用|价格|期限|有效期|时限|门槛|上限|下限",
    re.IGNORECASE,
)
# The thing a question asks about, named by its question word: "what warranty ...", "which
# plan ..." (the word after it), "what is the warranty on ..." (the last word of the noun
# phrase after "is the": "what is your returns policy?" asks about a policy).
_WH_RE = re.compile(
    r"\b(?:what|which)\s+(?:(?:is|are|was|were)\s+(?:the|a|an|my|your|our)\s+"
    r"(?P<phrase>[A-Za-z-]+(?:\s+[A-Za-z-]+)*?)"
    r"(?=\s+(?:on|for|of|in|with|at|to|from|under|if|when|after|before|does|do|is|are)\b"
    r"|\s*[?.!,]|\s*$)"
    r"|(?P<word>[A-Za-z-]+))",
    re.IGNORECASE,
)
_NOT_A_HEAD = frozenset(
    [
        "is",
        "are",
        "was",
        "were",
        "do",
        "does",
        "did",
        "can",
        "could",
        "will",
        "would",
        "should",
        "may",
        "might",
    ]
)
# A question with do-support or a modal ends on its bare main verb after a short subject:
# "how fast will my parcel arrive?", "when does the refund come?".
_FINAL_VERB_RE = re.compile(
    r"^(?:(?:how|what|which)(?:\s+\w+)?|when|where|why)\s+"
    r"(?:do|does|did|will|would|can|could|should|may|might|must)\s+"
    r"(?:[A-Za-z'’-]+\s+){0,3}(?!(?:a|an|the|my|your|to|of|on|for|in|at|with|from|by)\s)"
    r"[A-Za-z'’-]+\s+"
    r"(?P<verb>[A-Za-z-]+)\s*[?？]?$",
    re.IGNORECASE,
)
# Clause breaks inside a sentence that states two values ("phones 12 months, laptops 24").
_CLAUSE_RE = re.compile(r"[,;:，；：、]|\band\b|\bwhile\b|\bwhereas\b|\bbut\b|而|但")


@dataclass(frozen=True)
class SpecificityConflict:
    """A material sentence about the question's own case, more specifically than the sentence
    the claim rests on, that states another value."""

    sentence: str
    start: int
    end: int
    claim_value: str  # the claim's quantity, as written
    rival_value: str  # the sentence's value of the same kind, as written
    subject: tuple[str, ...]  # the question's terms the sentence names and the claim's does not
    words: str = ""  # those terms as the question writes them
    rests_on: str | None = None  # the material sentence that states the claim's value

    @property
    def reason(self) -> str:
        """Why the claim is not supported, for people: the question's words, both values and
        both sentences."""
        words = self.words or ", ".join(self.subject)
        own = (
            f"; the claim rests on {self.rests_on!r}, which does not name {words}"
            if self.rests_on
            else ""
        )
        return (
            f"the material states the question's case ({words}) differently: "
            f"{self.rival_value}, not {self.claim_value}, in {self.sentence.strip()!r}{own}"
        )


@lru_cache(maxsize=1024)
def question_subject(question: str, claim: str) -> tuple[str, ...]:
    """The question's content terms that the claim does not repeat and that do not only ask
    (stemmed English words, Chinese bigrams), once each, in question order."""
    said = {t.text for t in tokenize_spans(claim)}
    return tuple(
        dict.fromkeys(
            t
            for t in content_terms(question)
            if t not in said and not asks(t) and not t.replace(".", "").isdigit()
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


def _question_terms(question: str, used: frozenset[str]) -> frozenset[str]:
    """The question's content terms that name something (not the words that only ask, not
    its numbers, not the verb it ends on: "how fast will my parcel *arrive*?" asks about a
    parcel) and that the material uses."""
    verb = _FINAL_VERB_RE.search(question.strip())
    said = stem(verb.group("verb").lower()) if verb else None
    return frozenset(
        t
        for t in content_terms(question)
        if t in used and t != said and not asks(t) and not t.replace(".", "").isdigit()
    )


def _as_written(question: str, terms: tuple[str, ...]) -> str:
    """The question's words behind stemmed ``terms``, as the question writes them (overlapping
    Chinese bigrams joined: ``笔记本电脑``)."""
    wanted = set(terms)
    merged: list[list[int]] = []
    for t in tokenize_spans(question):
        if t.text not in wanted:
            continue
        if merged and not t.text.isascii() and t.start < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], t.end)
        else:
            merged.append([t.start, t.end])
    words = dict.fromkeys(question[a:b] for a, b in merged)
    return ", ".join(words) if words else ", ".join(terms)


@dataclass(frozen=True)
class _Statement:
    """A sentence of the material, or a clause of it, and a value it states."""

    index: int  # the sentence's index in the material view
    start: int
    end: int
    value: Quantity
    terms: frozenset[str]  # the words it names (stemmed, Chinese bigrams)


def _statements(
    q: Quantity,
    claim_qs: list[Quantity],
    view: _MaterialView,
    material_text: str,
    about: frozenset[str],
) -> tuple[list[_Statement], list[_Statement]]:
    """For the claim's value ``q``: the material's statements of a value of its kind that speak
    of the claim's thing (share one of its words), split into those that state ``q`` (own) and
    those that state another value (rivals). A sentence stating several values of the kind
    speaks clause by clause."""
    own: list[_Statement] = []
    rivals: list[_Statement] = []
    for i, sentence in enumerate(view.sentences):
        if not view.declarative[i] or not view.tokens[i] & about:
            continue  # a heading, a question, or a sentence about something else
        same = [m for m in view.sentence_quantities[i] if _same_kind(q, m)]
        if not same:
            continue
        matching = [m for m in same if quantities_match(m, [q])]
        quoted = matching and all(quantities_match(m, claim_qs) for m in same)
        if not matching or quoted or len(matching) == len(same):
            whole = _Statement(i, sentence.start, sentence.end, same[0], view.tokens[i])
            (own if matching else rivals).append(whole)
            continue
        for a, b in _clauses(sentence.text, sentence.start):
            here = [m for m in same if a <= m.start < b]
            if here:
                says = quantities_match(q, here)
                part = _Statement(i, a, b, here[0], _terms_in(material_text[a:b]))
                (own if says else rivals).append(part)
    return own, rivals


def _asks_for_value(question: str, q: Quantity, claim_terms: frozenset[str]) -> bool:
    """The question asks for a value of the claim's kind (by its wording, by a noun that names
    a value, by asking "what X" of an X the claim gives the value of) or states one: only then
    can another value of the material be the one that answers it. An open question ("what is
    the returns policy?") is answered by any true case of it."""

    if q.kind in asks_for(question) or _VALUE_NOUN_RE.search(question):
        return True
    for m in _WH_RE.finditer(question):
        head = (m.group("phrase") or "").split()[-1:] or [m.group("word") or ""]
        word = head[0].lower()
        if word and word not in _NOT_A_HEAD and stem(word) in claim_terms:
            return True
    return any(_same_kind(q, m) for m in extract_quantities(question))


def _stated_by_answer(
    rival: _Statement, asked: frozenset[str], claim: str, others: tuple[str, ...]
) -> bool:
    """The answer gives the rival's case itself: the claim or another claim of the answer
    states the rival's value about the rival's thing, or another claim states a value of its
    kind and names every one of the question's words the rival names."""
    named = rival.terms & asked
    for k, text in enumerate((claim, *others)):
        qs = [m for m in extract_quantities(text) if _same_kind(rival.value, m)]
        if not qs:
            continue
        words = {t for t in content_terms(text) if not t.replace(".", "").isdigit()}
        if quantities_match(rival.value, qs) and words & rival.terms:
            return True
        if k > 0 and named <= words:
            return True
    return False


def find_conflict(
    question: str, claim: str, material_text: str, others: tuple[str, ...] = ()
) -> SpecificityConflict | None:
    """The material sentence that is about the question's own case more specifically than the
    sentence the claim rests on and states another value than the claim, or None.

    "More specifically": of the question's naming words, the rival names every one the claim's
    own sentence names, and more — at least half of those the claim's own sentence leaves out.
    A rival that another claim of the same answer (``others``) states is no rival: the answer
    gives that case too.
    """
    claim_qs = [q for q in extract_quantities(claim) if q.kind in _RIVAL_KINDS]
    if not claim_qs or not question.strip():
        return None
    view = _material_view(material_text)
    used = frozenset().union(*view.tokens) if view.tokens else frozenset()
    asked = _question_terms(question, used)
    if not asked:
        return None  # the material never names what the question is about
    inside = [(q.start, q.end) for q in claim_qs]
    claim_terms = [
        t
        for t in tokenize_spans(claim)
        if t.text in set(content_terms(claim))
        and not any(a <= t.start < b for a, b in inside)
        and not t.text.replace(".", "").isdigit()
    ]
    about = frozenset(t.text for t in claim_terms)
    # in how many of the material's statements each of the question's words occurs
    spread = {t: sum(1 for toks in view.tokens if t in toks) for t in asked}
    for q in claim_qs:
        if not _asks_for_value(question, q, about):
            continue
        own, rivals = _statements(q, claim_qs, view, material_text, about)
        # the statement the claim rests on: the one sharing most of the claim's words
        rests = max(own, key=lambda s: (len(s.terms & about), len(s.terms & asked)), default=None)
        base = rests.terms & asked if rests is not None else frozenset()
        missing = tuple(sorted(asked - base))
        found: list[tuple[float, int, _Statement]] = []
        for r in rivals:
            named = r.terms & asked
            if not base < named or _share(missing, r.terms) < 0.5:
                continue  # not about the question's case more specifically than the claim's
            if not any(spread[t] == 1 for t in named - base):
                continue  # the words it adds name the material's topic, not one case of it
            if _stated_by_answer(r, asked, claim, others):
                continue
            found.append((_share(missing, r.terms), -r.index, r))
        if found:
            _, _, r = max(found, key=lambda f: (f[0], f[1]))
            s = view.sentences[r.index]
            more = tuple(t for t in content_terms(question) if t in (r.terms & asked) - base)
            own_sentence = view.sentences[rests.index].text.strip() if rests else None
            return SpecificityConflict(
                s.text,
                s.start,
                s.end,
                q.raw,
                r.value.raw,
                tuple(dict.fromkeys(more)),
                _as_written(question, tuple(dict.fromkeys(more))),
                own_sentence,
            )
    return None


def check_specificity(
    question: str | None,
    claim: str,
    material_text: str,
    support: Support,
    *,
    threshold: float,
    cap: float = 0.8,
    others: tuple[str, ...] = (),
) -> Support:
    """``support`` withdrawn when the material states the question's own case, more specifically
    than the sentence the claim rests on, with another value than the claim (and no other claim
    of the answer, ``others``, states it): the score capped at ``cap`` times ``threshold``, the
    rival sentence as the supporting sentence and in the reason. Unchanged otherwise."""
    if not question or not support.supported:
        return support
    conflict = find_conflict(question, claim, material_text, others)
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
