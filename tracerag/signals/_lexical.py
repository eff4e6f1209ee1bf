"""The default support backend: weighted term coverage with number, date and negation checks.

A claim is scored by how much of its weighted content (rare words count more, numbers and
named entities count extra) the best one to three sentences of the material cover. Questions in
the material back nothing, and titles or headings never lead the covering sentences; a preamble
naming the claim's source ("According to the NIH, …") is not content to cover. Every amount,
percentage, date, duration and number of the claim must be stated by the material: one that is
not — or that is stated only in another sentence while the sentence the claim aligns to states
another value of its kind — caps the score well below the threshold and is listed in
``mismatches``. A claim and sentence that disagree on negation score lower. When one sentence
restates most of the claim, a reversed comparison, a coordinated part it does not state, a
swapped name or an actor moved out of the subject's place also cap the score.
"""

from __future__ import annotations

import difflib
import math
import re
from bisect import bisect_right
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from tracerag.errors import ConfigurationError
from tracerag.signals._support import (
    LruCache,
    Support,
    SyncSupportBackend,
    check_inputs,
    register_backend,
)
from tracerag.text._negation import is_negated
from tracerag.text._quantities import Quantity, extract_quantities, quantities_match
from tracerag.text._sentences import Sentence, split_sentences
from tracerag.text._structure import (
    Comparison,
    actor_moved,
    attribution_preamble,
    comparisons,
    conjuncts,
    is_declarative,
    opposite,
)
from tracerag.text._words import is_stopword, tokenize, tokenize_spans

__all__ = ["CHEAP_CHARS", "DEFAULT_THRESHOLD", "LexicalParams", "LexicalSupport"]

#: Score at or above which a claim counts as supported (chosen on the WiCE dev set).
DEFAULT_THRESHOLD = 0.45
#: Characters of claims and (prepared) materials up to which checks count as ``cheap``: about
#: half a millisecond of scoring, less than a worker-thread hop costs the event loop's process.
CHEAP_CHARS = 6000

_CJK_RE = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
# Chinese characters that are mostly function words: bigrams across them are often not words.
_FUNCTION_CHARS = frozenset(
    "是在和与及或也都就而将被把对于为以从向由给让很更会要可能您我你他她它这那"
)
_KIND_LABELS = {
    "money": "amount",
    "percent": "percentage",
    "date": "date",
    "duration": "duration",
    "number": "number",
}


@dataclass(frozen=True)
class LexicalParams:
    """Tuning knobs of the lexical backend."""

    max_sentences: int = 3  # sentences whose union may cover the claim
    min_gain: float = 0.08  # coverage a further sentence must add to join the union
    union_weight: float = 0.7  # score = w * union coverage + (1 - w) * best single sentence
    quantity_weight: float = 1.5  # weight of a claim quantity relative to the rarest word
    entity_boost: float = 1.5  # extra weight of capitalised words (names) inside a sentence
    partial_credit: float = 0.5  # credit of a prefix (English) or character (Chinese) match
    prefix_len: int = 5
    negation_factor: float = 0.4  # score multiplier when claim and sentence disagree on negation
    negation_min_cover: float = 0.7  # ... if the sentence covers at least this much of the claim
    entity_penalty: float = 0.1  # score lost per name of the claim the sentences do not back
    mismatch_penalty: float = 0.3  # score lost per claim quantity the material does not state
    mismatch_cap: float = 0.8  # ... and the score is capped at this share of the threshold
    idf_power: float = 1.0  # weight = idf ** idf_power
    pool: int = 30  # sentences considered for the union (best single scores first)
    join_gaps: bool = False  # report "only one dedicated", not "only" and "dedicated"
    supported_credit: float = 0.01  # credit at which a claim word counts as backed
    structure_min_cover: float = 0.5  # aligned-sentence cover from which structure is checked
    short_material: int = 8  # sentences up to which a material counts as one focused passage


@dataclass
class _Term:
    token: str
    weight: float
    spans: list[tuple[int, int]]
    entity: bool = False


def _idf_table(docs: Sequence[frozenset[str]]) -> tuple[dict[str, float], float]:
    n = len(docs)
    df: Counter[str] = Counter()
    for d in docs:
        df.update(d)
    idf = {t: math.log(1.0 + (n - c + 0.5) / (c + 0.5)) for t, c in df.items()}
    unseen = math.log(1.0 + (n + 0.5) / 0.5)
    return idf, unseen


