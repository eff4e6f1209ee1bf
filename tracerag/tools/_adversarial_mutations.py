"""Every mutation kind of a claim, and the chat model that answers with one.

Fabricated and moved citations, changed entities, added or removed negations (numbers and
dates come from the quantities module); ``MutatingChatModel`` wraps a model so its answers
carry a chosen mutation.
"""

from __future__ import annotations

import random
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field, PrivateAttr

from tracerag._llm import ReplyChatModel
from tracerag.demo.models.extractive import parse_prompt
from tracerag.errors import InputError
from tracerag.prompts import TASK_ANSWER
from tracerag.signals._claims import CITATION_RE, Claim, citation_ids, split_claims
from tracerag.signals._types import Material
from tracerag.text._negation import is_negated
from tracerag.tools._adversarial_cases import DEFAULT_ENTITY_GROUPS, Case
from tracerag.tools._adversarial_quantities import quantity_mutations

__all__ = [
    "MUTATION_KINDS",
    "Inventory",
    "MutatingChatModel",
    "Mutation",
    "claim_mutations",
    "claim_segments",
    "mutate_answer",
]


MUTATION_KINDS = ("fabricated", "wrong_material", "number", "date", "entity", "negation")
# ----------------------------------------------------------------------------------------------
# Mutations


@dataclass(frozen=True)
class Mutation:
    """One claim of an answer made wrong in one way."""

    kind: str
    claim_index: int
    original: str  # the claim's sentence as in the answer, citation markers included
    mutated: str
    answer: str  # the whole answer with the mutated sentence
    detail: str = ""  # what changed, e.g. "24 → 48"


_NAME_RE = re.compile(r"(?<![\w\-])[A-Z][A-Za-z+]*(?:[ \-][A-Z][A-Za-z+]*)*(?![\w])")
_SENTENCE_LEAD_RE = re.compile(r"(?:^|[.!?。！？]\s*)$")


def _is_sentence_start(text: str, at: int) -> bool:
    return bool(_SENTENCE_LEAD_RE.search(text[:at].rstrip(' \t"“(')))


@dataclass
class Inventory:
    """What mutations draw from: every material seen, and the entities each one names."""

    materials: dict[str, Material] = field(default_factory=dict)
    groups: tuple[tuple[str, ...], ...] = DEFAULT_ENTITY_GROUPS

    @classmethod
    def from_cases(
        cls, cases: Iterable[Case], groups: Sequence[Sequence[str]] | None = None
    ) -> Inventory:
        """The inventory of every material of the cases."""
        inv = cls(groups=tuple(tuple(g) for g in (groups or DEFAULT_ENTITY_GROUPS)))
        for case in cases:
            inv.add(case.materials)
        return inv

    def add(self, materials: Iterable[Material]) -> None:
        """Add materials (by id; the first text seen for an id is kept)."""
        for m in materials:
            self.materials.setdefault(m.id, m)

    def names(self, material: Material) -> set[str]:
        """Capitalised names that a material uses inside its sentences."""
        return {
            m.group(0)
            for m in _NAME_RE.finditer(material.text)
            if not _is_sentence_start(material.text, m.start())
            and len(m.group(0)) > 1
            and not re.match(r"\s*\d", material.text[m.end() :])
        }

    def elsewhere(self, term: str, cited: set[str]) -> bool:
        """Whether ``term`` occurs in a material other than the cited ones."""
        pattern = _term_re(term)
        return any(mid not in cited and pattern.search(m.text) for mid, m in self.materials.items())


def _term_re(term: str) -> re.Pattern[str]:
    if term.isascii():
        return re.compile(rf"(?<![\w\-]){re.escape(term)}(?:s|es)?(?![\w\-])", re.IGNORECASE)
    return re.compile(re.escape(term))


def _marker_spans(text: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in CITATION_RE.finditer(text)]


def _outside(spans: list[tuple[int, int]], a: int, b: int) -> bool:
    return all(b <= s or a >= e for s, e in spans)


def claim_segments(answer: str) -> list[Claim]:
    return split_claims(answer)


def _replace(answer: str, claim: Claim, new_segment: str) -> str:
    return answer[: claim.start] + new_segment + answer[claim.end :]


# -- entities -----------------------------------------------------------------------------------


