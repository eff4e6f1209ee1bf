"""A conversation's follow-up turn as the standalone question it asks, without a model call.

"How long is the warranty on a laptop?" then "And for a phone?": the second turn asks "How
long is the warranty for a phone?". Checked on its own, the turn names only "phone", and an
answer about the phone's warranty looks as if it did not address it. ``resolve_turn`` reads a
turn against the user's earlier turns (each resolved the same way, in order) and gives the
question it stands for:

- an elliptical follow-up, a fragment that names a new subject and no question of its own
  ("And for a phone?", "What about phones?", "Same for Canada?", "Does that apply to
  refurbished laptops too?", "那手机呢？", "如果是平板电脑呢", "换成法国呢", "手机也一样吗"),
  inherits the predicate of the previous question with the new subject in place of the old
  one: ``substituted``. The old subject is found by structure, not by vocabulary: the noun
  phrase after the same preposition, else the last prepositional object (a number replaces a
  number), else a determiner's noun phrase (English); the phrase that shares the new subject's
  last characters (笔记本电脑 / 平板电脑, 德国 / 法国), else what comes before the first 的,
  else the object of 在 / 到 / 对于 … (Chinese). Where no slot can be told, the new subject
  is put before the previous question (``joined``), so neither is lost;
- a follow-up that states a condition ("What if I lost the receipt?", "And if I paid by
  card?", "And after 40 days?", "那过了保修期呢？", "如果超过30天呢？") adds it to the previous
  question, which keeps its own subject (``substituted``);
- a turn that refers back with a pronoun and names little of its own ("Is it waterproof?",
  "它防水吗？", "这个能退吗？") keeps its words and carries the previous question beside it
  (``context``);
- any other turn is already standalone and stays as it is (``standalone``).

The resolution is deterministic and language-aware (English and Chinese), and only as good as
its rules: a follow-up that changes the predicate and the subject at once ("And can I return
it?") is read as a pronoun reference, with the previous question as its context. Apps that
want a model to do it give ``RAGPipeline`` or ``wrap()`` a ``question_rewriter=`` runnable
(``tracerag._conversation``), as LangChain's history-aware retriever does.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "Resolution",
    "ResolutionMethod",
    "resolve_turn",
]

ResolutionMethod = Literal["standalone", "substituted", "joined", "context", "rewriter"]


def _seq(text: str) -> tuple[str, ...]:
    return tuple(text.split())


_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_CJK_RE = re.compile(f"[{_CJK}]")
_LATIN_RE = re.compile(r"[A-Za-z]+")


@dataclass(frozen=True)
class Resolution:
    """A turn and the standalone question it asks.

    ``question`` is the standalone question (the turn itself when it is ``standalone``),
    ``turn`` the turn as the user wrote it, ``method`` how it was resolved, ``previous`` the
    (resolved) earlier question it was resolved with, ``subject`` the new subject an elliptical
    turn named and ``replaced`` the previous question's words it took the place of.
    """

    question: str
    turn: str
    method: ResolutionMethod
    previous: str | None = None
    subject: str | None = None
    replaced: str | None = None

    @property
    def changed(self) -> bool:
        """Whether the standalone question differs from the turn."""
        return self.question != self.turn


def _is_chinese(text: str) -> bool:
    cjk = len(_CJK_RE.findall(text))
    return cjk > 0 and cjk >= len(_LATIN_RE.findall(text))


def resolve_turn(turn: str, earlier: Sequence[str]) -> Resolution:
    """The standalone question ``turn`` asks after the user's ``earlier`` turns (oldest first).

    Each earlier turn is resolved against the ones before it first, so a third turn ("And for
    a tablet?") inherits the predicate the second one inherited.
    """
    turn = turn.strip()
    previous: str | None = None
    for text in earlier:
        text = text.strip()
        if not _ACKNOWLEDGEMENT_RE.sub("", text).strip(" .!?。！？~～"):
            continue  # "Thanks!", "好的": no question to follow
        previous = text if previous is None else _resolve(text, previous).question
    if previous is None:
        return Resolution(turn, turn, "standalone")
    return _resolve(turn, previous)


# Sentences of a turn, and the acknowledgements that open a follow-up ("Thanks. And for a
# phone?", "好的，谢谢。那手机呢？").
_SENTENCE_END_RE = re.compile(r"(?<=[.!?。！？；;])\s*")
_ACKNOWLEDGEMENT_RE = re.compile(
    r"^(?:(?:ok(?:ay)?|thanks|thank\s+you|great|got\s+it|i\s+see|cool|perfect|alright|sure|"
    r"好的|好|谢谢|多谢|明白了|明白|知道了|了解|嗯|哦|噢)[\s,，、.!！。]*)+",
    re.IGNORECASE,
)


def _last_clause(turn: str) -> str:
    """The turn's last sentence, without the acknowledgements that open it."""
    sentences = [s for s in _SENTENCE_END_RE.split(turn.strip()) if s.strip()]
    last = sentences[-1] if sentences else turn
    return _ACKNOWLEDGEMENT_RE.sub("", last).strip() or last.strip()


def _resolve(turn: str, previous: str) -> Resolution:
    clause = _last_clause(turn)
    if clause != turn.strip():
        # "Thanks. And for a phone?": the follow-up is its last sentence
        inner = _resolve_one(clause, previous)
        if inner.method in ("substituted", "joined"):
            return Resolution(
                inner.question, turn, inner.method, previous, inner.subject, inner.replaced
            )
    return _resolve_one(turn, previous)


def _resolve_one(turn: str, previous: str) -> Resolution:
    if _is_chinese(turn) or (_is_chinese(previous) and not _LATIN_RE.search(turn)):
        return _resolve_zh(turn, previous)
    return _resolve_en(turn, previous)


# -- English -----------------------------------------------------------------------------------

# The openings of a follow-up that names a new subject for the previous question; the subject
# is what follows. Longest first.
_EN_LEADS = tuple(
    sorted(
        (
            "and what about",
            "and how about",
            "but what about",
            "ok what about",
            "okay what about",
            "what about",
            "how about",
            "what if it is",
            "what if it's",
            "what if it was",
            "what if they are",
            "what if",
            "and what if",
            "but what if",
            "but if",
            "even if",
            "and if it is",
            "and if it's",
            "and if",
            "and the same for",
            "and same for",
            "the same for",
            "same for",
            "same question for",
            "same with",
            "is that the same for",
            "is it the same for",
            "is this the same for",
            "is that true for",
            "is that also true for",
            "does that apply to",
            "does that also apply to",
            "does this apply to",
            "does this also apply to",
            "does the same apply to",
            "does the same go for",
            "and for",
            "also for",
            "and in",
            "and on",
            "and with",
            "and to",
            "and from",
            "and at",
            "and after",
            "and within",
            "and over",
            "and under",
            "and",
            "also",
            "or",
            "then",
            "so",
        ),
        key=len,
        reverse=True,
    )
)
# Leads that open a condition ("what if I lost the receipt", "and if I paid by card").
_EN_IF_LEADS = frozenset(("what if", "and if", "and what if", "but what if", "but if", "even if"))
# Leads after which the rest is a subject whatever its length.
_EN_SUBJECT_LEADS = frozenset(
    lead for lead in _EN_LEADS if lead not in {"and", "also", "or", "then", "so", *_EN_IF_LEADS}
)
# Leads that end in a preposition of their own ("what about", "same for", "does that apply
# to"): what follows is the new subject, not a prepositional phrase.
_EN_SUBJECT_ONLY_LEADS = frozenset(
    lead
    for lead in _EN_LEADS
    if lead.endswith((" about", "same for", "same with", "apply to", "go for", " true for"))
    or lead == "same question for"
)
_EN_PREPOSITIONS = _seq(
    "for on in at to with from of about after before within over under by into via "
    "during without inside outside near per between"
)
_EN_DETERMINERS = _seq(
    "a an the my your our their his her its this that these those some any each every"
)
# Words that open a question or a clause of its own: a turn that starts with one asks its own
# question (after a lead such as "and").
_EN_CLAUSE_OPENERS = frozenset(
    _seq("""
    what which who whom whose when where why how is are was were am do does did can could will
    would should shall may might must have has had i you we they he she it there let please
    """)
)
# A trailing word that only says "as well".
_EN_TAIL_RE = re.compile(
    r"(?:[\s,]+(?:too|as\s+well|also|instead|then|though|please|then\s+too))+\s*$", re.I
)
_EN_PUNCT_END_RE = re.compile(r"[\s?？!！.。]+$")
_EN_WORD_RE = re.compile(r"[A-Za-z0-9$€£%][A-Za-z0-9$€£%'’.,-]*")
_NUMBERISH_RE = re.compile(r"\d")
_EN_EXPLETIVE_RE = re.compile(
    r"\bit\s+(?:is\s+|'s\s+|’s\s+)?(?:possible|true|necessary|required|allowed|ok|okay|safe|"
    r"worth|better|best|free\s+to|likely|normal|important|too\s+late)\b"
    r"|\b(?:is|was)\s+it\s+(?:possible|true|necessary|required|allowed|ok|okay|safe|worth|"
    r"likely|normal|important|too\s+late)\b"
    r"|\bthat\s+(?=\w+\s)|\bthis\s+(?:year|month|week|weekend|time|morning|evening)\b",
    re.I,
)
_EN_CONTENT_STOP = frozenset(
    _seq("""
    a an the and or but of to in on at for with from by about after before is are was were be
    been am do does did can could will would should shall may might must have has had i you we
    they he she it its this that these those there what which who whom whose when where why how
    my your our their me us him her them one not no yes if then so also too as well please
    much many long often far soon
    """)
)


def _en_words(text: str) -> list[str]:
    return [w.lower() for w in _EN_WORD_RE.findall(text)]


def _en_strip(text: str) -> str:
    text = _EN_PUNCT_END_RE.sub("", text.strip())
    text = _EN_TAIL_RE.sub("", text)
    return text.strip(" ,;:-—")


def _en_lead(text: str) -> tuple[str | None, str]:
    """The follow-up's lead (lower case) and the rest of it."""
    low = text.lower()
    for lead in _EN_LEADS:
        if low == lead:
            return lead, ""
        if low.startswith(lead) and not low[len(lead)].isalnum():
            return lead, text[len(lead) :].strip(" ,;:-—")
    return None, text


def _en_fragment(turn: str) -> tuple[str, str | None] | None:
    """The new subject an elliptical English turn names, and the preposition it opens with;
    None when the turn asks a question of its own."""
    body = _en_strip(turn)
    if not body:
        return None
    lead, rest = _en_lead(body)
    rest = _en_strip(rest)
    words = _en_words(rest)
    if not words:
        return None
    if (
        lead is not None
        and lead not in _EN_SUBJECT_ONLY_LEADS
        and lead.endswith(tuple(f" {p}" for p in _EN_PREPOSITIONS))
    ):
        # "and for a phone", "does that apply to phones": the lead's preposition opens it
        opening = lead.rsplit(" ", 1)[1]
        rest, words = f"{opening} {rest}", [opening, *words]
        lead = lead.rsplit(" ", 1)[0] or None
    if words[0] in _EN_CLAUSE_OPENERS:
        return None  # "and how long does shipping take?": a question of its own
    if lead in _EN_SUBJECT_LEADS:
        pass
    elif lead is not None:
        # "and a phone?", "or with Apple Pay?": short, no clause of its own
        if len(words) > 6:
            return None
    elif turn.rstrip().endswith(("?", "？")) and words[0] in _EN_PREPOSITIONS:
        # "for a phone?", "in Germany?"; a bare noun phrase ("Refund policy?") is a terse
        # question of its own
        if len(words) > 6:
            return None
    else:
        return None
    if lead in _EN_IF_LEADS and words[0] not in _EN_PREPOSITIONS:
        return None  # "what if I lost the receipt": a condition (``_en_condition``)
    if words[0] in _EN_PREPOSITIONS or words[0] in _EN_DETERMINERS:
        rest = rest[:1].lower() + rest[1:]  # "For a phone?" inside the question: "for a phone"
    return rest, words[0] if words[0] in _EN_PREPOSITIONS and len(words) > 1 else None


@dataclass(frozen=True)
class _Slot:
    start: int
    end: int
    prep: str | None  # the preposition before it, if any


_EN_STOP_NP = frozenset(
    _EN_PREPOSITIONS
    + _seq(
        "and or but if when while whether than that which who is are was were do does did can "
        "could will would should have has had be been being"
    )
)


def _en_slots(question: str) -> list[_Slot]:
    """The noun phrases of a question that a new subject may take the place of: each
    preposition's object, and each phrase opened by a determiner (in the question's order)."""
    body_end = len(_EN_PUNCT_END_RE.sub("", question))
    spans = [(m.start(), m.end(), m.group().lower()) for m in _EN_WORD_RE.finditer(question)]
    spans = [s for s in spans if s[1] <= body_end]
    slots: list[_Slot] = []
    for i, (_start, _end, word) in enumerate(spans):
        opener = word in _EN_PREPOSITIONS or (word in _EN_DETERMINERS and word != "that")
        if not opener:
            continue
        prep = word if word in _EN_PREPOSITIONS else None
        j = i + 1 if prep is not None else i
        if j >= len(spans):
            continue
        k = j
        # the phrase: a determiner, then up to four words, to the next preposition, clause word
        # or punctuation
        while k < len(spans) and k - j < 5:
            if k > j and spans[k][2] in _EN_STOP_NP:
                break
            if k >= j + 2 and spans[k][2].endswith(("ed", "ing")):
                break  # "the iPhone 14 covered": a participle after the phrase
            if k > j and re.search(r"[,;:]", question[spans[k - 1][1] : spans[k][0]]):
                break
            k += 1
        if k == j or (k == j + 1 and spans[j][2] in _EN_DETERMINERS):
            continue
        if spans[j][2] in _EN_CLAUSE_OPENERS and spans[j][2] not in _EN_DETERMINERS:
            continue
        slots.append(_Slot(spans[j][0], spans[k - 1][1], prep))
    # a determiner phrase inside a prepositional object is the same slot
    unique: list[_Slot] = []
    for slot in slots:
        if any(s.start <= slot.start and slot.end <= s.end for s in unique):
            continue
        unique.append(slot)
    return unique


def _en_subject_word(question: str) -> _Slot | None:
    """The first content word after the question's opening words ("Is shipping free?" →
    "shipping"), when the question has no noun phrase to replace."""
    body_end = len(_EN_PUNCT_END_RE.sub("", question))
    for m in _EN_WORD_RE.finditer(question):
        if m.end() > body_end:
            break
        if m.group().lower() not in _EN_CONTENT_STOP:
            return _Slot(m.start(), m.end(), None)
    return None


def _choose_en_slot(
    slots: Sequence[_Slot], question: str, subject: str, prep: str | None
) -> _Slot | None:
    numeric = bool(_NUMBERISH_RE.search(subject))

    def is_numeric(slot: _Slot) -> bool:
        return bool(_NUMBERISH_RE.search(question[slot.start : slot.end]))

    kind = [s for s in slots if is_numeric(s) == numeric]
    if prep is not None:
        same = [s for s in kind if s.prep == prep]
        if same:
            return same[-1]
        with_prep = [s for s in kind if s.prep is not None]
        return with_prep[-1] if with_prep else None
    with_prep = [s for s in kind if s.prep is not None]
    return with_prep[-1] if with_prep else None


_EN_COPULAS = frozenset(("is", "are", "was", "were", "isn't", "aren't"))
_EN_WH = frozenset(("what", "which", "who", "when", "where", "how", "why", "what's", "how's"))
_EN_PRONOUNS = frozenset(("i", "you", "we", "they", "he", "she", "it"))


def _en_core_np(question: str, subject: str) -> _Slot | None:
    """The question's own noun phrase when it has no prepositional one: the subject of a
    copula ("Is express shipping free?" → "express shipping"), else the phrase it ends with,
    the verb's object ("Does the warranty cover water damage?" → "water damage")."""
    body_end = len(_EN_PUNCT_END_RE.sub("", question))
    spans = [m for m in _EN_WORD_RE.finditer(question) if m.end() <= body_end]
    words = [m.group().lower() for m in spans]
    if not words:
        return None
    i = 0
    while i < len(words) and words[i] in _EN_WH:
        i += 1
    if i < len(words) and words[i] in ("much", "many", "long", "often", "far", "soon"):
        i += 1
    copula = i < len(words) and words[i] in _EN_COPULAS
    if copula:
        i += 1
        if i < len(words) and words[i] == "there":
            i += 1
        first = i
        while first < len(words) and words[first] in _EN_DETERMINERS:
            first += 1
        end = first
        while end < len(words) and words[end] not in _EN_CONTENT_STOP | _EN_STOP_NP:
            if end > first and words[end].endswith(("ed", "ing")):
                break  # "is the iPhone 14 covered": the participle is the predicate
            end += 1
        if end == len(words) and end - first >= 2 and i == 1:
            end -= 1  # "is express shipping free": the last word is what is asked of it
        if end == first:
            return None
        start = i if _starts_with_determiner(subject) else first
        return _Slot(spans[start].start(), spans[end - 1].end(), None)
    end = len(words)
    start = end
    while start > 0 and words[start - 1] not in _EN_CONTENT_STOP | _EN_STOP_NP:
        start -= 1
    if start == end or start == 0:
        return None
    # the object the question ends with, as long as the new subject: "does the warranty cover
    # water damage" → "water damage" for "screen cracks"
    size = max(1, len([w for w in _en_words(subject) if w not in _EN_DETERMINERS]))
    start = max(start, end - size)
    if start > 0 and words[start - 1] in _EN_DETERMINERS and _starts_with_determiner(subject):
        start -= 1
    return _Slot(spans[start].start(), spans[end - 1].end(), None)


def _starts_with_determiner(text: str) -> bool:
    words = _en_words(text)
    return bool(words) and words[0] in _EN_DETERMINERS


def _determiner_slot(slots: Sequence[_Slot], question: str, subject: str) -> _Slot | None:
    numeric = bool(_NUMBERISH_RE.search(subject))
    kind = [s for s in slots if bool(_NUMBERISH_RE.search(question[s.start : s.end])) == numeric]
    return kind[-1] if kind else None


def _with_head(subject: str, replaced: str) -> str:
    """ "unopened ones" in place of "opened items": "unopened items"."""
    words = subject.split()
    if len(words) >= 2 and words[-1].lower() in ("one", "ones"):
        head = replaced.split()[-1] if replaced.split() else words[-1]
        return " ".join([*words[:-1], head])
    return subject


def _en_same_head(question: str, subject: str) -> _Slot | None:
    """The phrase of the question that ends in the new subject's last word, with the words
    that qualify it ("standard shipping" for "express shipping"); None when there is none or
    it is the new subject already."""
    words = _en_words(subject)
    if not words or words[-1] in _EN_CONTENT_STOP or _NUMBERISH_RE.search(words[-1]):
        return None
    head = words[-1]
    body_end = len(_EN_PUNCT_END_RE.sub("", question))
    spans = [m for m in _EN_WORD_RE.finditer(question) if m.end() <= body_end]
    for i, m in enumerate(spans):
        if m.group().lower() != head:
            continue
        j = i
        while j > 0 and spans[j - 1].group().lower() not in _EN_CONTENT_STOP | _EN_STOP_NP:
            j -= 1
        if question[spans[j].start() : m.end()].lower() == subject.lower():
            return None
        return _Slot(spans[j].start(), m.end(), None)
    return None


def _en_condition(turn: str) -> str | None:
    """The clause of a follow-up that adds a condition to the previous question ("What if I
    lost the receipt?" → "I lost the receipt"), or None."""
    lead, rest = _en_lead(_en_strip(turn))
    rest = _en_strip(rest)
    if lead is not None and lead.split(" ", 2)[:2] in (["what", "if"], ["and", "if"]):
        said = lead.split(" ", 2)[2] if lead.count(" ") >= 2 else ""
        if said:  # "what if it's refurbished" (a condition), "what if it's a phone" (a subject)
            if not rest or _starts_with_determiner(rest):
                return None
            return f"{said} {rest}"
    if lead not in _EN_IF_LEADS:
        return None
    words = _en_words(rest)
    if not words or words[0] in _EN_PREPOSITIONS:
        return None
    if lead.startswith("what") or lead.startswith("and what") or lead.startswith("but what"):
        # "what if it's a phone": a new subject (a fragment); "what if it's refurbished": a
        # condition
        after = words[1:] if words[0] in ("it's", "it’s") else words[2:]
        if (words[0] in ("it's", "it’s") or words[:2] == ["it", "is"]) and (
            after and after[0] in _EN_DETERMINERS
        ):
            return None
    return rest


def _resolve_en(turn: str, previous: str) -> Resolution:
    condition = _en_condition(turn)
    if condition is not None:
        body = _EN_PUNCT_END_RE.sub("", previous)
        question = f"{body} if {condition}{previous[len(body) :].strip() or '?'}"
        return Resolution(question, turn, "substituted", previous, condition, None)
    fragment = _en_fragment(turn)
    if fragment is None:
        if _en_refers_back(turn):
            return Resolution(_with_context(turn, previous), turn, "context", previous)
        return Resolution(turn, turn, "standalone", previous)
    subject, prep = fragment
    slot = _en_same_head(previous, subject) if prep is None else None
    if slot is None:
        slot = _choose_en_slot(_en_slots(previous), previous, subject, prep)
    if slot is not None and prep is not None:
        # the slot is the preposition's object: the new phrase takes the place of both
        before = previous[: slot.start].rstrip()
        if before.lower().endswith(tuple(_EN_PREPOSITIONS)):
            cut = before.rfind(" ") + 1
            start = cut if cut > 0 else 0
            replaced = previous[start : slot.end]
            question = previous[:start] + subject + previous[slot.end :]
            return Resolution(question, turn, "substituted", previous, subject, replaced)
    if slot is None and prep is None:
        slot = (
            _en_core_np(previous, subject)
            or _determiner_slot(_en_slots(previous), previous, subject)
            or _en_subject_word(previous)
        )
    if slot is None:
        if prep is not None:  # a condition the previous question did not have: added
            body = _EN_PUNCT_END_RE.sub("", previous)
            question = f"{body} {subject}{previous[len(body) :] or '?'}"
            return Resolution(question, turn, "substituted", previous, subject, None)
        return Resolution(f"{subject}: {previous}", turn, "joined", previous, subject, None)
    object_text = subject
    if prep is not None:
        object_text = subject.split(" ", 1)[1] if " " in subject else subject
    replaced = previous[slot.start : slot.end]
    object_text = _with_head(object_text, replaced)
    question = previous[: slot.start] + object_text + previous[slot.end :]
    return Resolution(question, turn, "substituted", previous, subject, replaced)


def _en_refers_back(turn: str) -> bool:
    """Whether an English turn leans on the previous one: a pronoun that is not expletive,
    and at most two content words of its own."""
    words = _en_words(_EN_EXPLETIVE_RE.sub(" ", turn))
    refers = False
    for i, word in enumerate(words):
        if word in ("it", "its", "they", "them", "their"):
            refers = True
        elif word in ("this", "that", "these", "those"):
            # a determiner ("this laptop") names its own subject
            following = words[i + 1] if i + 1 < len(words) else None
            refers = refers or following is None or following in _EN_CONTENT_STOP
    if not refers:
        return False
    content = [w for w in _en_words(turn) if w not in _EN_CONTENT_STOP]
    return len(content) <= 3


def _with_context(turn: str, previous: str) -> str:
    if _is_chinese(turn):
        return f"{turn}（{_EN_PUNCT_END_RE.sub('', previous)}）"
    return f"{turn} ({_EN_PUNCT_END_RE.sub('', previous)})"


# -- Chinese -----------------------------------------------------------------------------------

_ZH_PUNCT_RE = re.compile(r"[\s?？!！。.,，、~～…]+")
_ZH_FILLERS_RE = re.compile(
    r"^(?:请问一下|请问|我想问一下|我想问|想问一下|想问|你好|您好|麻烦问一下|麻烦问下|问一下|"
    r"那请问|另外|还有|然后|再问一下|再问下)[，,、\s]*"
)
_ZH_LEAD_RE = re.compile(
    r"^(?:那么|那|好的|好|嗯|哦)?[，,\s]*"
    r"(?:如果|要是|假如|假设|换成|换作|换到|改成|对于|关于|至于|还有|另外)?"
    r"(?:是|说|买的是|买|用|寄到|寄往|发到|发往|送到|在|到|去)?"
)
_ZH_TAIL_RE = re.compile(
    r"(?:的话)?(?:呢|怎么样|怎样|如何|又如何|又怎样|又怎么样)+$"
    r"|(?:的话)?(?:也|又)?(?:一样|同样|相同|这样|适用|是这样|也是|也一样|也适用)(?:吗|么|嘛)?$"
)
# What a turn of its own asks with (a fragment has none of these).
_ZH_QUESTION_WORDS_RE = re.compile(
    r"多久|多长|多少|几|什么|怎么|为什么|为何|哪|谁|吗|么|是否|能否|可否|有没有|能不能|可不可以"
    r"|会不会|要不要|是不是|行不行|对不对"
)
# A pronoun that stands for the previous subject: 它 always; 这个 / 那款 … only before the
# predicate ("这个能退吗", "那款多少钱"), not before a noun of their own ("这个月").
_ZH_PRONOUN_RE = re.compile(
    r"它们?"
    r"|(?:这个|那个|这款|那款|这种|那种|这台|那台|这件|那件|该产品|此产品|这些|那些)"
    r"(?=$|[的能可会是有要多怎吗支防保包适还也都在用需什几，,？?])"
)
# Characters at which a Chinese noun phrase starts or ends: particles, prepositions, the
# verbs that open a question's predicate, punctuation.
_ZH_BOUNDARY = set("的了吗呢吧是有在到从对于给把被和与及或买用要能会可需，,、？?！!。 ")
_ZH_MARKERS_RE = re.compile(r"(?:寄到|寄往|发到|发往|送到|运到|对于|关于|在|到|往|从|给|买|用)")
_ZH_PREDICATE_RE = re.compile(
    r"的|是|有|能|可以|可|要|需要|需|会|怎么|什么|多久|多长|多少|几|吗|哪|如何|支持|包括|提供|享受|保修"
    r"|退|换|运费|收费|费用|价格"
)


# Verbs a marker's object ends at (在北京配送, 寄到上海要): a service's own actions.
_ZH_VERBS_RE = re.compile(
    r"配送|发货|到货|送达|送货|邮寄|快递|寄|运送|退货|换货|退款|维修|修理|购买|使用|办理|申请|支付|付款"
    r"|上班|营业|开门|下单|取货|自提|安装"
)


def _zh_fragment(turn: str) -> str | None:
    """The new subject an elliptical Chinese turn names; None when it asks its own question."""
    body = _ZH_PUNCT_RE.sub("", turn)
    body = _ZH_FILLERS_RE.sub("", body)
    tail = _ZH_TAIL_RE.search(body)
    core = body[: tail.start()] if tail else body
    lead = _ZH_LEAD_RE.match(core)
    led = bool(lead and lead.group())
    subject = core[lead.end() :] if lead else core
    if not subject or len(subject) > 12:
        return None
    if tail is None and not led:
        return None
    if (
        tail is not None
        and not led
        and re.fullmatch(r"(?:的话)?(?:怎么样|怎样|如何)", tail.group())
    ):
        return None  # "这款手机怎么样": asks about it, after nothing that leads it back
    if tail is None and not re.match(
        r"^(?:那么|那)?[，,\s]*(?:如果|要是|假如|换成|换作|改成|对于|至于)", core
    ):
        return None  # "那退货政策": only with 呢 / 如果 … is it a fragment
    if _ZH_QUESTION_WORDS_RE.search(subject):
        return None
    return subject


def _zh_extend_left(text: str, end: int, stop: int, within: int | None = None) -> int:
    """The start of the phrase that ends at ``end``: back to a boundary character or ``stop``
    (never after ``within``, the start of what must be in it)."""
    start = end if within is None else within
    while start > stop and text[start - 1] not in _ZH_BOUNDARY:
        start -= 1
    return start


def _zh_slot(previous: str, subject: str) -> tuple[int, int] | None:
    body_end = len(previous.rstrip("？?！!。. "))
    filler = _ZH_FILLERS_RE.match(previous)
    stop = filler.end() if filler else 0
    text = previous[:body_end]
    # 1. the phrase that ends as the new subject ends (笔记本电脑 / 平板电脑, 德国 / 法国)
    core = subject.split("的")[0]
    for k in range(min(len(core), 4), 0, -1):
        suffix = core[-k:]
        if suffix in _ZH_BOUNDARY or not _CJK_RE.search(suffix):
            continue
        at = text.find(suffix, stop)
        while at != -1:
            end = at + k
            start = _zh_extend_left(text, end, stop, within=at)
            # the phrase may not run into the predicate after it
            if text[start:end] != core and end - start <= 8:
                return start, end
            at = text.find(suffix, at + 1)
    # 2. a subject "A的B" whose B the previous question names: A takes the new A's place
    if "的" in subject:
        _, head = subject.split("的", 1)
        at = text.find(head, stop) if head else -1
        if at > 0 and text[at - 1] == "的":
            start = _zh_extend_left(text, at - 1, stop)
            if start < at - 1:
                return start, at + len(head)
    # 3. the object of a marker (在德国, 寄到德国, 对于会员): to the next predicate word
    for m in _ZH_MARKERS_RE.finditer(text, stop):
        start = m.end()
        rest = text[start:]
        end_at = _ZH_PREDICATE_RE.search(rest) or None
        verb = _ZH_VERBS_RE.search(rest)
        if verb is not None and (end_at is None or verb.start() < end_at.start()):
            end_at = verb
        end = start + (end_at.start() if end_at else len(rest))
        if 1 <= end - start <= 6:
            return start, end
    # 4. what comes before the first 的 (笔记本电脑的保修期)
    lead = _ZH_LEAD_RE.match(text, stop)
    start = lead.end() if lead and lead.group() else stop
    de = text.find("的", start)
    if de != -1 and 1 <= de - start <= 8:
        return start, de
    # 5. the opening noun run, to the first predicate word (笔记本电脑保修多久)
    end_at = _ZH_PREDICATE_RE.search(text, start)
    if end_at is not None and 1 <= end_at.start() - start <= 8:
        return start, end_at.start()
    return None


# A fragment that states a condition rather than a new subject ("过了保修期", "超过30天",
# "没有发票", "签收以后"): it is added to the previous question, which keeps its own subject.
_ZH_CONDITION_RE = re.compile(
    r"^(?:过了|超过|超出|没有|没|不在|不是|已经|逾期|错过|用了|拆封|拆了|坏了)"
    r"|(?:以后|之后|以前|之前|的时候|期间|时|后)$"
)


def _resolve_zh(turn: str, previous: str) -> Resolution:
    subject = _zh_fragment(turn)
    if subject is not None and _ZH_CONDITION_RE.search(subject):
        body = previous.strip()
        return Resolution(f"{subject}，{body}", turn, "substituted", previous, subject, None)
    if subject is None:
        body = _ZH_PUNCT_RE.sub("", turn)
        if _ZH_PRONOUN_RE.search(body) and len(body) <= 12:
            slot = _zh_slot(previous, "")
            if slot is not None:
                old = previous[slot[0] : slot[1]]
                pronoun = _ZH_PRONOUN_RE.search(turn)
                question = _ZH_PRONOUN_RE.sub(old, turn, count=1)
                replaced = pronoun.group() if pronoun else None
                return Resolution(question, turn, "substituted", previous, old, replaced)
            return Resolution(_with_context(turn, previous), turn, "context", previous)
        return Resolution(turn, turn, "standalone", previous)
    slot = _zh_slot(previous, subject)
    if slot is None:
        return Resolution(f"{subject}：{previous}", turn, "joined", previous, subject, None)
    start, end = slot
    replaced = previous[start:end]
    if "的" in subject and previous[end : end + 1] == "的":
        # "手机的保修期" in place of "笔记本电脑" before "的保修期": no 的 twice
        head = subject.split("的", 1)[1]
        if previous[end + 1 :].startswith(head):
            end += 1 + len(head)
            replaced = previous[start:end]
    question = previous[:start] + subject + previous[end:]
    return Resolution(question, turn, "substituted", previous, subject, replaced)
