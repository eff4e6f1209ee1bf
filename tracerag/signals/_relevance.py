"""Answer relevance: does the answer address the question that was asked?

The question is the request's standalone question: a conversation's follow-up ("And for a
phone?") is judged as the question it asks after the earlier turns ("How long is the warranty
for a phone?", ``tracerag.text._followup``), never as the bare turn.

Every claim of an answer can be supported by the sentence it cites, and every sample can agree,
while the answer is about something else: "What is the capital of Mars?" answered with the
returns policy. The citation verifier cannot see that (it checks each claim against its
material, not against the question), so this signal looks at the question and at the answer's
side: the text of its supported cited claims, the sentences they rest on and the materials they
cite.

The lexical check (always available; Chinese and English alike):

- the question's *subject* is its content words (stemmed English words, numbers, Chinese
  bigrams) less those that only ask ("how long", "what", 多久, 哪里);
- the answer addresses the question when its side names at least one of them (an English word
  of four letters or more also matches a longer or shorter form of itself: "travel",
  "travelling");
- an answer that names none of them still addresses a question that asks for a duration ("how
  long", 多久), an amount ("how much", 多少钱), a percentage or a date ("when", 什么时候) when
  one of its claims states one — unless the question names something (an English name or
  acronym written in capitals, or a number) that the answer's side never mentions. "How long do
  I have to send something back?" answered "Returns are accepted within 30 days of delivery"
  addresses it; "How long does a flight to Mars take?" answered the same does not.

With sentence embeddings, an answer in a language the model reads is judged by meaning instead:
the cosine similarity of the question with its best claim (the claim and the sentence it
cites); below ``min_similarity`` the answer does not address the question. The ``embeddings``
and ``learned-embeddings`` support backends' MiniLM is used that way on its own, with the
threshold measured for it (``relevance_min_similarity``); any other model through
``AnswerRelevance(embeddings=..., min_similarity=...)``. Text the model does not read (Chinese,
for MiniLM) gets the lexical check.

What it cannot see: an answer that shares a word with the question by accident and states the
kind of value asked ("How many countries are in the European Union?" answered "Northwind ships
to 28 countries") reads as relevant to both checks; a paraphrase that shares no word with the
question and asks for no value ("Can I get my money back if I change my mind?" answered from
the returns policy) is flagged by the lexical one. A flag therefore sends a passing answer to
review, with the reason, rather than withholding it.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from tracerag.errors import ConfigurationError
from tracerag.text._asking import asks, asks_for
from tracerag.text._quantities import extract_quantities
from tracerag.text._words import is_stopword, stem, token_set, tokenize_spans

__all__ = [
    "DEFAULT_MIN_SIMILARITY",
    "AnswerPart",
    "AnswerRelevance",
    "RelevanceReport",
    "asks_for",
    "check_relevance",
    "embeddings_of",
]

#: The cosine similarity (all-MiniLM-L6-v2) below which a claim does not address a question,
#: chosen on half of AttributionBench's questions and measured on the other half
#: (``benchmarks/relevance.py``).
DEFAULT_MIN_SIMILARITY = 0.15

Method = Literal["lexical", "embeddings", "none"]

# An English word that names something: capitalised inside the question (not its first word,
# not "I"), an acronym, or a number.
_EN_WORD_RE = re.compile(r"[A-Za-z][A-Za-z'’]*|\d+(?:[.,]\d+)*")
_AT_SENTENCE_START_RE = re.compile(r"(?:\A|[.!?。！？:：]\s*|[\"“(（\[]\s*)\Z")
_CJK_RE = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_LATIN_RE = re.compile(r"[A-Za-z]+")


@dataclass(frozen=True)
class AnswerPart:
    """One cited claim of an answer and what it rests on: the claim's text, the material
    sentence that supports it, the cited material's text (title and body), and whether the
    verifier found it supported."""

    text: str
    sentence: str | None = None
    material: str = ""
    supported: bool = True


@dataclass(frozen=True)
class RelevanceReport:
    """Whether an answer addresses its question, and why.

    ``addresses`` is None when nothing could be judged (no cited claim, or a question that
    names no subject and asks for no kind of value). ``question_terms`` are the question's
    subject words as the question writes them (a Chinese run of them as one), ``matched``
    those the answer's side names, ``coverage`` the share of the subject's terms it names;
    ``asks_for`` the kinds of value the question asks for and ``states`` whether a claim
    states one; ``unnamed`` the question's names the answer's side never mentions;
    ``similarity`` the best claim's cosine similarity with the question (method
    ``embeddings``).
    """

    addresses: bool | None
    method: Method
    question_terms: tuple[str, ...] = ()
    matched: tuple[str, ...] = ()
    coverage: float | None = None  # the share of the question's subject terms named
    asks_for: tuple[str, ...] = ()
    states: bool = False
    unnamed: tuple[str, ...] = ()
    similarity: float | None = None
    min_similarity: float | None = None
    reason: str = ""

    def to_record(self) -> dict[str, Any]:
        """The JSON-able form kept in the Response's signal detail and the audit record."""
        return {
            "addresses": self.addresses,
            "method": self.method,
            "question_terms": list(self.question_terms),
            "matched": list(self.matched),
            "coverage": self.coverage,
            "asks_for": list(self.asks_for),
            "states": self.states,
            "unnamed": list(self.unnamed),
            "similarity": self.similarity,
            "min_similarity": self.min_similarity,
            "reason": self.reason,
        }


