"""Sentence splitting for Chinese and English text, with offsets into the original text."""

from __future__ import annotations

import re
from typing import NamedTuple

from tracerag.errors import InputTypeError

__all__ = ["CITATION_MARKER_RE", "Sentence", "split_sentences"]

#: A citation marker such as ``[M03]``, ``[policy-7]``, ``[1]``, ``[M03, M04]``, ``【1】`` or
#: ``［M03］`` (full-width letters and digits too).
_MARKER_ID = r"[A-Za-z0-9\uff10-\uff19\uff21-\uff3a\uff41-\uff5a][\w.\-:/#]{0,40}"
CITATION_MARKER_RE = re.compile(
    rf"[\[【［](?:{_MARKER_ID})(?:\s*[,;，；、]\s*{_MARKER_ID})*[\]】］]"
)


class Sentence(NamedTuple):
    """One sentence: its text and its ``[start, end)`` offsets in the text it came from."""

    text: str
    start: int
    end: int


# Full stops that always end a sentence, and the English ones that need a look at context.
_CJK_TERMINATORS = frozenset("。！？；!?;…")
_CLOSERS = frozenset("\"'”’」』）)】］]》>")
_BLANKS_RE = re.compile(r"[ \t]*")
_CJK_RE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")

# Abbreviations after which a full stop never ends a sentence (compared lowercased, without
# the final dot). Single letters (initials, "U.S.", "e.g.") are handled separately.
_ABBREVIATION_TEXT = """
    mr mrs ms dr prof sr jr st mt vs etc approx dept est fig figs vol vols ed eds rev gen col
    lt sgt capt cmdr gov sen rep pres no nos art sec ch pp para ref refs inc ltd co corp
    jan feb mar apr jun jul aug sep sept oct nov dec cf al
"""
_ABBREVIATIONS = frozenset(_ABBREVIATION_TEXT.split())
# Of those, the ones that often end a sentence: split after them when a capital letter follows.
_FINAL_ABBREVIATIONS = frozenset({"etc", "inc", "ltd", "co", "corp", "al"})


def _word_before(text: str, dot: int) -> str:
    """The run of letters and dots that ends right before ``text[dot]`` (e.g. ``"e.g"``)."""
    i = dot
    while i > 0 and (text[i - 1].isalpha() or text[i - 1] == "."):
        i -= 1
    return text[i:dot].lstrip(".")


def _next_non_space(text: str, i: int) -> str:
    while i < len(text) and text[i] in " \t":
        i += 1
    return text[i] if i < len(text) else ""


def _dot_ends_sentence(text: str, i: int) -> bool:
    """Whether the full stop ``text[i]`` ends a sentence."""
    nxt = text[i + 1] if i + 1 < len(text) else ""
    if nxt == ".":  # an ellipsis: the last dot decides
        return False
    if nxt and not nxt.isspace() and nxt not in _CLOSERS and nxt not in "[【［":
        # "3.5", "15.03.2024", "example.com", "e.g." (first dot): not an end, unless
        # Chinese text follows directly.
        return bool(_CJK_RE.match(nxt))
    word = _word_before(text, i)
    low = word.lower()
    after = _next_non_space(text, i + 1)
    if not word:
        return True
    if "." in low or (len(word) == 1 and word.isalpha()):
        # "e.g.", "i.e.", "U.S.", an initial "K.": only a line end or a Chinese character
        # after it makes it an end.
        return after == "" or after == "\n" or bool(_CJK_RE.match(after))
    if low in _FINAL_ABBREVIATIONS:
        return after == "" or after == "\n" or after.isupper() or bool(_CJK_RE.match(after))
    if low == "no":
        # "No. 5" is an abbreviation; "The answer is no." is not.
        return not (after.isdigit() or after == "#")
    if low in _ABBREVIATIONS:
        if low in {
            "mar",
            "jun",
            "jul",
            "aug",
            "sep",
            "sept",
            "oct",
            "nov",
            "dec",
            "jan",
            "feb",
            "apr",
        }:
            return not after.isdigit() and not (after and after.islower())
        return after == "" or after == "\n"
    return True


def _boundaries(text: str) -> list[int]:
    """End offsets (exclusive) of the sentences of ``text``."""
    ends: list[int] = []
    n = len(text)
    i = 0
    while i < n:
        ch = text[i]
        if ch in "[【［":
            m = CITATION_MARKER_RE.match(text, i)
            if m:
                i = m.end()
                continue
        if ch == "\n":
            ends.append(i)
            i += 1
            continue
        is_end = False
        if ch in _CJK_TERMINATORS:
            is_end = True
        elif ch in ".．":
            is_end = ch == "．" or _dot_ends_sentence(text, i)
        if not is_end:
            i += 1
            continue
        j = i + 1
        # Runs of terminators ("?!", "……", "...") and closing quotes or brackets.
        while j < n and (text[j] in _CJK_TERMINATORS or text[j] in ".．" or text[j] in _CLOSERS):
            if text[j] in "]】］" and CITATION_MARKER_RE.match(text, j):
                break
            j += 1
        # Citation markers that follow the full stop belong to the sentence before.
        k = j
        while True:
            p = _BLANKS_RE.match(text, k).end()  # type: ignore[union-attr]
            cm = CITATION_MARKER_RE.match(text, p)
            if not cm:
                break
            k = cm.end()
            j = k
            # A full stop right after a trailing marker ("... days [M03].") is the same end.
            while j < n and text[j] in ".。．":
                j += 1
            k = j
        ends.append(j)
        i = j
    ends.append(n)
    return ends


def split_sentences(text: str) -> list[Sentence]:
    """Split Chinese and English text into sentences.

    Splits after ``。！？；`` and ``. ! ? ;`` and at newlines, but not inside decimals, amounts,
    dates, common abbreviations or citation markers. A citation marker written after the full
    stop belongs to the sentence before it. Offsets satisfy ``text[s.start:s.end] == s.text``;
    sentences carry no surrounding whitespace and empty sentences are dropped.
    """
    if not isinstance(text, str):
        raise InputTypeError(f"text must be str, not {type(text).__name__}")
    sentences: list[Sentence] = []
    begin = 0
    for end in _boundaries(text):
        if end <= begin:
            continue
        start, stop = begin, end
        while start < stop and text[start].isspace():
            start += 1
        while stop > start and text[stop - 1].isspace():
            stop -= 1
        if stop > start:
            sentences.append(Sentence(text[start:stop], start, stop))
        begin = end
    return sentences