def _entity_mutations(
    segment: str, cited: set[str], inventory: Inventory, rng: random.Random, limit: int = 2
) -> list[tuple[str, str]]:
    markers = _marker_spans(segment)
    out: list[tuple[str, str]] = []
    claim_plain = CITATION_RE.sub(" ", segment)
    for group in inventory.groups:
        for term in group:
            for m in _term_re(term).finditer(segment):
                if not _outside(markers, m.start(), m.end()):
                    continue
                options = [
                    t
                    for t in group
                    if t.lower() != term.lower()
                    and not _term_re(t).search(claim_plain)
                    and inventory.elsewhere(t, cited)
                ]
                if not options:
                    continue
                new = rng.choice(options)
                found = m.group(0)
                suffix = found[len(term) :] if found.lower().startswith(term.lower()) else ""
                if found[:1].isupper() and new[:1].islower():
                    new = new[:1].upper() + new[1:]
                replacement = new + (suffix if new.isascii() else "")
                out.append(
                    (
                        segment[: m.start()] + replacement + segment[m.end() :],
                        f"{found} → {replacement}",
                    )
                )
                break
            if len(out) >= limit:
                return out
    if out:
        return out
    # no known group: swap a capitalised name for a name used by another material
    cited_texts = [inventory.materials[c].text for c in cited if c in inventory.materials]
    others = sorted(
        {
            n
            for mid, mat in inventory.materials.items()
            if mid not in cited
            for n in inventory.names(mat)
            if not any(n in t for t in cited_texts)
        }
    )
    for m in _NAME_RE.finditer(segment):
        if not _outside(markers, m.start(), m.end()) or _is_sentence_start(segment, m.start()):
            continue
        if re.match(r"\s*\d", segment[m.end() :]):
            continue  # a label such as "Clause 4", not a name
        options = [n for n in others if n not in claim_plain]
        if options:
            new = rng.choice(options)
            out.append((segment[: m.start()] + new + segment[m.end() :], f"{m.group(0)} → {new}"))
            break
    return out


# -- negation -----------------------------------------------------------------------------------

_EN_REMOVE = [
    (re.compile(r"\bcannot\b"), "can"),
    (re.compile(r"\bCannot\b"), "Can"),
    (
        re.compile(r"\b(can|do|does|did|is|are|was|were|will|would|should|must)n['’]t\b", re.I),
        r"\1",
    ),
    (
        re.compile(
            r"\b(is|are|was|were|can|may|must|will|should|would|could|do|does)\s+not\s+", re.I
        ),
        r"\1 ",
    ),
    (re.compile(r"\bnever\b"), "always"),
    (re.compile(r"\bno\s+(?!later|more|less|fewer)", re.I), "a "),
    (re.compile(r"\bnot\s+"), ""),
    (re.compile(r"\bwithout\b"), "with"),
]
_EN_AUX_RE = re.compile(
    r"\b(is|are|was|were|can|may|must|will|should|would|could|has been|have been)\b(?!\s+not)"
)
#: Verbs common in policy text, in the third person: "costs" → "does not cost".
_EN_VERBS = (
    "accepts",
    "adds",
    "allows",
    "applies",
    "arranges",
    "arrives",
    "carries",
    "charges",
    "costs",
    "counts",
    "covers",
    "earns",
    "expires",
    "extends",
    "gets",
    "gives",
    "includes",
    "issues",
    "keeps",
    "lasts",
    "needs",
    "offers",
    "pays",
    "provides",
    "qualifies",
    "reaches",
    "receives",
    "replaces",
    "requires",
    "sells",
    "ships",
    "supports",
    "takes",
)
_EN_VERB_RE = re.compile(r"\b(?P<verb>" + "|".join(_EN_VERBS) + r")\b")
_ZH_REMOVE = [
    ("不予", "予以"),
    ("不会", "会"),
    ("不可", "可"),
    ("不能", "能"),
    ("不得", "可"),
    ("不承担", "承担"),
    ("不在", "在"),
    ("不含", "含"),
    ("无需", "需要"),
    ("无须", "需要"),
    ("不需要", "需要"),
    ("没有", "有"),
    ("不是", "是"),
    ("未", "已"),
    ("不", ""),
]
_ZH_ADD = [
    ("可以", "不可以"),
    ("可申请", "不可申请"),
    ("可获得", "不可获得"),
    ("可在", "不可在"),
    ("可享受", "不可享受"),
    ("享受", "不享受"),
    ("将被", "不会被"),
    ("会在", "不会在"),
    ("须", "无须"),
    ("需要", "不需要"),
    ("需先", "无需"),
    ("提供", "不提供"),
    ("收取", "不收取"),
    ("免费", "不免费"),
    ("全额", "不全额"),
    ("均可", "均不可"),
    ("可", "不可"),
    ("为", "不为"),
    ("是", "不是"),
    ("有", "没有"),
    ("会", "不会"),
]