# Light verbs: in a question they carry the asking ("how long does it take"), not the subject.
_LIGHT_VERBS = frozenset(stem(w) for w in ("take", "make", "happen", "mean"))


def _subject(question: str) -> list[tuple[str, tuple[int, int]]]:
    """The question's subject terms with the span of the question each was made from, once
    each."""
    seen: dict[str, tuple[int, int]] = {}
    for token in tokenize_spans(question):
        term = token.text
        if term in seen or is_stopword(term) or asks(term) or term in _LIGHT_VERBS:
            continue
        seen[term] = (token.start, token.end)
    return list(seen.items())


def _words(question: str, spans: Sequence[tuple[int, int]]) -> tuple[str, ...]:
    """The question's words at ``spans``, overlapping spans (Chinese bigrams) read as one run:
    ``两张``, ``张券``, ``券能`` → ``两张券能``."""
    runs: list[list[int]] = []
    for start, end in sorted(spans):
        if runs and start < runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], end)
        else:
            runs.append([start, end])
    return tuple(dict.fromkeys(question[a:b] for a, b in runs))


# Words that are capitalised for being first in a clause, not for naming anything.
_NOT_NAMES_TEXT = """
a an the what which who whom whose when where why how is are was were do does did can could
will would should may might must shall i if and or but please
"""
_NOT_NAMES = frozenset(_NOT_NAMES_TEXT.split())


def _names(question: str) -> list[tuple[str, str]]:
    """The question's English names and numbers: (term as tokenised, word as written)."""
    out: dict[str, str] = {}
    for m in _EN_WORD_RE.finditer(question):
        word = m.group()
        if word[0].isdigit():
            named = True
        elif word.lower() in _NOT_NAMES:
            named = False
        elif len(word) >= 2 and word.isupper():
            named = True
        else:
            named = word[0].isupper() and not _AT_SENTENCE_START_RE.search(question[: m.start()])
        if named:
            for token in tokenize_spans(word):
                if not is_stopword(token.text):
                    out.setdefault(token.text, word)
    return list(out.items())


class _Side:
    """The tokens of the answer's side, for exact lookups and, for English words of four
    letters or more, a longer or shorter form of the same word ("travel" and "travell", the
    stems of "travel" and "travelling")."""

    def __init__(self, texts: Sequence[str]) -> None:
        self.tokens: frozenset[str] = frozenset().union(*(token_set(t) for t in texts))
        self._words = sorted(t for t in self.tokens if _is_word(t))

    def names(self, term: str) -> bool:
        if term in self.tokens:
            return True
        if not _is_word(term):
            return False
        at = bisect.bisect_left(self._words, term)
        if at < len(self._words) and self._words[at].startswith(term):
            return True
        return any(term[:k] in self.tokens for k in range(4, len(term)))


