"""What a question asks rather than names: its asking words, and the kinds of value it asks for.

Both the relevance check (does the answer state what the question asks for?) and the rival-value
check (does the question single out a case?) read a question this way, so it is one leaf module
below both, English and Chinese alike.
"""

from __future__ import annotations

import re

from tracerag.text._words import stem

__all__ = ["asks", "asks_for"]

# Words that ask rather than name: stemmed as ``tokenize`` stems them.
_EN_ASKING_TEXT = """
how long much many often far big old soon late early what which who whom whose when where why
whether tell know explain describe get need want like please can could would should may might
take cost last
"""
_EN_ASKING = frozenset(_EN_ASKING_TEXT.split()) | frozenset(
    stem(w) for w in _EN_ASKING_TEXT.split()
)
# A Chinese bigram holding one of these characters asks (多长, 多久, 几个, 什么, 哪里, 怎么 ...).
_ZH_ASKING = frozenset("多少几哪什么怎谁吗呢久啥如何")


def asks(term: str) -> bool:
    """Whether a token (a stemmed English word, a Chinese bigram) asks rather than names."""
    if term.isascii():
        return term in _EN_ASKING
    return any(ch in _ZH_ASKING for ch in term)


#: The kinds of value whose presence can stand for the question's words: a plain number says
#: too little (most answers have one).
_ANSWERING_KINDS = ("duration", "date", "money", "percent")

# What a question asks for, by its wording: the kinds of value that answer it.
_ASKS: tuple[tuple[re.Pattern[str], frozenset[str]], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), frozenset(kinds))
    for pattern, kinds in (
        # English
        (
            r"\bhow\s+(?:long|soon|quickly|fast|late|early)\b"
            r"|\bhow\s+many\s+(?:(?:business|working|calendar)\s+)?"
            r"(?:days|weeks|months|years|hours|minutes)\b",
            {"duration", "date"},
        ),
        (
            r"\bwhen\b|\bwhat\s+(?:date|day|time|year|month)\b|\bwhich\s+(?:date|day|year|month)\b"
            r"|\bdeadline\b|\buntil\s+when\b",
            {"date", "duration"},
        ),
        (
            r"\bhow\s+much\b|\b(?:price|prices|cost|costs|fee|fees|charge|charges|charged)\b",
            {"money", "percent"},
        ),
        (r"\bwhat\s+(?:percentage|percent|share|proportion)\b", {"percent"}),
        # Chinese
        (
            r"多久|多长时间|多少天|几天|几个月|多少个月|几年|多少年|几个小时|几小时|多少小时|几周"
            r"|几个工作日|多长",
            {"duration", "date"},
        ),
        (r"什么时候|何时|哪天|哪一天|几号|几月|哪年|哪一年|截止|期限", {"date", "duration"}),
        (
            r"多少钱|几元|多少元|花多少|付多少|收多少|多贵"
            r"|(?:费用|价格|价钱|收费|运费|服务费)(?:是|要|为)?(?:多少|几)",
            {"money", "percent"},
        ),
        (r"百分之几|几折|多少折|百分比", {"percent"}),
    )
)


def asks_for(question: str) -> tuple[str, ...]:
    """The kinds of value the question asks for (``duration``, ``date``, ``money``,
    ``percent``), in that order."""
    kinds: set[str] = set()
    for pattern, found in _ASKS:
        if pattern.search(question):
            kinds |= found
    return tuple(k for k in _ANSWERING_KINDS if k in kinds)