def _negation_mutations(segment: str) -> list[tuple[str, str]]:
    markers = _marker_spans(segment)
    plain = CITATION_RE.sub(" ", segment)
    chinese = len(re.findall(r"[\u4e00-\u9fff]", plain)) > len(re.findall(r"[A-Za-z]+", plain))

    def first(pattern: re.Pattern[str], repl: str) -> tuple[str, str] | None:
        for m in pattern.finditer(segment):
            if _outside(markers, m.start(), m.end()):
                new = segment[: m.start()] + m.expand(repl) + segment[m.end() :]
                return new, f"{m.group(0).strip()!r} → {m.expand(repl).strip()!r}"
        return None

    negated = is_negated(plain)
    if chinese:
        pairs = _ZH_REMOVE if negated else _ZH_ADD
        for old, new in pairs:
            found = first(re.compile(re.escape(old)), new)
            if found and is_negated(CITATION_RE.sub(" ", found[0])) != negated:
                return [found]
        if not negated:
            return [("并非" + segment.lstrip(), "prefixed 并非")]
        return []
    if negated:
        for pattern, repl in _EN_REMOVE:
            found = first(pattern, repl)
            if found and not is_negated(CITATION_RE.sub(" ", found[0])):
                return [found]
        return []
    aux = next(
        (m for m in _EN_AUX_RE.finditer(segment) if _outside(markers, m.start(), m.end())), None
    )
    verb = next(
        (m for m in _EN_VERB_RE.finditer(segment) if _outside(markers, m.start(), m.end())), None
    )
    if aux is not None and (verb is None or aux.start() < verb.start()):
        word = aux.group(1)
        negated_word = "cannot" if word == "can" else f"{word} not"
        new = segment[: aux.start()] + negated_word + segment[aux.end() :]
        return [(new, f"{word!r} → {negated_word!r}")]
    if verb is not None:
        word = verb.group("verb")
        if word.endswith("ies"):
            base = word[:-3] + "y"
        elif word.endswith(("ches", "shes", "sses", "xes")):
            base = word[:-2]
        else:
            base = word[:-1]
        new = segment[: verb.start()] + f"does not {base}" + segment[verb.end() :]
        return [(new, f"{word!r} → 'does not {base}'")]
    body = segment.lstrip()
    lead = segment[: len(segment) - len(body)]
    return [
        (
            lead + "It is not true that " + body[:1].lower() + body[1:],
            "prefixed 'It is not true that'",
        )
    ]


# -- citations ----------------------------------------------------------------------------------


def _recite(segment: str, new_id: str) -> str:
    spans = _marker_spans(segment)
    if not spans:
        return segment
    out = segment
    for i, (a, b) in enumerate(sorted(spans, reverse=True)):
        replacement = f"[{new_id}]" if i == len(spans) - 1 else ""
        out = out[:a] + replacement + out[b:]
    return out


def _fabricated_mutations(
    segment: str, retrieved: set[str], inventory: Inventory, rng: random.Random
) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    known = sorted(i for i in inventory.materials if i not in retrieved)
    if known:
        fake = rng.choice(known)
        out.append((_recite(segment, fake), f"cites {fake}, known but not retrieved"))
    cited = citation_ids(segment)
    base = cited[0] if cited else "doc"
    invented = f"{base}-{rng.randint(2, 9)}"
    while invented in retrieved or invented in inventory.materials:
        invented += "x"
    out.append((_recite(segment, invented), f"cites {invented}, never existed"))
    return out


def _norm(text: str) -> str:
    return re.sub(r"\s+", "", text).lower()


def _wrong_material_mutations(
    segment: str, claim: Claim, materials: Sequence[Material], rng: random.Random, limit: int = 2
) -> list[tuple[str, str]]:
    cited = set(claim.cited_ids)
    body = _norm(claim.text)
    options = [
        m
        for m in materials
        if m.id not in cited and not m.stale_reason() and body not in _norm(m.text)
    ]
    rng.shuffle(options)
    return [
        (_recite(segment, m.id), f"cites {m.id} instead of {', '.join(claim.cited_ids)}")
        for m in options[:limit]
    ]