def _is_word(term: str) -> bool:
    return term.isascii() and term.isalpha() and len(term) >= 4


def _chosen(parts: Sequence[AnswerPart]) -> list[AnswerPart]:
    """The supported parts (all parts when none is: the answer will not pass, but the report
    still says what it is about)."""
    return [p for p in parts if p.supported] or list(parts)


def _quote(words: Sequence[str]) -> str:
    return ", ".join(words)


def _kinds(kinds: Sequence[str]) -> str:
    return " or ".join(kinds[:2])


def _lexical(question: str, parts: Sequence[AnswerPart]) -> RelevanceReport:
    chosen = _chosen(parts)
    subject = _subject(question)
    kinds = asks_for(question)
    if not subject and not kinds:
        return RelevanceReport(None, "none", reason="the question names no subject to look for")
    side = _Side([t for p in chosen for t in (p.text, p.sentence or "", p.material) if t])
    words = _words(question, [span for _, span in subject])
    named = [span for term, span in subject if side.names(term)]
    matched = _words(question, named)
    stated = {
        q.kind for p in chosen for t in (p.text, p.sentence or "") for q in extract_quantities(t)
    }
    states = bool(stated & set(kinds))
    unnamed = tuple(word for term, word in _names(question) if not side.names(term))
    report = RelevanceReport(
        None,
        "lexical",
        question_terms=words,
        matched=matched,
        coverage=round(len(named) / len(subject), 4) if subject else None,
        asks_for=kinds,
        states=states,
        unnamed=unnamed,
    )
    if matched:
        return replace(
            report, addresses=True, reason=f"the answer names the question's {_quote(matched)}"
        )
    if states and not unnamed:
        return replace(
            report,
            addresses=True,
            reason=f"the answer states a {_kinds(kinds)}, which the question asks for",
        )
    if words:
        reason = (
            f"none of the question's words ({_quote(words)}) appear in the answer, the "
            "sentences it cites or their materials"
        )
        if kinds and not states:
            reason += f", and it states no {_kinds(kinds)}"
        elif kinds:
            reason += f"; it states a {_kinds(kinds)} but never mentions {_quote(unnamed)}"
    else:
        reason = f"the question asks for a {_kinds(kinds)} and the answer states none"
    return replace(
        report, addresses=False, reason=f"the answer does not address the question: {reason}"
    )


def _mostly_chinese(text: str) -> bool:
    cjk = len(_CJK_RE.findall(text))
    return cjk > 0 and cjk >= len(_LATIN_RE.findall(text))


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(float(x) * float(y) for x, y in zip(a, b, strict=False))
    na = sum(float(x) * float(x) for x in a) ** 0.5
    nb = sum(float(y) * float(y) for y in b) ** 0.5
    return dot / (na * nb) if na and nb else 0.0