def _is_entity(claim: str, start: int, end: int) -> bool:
    word = claim[start:end]
    if not word[:1].isupper():
        return False
    before = claim[:start].rstrip()
    return bool(before) and before[-1] not in '.!?。！？:;"“'


class LexicalSupport(SyncSupportBackend):
    """Support by weighted term coverage, with exact agreement of numbers, dates and negation."""

    def __init__(
        self,
        threshold: float = DEFAULT_THRESHOLD,
        params: LexicalParams | None = None,
        *,
        name: str = "lexical",
    ) -> None:
        if not 0.0 < threshold <= 1.0:
            raise ConfigurationError(f"threshold must be in (0, 1], got {threshold!r}")
        self.name = name
        self.threshold = float(threshold)
        self.params = params or LexicalParams()

    def __repr__(self) -> str:
        return f"LexicalSupport(threshold={self.threshold})"

    # ------------------------------------------------------------------------------------------

    def __call__(
        self, claim: str, material_text: str, *, corpus: Sequence[str] | None = None
    ) -> Support:
        """Score how well ``material_text`` supports ``claim``."""
        check_inputs(claim, material_text)
        analysis = analyse(claim, material_text, corpus, self.params)
        return analysis.to_support(self, claim, _material_view(material_text).sentences)

    def cheap(self, checks: Sequence[tuple[str, str]], corpus: Sequence[str]) -> bool:
        """True when the checks take well under a millisecond: this class's own scoring (a
        subclass that scores otherwise is not vouched for), every material and corpus text
        already prepared (split, tokenized, its quantities found: the costly part), and at
        most ``CHEAP_CHARS`` characters of claims and materials in all."""
        if type(self).__call__ is not LexicalSupport.__call__:
            return False
        if sum(len(claim) + len(text) for claim, text in checks) > CHEAP_CHARS:
            return False
        return all(text in _VIEWS and text in _DOC_TOKENS for _, text in checks) and all(
            text in _DOC_TOKENS for text in corpus if isinstance(text, str)
        )

    def with_threshold(self, threshold: float) -> LexicalSupport:
        """The same backend with another threshold."""
        return LexicalSupport(threshold, self.params, name=self.name)

    def with_params(self, **changes: Any) -> LexicalSupport:
        """The same backend with some parameters changed."""
        return LexicalSupport(self.threshold, replace(self.params, **changes), name=self.name)


