"""Split an answer into claims and read the citation markers attached to each.

A citation is a material id in square brackets after the text it supports: ``[M03]``,
``[policy-7]``, several as ``[M01][M02]`` or ``[M01, M02]``; the full-width brackets Chinese
text uses count the same (``【M03】``, ``［M03］``). A number (``[1]``) is a footnote: where the
front door allows it, it names the material shown in that position. Markdown links
``[text](url)`` are not citations. A claim is one sentence of the answer (Chinese or English
punctuation); markers standing alone after a sentence belong to that sentence.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field

from tracerag.text._sentences import split_sentences
from tracerag.text._words import content_terms

# an id: ASCII or full-width letters and digits, CJK characters, and . - : / # inside
_FULL_WIDTH = "\uff10-\uff19\uff21-\uff3a\uff41-\uff5a"
_REST = rf"[\w.\-:/#{_FULL_WIDTH}\u4e00-\u9fff]{{0,127}}"
_ID = rf"[A-Za-z0-9{_FULL_WIDTH}\u4e00-\u9fff]{_REST}"
# in full-width brackets an id starts with a letter or digit: 【温馨提示】 is a heading
_FW_ID = rf"[A-Za-z0-9{_FULL_WIDTH}]{_REST}"
_SEP = r"\s*[,，;；、]\s*"
# ``[id]``, or as Chinese-writing models cite, ``【id】`` and ``［id］`` (full-width brackets);
# a bracket closes the way it opened
CITATION_RE = re.compile(
    rf"\[(?P<ids>{_ID}(?:{_SEP}{_ID})*)\](?!\()"
    rf"|【(?P<lenticular>{_FW_ID}(?:{_SEP}{_FW_ID})*)】"
    rf"|［(?P<fullwidth>{_FW_ID}(?:{_SEP}{_FW_ID})*)］"
)
_SPLIT_IDS = re.compile(r"\s*[,，;；、]\s*")
_HAS_FULL_WIDTH = re.compile(f"[{_FULL_WIDTH}]")


@dataclass(frozen=True)
class Claim:
    """One sentence of an answer: its text without markers, and the ids it cites, in order."""

    text: str
    start: int
    end: int
    cited_ids: tuple[str, ...] = field(default_factory=tuple)


def citation_ids(text: str) -> list[str]:
    """Every cited id in the text, in order of appearance (repeats kept); full-width letters
    and digits read as their ASCII forms (``［１］`` cites ``1``)."""
    return [
        unicodedata.normalize("NFKC", i) if _HAS_FULL_WIDTH.search(i) else i
        for m in CITATION_RE.finditer(text)
        for i in _SPLIT_IDS.split(m.group("ids") or m.group("lenticular") or m.group("fullwidth"))
        if i
    ]


_MARKUP = re.compile(r"</?[A-Za-z_][\w\-]*(?:\s[^<>]*)?/?>")


def strip_citations(text: str) -> str:
    """The text with its citation markers (and stray markup tags) removed, whitespace tidied."""
    stripped = _MARKUP.sub("", CITATION_RE.sub("", text))
    stripped = re.sub(r"\s+([.。!！?？;；,，])", r"\1", stripped)
    return re.sub(r"[ \t]{2,}", " ", stripped).strip()


def split_claims(answer: str) -> list[Claim]:
    """The answer's claims; sentences without content words (e.g. a lone marker) are merged."""
    claims: list[Claim] = []
    for sentence in split_sentences(answer):
        ids = tuple(dict.fromkeys(citation_ids(sentence.text)))
        text = strip_citations(sentence.text)
        if not content_terms(text):
            if ids and claims:  # markers standing alone cite the sentence before them
                prev = claims[-1]
                merged = tuple(dict.fromkeys(prev.cited_ids + ids))
                claims[-1] = Claim(prev.text, prev.start, sentence.end, merged)
            continue
        claims.append(Claim(text, sentence.start, sentence.end, ids))
    return claims
