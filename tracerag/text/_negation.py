"""Negation cues in Chinese and English text."""

from __future__ import annotations

import re

from tracerag.errors import InputTypeError

__all__ = ["is_negated", "negation_cues"]

_EN_CUES = (
    r"not|no|never|cannot|none|nobody|nothing|nowhere|neither|nor|without|"
    r"(?:ca|wo|do|does|did|is|are|was|were|has|have|had|should|would|could|must|need|shall)n['’]t|"
    r"can['’]t|won['’]t|ain['’]t"
)
_EN_RE = re.compile(rf"\b(?:{_EN_CUES})\b|\bnon-(?=[A-Za-z])", re.I)
# English phrases that contain a cue word but do not negate the statement.
_EN_NOT_NEGATION_RE = re.compile(
    r"\bnot\s+only\b|\bnot\s+just\b|\bno\s+(?:later|more|less|fewer)\s+than\b|\bno\.\s*(?=\d)|"
    r"\bnothing\s+but\b|\bno\s+doubt\b|\bnone\s+other\s+than\b|\bnot\s+to\s+mention\b",
    re.I,
)

# Longest first, so that "不得" is one cue, not "不" plus a stray "得".
_ZH_CUES = (
    "不得",
    "不可",
    "不能",
    "禁止",
    "没有",
    "沒有",
    "没",
    "沒",
    "不",
    "无",
    "無",
    "非",
    "未",
    "勿",
)
# Words that contain a cue character but are not negations.
_ZH_NOT_NEGATION = (
    "不仅",
    "不但",
    "不光",
    "不只",
    "不过",
    "不断",
    "不久",
    "不少",
    "不错",
    "不管",
    "不论",
    "不同",
    "不如",
    "不然",
    "不得不",
    "不禁",
    "不已",
    "差不多",
    "了不起",
    "不料",
    "不愧",
    "不免",
    "不时",
    "不住",
    "忍不住",
    "不外乎",
    "不少于",
    "不低于",
    "不超过",
    "不高于",
    "不多于",
    "不大于",
    "不小于",
    "无论",
    "無論",
    "无比",
    "无数",
    "无限",
    "无线",
    "無線",
    "无聊",
    "无奈",
    "无疑",
    "毫无疑问",
    "非常",
    "非凡",
    "是非",
    "除非",
    "非洲",
    "莫非",
    "无非",
    "未来",
    "未來",
    "未免",
    "没收",
    "沒收",
    "不可避免",
    "不可或缺",
    "无理由",
)
_ZH_RE = re.compile(
    "|".join(re.escape(w) for w in sorted(_ZH_NOT_NEGATION + _ZH_CUES, key=len, reverse=True))
)
_ZH_CUE_SET = frozenset(_ZH_CUES)


def negation_cues(text: str) -> list[str]:
    """The negation words of ``text`` in reading order (English ones lowercased).

    English: not, no, never, cannot, n't forms, without, neither, nor, none, non-…;
    Chinese: 不, 没, 没有, 无, 非, 未, 勿, 不得, 不可, 不能, 禁止. Words that only look
    negative, such as "not only", "no later than", 不仅, 无论 or 非常, are not cues.
    """
    if not isinstance(text, str):
        raise InputTypeError(f"text must be str, not {type(text).__name__}")
    found: list[tuple[int, str]] = []
    blocked = [(m.start(), m.end()) for m in _EN_NOT_NEGATION_RE.finditer(text)]
    for m in _EN_RE.finditer(text):
        if any(a <= m.start() < b for a, b in blocked):
            continue
        found.append((m.start(), m.group().lower().replace("’", "'")))
    for m in _ZH_RE.finditer(text):
        if m.group() in _ZH_CUE_SET:
            found.append((m.start(), m.group()))
    found.sort()
    return [cue for _, cue in found]


def is_negated(text: str) -> bool:
    """Whether ``text`` contains a negation cue."""
    return bool(negation_cues(text))