@dataclass
class _Analysis:
    terms: list[_Term]
    claim_qs: list[Quantity]
    sentence_scores: list[float]
    chosen: list[int]
    union_cov: float
    covered: dict[int, float]  # term index -> credit in the chosen union
    q_covered: list[bool]
    mismatches: list[Quantity]
    negation_mismatch: bool
    claim_negated: bool
    missing_entities: list[str]
    score: float  # coverage, before penalties
    params: LexicalParams
    conflicts: list[tuple[str, str]] = field(default_factory=list)  # (claim value, sentence's)
    preamble: str = ""  # the claim's source mention, not checked
    content_from: int = 0  # where the claim's content starts (after the preamble)
    comparison: str = ""  # how the aligned sentence reverses a comparison of the claim
    missing_conjunct: str = ""  # a coordinated part of the claim the sentences do not state
    swapped: list[tuple[str, str]] = field(default_factory=list)  # (claim words, sentence's)
    foreign: float = 0.0  # weight share of claim words found elsewhere but not in the sentences
    uncovered: float = 0.0  # weight share of claim words with no credit in the sentences

    def structure(
        self, claim: str, view: _MaterialView, docs: Sequence[str], material_text: str
    ) -> None:
        """The structural checks against the chosen sentences: comparisons, coordinated parts,
        swapped words, and claim words that the material states elsewhere."""
        if not self.chosen:
            return
        terms, cur = self.terms, self.covered
        total = sum(t.weight for t in terms) or 1.0
        missing = [k for k in range(len(terms)) if cur.get(k, 0.0) <= 0.0]
        self.uncovered = sum(terms[k].weight for k in missing) / total
        # words the chosen sentences lack but other sentences or other materials have
        docs = tuple(docs)
        elsewhere_tokens = _elsewhere_tokens(docs, material_text, self.chosen[0])
        self.foreign = (
            sum(terms[k].weight for k in missing if terms[k].token in elsewhere_tokens) / total
        )
        if self.aligned_cover < self.params.structure_min_cover:
            # the checks below compare the claim with one sentence that restates it; a claim
            # pieced together from several sentences is judged by its coverage instead
            self.mismatches = [q for q in self.mismatches if q.raw not in dict(self.conflicts)]
            self.conflicts = []
            return
        claim_cmp = comparisons(claim)
        if claim_cmp:
            for i in self.chosen[:1]:
                said = comparisons(view.sentences[i].text)
                self.comparison = _comparison_conflict(claim_cmp, said)
        moved = actor_moved(claim[self.content_from :], view.sentences[self.chosen[0]].text)
        if moved and not self.comparison:
            self.comparison = f"{moved!r} is not the one who acts in the sentence"
        parts = conjuncts(claim)
        for a, b in parts[:-1]:  # the last part carries the rest of the claim
            inside = _terms_within(terms, a, b)
            if inside and all(cur.get(k, 0.0) <= 0.0 for k in inside):
                self.missing_conjunct = claim[a:b].strip()
                break
        if len(view.sentences) <= self.params.short_material:
            # in a short, focused material a word moved from another sentence is suspect too
            others = elsewhere_tokens
        else:
            others = _other_materials_tokens(docs, material_text)
        self.swapped = _swaps(claim, terms, view.token_seqs[self.chosen[0]], others)

    def adjust(self, base: float, threshold: float) -> tuple[float, list[str]]:
        """``base`` after the penalties (names, quantities, negation, structure), and the
        reasons."""
        p = self.params
        score = base - p.entity_penalty * len(self.missing_entities)
        reasons: list[str] = []
        if self.comparison:
            score = min(score, p.mismatch_cap * threshold)
            reasons.append(f"comparison mismatch: {self.comparison}")
        if self.missing_conjunct:
            score = min(score, p.mismatch_cap * threshold)
            reasons.append(f"partly stated: {self.missing_conjunct!r} is not in the sentences")
        for said, instead in self.swapped:
            score = min(score, p.mismatch_cap * threshold)
            reasons.append(f"{said!r} not in the sentence, which names {instead!r}")
        if self.negation_mismatch:
            score *= p.negation_factor
            reasons.append(
                "negation mismatch: the claim is negated, the sentence is not"
                if self.claim_negated
                else "negation mismatch: the sentence is negated, the claim is not"
            )
        if self.mismatches:
            score -= p.mismatch_penalty * len(self.mismatches)
            score = min(score, p.mismatch_cap * threshold)
            conflicts = dict(self.conflicts)
            for q in reversed(self.mismatches):
                label = _KIND_LABELS.get(q.kind, q.kind)
                if q.raw in conflicts:
                    reasons.insert(
                        0,
                        f"{label} {q.raw} not in the supporting sentence, which says "
                        f"{conflicts[q.raw]}",
                    )
                else:
                    reasons.insert(0, f"{label} {q.raw} not in material")
        return max(0.0, min(1.0, score)), reasons

    @property
    def aligned_cover(self) -> float:
        """How much of the claim the sentence it aligns to covers on its own."""
        return self.sentence_scores[self.chosen[0]] if self.chosen else 0.0

    @property
    def hard_mismatch(self) -> bool:
        """Whether a check fails that no amount of overlap makes up for."""
        return bool(self.mismatches or self.comparison or self.missing_conjunct or self.swapped)

    def to_support(
        self,
        backend: LexicalSupport,
        claim: str,
        sentences: list[Sentence],
    ) -> Support:
        score, reasons = self.adjust(self.score, backend.threshold)
        supported = score >= backend.threshold and not self.hard_mismatch
        if not reasons:
            share = f"{self.union_cov:.0%} of the claim's weighted terms"
            reasons.append(
                f"sentence covers {share}" if supported else f"low overlap: covers {share}"
            )
        order = sorted(range(len(sentences)), key=lambda i: -self.sentence_scores[i])
        if sentences:
            best = self.chosen[0] if self.chosen else order[0]
            s = sentences[best]
            sentence, start, end = s.text, s.start, s.end
        else:
            sentence, start, end = "", 0, 0
        candidates = tuple(
            (sentences[i].start, sentences[i].end, round(self.sentence_scores[i], 4))
            for i in order[:5]
        )
        return Support(
            score=round(score, 6),
            supported=supported,
            sentence=sentence,
            start=start,
            end=end,
            backend=backend.name,
            reason="; ".join(reasons),
            mismatches=tuple(q.raw for q in self.mismatches),
            candidates=candidates,
            unsupported_terms=tuple(self.unsupported_terms(claim)),
        )

    def unsupported_terms(self, claim: str) -> list[str]:
        """Words of the claim not covered by the chosen sentences, in claim order."""
        spans: list[tuple[int, int]] = []
        cjk_chars_bad: dict[int, bool] = {}
        for i, term in enumerate(self.terms):
            ok = self.covered.get(i, 0.0) >= self.params.supported_credit
            for a, b in term.spans:
                if _CJK_RE.match(claim[a:b]) and b - a == 2:
                    for k in (a, a + 1):
                        # a Chinese character is unsupported when no bigram of it is covered
                        cjk_chars_bad[k] = cjk_chars_bad.get(k, True) and not ok
                elif not ok:
                    spans.append((a, b))
        for k, bad in cjk_chars_bad.items():
            if bad:
                spans.append((k, k + 1))
        for q, ok in zip(self.claim_qs, self.q_covered, strict=True):
            if not ok:
                spans.append((q.start, q.end))
        spans.sort()
        merged: list[tuple[int, int]] = []
        for a, b in spans:
            if merged and (
                a < merged[-1][1]
                or (a == merged[-1][1] and _CJK_RE.match(claim[a : a + 1]))
                or (self.params.join_gaps and _only_function_words(claim[merged[-1][1] : a]))
            ):
                merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
            else:
                merged.append((a, b))
        out: list[str] = []
        for a, b in merged:
            word = claim[a:b]
            if word not in out:
                out.append(word)
        return out


