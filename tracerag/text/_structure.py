"""Sentence structure that support depends on, in Chinese and English: attribution preambles,
questions and headings, comparisons (who is more or less than whom, what came before what) and
coordinated parts of a claim ("A and B ...")."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, NamedTuple

from tracerag.text._sentences import CITATION_MARKER_RE
from tracerag.text._words import is_stopword, tokenize_spans

__all__ = [
    "Comparison",
    "actor_moved",
    "attribution_preamble",
    "comparisons",
    "conjuncts",
    "is_declarative",
    "opposite",
]

# "According to the NIH, ...", "As reported by Reuters, ...", "Per the manual, ..."
_EN_PREAMBLE_RE = re.compile(
    r"^\s*(?:(?:according|thanks)\s+to|as\s+(?:reported|stated|noted|described|explained|"
    r"shown|documented|mentioned)\s+(?:by|in)|per|citing|based\s+on|in\s+the\s+words\s+of)"
    r"\s+[^,;:]{1,80}?[,:]\s*",
    re.I,
)
# "The NIH says (that) ...", "Researchers at X found that ...", "A 2019 study shows that ..."
_EN_SAYS_RE = re.compile(
    r"^\s*(?:[^,;:.]{1,60}?)\s+(?:says?|said|states?|stated|reports?|reported|notes?|noted|"
    r"explains?|explained|writes?|wrote|suggests?|suggested|finds?|found|shows?|showed|"
    r"argues?|argued|claims?|claimed|indicates?|indicated|confirms?|confirmed|"
    r"points?\s+out|believes?|believed|estimates?|estimated)\s+(?:that\s+|,\s*)",
    re.I,
)
# "根据说明书，…", "据新华社报道，…", "按照规定，…", "客服表示，…"
_ZH_PREAMBLE_RE = re.compile(
    r"^\s*(?:(?:根据|依据|据|按照|依照)[^，,：:。]{1,30}?(?:报道|介绍|显示|规定|说明|称|所述)?"
    r"[，,：:]|[^，,：:。]{1,20}?(?:表示|指出|称|认为|介绍|提到|说)[，,：:])\s*"
)


def attribution_preamble(claim: str) -> int:
    """Where the content of ``claim`` starts after a preamble naming its source (0 if none).

    "According to the NIH, adults need 7 hours of sleep." → the offset of "adults". The source
    is a mention of where the claim comes from, not content that a material must state.
    """
    for pattern in (_EN_PREAMBLE_RE, _ZH_PREAMBLE_RE, _EN_SAYS_RE):
        m = pattern.match(claim)
        if m and m.end() < len(claim) and _has_content(claim[m.end() :]):
            return m.end()
    return 0


def _has_content(text: str) -> bool:
    return sum(1 for t in tokenize_spans(text) if not is_stopword(t.text)) >= 2


_HEADING_END = frozenset(".。!！;；:：…\"”'’)）】]")


def is_declarative(sentence: str) -> bool:
    """Whether a material sentence states something: not a question, title or heading.

    Questions end with ``?``/``？``; a heading is a short line (at most eight words or twenty
    Chinese characters) with no final punctuation and no number, or a line marked as a title.
    """
    text = CITATION_MARKER_RE.sub("", sentence).strip()
    if not text:
        return False
    if text.endswith(("?", "？")):
        return False
    if re.match(r"^\(meta data\)\s*title\s*:", text, re.I) or re.match(r"^#{1,6}\s", text):
        return False
    if text[-1] in _HEADING_END:
        return True
    if any(ch.isdigit() for ch in text):
        return True
    words = re.findall(r"[A-Za-z]+", text)
    chinese = re.findall(r"[\u4e00-\u9fff]", text)
    if chinese:
        return len(chinese) > 20
    return len(words) > 8


# ----------------------------------------------------------------------------------------------
# Comparisons


class Comparison(NamedTuple):
    """A comparison in text: ``left`` is ``relation`` to ``right`` (terms as tokenized)."""

    relation: str  # "more" | "less" | "before" | "after" | "same"
    left: frozenset[str]
    right: frozenset[str]
    cue_start: int
    cue_end: int


_OPPOSITE = {"more": "less", "less": "more", "before": "after", "after": "before"}
_EN_COMPARATIVE_RE = re.compile(
    r"\b(?P<cue>(?:more|greater|higher|larger|bigger|longer|older|faster|stronger|heavier|"
    r"better|earlier)(?:\s+\w+){0,2}?\s+than"
    r"|(?:less|fewer|lower|smaller|shorter|younger|slower|weaker|lighter|worse|later)"
    r"(?:\s+\w+){0,2}?\s+than"
    r"|\w+er\s+than"
    r"|before|after|prior\s+to|preceded|followed|outlived|outnumbered|exceeds?|exceeded|"
    r"surpass(?:es|ed)?|outperform(?:s|ed)?)\b",
    re.I,
)
_EN_LESS_WORDS = frozenset(
    [
        "less",
        "fewer",
        "lower",
        "smaller",
        "shorter",
        "younger",
        "slower",
        "weaker",
        "lighter",
        "worse",
        "later",
    ]
)
_ZH_COMPARATIVE_RE = re.compile(
    r"(?P<cue>高于|低于|大于|小于|多于|少于|早于|晚于|先于|优于|劣于|超过|不及|之前|之后|以前|以后|"
    r"比(?P<adj>[^，,。；;]{0,12}?)(?:更|还)?(?P<deg>高|低|大|小|多|少|早|晚|快|慢|长|短|强|弱|贵|便宜|好|差|重|轻))"
)
_ZH_RELATION = {
    "高于": "more",
    "大于": "more",
    "多于": "more",
    "超过": "more",
    "优于": "more",
    "低于": "less",
    "小于": "less",
    "少于": "less",
    "不及": "less",
    "劣于": "less",
    "早于": "before",
    "先于": "before",
    "之前": "before",
    "以前": "before",
    "晚于": "after",
    "之后": "after",
    "以后": "after",
}
_ZH_DEGREE = {
    "高": "more",
    "大": "more",
    "多": "more",
    "快": "more",
    "长": "more",
    "强": "more",
    "贵": "more",
    "好": "more",
    "重": "more",
    "早": "before",
    "低": "less",
    "小": "less",
    "少": "less",
    "慢": "less",
    "短": "less",
    "弱": "less",
    "便宜": "less",
    "差": "less",
    "轻": "less",
    "晚": "after",
}


def _relation_en(cue: str) -> str:
    low = cue.lower()
    first = low.split()[0]
    if first in {"before", "prior", "preceded", "earlier"}:
        return "before"
    if first in {"after", "followed", "later"}:
        return "after"
    if first in _EN_LESS_WORDS:
        return "less"
    return "more"


def _terms(text: str, offset: int) -> list[tuple[str, int]]:
    return [(t.text, t.start + offset) for t in tokenize_spans(text) if not is_stopword(t.text)]


_CLAUSE_BREAK_RE = re.compile(r"[,，;；:：]")
_CLAUSE_OR_SENTENCE_BREAK_RE = re.compile(r"[,，;；:：。.]")


def comparisons(text: str) -> list[Comparison]:
    """The comparisons of one sentence, with the content terms on each side of the cue (up to
    the nearest clause break)."""
    return list(_comparisons(text))


@lru_cache(maxsize=4096)
def _comparisons(text: str) -> tuple[Comparison, ...]:
    """The comparisons of one text, kept for the claims and sentences checked again."""
    out: list[Comparison] = []
    for m in list(_EN_COMPARATIVE_RE.finditer(text)) + list(_ZH_COMPARATIVE_RE.finditer(text)):
        cue = m.group("cue")
        if cue[0].isascii():
            relation = _relation_en(cue)
            cue_start, cue_end = m.start("cue"), m.end("cue")
        elif cue.startswith("比"):
            relation = _ZH_DEGREE.get(m.group("deg"), "more")
            cue_start, cue_end = m.start("cue"), m.start("cue") + 1
        else:
            relation = _ZH_RELATION[cue]
            cue_start, cue_end = m.start("cue"), m.end("cue")
        left_text = _CLAUSE_BREAK_RE.split(text[:cue_start])[-1]
        right_part = text[cue_end:]
        right_text = _CLAUSE_OR_SENTENCE_BREAK_RE.split(right_part)[0]
        if cue.startswith("比"):
            # "A 比 B 高": B sits between 比 and the degree word
            right_text = text[cue_end : m.start("deg")]
        left = frozenset(t for t, _ in _terms(left_text, 0)[-3:])
        right = frozenset(t for t, _ in _terms(right_text, 0)[:3])
        if left and right:
            out.append(Comparison(relation, left, right, cue_start, cue_end))
    return tuple(out)


def opposite(relation: str) -> str:
    """The converse relation (more ↔ less, before ↔ after)."""
    return _OPPOSITE.get(relation, relation)


# ----------------------------------------------------------------------------------------------
# Coordination

_EN_AND_RE = re.compile(r"\s*,?\s+(?:and|or|as\s+well\s+as|along\s+with|together\s+with)\s+", re.I)
_ZH_AND_RE = re.compile(r"以及|或者|和|与|及|跟|或|、")


_EN_VERB_AFTER_RE = re.compile(
    r"\s+(?:are|is|were|was|have|has|had|can|could|must|may|might|will|would|should|"
    r"get|gets|cost|costs|need|needs|do|does|did)\b",
    re.I,
)


_EN_WORD_RE = re.compile(r"[A-Za-z]+")
_HAN_CHAR_RE = re.compile(r"[\u4e00-\u9fff]")
_WORD_OR_HAN_RE = re.compile(r"[A-Za-z]+|[\u4e00-\u9fff]")


def conjuncts(claim: str) -> list[tuple[int, int]]:
    """Offsets of the coordinated parts of a claim's first phrase ("A and B are …" → A, B…;
    "A or B" alike).

    Only a coordination of short parts (noun phrases, up to four words or eight Chinese
    characters each side) is split; the rest of the claim stays with the last part.
    """
    return list(_conjuncts(claim))


@lru_cache(maxsize=4096)
def _conjuncts(claim: str) -> tuple[tuple[int, int], ...]:
    """The coordinated parts of one claim, kept for the claims checked again."""
    text = CITATION_MARKER_RE.sub(lambda m: " " * len(m.group()), claim)
    for pattern, short in ((_EN_AND_RE, 4), (_ZH_AND_RE, 8)):
        for m in pattern.finditer(text):
            before = text[: m.start()]
            head = _CLAUSE_BREAK_RE.split(before)[-1]
            head_start = m.start() - len(head)
            size = (
                len(_EN_WORD_RE.findall(head))
                if pattern is _EN_AND_RE
                else len(_HAN_CHAR_RE.findall(head))
            )
            # Chinese 和/或/与 join nouns: only the words right before them are the first part
            if not head.strip() or (pattern is _EN_AND_RE and size > short + 2):
                continue
            after = text[m.end() :]
            if not _WORD_OR_HAN_RE.search(after):
                continue
            # the first conjunct: the content words after the last function word before "and"
            # (at most two words or two bigrams)
            tokens = tokenize_spans(head)
            while tokens and is_stopword(tokens[-1].text):
                tokens.pop()
            run: list[Any] = []
            for t in reversed(tokens):
                if is_stopword(t.text) or len(run) == 2:
                    break
                run.append(t)
            if not run:
                continue
            first = (head_start + run[-1].start, m.start())
            second_tokens = [t for t in tokenize_spans(after) if not is_stopword(t.text)]
            if not second_tokens:
                continue
            second_start = m.end() + second_tokens[0].start
            parts = [first, (second_start, len(claim))]
            if pattern is _EN_AND_RE and _EN_VERB_AFTER_RE.match(after[second_tokens[0].end :]):
                # "A and B are ...", "A or B costs ...": B alone is the second conjunct
                parts.insert(1, (second_start, m.end() + second_tokens[0].end))
            elif pattern is _ZH_AND_RE and len(second_tokens) > 1:
                # "A和B可享受...": the first two bigrams of B stand for B
                parts.insert(1, (second_start, m.end() + second_tokens[1].end))
            return tuple(parts)
    return ()


# ----------------------------------------------------------------------------------------------
# Who does what

_NAME_RUN_RE = re.compile(r"^\s*((?:[A-Z][\w'’.-]*\s+){0,3}?[A-Z][\w'’.-]*)\s+([a-z][a-z'’-]+)")
_BY_RE = re.compile(r"\bby\b", re.I)


@lru_cache(maxsize=4096)
def actor_moved(claim: str, sentence: str) -> str:
    """The name that is the subject of the claim's verb but, in the sentence, appears only after
    that verb, and not as its passive agent ("X left the party" against "… leaving the party and
    joining X"); "" when there is none. English only; the name must be capitalised in both."""
    m = _NAME_RUN_RE.match(claim)
    if not m:
        return ""
    name, verb_word = m.group(1), m.group(2)
    verb = tokenize_spans(verb_word)
    if not verb or is_stopword(verb[0].text):
        return ""
    verb_stem = verb[0].text
    tokens = tokenize_spans(sentence)
    verb_at = [t.start for t in tokens if t.text == verb_stem]
    if not verb_at:
        return ""
    last = name.split()[-1]
    if is_stopword(last.lower()):  # "The company ...": not a name
        return ""
    places = [mm.start() for mm in re.finditer(rf"\b{re.escape(last)}\b", sentence)]
    if not places or any(p < verb_at[0] for p in places):
        return ""
    if any(_BY_RE.search(sentence, verb_at[0], p) for p in places):
        return ""  # passive: "... was left by X"
    return name