def check_relevance(
    question: str,
    parts: Sequence[AnswerPart],
    *,
    embeddings: Any = None,
    min_similarity: float = DEFAULT_MIN_SIMILARITY,
    reads_chinese: bool = False,
) -> RelevanceReport:
    """Whether the answer made of ``parts`` (its cited claims) addresses ``question``.

    ``embeddings``: a LangChain ``Embeddings``; with it, text it reads (not Chinese unless
    ``reads_chinese``) is judged by the best claim's similarity with the question against
    ``min_similarity``; otherwise, and for other text, the lexical check decides.
    """
    if not question.strip() or not parts:
        return RelevanceReport(None, "none", reason="no cited claim to judge")
    lexical = _lexical(question, parts)
    texts = [" ".join(filter(None, [p.text, p.sentence])) for p in _chosen(parts)]
    readable = reads_chinese or not (
        _mostly_chinese(question) or any(_mostly_chinese(t) for t in texts)
    )
    if embeddings is None or not readable:
        return lexical
    vectors = embeddings.embed_documents([question, *texts])
    similarity = round(max(_cosine(vectors[0], v) for v in vectors[1:]), 4)
    addresses = similarity >= min_similarity
    reason = (
        f"its best claim's similarity with the question is {similarity:.2f} "
        f"(at least {min_similarity:.2f} addresses it)"
        if addresses
        else "the answer does not address the question: its best claim's similarity with "
        f"the question is {similarity:.2f}, below {min_similarity:.2f}"
    )
    return RelevanceReport(
        addresses,
        "embeddings",
        question_terms=lexical.question_terms,
        matched=lexical.matched,
        coverage=lexical.coverage,
        asks_for=lexical.asks_for,
        states=lexical.states,
        unnamed=lexical.unnamed,
        similarity=similarity,
        min_similarity=min_similarity,
        reason=reason,
    )


def embeddings_of(backend: object) -> tuple[Any, float] | None:
    """The sentence embeddings a support backend judges with, and the relevance threshold
    measured for them (``relevance_min_similarity``), or None: a backend without embeddings,
    or embeddings nobody measured for relevance."""
    embeddings = getattr(backend, "embeddings", None)
    threshold = getattr(embeddings, "relevance_min_similarity", None)
    if embeddings is None or not isinstance(threshold, int | float):
        return None
    return embeddings, float(threshold)


@dataclass(frozen=True)
class AnswerRelevance:
    """How the pipeline judges whether an answer addresses its question (``answer_relevance=``
    of ``RAGPipeline`` and ``wrap``; ``False`` turns the check off).

    ``embeddings``: a LangChain ``Embeddings`` to judge by meaning (default: the support
    backend's, when it is MiniLM, else the lexical check); ``min_similarity``: the similarity
    below which the best claim does not address the question — 0.15 was measured for
    all-MiniLM-L6-v2; measure your model's with ``benchmarks/relevance.py --embeddings``
    before relying on it; ``reads_chinese``: whether the model reads Chinese (else Chinese
    answers get the lexical check).
    """

    embeddings: Any = None
    min_similarity: float = DEFAULT_MIN_SIMILARITY
    reads_chinese: bool = False

    def __post_init__(self) -> None:
        if (
            isinstance(self.min_similarity, bool)
            or not isinstance(self.min_similarity, int | float)
            or not -1.0 <= self.min_similarity <= 1.0
        ):
            raise ConfigurationError(
                f"min_similarity must be a number in [-1, 1], got {self.min_similarity!r}"
            )
        if self.embeddings is not None and not callable(
            getattr(self.embeddings, "embed_documents", None)
        ):
            raise ConfigurationError(
                "embeddings must be a LangChain Embeddings (with embed_documents), got "
                f"{type(self.embeddings).__name__}"
            )

    def uses_embeddings(self, backend: object) -> bool:
        """Whether answers verified by ``backend`` are judged with embeddings."""
        return self.embeddings is not None or embeddings_of(backend) is not None

    def check(
        self, question: str, parts: Sequence[AnswerPart], *, backend: object = None
    ) -> RelevanceReport:
        """The report for one answer; ``backend``: the support backend that verified it
        (its MiniLM is used when this check was given no embeddings)."""
        if self.embeddings is not None:
            return check_relevance(
                question,
                parts,
                embeddings=self.embeddings,
                min_similarity=self.min_similarity,
                reads_chinese=self.reads_chinese,
            )
        found = embeddings_of(backend)
        if found is None:
            return check_relevance(question, parts)
        embeddings, threshold = found
        return check_relevance(question, parts, embeddings=embeddings, min_similarity=threshold)

    def lexical(self, question: str, parts: Sequence[AnswerPart]) -> RelevanceReport:
        """The lexical check alone (what the pipeline falls back to when embeddings fail)."""
        return check_relevance(question, parts)