_GAP_RE = re.compile(r"[\sA-Za-z'’]+")


def _only_function_words(gap: str) -> bool:
    """Whether the text between two flagged words holds only function words (" of the ")."""
    return bool(_GAP_RE.fullmatch(gap)) and all(is_stopword(t) for t in tokenize(gap))


#: The words of each recently seen document, by text.
_DOC_TOKENS: LruCache[str, frozenset[str]] = LruCache(256)


def _doc_tokens(text: str) -> frozenset[str]:
    tokens = _DOC_TOKENS.get(text)
    return tokens if tokens is not None else _DOC_TOKENS.put(text, frozenset(tokenize(text)))


@lru_cache(maxsize=256)
def _other_materials_tokens(docs: tuple[str, ...], material_text: str) -> frozenset[str]:
    """The words of the retrieved materials other than this one."""
    return frozenset().union(*(_doc_tokens(d) for d in docs if d != material_text))


@lru_cache(maxsize=1024)
def _elsewhere_tokens(docs: tuple[str, ...], material_text: str, sentence: int) -> frozenset[str]:
    """The words of the material's sentences other than sentence ``sentence``, and of the
    other retrieved materials."""
    tokens = _material_view(material_text).tokens
    return _other_materials_tokens(docs, material_text).union(
        *(t for i, t in enumerate(tokens) if i != sentence)
    )


