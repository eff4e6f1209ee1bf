"""Synthetic claim/material pairs made from the demo knowledge base, to fit the verifier on.

Every declarative sentence of every document is turned into labelled claims against its own
document:

* supported: the sentence itself; the sentence behind an attribution preamble ("According to
  <title>, …"); its first clause alone; the sentence with a parenthesis or a trailing clause
  dropped;
* not supported: a number changed (digits, or a Chinese number), a content word replaced by one
  of another document (the swap the self-test makes, but drawn independently and at random), a
  negation added, a part joined to the claim that the document does not state ("… and <words of
  another document>"), and a sentence of another document.

The pairs are generated on the fly (seeded), never stored. They are not the adversarial
self-test's mutations: the self-test mutates the extractive model's answers with its own
generator; this one mutates the documents' sentences with simpler rules.
"""

from __future__ import annotations

import random
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verifier_data import Pair

from tracerag.demo.kb import load_documents
from tracerag.text._sentences import split_sentences
from tracerag.text._structure import is_declarative
from tracerag.text._words import is_stopword

_CJK = re.compile(r"[\u4e00-\u9fff]")
_DIGITS = re.compile(r"\d+")
_EN_AUX = re.compile(r"\b(is|are|can|will|must|may|does|do|has|have)\b")
_ZH_VERB = re.compile(r"(可以|可|需要|享受|提供|支持|将)")
_ZH_NUM = re.compile(r"[一二三四五六七八九十两]+")
_EN_WORD = re.compile(r"[A-Za-z][a-z]{3,}")


def _chinese(text: str) -> bool:
    return bool(_CJK.search(text))


def _change_number(sentence: str, rng: random.Random) -> str | None:
    found = list(_DIGITS.finditer(sentence))
    if found:
        m = rng.choice(found)
        value = int(m.group())
        new = value + rng.choice([1, 2, 3, 5, 10]) if value < 1000 else value + 1
        return sentence[: m.start()] + str(new) + sentence[m.end() :]
    zh = list(_ZH_NUM.finditer(sentence))
    if zh:
        m = rng.choice(zh)
        new = "五" if m.group() != "五" else "三"
        return sentence[: m.start()] + new + sentence[m.end() :]
    return None


def _words(text: str) -> list[str]:
    if _chinese(text):
        runs = re.findall(r"[\u4e00-\u9fff]{2,4}", text)
        return [r[:2] for r in runs]
    return [w for w in _EN_WORD.findall(text) if not is_stopword(w.lower())]


def _swap_word(sentence: str, other: str, rng: random.Random) -> str | None:
    mine = [w for w in _words(sentence) if w not in other]
    theirs = [w for w in _words(other) if w not in sentence]
    if not mine or not theirs:
        return None
    old, new = rng.choice(mine), rng.choice(theirs)
    return sentence.replace(old, new, 1)


def _negate(sentence: str) -> str | None:
    if _chinese(sentence):
        m = _ZH_VERB.search(sentence)
        return sentence[: m.start()] + "不" + sentence[m.start() :] if m else None
    m = _EN_AUX.search(sentence)
    return sentence[: m.end()] + " not" + sentence[m.end() :] if m else None


def _add_part(sentence: str, other: str, rng: random.Random) -> str | None:
    theirs = [w for w in _words(other) if w not in sentence]
    if not theirs:
        return None
    extra = rng.choice(theirs)
    if _chinese(sentence):
        m = re.search(r"(购买|享受|提供|支持|适用于)", sentence)
        return sentence[: m.end()] + extra + "和" + sentence[m.end() :] if m else None
    words = _EN_WORD.findall(sentence)
    nouns = [w for w in words if not is_stopword(w.lower())]
    if not nouns:
        return None
    target = nouns[0]
    return sentence.replace(target, f"{target} and {extra.lower()}", 1)


def _first_clause(sentence: str) -> str | None:
    for sep in (", ", "，"):
        if sep in sentence:
            head, tail = sentence.split(sep, 1)
            # keep the part that carries the content (the longer one), as a sentence
            part = head if len(head) > len(tail) else tail
            if len(part) >= 20 or (_chinese(part) and len(part) >= 8):
                return part.rstrip(".。") + ("。" if _chinese(part) else ".")
    return None


def synthetic_pairs(seed: int = 0) -> list[Pair]:
    """Labelled pairs made from the demo knowledge base (``dataset`` ``"synthetic"``)."""
    rng = random.Random(seed)
    docs = [
        (d.metadata["id"], d.metadata.get("title", ""), d.page_content) for d in load_documents()
    ]
    out: list[Pair] = []

    def add(doc_id: str, claim: str | None, material: str, supported: bool) -> None:
        if claim and claim.strip():
            out.append(Pair("synthetic", doc_id, claim.strip(), material, supported))

    for doc_id, title, text in docs:
        # the other documents of the same language lend the swapped and added words
        others = [t for i, _, t in docs if i != doc_id and _chinese(t) == _chinese(text)]
        for s in split_sentences(text):
            sentence = s.text.strip()
            if not is_declarative(sentence):
                continue
            other = rng.choice(others)
            zh = _chinese(sentence)
            add(doc_id, sentence, text, True)
            preamble = f"根据《{title}》，" if zh else f"According to the {title} policy, "
            add(
                doc_id,
                preamble + (sentence if zh else sentence[:1].lower() + sentence[1:]),
                text,
                True,
            )
            add(doc_id, _first_clause(sentence), text, True)
            add(doc_id, _change_number(sentence, rng), text, False)
            add(doc_id, _swap_word(sentence, other, rng), text, False)
            add(doc_id, _negate(sentence), text, False)
            add(doc_id, _add_part(sentence, other, rng), text, False)
            foreign = [x.text for x in split_sentences(other) if is_declarative(x.text)]
            if foreign:
                add(doc_id, rng.choice(foreign), text, False)
    return out


if __name__ == "__main__":
    pairs = synthetic_pairs()
    print(f"{len(pairs)} pairs, {sum(p.supported for p in pairs)} supported")
    for p in random.Random(1).sample(pairs, 12):
        print(("+" if p.supported else "-"), p.claim)