def claim_mutations(
    kind: str,
    answer: str,
    claim_index: int,
    materials: Sequence[Material],
    inventory: Inventory,
    rng: random.Random,
) -> list[Mutation]:
    """Every variant of mutation ``kind`` of one claim of ``answer`` (possibly none)."""
    if kind not in MUTATION_KINDS:
        raise InputError(f"unknown mutation kind {kind!r}; known: {', '.join(MUTATION_KINDS)}")
    claims = claim_segments(answer)
    claim = claims[claim_index]
    segment = answer[claim.start : claim.end]
    retrieved = {m.id for m in materials}
    cited = set(claim.cited_ids)
    if kind == "fabricated":
        variants = _fabricated_mutations(segment, retrieved, inventory, rng)
    elif kind == "wrong_material":
        variants = _wrong_material_mutations(segment, claim, materials, rng)
    elif kind in ("number", "date"):
        variants = quantity_mutations(kind, segment, rng)
    elif kind == "entity":
        variants = _entity_mutations(segment, cited, inventory, rng)
    else:
        variants = _negation_mutations(segment)
    out: list[Mutation] = []
    for new_segment, detail in variants:
        if new_segment == segment:
            continue
        mutated_answer = _replace(answer, claim, new_segment)
        # the mutation must leave the answer's claims where they were
        if len(claim_segments(mutated_answer)) != len(claims):
            continue
        out.append(Mutation(kind, claim_index, segment, new_segment, mutated_answer, detail))
    return out


def mutate_answer(
    answer: str,
    materials: Sequence[Material],
    kind: str,
    rng: random.Random,
    inventory: Inventory | None = None,
) -> Mutation | None:
    """One mutation of ``kind`` applied to one randomly chosen claim, or None if none applies."""
    inventory = inventory or Inventory()
    inventory.add(materials)
    claims = claim_segments(answer)
    order = list(range(len(claims)))
    rng.shuffle(order)
    for index in order:
        if not claims[index].cited_ids:
            continue
        variants = claim_mutations(kind, answer, index, materials, inventory, rng)
        if variants:
            return rng.choice(variants)
    return None


class MutatingChatModel(ReplyChatModel):
    """Wraps a chat model and makes a share of its answers wrong, one mutation each.

    Each answer call is mutated with probability ``rate`` by mutation ``kind`` (see
    ``MUTATION_KINDS``) applied to one claim; plan calls pass through unchanged. ``materials``
    (id → Material) tells which cited materials exist and which are outdated; materials only
    seen in the prompt are used as they appear there. ``mutated`` holds every answer it changed,
    so a test can tell which answers are wrong. Reproducible for a given ``seed``.
    """

    base: BaseChatModel
    kind: str = "number"
    rate: float = 0.5
    seed: int = 0
    materials: dict[str, Any] = Field(default_factory=dict)
    model_name: str = "mutating-chat-model"

    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)
    _calls: int = PrivateAttr(default=0)
    _mutated: dict[str, Mutation] = PrivateAttr(default_factory=dict)
    _inventory: Inventory | None = PrivateAttr(default=None)

    @property
    def _llm_type(self) -> str:
        return "tracerag-mutating"

    @property
    def mutated(self) -> dict[str, Mutation]:
        """Every answer this model changed, with the mutation that made it."""
        with self._lock:
            return dict(self._mutated)

    def _change(self, messages: list[BaseMessage], text: str) -> str:
        parsed = parse_prompt(messages)
        if parsed.task != TASK_ANSWER:
            return text
        with self._lock:
            call = self._calls
            self._calls += 1
            if self._inventory is None:
                self._inventory = Inventory()
                self._inventory.add(m for m in self.materials.values() if isinstance(m, Material))
            inventory = self._inventory
        rng = random.Random(f"{self.seed}:{call}")
        if rng.random() >= self.rate:
            return text
        materials: list[Material] = []
        for m in parsed.materials:
            known = self.materials.get(m.id)
            materials.append(
                known
                if isinstance(known, Material)
                else Material(id=m.id, text=" ".join(m.sentences), title=m.title)
            )
        mutation = mutate_answer(text, materials, self.kind, rng, inventory)
        if mutation is None:
            return text
        with self._lock:
            self._mutated[mutation.answer] = mutation
        return mutation.answer

    def _reply(self, messages: list[BaseMessage], **kwargs: Any) -> ChatResult:
        return self._rewrite(messages, self.base._generate(messages, **kwargs))

    async def _areply(self, messages: list[BaseMessage], **kwargs: Any) -> ChatResult:
        return self._rewrite(messages, await self.base._agenerate(messages, **kwargs))

    def _rewrite(self, messages: list[BaseMessage], result: ChatResult) -> ChatResult:
        generation = result.generations[0]
        text = generation.message.content
        if not isinstance(text, str):
            return result
        new = self._change(messages, text)
        if new == text:
            return result
        message = generation.message.model_copy(update={"content": new})
        return ChatResult(
            generations=[ChatGeneration(message=message)], llm_output=result.llm_output
        )
