"""Split an answer into claims and read the citation markers attached to each.

A citation is a material id in square brackets after the text it supports: ``[M03]``,
``[policy-7]``, several as ``[M01][M02]`` or ``[M01, M02]``. Markdown links ``[text](url)`` are
not citations. A claim is one sentence of the answer (Chinese or English punctuation); markers
standing alone after a sentence belong to that sentence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tracerag.text._sentences import split_sentences
from tracerag.text._tokens import content_terms

_ID = r"[A-Za-z0-9\u4e00-\u9fff][\w.\-:/#\u4e00-\u9fff]{0,127}"
CITATION_RE = re.compile(rf"\[(?P<ids>{_ID}(?:\s*[,，;；、]\s*{_ID})*)\](?!\()")
_SPLIT_IDS = re.compile(r"\s*[,，;；、]\s*")


@dataclass(frozen=True)
class Claim:
    """One sentence of an answer: its text without markers, and the ids it cites, in order."""

    text: str
    start: int
    end: int
    cited_ids: tuple[str, ...] = field(default_factory=tuple)


def citation_ids(text: str) -> list[str]:
    """Every cited id in the text, in order of appearance (repeats kept)."""
    return [i for m in CITATION_RE.finditer(text) for i in _SPLIT_IDS.split(m.group("ids")) if i]


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