def _swaps(
    claim: str,
    terms: list[_Term],
    sentence_seq: list[str],
    other_materials: frozenset[str],
) -> list[tuple[str, str]]:
    """Words of the claim put in the place of other words of the aligned sentence: a replaced
    run of one or two content words next to words both texts share, where the claim's words
    are not in the sentence and are names (capitalised inside the claim) or words that other
    retrieved materials (or other sentences of a short material) use: another product, plan
    or place; or a word swapped where a noun stands ("per tablet"; 的/量词 + noun, or first in
    a Chinese clause)."""
    by_token = {t.token: t for t in terms}
    order = sorted(((a, t.token) for t in terms for a, _ in t.spans), key=lambda x: x[0])
    claim_seq = [tok for _, tok in order]
    out: list[tuple[str, str]] = []
    blocks = _opcodes(tuple(claim_seq), tuple(sentence_seq))
    for n, (tag, i1, i2, j1, j2) in enumerate(blocks):
        if tag != "replace":
            continue
        said = claim_seq[i1:i2]
        longest = 5 if any(not tok.isascii() for tok in said) else 2
        if not (1 <= i2 - i1 <= longest and 1 <= j2 - j1 <= longest + 1):
            continue
        before = n > 0 and blocks[n - 1][0] == "equal"
        after = n + 1 < len(blocks) and blocks[n + 1][0] == "equal"
        if not (before or after):
            continue
        if any(tok.isdigit() or tok in sentence_seq for tok in said):
            continue
        spans = [by_token[tok].spans[0] for tok in said if tok in by_token]
        if not spans:
            continue
        a, b = min(s for s, _ in spans), max(e for _, e in spans)
        named = any(by_token[tok].entity for tok in said if tok in by_token)
        cjk = not said[0].isascii()
        known = (any if cjk else all)(tok in other_materials for tok in said)
        if cjk:
            slot = _cjk_noun_slot(claim, a) or _cjk_word_swap(said, sentence_seq[j1:j2])
        else:
            slot = i2 - i1 == 1 and j2 - j1 == 1 and _noun_slot(claim, a)
        if not (named or known or slot):
            continue
        out.append((claim[a:b], " ".join(sentence_seq[j1:j2])))
    return out


@lru_cache(maxsize=4096)
def _opcodes(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[tuple[str, int, int, int, int], ...]:
    """How to turn word sequence ``a`` into ``b`` (``difflib`` opcodes, no junk heuristic)."""
    return tuple(difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes())


_DETERMINERS = frozenset(
    ["a", "an", "the", "per", "each", "every", "any", "this", "these", "those", "my", "your"]
)


_CJK_NOUN_BEFORE = frozenset("的个位张台件份种款")
# characters of Chinese verbs, adverbs and auxiliaries that paraphrases swap freely (可以/能够,
# 需要/必须, 立即/马上): a replaced word holding one of them is not taken for a swapped name
_CJK_FREE_CHARS = frozenset(
    "可以能够需要必须应该该当得立即马上随时刻已经曾将会仍然还都均皆只仅就才又再也更最很非常十分"
    "提供享受获得进行办理申请使用通过按照根据由于因为所以如果若则即便虽然但并且而且或者"
)


def _bigram_text(tokens: Sequence[str]) -> str:
    """The characters a run of overlapping Chinese bigrams spells ("和平", "平板" -> "和平板")."""
    if not tokens:
        return ""
    text = tokens[0]
    for tok in tokens[1:]:
        text += tok[1:] if len(tok) == 2 and text.endswith(tok[:1]) else tok
    return text


def _cjk_word_swap(said: Sequence[str], instead: Sequence[str]) -> bool:
    """Whether a run of Chinese bigrams replaces one word of the sentence with another word
    wholesale: the same characters around it, and two words of two or more characters that
    share no character and are not verbs, adverbs or auxiliaries
    ("绑定手机号" -> "绑定平板电脑号")."""
    a, b = _bigram_text(said), _bigram_text(instead)
    head = 0
    while head < min(len(a), len(b)) and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < min(len(a), len(b)) - head and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    core_a, core_b = a[head : len(a) - tail], b[head : len(b) - tail]
    return (
        head > 0
        and tail > 0
        and len(core_a) >= 2
        and len(core_b) >= 2
        and all(_CJK_RE.match(ch) for ch in core_a + core_b)
        and not set(core_a) & set(core_b)
        and not (set(core_a) | set(core_b)) & _CJK_FREE_CHARS
    )


def _cjk_noun_slot(claim: str, at: int) -> bool:
    """Whether the Chinese word at ``at`` stands where a noun stands: first in its clause, or
    right after 的 or a measure word."""
    before = claim[:at].rstrip()
    return not before or before[-1] in "，,；;：:。" or before[-1] in _CJK_NOUN_BEFORE


def _noun_slot(claim: str, at: int) -> bool:
    """Whether the word at ``at`` stands where a noun stands: right after a determiner or a
    number, or first in the claim."""
    before = re.findall(r"[A-Za-z]+|\d+", claim[:at])
    if not before:
        return True
    return before[-1].lower() in _DETERMINERS or before[-1].isdigit()


def _terms_within(terms: list[_Term], a: int, b: int) -> list[int]:
    """The indexes of the terms with an occurrence starting in ``[a, b)``."""
    out = []
    for k, t in enumerate(terms):
        for s, _ in t.spans:
            if a <= s < b:
                out.append(k)
                break
    return out


def _claim_terms(claim: str, claim_qs: list[Quantity]) -> list[tuple[str, int, int]]:
    inside = [(q.start, q.end) for q in claim_qs]
    out = []
    for tok in tokenize_spans(claim):
        if is_stopword(tok.text):
            continue
        if any(tok.start < b and a < tok.end for a, b in inside):
            continue
        if tok.text.replace(".", "").isdigit():
            continue  # numbers are checked as quantities
        out.append((tok.text, tok.start, tok.end))
    return out


@dataclass(frozen=True)
class _MaterialView:
    """What the backend needs of a material, computed once per material text."""

    sentences: list[Sentence]
    tokens: list[frozenset[str]]
    chars: list[frozenset[str]]
    quantities: list[Quantity]
    sentence_quantities: list[list[Quantity]]
    negated: list[bool]
    declarative: list[bool]  # states something (not a question, title or heading)
    question: list[bool]
    token_seqs: list[list[str]]
    idf: dict[str, float]
    unseen: float


def _prefixes(tokens: frozenset[str], n: int) -> frozenset[str]:
    return frozenset(t[:n] for t in tokens if len(t) >= n and t.isascii())


@lru_cache(maxsize=256)
def _sentence_prefixes(material_text: str, n: int) -> tuple[frozenset[str], ...]:
    """The ``n``-character word prefixes of each sentence of a material."""
    return tuple(_prefixes(toks, n) for toks in _material_view(material_text).tokens)


def _content_sequence(sentence: Sentence, quantities: list[Quantity]) -> list[str]:
    """The sentence's content words in order, without the words of its quantities."""
    inside = [(q.start - sentence.start, q.end - sentence.start) for q in quantities]
    return [
        t.text
        for t in tokenize_spans(sentence.text)
        if not is_stopword(t.text)
        and not t.text[:1].isdigit()
        and not any(a <= t.start < b for a, b in inside)
    ]


#: Each recently seen material, prepared for scoring, by text.
_VIEWS: LruCache[str, _MaterialView] = LruCache(256)


def _material_view(material_text: str) -> _MaterialView:
    view = _VIEWS.get(material_text)
    return view if view is not None else _VIEWS.put(material_text, _prepare(material_text))


def _prepare(material_text: str) -> _MaterialView:
    sentences = split_sentences(material_text)
    tokens = [frozenset(tokenize(s.text)) for s in sentences]
    quantities = extract_quantities(material_text)
    per_sentence: list[list[Quantity]] = [[] for _ in sentences]
    starts = [s.start for s in sentences]
    for q in quantities:
        i = bisect_right(starts, q.start) - 1
        if 0 <= i < len(sentences) and q.start < sentences[i].end:
            per_sentence[i].append(q)
    idf, unseen = _idf_table(tokens)
    return _MaterialView(
        sentences=sentences,
        tokens=tokens,
        chars=[frozenset(_CJK_RE.findall(s.text)) for s in sentences],
        quantities=quantities,
        sentence_quantities=per_sentence,
        negated=[is_negated(s.text) for s in sentences],
        declarative=[is_declarative(s.text) for s in sentences],
        question=[s.text.rstrip().endswith(("?", "？")) for s in sentences],
        token_seqs=[
            _content_sequence(s, qs) for s, qs in zip(sentences, per_sentence, strict=True)
        ],
        idf=idf,
        unseen=unseen,
    )


@lru_cache(maxsize=32)
def _corpus_idf(corpus: tuple[str, ...]) -> tuple[dict[str, float], float]:
    return _idf_table([_doc_tokens(d) for d in corpus])


def analyse(
    claim: str,
    material_text: str,
    corpus: Sequence[str] | None,
    params: LexicalParams,
) -> _Analysis:
    """Score every sentence of the material against the claim and pick the covering union."""
    p = params
    view = _material_view(material_text)
    sentences = view.sentences
    n = len(sentences)
    if corpus:
        docs = tuple(d for d in corpus if isinstance(d, str))
        if material_text not in docs:
            docs = (*docs, material_text)
        idf, unseen = _corpus_idf(docs)
    else:
        docs = ()
        idf, unseen = view.idf, view.unseen

    # a preamble naming the claim's source ("According to the NIH, ...") is not content
    content_from = attribution_preamble(claim)
    claim_qs = extract_quantities(claim)
    terms: dict[str, _Term] = {}
    for tok, a, b in _claim_terms(claim, claim_qs):
        if a < content_from:
            continue
        weight = idf.get(tok, unseen) ** p.idf_power
        entity = _is_entity(claim, a, b)
        if entity:
            weight *= p.entity_boost
        elif len(tok) == 2 and (tok[0] in _FUNCTION_CHARS or tok[1] in _FUNCTION_CHARS):
            weight *= 0.5  # a Chinese bigram across a function word is weak evidence
        if tok in terms:
            terms[tok].spans.append((a, b))
            terms[tok].weight = max(terms[tok].weight, weight)
            terms[tok].entity = terms[tok].entity or entity
        else:
            terms[tok] = _Term(tok, weight, [(a, b)], entity)
    term_list = list(terms.values())
    q_weight = p.quantity_weight * unseen**p.idf_power
    total = sum(t.weight for t in term_list) + q_weight * len(claim_qs)

    # credit[i][k]: how far sentence i backs term k (1 exact, partial for a prefix or characters);
    # questions back nothing; titles and headings only name things (they never lead the union)
    credit: list[dict[int, float]] = []
    for i in range(n):
        row: dict[int, float] = {}
        if not view.question[i]:
            toks = view.tokens[i]
            prefixes = (
                _sentence_prefixes(material_text, p.prefix_len)[i]
                if p.partial_credit
                else frozenset()
            )
            for k, t in enumerate(term_list):
                if t.token in toks:
                    row[k] = 1.0
                elif p.partial_credit and (
                    (
                        t.token.isascii()
                        and t.token[: p.prefix_len] in prefixes
                        and len(t.token) >= p.prefix_len
                    )
                    or (
                        len(t.token) == 2
                        and not t.token.isascii()
                        and set(t.token) <= view.chars[i]
                    )
                ):
                    row[k] = p.partial_credit
        credit.append(row)
    q_hit = [
        [view.declarative[i] and quantities_match(q, view.sentence_quantities[i]) for q in claim_qs]
        for i in range(n)
    ]

    def gain(i: int, cur: dict[int, float], qcov: list[bool]) -> float:
        got = sum(
            term_list[k].weight * (c - cur.get(k, 0.0))
            for k, c in credit[i].items()
            if c > cur.get(k, 0.0)
        )
        got += q_weight * sum(1 for j, hit in enumerate(q_hit[i]) if hit and not qcov[j])
        return got / total if total > 0 else 0.0

    no_q = [False] * len(claim_qs)
    sentence_scores = [gain(i, {}, no_q) for i in range(n)]
    chosen: list[int] = []
    cur: dict[int, float] = {}
    qcov = list(no_q)
    union_cov = 0.0
    if n:
        order = sorted(range(n), key=lambda i: (not view.declarative[i], -sentence_scores[i]))
        best = order[0]
        order = sorted(range(n), key=lambda i: -sentence_scores[i])
        while True:
            chosen.append(best)
            union_cov += gain(best, cur, qcov)
            for k, c in credit[best].items():
                cur[k] = max(cur.get(k, 0.0), c)
            qcov = [a or b for a, b in zip(qcov, q_hit[best], strict=True)]
            if len(chosen) >= p.max_sentences:
                break
            # only sentences that cover something on their own can add to the union
            pool = [i for i in order[: p.pool] if i not in chosen]
            if not pool:
                break
            best_gain, best = max((gain(i, cur, qcov), i) for i in pool)
            if best_gain < p.min_gain:
                break

    best_single = sentence_scores[chosen[0]] if chosen else 0.0
    score = p.union_weight * union_cov + (1.0 - p.union_weight) * best_single
    # names the chosen sentences do not back
    missing_entities = [t.token for k, t in enumerate(term_list) if t.entity and cur.get(k, 0) < 1]
    stated_qs = [q for i in range(n) if view.declarative[i] for q in view.sentence_quantities[i]]
    stated = [quantities_match(q, stated_qs) for q in claim_qs]
    mismatches = [q for q, ok in zip(claim_qs, stated, strict=True) if not ok]
    conflicts = _quantity_conflicts(claim, claim_qs, term_list, credit, q_hit, stated, view)
    mismatches += [q for q, _ in conflicts if q not in mismatches]
    claim_negated = is_negated(claim[content_from:])
    # a negation flip matters when the sentence otherwise restates the claim
    negation_mismatch = (
        bool(chosen)
        and claim_negated != view.negated[chosen[0]]
        and best_single >= p.negation_min_cover
    )
    analysis = _Analysis(
        terms=term_list,
        claim_qs=claim_qs,
        sentence_scores=sentence_scores,
        chosen=chosen,
        union_cov=min(1.0, union_cov),
        covered=cur,
        q_covered=qcov,
        mismatches=mismatches,
        negation_mismatch=negation_mismatch,
        claim_negated=claim_negated,
        missing_entities=missing_entities,
        score=min(1.0, score),
        params=p,
        conflicts=[(q.raw, said) for q, said in conflicts],
        preamble=claim[:content_from].strip(),
        content_from=content_from,
    )
    analysis.structure(claim, view, docs, material_text)
    return analysis


@lru_cache(maxsize=4096)
def _clause_of(claim: str, at: int) -> tuple[int, int]:
    """The clause (between , ; : and sentence ends) of ``claim`` around offset ``at``."""
    start = max((claim.rfind(c, 0, at) for c in ",;:，；：、"), default=-1) + 1
    ends = [e for e in (claim.find(c, at) for c in ",;:，；：") if e >= 0]
    return start, min(ends) if ends else len(claim)


def _same_family(a: Quantity, b: Quantity) -> bool:
    if a.kind != b.kind or a.kind == "number":  # plain numbers say too little to conflict
        return False
    if a.kind in {"duration", "money"}:
        return a.unit == b.unit
    if a.kind == "number":
        return (a.unit == "time") == (b.unit == "time")
    return True


def _quantity_conflicts(
    claim: str,
    claim_qs: list[Quantity],
    terms: list[_Term],
    credit: list[dict[int, float]],
    q_hit: list[list[bool]],
    stated: list[bool],
    view: _MaterialView,
) -> list[tuple[Quantity, str]]:
    """Claim quantities stated somewhere in the material, but not in the sentence the claim's
    words around them align to, which states another value of the same kind instead."""
    out: list[tuple[Quantity, str]] = []
    for j, q in enumerate(claim_qs):
        if not stated[j] or not any(
            _same_family(q, m) for found in view.sentence_quantities for m in found
        ):
            continue  # no sentence could state another value of its kind
        a, b = _clause_of(claim, q.start)
        anchors = _terms_within(terms, a, b)
        if not anchors:
            continue

        weights = [(k, terms[k].weight) for k in anchors]
        scores = [sum([w * row[k] for k, w in weights if k in row]) for row in credit]
        top = max(scores, default=0.0)
        if top <= 0.0:
            continue
        # the sentences the anchors align to best
        aligned = [i for i, v in enumerate(scores) if v >= top - 1e-9]
        if any(q_hit[i][j] for i in aligned):
            continue
        for i in sorted(aligned, key=lambda i: -scores[i]):  # best first, ties in sentence order
            rivals = [
                m
                for m in view.sentence_quantities[i]
                if _same_family(q, m) and not quantities_match(m, [q])
            ]
            if rivals:
                out.append((q, rivals[0].raw))
                break
    return out


def _comparison_conflict(claim_cmp: list[Comparison], sentence_cmp: list[Comparison]) -> str:
    """How a sentence reverses one of the claim's comparisons ("" when it does not)."""
    for c in claim_cmp:
        for s in sentence_cmp:
            same = (c.left & s.left) and (c.right & s.right)
            swapped = (c.left & s.right) and (c.right & s.left)
            if same and not swapped:
                if s.relation == opposite(c.relation) != c.relation:
                    return "the sentence states the opposite comparison"
            elif swapped and not same and s.relation == c.relation:
                return "the sentence compares the other way round"
    return ""


register_backend("lexical", LexicalSupport)
