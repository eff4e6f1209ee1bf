"""Adversarial self-test of the citation verifier: does it catch answers that were made wrong?

Real answers with their retrieved materials — by default the demo knowledge base's questions
answered through ``RAGPipeline`` by the offline ``ExtractiveChatModel`` at several seeds, or
the stored records of an audit store — are mutated one claim at a time:

``fabricated``
    the claim cites an id that was never retrieved;
``wrong_material``
    the claim's citation moves to another retrieved (current) material;
``number``
    an amount, percentage, duration or number of the claim is changed;
``date``
    a date of the claim is shifted (day, month or year);
``entity``
    a product, plan, tier, payment or other named entity is swapped for one that occurs in
    another material;
``negation``
    a negation is added to or removed from the claim (English and Chinese).

Only claims that the verifier supported before the mutation are mutated. A mutation is
*intercepted* when the mutated claim is no longer ``supported``. Unmutated answers whose claims
all cite retrieved, current materials measure the *false-alarm rate*: the share of them in
which the verifier flags any claim. (With stored records, whose answers may really be wrong,
that rate is a flag rate.) ``tracerag audit adversarial`` exits non-zero when a mutation type's
interception rate is below its floor or false alarms exceed the maximum.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field, PrivateAttr

from tracerag._llm import ReplyChatModel
from tracerag._routing import Ticket
from tracerag.errors import InputError
from tracerag.signals._citations import SUPPORTED, verify_citations
from tracerag.signals._claims import CITATION_RE, Claim, citation_ids, split_claims
from tracerag.signals._confidence import Combiner
from tracerag.signals._support import SupportBackend, get_backend
from tracerag.signals._types import Material
from tracerag.store._audit_record import AuditRecord
from tracerag.text._negation import is_negated
from tracerag.text._quantities import (
    _EN_UNITS,
    Quantity,
    extract_quantities,
    parse_chinese_number,
)

__all__ = ["AdversarialReport", "MutatingChatModel", "run_adversarial"]

MUTATION_KINDS = ("fabricated", "wrong_material", "number", "date", "entity", "negation")
#: The goals: every fabricated id, 95% of changed numbers and dates.
DEFAULT_FLOORS: dict[str, float] = {"fabricated": 1.0, "number": 0.95, "date": 0.95}
DEFAULT_MAX_FALSE_ALARM = 0.05
DEFAULT_SEEDS = (1, 2, 3)

#: More questions about the demo knowledge base (beside the demo's own), each with the documents
#: that answer it, so that most documents are answered from, in English and Chinese, including
#: dates and negations.
PROBE_QUESTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Can unopened items be returned for a full refund?", ("returns",)),
    ("When does the current returns policy take effect?", ("returns",)),
    ("How soon are refunds issued after the returned item passes inspection?", ("refund-timing",)),
    ("Who pays for return shipping on a change-of-mind return?", ("return-shipping",)),
    ("How much does standard domestic shipping cost?", ("shipping-fees",)),
    ("How long does standard delivery take?", ("delivery-times",)),
    ("How much does international shipping cost?", ("international-shipping",)),
    ("Does the warranty cover accidental damage?", ("warranty", "care-plus")),
    (
        "How long does Northwind take to repair a device under a warranty claim?",
        ("warranty-claims",),
    ),
    ("How much does Northwind Care+ cost for a laptop?", ("care-plus",)),
    ("How much spending is required for Gold status?", ("membership-tiers",)),
    ("How many reward points are needed for ¥1 off?", ("points-redemption",)),
    ("When do reward points expire?", ("points-redemption",)),
    ("Can a gift card be exchanged for cash?", ("gift-cards",)),
    ("Can I cancel an order after it has shipped?", ("order-cancellation",)),
    ("How long does Northwind keep order records?", ("privacy",)),
    ("Does Northwind sell customers' personal data?", ("privacy",)),
    ("How much does wall-mount TV installation cost?", ("tv-installation",)),
    ("How much does air-conditioner installation cost?", ("appliance-installation",)),
    ("How long does the trade-in inspection take?", ("trade-in",)),
    ("What payment terms do business accounts get?", ("business-accounts",)),
    ("How quickly are complaints acknowledged?", ("complaints",)),
    ("Which payment methods are accepted?", ("payment-methods",)),
    ("Which instalment plans are interest-free?", ("payment-methods",)),
    ("价格保护规则什么时候生效？", ("price-protection",)),
    ("每个订单可以申请几次价格保护？", ("price-protection",)),
    ("秒杀商品可以申请价格保护吗？", ("price-protection",)),
    ("申请增值税专用发票需要提供什么信息？", ("invoices",)),
    ("发票抬头错了多久内可以申请重开？", ("invoice-reissue",)),
    ("一个订单可以使用几张优惠券？", ("coupons",)),
    ("优惠券过期后可以补发吗？", ("coupons",)),
    ("保修期外上门维修怎么收费？", ("onsite-repair",)),
    ("上门维修服务覆盖多少个城市？", ("onsite-repair",)),
    ("寄出旧设备前客户需要做什么？", ("trade-in-data",)),
    ("学生认证后购买笔记本电脑有多少折扣？", ("student-discount",)),
    ("学生认证的有效期是多久？", ("student-discount",)),
    ("预售商品需要支付多少定金？", ("pre-orders",)),
    ("客户放弃支付尾款，定金会退还吗？", ("pre-orders",)),
    ("会员日是每月哪一天？", ("member-day",)),
    ("会员日白金会员可以获得几倍积分？", ("member-day",)),
    ("更换绑定手机号需要什么验证？", ("account-security",)),
    ("客服会索要登录密码吗？", ("account-security",)),
    ("电子发票会在申请后多久发送到邮箱？", ("invoices",)),
)

#: Interchangeable names of one kind (products, plans, tiers, payment methods, ...). An entity
#: swap replaces one with another of its group that occurs in another material.
DEFAULT_ENTITY_GROUPS: tuple[tuple[str, ...], ...] = (
    (
        "laptop",
        "tablet",
        "phone",
        "television",
        "washing machine",
        "dishwasher",
        "air-conditioner",
        "smartwatch",
        "camera",
    ),
    ("笔记本电脑", "平板电脑", "手机", "电视", "洗衣机", "洗碗机", "空调", "相机"),
    ("Silver", "Gold", "Platinum"),
    ("银卡", "金卡", "白金"),
    ("Visa", "Mastercard", "UnionPay", "Alipay", "WeChat Pay", "PayPal"),
    ("支付宝", "微信支付", "银联", "信用卡"),
    ("standard", "express"),
    ("Tibet", "Xinjiang", "Hong Kong", "Macau"),
    ("增值税电子普通发票", "增值税专用发票"),
    ("秒杀", "清仓", "赠品", "预售"),
    ("优惠券", "满减券", "礼品卡"),
    ("短信", "人脸识别", "邮箱"),
    ("金卡会员", "白金会员", "学生"),
    ("store credit", "original payment method", "bank card"),
)


# ----------------------------------------------------------------------------------------------
# Cases: real answers with their retrieved materials


@dataclass(frozen=True)
class Case:
    """One real answer and the materials that were retrieved for it."""

    case_id: str
    question: str
    answer: str
    materials: tuple[Material, ...]
    source: str = ""


def cases_from_records(
    records: Iterable[AuditRecord | Mapping[str, Any]], source: str = ""
) -> list[Case]:
    """One Case per distinct successful sample answer of each audit record."""
    cases: list[Case] = []
    seen: set[tuple[str, str, tuple[str, ...]]] = set()
    for data in records:
        record = AuditRecord.parse(data)
        materials = tuple(m.to_material() for m in record.materials)
        if not materials:
            continue
        answers: list[str] = []
        for sample in record.samples:
            if not sample.error and sample.answer and sample.answer.strip():
                answers.append(sample.answer)
        response = record.response
        if not answers and response is not None and response.answer:
            answers.append(response.answer)
        question = record.question or ""
        ids = tuple(m.id for m in materials)
        for answer in answers:
            key = (question, answer, ids)
            if key in seen:
                continue
            seen.add(key)
            digest = hashlib.sha256(f"{question}\n{answer}".encode()).hexdigest()[:10]
            cases.append(
                Case(
                    case_id=f"{len(cases)}-{digest}",
                    question=question,
                    answer=answer,
                    materials=materials,
                    source=source,
                )
            )
    return cases


def demo_questions() -> list[str]:
    """The demo's bundled questions followed by ``PROBE_QUESTIONS``."""
    return list(relevant_documents())


def relevant_documents() -> dict[str, tuple[str, ...]]:
    """Each demo and probe question with the documents that answer it (empty: none does)."""
    from tracerag.demo.kb import load_questions

    out = {q["question"]: tuple(q.get("relevant") or ()) for q in load_questions()}
    for question, relevant in PROBE_QUESTIONS:
        out.setdefault(question, relevant)
    return out


class _QuietEscalation:
    """Keeps tickets without logging them (self-tests escalate on purpose)."""

    def __init__(self) -> None:
        self.tickets: list[Ticket] = []

    def handle(self, ticket: Ticket) -> None:
        self.tickets.append(ticket)


def _keeper(records: list[dict[str, Any]]) -> Callable[[dict[str, Any]], bool]:
    """An audit sink that keeps each record in ``records``."""

    def keep(record: dict[str, Any]) -> bool:
        records.append(record)
        return True

    return keep


def demo_records(
    seeds: Sequence[int] = DEFAULT_SEEDS,
    questions: Sequence[str] | None = None,
    *,
    llm_factory: Callable[[int], BaseChatModel] | None = None,
    n_samples: int = 5,
    temperature: float = 0.7,
    k: int = 4,
    combiner: Combiner | None = None,
    min_samples: int | None = None,
) -> list[dict[str, Any]]:
    """Audit records of the demo questions answered through ``RAGPipeline`` at each seed.

    ``llm_factory(seed)`` builds the chat model (default: ``ExtractiveChatModel(seed=seed)``);
    ``min_samples``: adaptive sampling's first round (None: the default; ``n_samples``: fixed N).
    """
    from tracerag._adaptive import DEFAULT_MIN_SAMPLES
    from tracerag._pipeline import RAGPipeline
    from tracerag.demo.kb import build_retriever
    from tracerag.demo.models.extractive import ExtractiveChatModel
    from tracerag.prompts import DEFAULT_PROMPT_VERSION

    questions = list(questions) if questions is not None else demo_questions()
    make = llm_factory or (lambda seed: ExtractiveChatModel(seed=seed))
    retriever = build_retriever(k=k)
    records: list[dict[str, Any]] = []
    for seed in seeds:
        llm = make(seed)
        pipeline = RAGPipeline(
            retriever,
            llm,
            prompt_version=DEFAULT_PROMPT_VERSION,
            model_version=getattr(llm, "model_name", type(llm).__name__),
            n_samples=n_samples,
            min_samples=min_samples if min_samples is not None else DEFAULT_MIN_SAMPLES,
            temperature=temperature,
            escalation=_QuietEscalation(),
            combiner=combiner,
            audit=_keeper(records),
        )
        for question in questions:
            pipeline.invoke(question)
    return records


def demo_cases(
    seeds: Sequence[int] = DEFAULT_SEEDS, questions: Sequence[str] | None = None
) -> list[Case]:
    """Real answers to the demo questions (extractive model, each seed), deduplicated."""
    label = "demo seeds " + ",".join(str(s) for s in seeds)
    return cases_from_records(demo_records(seeds, questions), source=label)


def store_cases(url: str | None = None, limit: int = 500) -> list[Case]:
    """Real answers from the newest ``limit`` requests of the audit store at ``url``."""
    from tracerag.store import open_store
    from tracerag.store._open import resolve_store_url

    store = open_store(url)
    try:
        records = [store.get(s.request_id).record for s in store.list_requests(limit=limit)]
    finally:
        store.close()
    return cases_from_records(records, source=f"store {resolve_store_url(url)}")


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


def _claim_segments(answer: str) -> list[Claim]:
    return split_claims(answer)


def _replace(answer: str, claim: Claim, new_segment: str) -> str:
    return answer[: claim.start] + new_segment + answer[claim.end :]


# -- numbers ------------------------------------------------------------------------------------

_DIGITS_RE = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?")
#: The numerals a number mutation rewrites: the everyday ones from one to ten (not the financial
#: forms such as 壹), their values from the text module's numeral tables.
_CN_MUTABLE = "一二两三四五六七八九十"
_CN_VALUES = {c: int(parse_chinese_number(c) or 0) for c in _CN_MUTABLE}
_CN_NUMERALS = {v: c for c, v in _CN_VALUES.items() if c != "二"}  # 2 in a quantity is 两
_EN_VALUES = {word: value for word, value in _EN_UNITS.items() if 1 <= value <= 12}
_EN_NUMERALS = {v: k for k, v in _EN_VALUES.items()}
_EN_WORD_RE = re.compile(r"\b(" + "|".join(_EN_VALUES) + r")\b", re.IGNORECASE)
_CN_NUM_RE = re.compile("[" + "".join(_CN_VALUES) + "]")


def _new_values(value: float, avoid: set[float]) -> list[float]:
    """Double, half, one step up and one down (a step is 1 below 20, else the leading digit's
    unit: 30 → 40, 5,000 → 6,000); never a value that another number of the claim has."""
    step = 1.0 if value < 20 else 10.0 ** (len(str(int(value))) - 1)
    ops = [value * 2, value + step]
    if value - step > 0:
        ops.append(value - step)
    if value >= 2 and (value / 2) == int(value / 2):
        ops.append(value / 2)
    return list(dict.fromkeys(v for v in ops if v != value and v not in avoid))


def _format_like(token: str, value: float) -> str:
    decimals = len(token.split(".", 1)[1]) if "." in token else 0
    if decimals == 0 and value != int(value):
        decimals = 1
    text = f"{value:,.{decimals}f}" if "," in token else f"{value:.{decimals}f}"
    return text


def _changed_numbers(raw: str, avoid: set[float]) -> list[str]:
    """Every changed form of a quantity's number (digits, English or Chinese numerals)."""
    m = _DIGITS_RE.search(raw)
    if m:
        token = m.group(0)
        values = _new_values(float(token.replace(",", "")), avoid)
        return [raw[: m.start()] + _format_like(token, v) + raw[m.end() :] for v in values]
    m = _EN_WORD_RE.search(raw)
    if m:
        value = _EN_VALUES[m.group(1).lower()]
        out = []
        for v in _new_values(float(value), avoid):
            if v in _EN_NUMERALS:
                word = _EN_NUMERALS[int(v)]
                word = word.capitalize() if m.group(1)[0].isupper() else word
                out.append(raw[: m.start()] + word + raw[m.end() :])
        return out
    m = _CN_NUM_RE.search(raw)
    if m and not _CN_NUM_RE.search(raw, m.end()):
        value = _CN_VALUES[m.group(0)]
        return [
            raw[: m.start()] + _CN_NUMERALS[int(v)] + raw[m.end() :]
            for v in _new_values(float(value), avoid)
            if v in _CN_NUMERALS
        ]
    return []


def _quantity_mutations(
    kind: str, segment: str, rng: random.Random, limit: int = 3
) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    quantities = extract_quantities(segment)
    if kind == "number":
        chosen = [q for q in quantities if q.kind != "date" and q.unit != "time"]
    else:
        chosen = [q for q in quantities if q.kind == "date"]
    # a changed number never repeats another number of the same claim ("3 to 3 days")
    stated = {q.number if q.number is not None else q.value for q in quantities}
    avoid = {float(v) for v in stated if isinstance(v, (int, float))}
    for q in chosen[:limit]:
        options: Sequence[str | None]
        if kind == "number":
            options = _changed_numbers(q.raw, avoid)
        else:
            options = [_shifted_date(q, rng, part) for part in ("d", "m", "y")]
        for new_raw in dict.fromkeys(options):
            if new_raw is None or new_raw == q.raw:
                continue
            out.append((segment[: q.start] + new_raw + segment[q.end :], f"{q.raw} → {new_raw}"))
    return out


# -- dates --------------------------------------------------------------------------------------

_MONTH_NAMES = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
_MONTH_RE = re.compile(
    r"\b("
    + "|".join(n for n in _MONTH_NAMES)
    + r"|"
    + "|".join(n[:3] for n in _MONTH_NAMES)
    + r")\.?\b",
    re.IGNORECASE,
)
_DATE_DIGITS_RE = re.compile(r"\d+")


def _shift(
    y: int | None, m: int | None, d: int | None, part: str, rng: random.Random
) -> tuple[int | None, int | None, int | None] | None:
    """The date with one part moved: the day by 1–7 days, the month by 1–3, the year by 1."""
    if part == "d" and d is not None:
        delta = rng.choice([1, 2, 3, 7, -1, -2, -7])
        if y is not None and m is not None:
            new = date(y, m, d) + timedelta(days=delta)
            return new.year, new.month, new.day
        day = d + abs(delta) if d + abs(delta) <= 28 else d - abs(delta)
        return y, m, day
    if part == "m" and m is not None:
        month = (m - 1 + rng.choice([1, 2, 3, -1])) % 12 + 1
        if d is not None and y is not None:
            try:
                date(y, month, d)
            except ValueError:
                return None
        return y, month, d
    if part == "y" and y is not None:
        return y + rng.choice([-1, 1]), m, d
    return None


def _shifted_date(q: Quantity, rng: random.Random, part: str) -> str | None:
    value = str(q.value)
    parts = value[2:].split("-") if value.startswith("--") else value.split("-")
    y: int | None
    m: int | None
    d: int | None
    if value.startswith("--"):
        y, m, d = None, int(parts[0]), int(parts[1]) if len(parts) > 1 else None
    else:
        y = int(parts[0])
        m = int(parts[1]) if len(parts) > 1 else None
        d = int(parts[2]) if len(parts) > 2 else None
    shifted = _shift(y, m, d, part, rng)
    if shifted is None:
        return None
    ny, nm, nd = shifted
    raw = q.raw
    month_word = _MONTH_RE.search(raw)
    wanted = {"y": (y, ny), "m": (m, nm), "d": (d, nd)}
    used: set[str] = set()
    pieces: list[tuple[int, int, str]] = []
    for g in _DATE_DIGITS_RE.finditer(raw):
        token = g.group(0)
        number = int(token)
        slot = None
        if len(token) == 4 and y is not None and "y" not in used:
            slot = "y"
        else:
            for name in ("m", "d") if not month_word else ("d",):
                old = wanted[name][0]
                if name not in used and old is not None and old == number:
                    slot = name
                    break
        if slot is None:
            continue
        used.add(slot)
        new_number = wanted[slot][1]
        if new_number is None:
            return None
        width = len(token) if token.startswith("0") or slot == "y" else 0
        pieces.append((g.start(), g.end(), f"{new_number:0{width}d}"))
    if month_word and m is not None and nm is not None and nm != m:
        name = _MONTH_NAMES[nm - 1]
        found = month_word.group(1)
        if len(found) == 3:
            name = name[:3]
        pieces.append((month_word.start(1), month_word.end(1), name))
    if not pieces:
        return None
    out = raw
    for a, b, text in sorted(pieces, reverse=True):
        out = out[:a] + text + out[b:]
    return out


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
    claims = _claim_segments(answer)
    claim = claims[claim_index]
    segment = answer[claim.start : claim.end]
    retrieved = {m.id for m in materials}
    cited = set(claim.cited_ids)
    if kind == "fabricated":
        variants = _fabricated_mutations(segment, retrieved, inventory, rng)
    elif kind == "wrong_material":
        variants = _wrong_material_mutations(segment, claim, materials, rng)
    elif kind in ("number", "date"):
        variants = _quantity_mutations(kind, segment, rng)
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
        if len(_claim_segments(mutated_answer)) != len(claims):
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
    claims = _claim_segments(answer)
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
        from tracerag.demo.models.extractive import parse_prompt
        from tracerag.prompts import TASK_ANSWER

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


# ----------------------------------------------------------------------------------------------
# The self-test


@dataclass
class KindResult:
    """How often one mutation type was intercepted."""

    kind: str
    total: int = 0
    intercepted: int = 0
    floor: float | None = None
    misses: list[dict[str, Any]] = field(default_factory=list)
    by_language: dict[str, list[int]] = field(default_factory=dict)  # lang -> [caught, total]

    @property
    def rate(self) -> float | None:
        """Share of mutations intercepted (None when there were none)."""
        return self.intercepted / self.total if self.total else None

    @property
    def ok(self) -> bool:
        """Whether the rate meets the floor (no floor, or no mutation, is ok)."""
        return self.floor is None or self.rate is None or self.rate >= self.floor - 1e-12


@dataclass
class AdversarialReport:
    """Interception per mutation type and false alarms on the unmutated answers."""

    backend: str
    source: str
    cases: int = 0
    eligible: int = 0  # unmutated answers whose claims all cite retrieved, current materials
    claims: int = 0  # supported claims that were mutated
    false_alarms: int = 0
    max_false_alarm: float = DEFAULT_MAX_FALSE_ALARM
    excluded: dict[str, int] = field(default_factory=dict)
    kinds: dict[str, KindResult] = field(default_factory=dict)
    not_applicable: dict[str, int] = field(default_factory=dict)
    false_alarm_examples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def false_alarm_rate(self) -> float | None:
        """Share of eligible unmutated answers in which the verifier flagged a claim."""
        return self.false_alarms / self.eligible if self.eligible else None

    def failures(self) -> list[str]:
        """Each floor missed and the false-alarm limit if exceeded, for people."""
        out = [
            f"{k.kind}: intercepted {k.intercepted}/{k.total} ({k.rate:.1%}) < floor {k.floor:.1%}"
            for k in self.kinds.values()
            if not k.ok and k.rate is not None and k.floor is not None
        ]
        rate = self.false_alarm_rate
        if rate is not None and rate > self.max_false_alarm + 1e-12:
            out.append(
                f"false alarms: {self.false_alarms}/{self.eligible} ({rate:.1%}) > "
                f"{self.max_false_alarm:.1%}"
            )
        if not self.eligible:
            out.append("no eligible answers to test")
        return out

    def untested(self) -> list[str]:
        """Mutation kinds with a floor but no mutation made (e.g. answers without dates)."""
        return [k for k, r in self.kinds.items() if r.floor and not r.total]

    @property
    def ok(self) -> bool:
        """Whether every floor is met and false alarms are within the limit."""
        return not self.failures()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form."""
        return {
            "backend": self.backend,
            "source": self.source,
            "cases": self.cases,
            "eligible": self.eligible,
            "claims_mutated": self.claims,
            "excluded": self.excluded,
            "false_alarms": self.false_alarms,
            "false_alarm_rate": self.false_alarm_rate,
            "max_false_alarm": self.max_false_alarm,
            "false_alarm_examples": self.false_alarm_examples,
            "mutations": {
                k: {
                    "total": r.total,
                    "intercepted": r.intercepted,
                    "rate": r.rate,
                    "floor": r.floor,
                    "ok": r.ok,
                    "by_language": {
                        lang: {"intercepted": c[0], "total": c[1]}
                        for lang, c in sorted(r.by_language.items())
                    },
                    "misses": r.misses,
                }
                for k, r in self.kinds.items()
            },
            "not_applicable": self.not_applicable,
            "ok": self.ok,
            "failures": self.failures(),
            "untested": self.untested(),
        }

    def render(self, show_misses: int = 3) -> str:
        """A table for people, with a few missed mutations of each type."""
        lines = [
            f"adversarial self-test — backend {self.backend}, {self.cases} answers "
            f"({self.source}); {self.claims} supported claims mutated; {self.eligible} answers "
            "checked for false alarms",
            "",
            f"{'mutation':<16}{'intercepted':>13}{'rate':>9}{'floor':>9}  {'':<12}"
            f"{'en':>9}{'zh':>9}",
        ]
        for r in self.kinds.values():
            rate = f"{r.rate:.1%}" if r.rate is not None else "—"
            floor = f"{r.floor:.0%}" if r.floor is not None else "—"
            status = "ok" if r.ok else "BELOW FLOOR"
            if r.floor is None:
                status = ""
            langs = "".join(
                f"{'{}/{}'.format(*r.by_language.get(lang, [0, 0])):>9}" for lang in ("en", "zh")
            )
            lines.append(
                f"{r.kind:<16}{f'{r.intercepted}/{r.total}':>13}{rate:>9}{floor:>9}  "
                f"{status:<12}{langs}"
            )
        fa = self.false_alarm_rate
        fa_text = f"{fa:.1%}" if fa is not None else "—"
        fa_ok = "ok" if fa is not None and fa <= self.max_false_alarm + 1e-12 else "TOO HIGH"
        lines.append(
            f"{'false alarms':<16}{f'{self.false_alarms}/{self.eligible}':>13}{fa_text:>9}"
            f"{f'≤{self.max_false_alarm:.0%}':>9}  {fa_ok}"
        )
        if self.excluded:
            lines.append(
                "answers not checked for false alarms: "
                + ", ".join(f"{n} {why}" for why, n in sorted(self.excluded.items()))
            )
        if any(self.not_applicable.values()):
            lines.append(
                "claims with nothing to mutate: "
                + ", ".join(f"{k} {n}" for k, n in self.not_applicable.items() if n)
            )
        for r in self.kinds.values():
            for miss in r.misses[:show_misses]:
                lines.append(
                    f"  missed {r.kind} ({miss['detail']}): {miss['mutated']!r} → "
                    f"{miss['verdict']} {miss['score']:.2f} ({miss['reason']})"
                )
        for ex in self.false_alarm_examples[:show_misses]:
            lines.append(f"  false alarm: {ex['claim']!r} → {ex['verdict']} ({ex['reason']})")
        if self.untested():
            lines.append(
                "untested (no answer had anything to mutate): " + ", ".join(self.untested())
            )
        failures = self.failures()
        lines.append("")
        lines.append("result: " + ("PASS" if not failures else "FAIL — " + "; ".join(failures)))
        return "\n".join(lines)


def _eligibility(case: Case, claims: Sequence[Claim]) -> str | None:
    by_id = {m.id: m for m in case.materials}
    cited = [c for claim in claims for c in claim.cited_ids]
    if not claims or not cited:
        return "uncited or refusal"
    if any(not claim.cited_ids for claim in claims):
        return "with an uncited claim"
    if any(c not in by_id for c in cited):
        return "citing an unretrieved id"
    if any(by_id[c].stale_reason() for c in cited):
        return "citing an outdated material"
    return None


def run_adversarial(
    cases: Sequence[Case],
    backend: str | SupportBackend = "lexical",
    *,
    kinds: Sequence[str] = MUTATION_KINDS,
    floors: Mapping[str, float] | None = None,
    max_false_alarm: float = DEFAULT_MAX_FALSE_ALARM,
    entity_groups: Sequence[Sequence[str]] | None = None,
    seed: int = 0,
    source: str | None = None,
    keep_misses: int = 20,
) -> AdversarialReport:
    """Mutate every supported claim of every eligible case and count what the verifier catches."""
    impl = get_backend(backend)
    floors = DEFAULT_FLOORS if floors is None else floors
    unknown = set(floors) - set(MUTATION_KINDS)
    if unknown:
        raise InputError(f"unknown mutation kinds in floors: {', '.join(sorted(unknown))}")
    inventory = Inventory.from_cases(cases, entity_groups)
    report = AdversarialReport(
        backend=impl.name,
        source=source if source is not None else (cases[0].source if cases else ""),
        cases=len(cases),
        max_false_alarm=max_false_alarm,
        kinds={k: KindResult(k, floor=floors.get(k)) for k in kinds},
        not_applicable={k: 0 for k in kinds},
    )
    for case in cases:
        claims = _claim_segments(case.answer)
        base = verify_citations(case.answer, case.materials, backend=impl)
        why = _eligibility(case, claims)
        if why:
            report.excluded[why] = report.excluded.get(why, 0) + 1
        else:
            report.eligible += 1
            flagged = [c for c in base.claims if c.verdict != SUPPORTED]
            if flagged:
                report.false_alarms += 1
                if len(report.false_alarm_examples) < keep_misses:
                    c = flagged[0]
                    report.false_alarm_examples.append(
                        {
                            "case": case.case_id,
                            "claim": c.text,
                            "verdict": c.verdict,
                            "score": c.score,
                            "reason": c.reason,
                        }
                    )
        if len(base.claims) != len(claims):
            continue
        current = {m.id for m in case.materials if not m.stale_reason()}
        for index, (claim, verdict) in enumerate(zip(claims, base.claims, strict=True)):
            # only claims that cite current, retrieved materials and verify are mutated
            if verdict.verdict != SUPPORTED or not set(claim.cited_ids) <= current:
                continue
            report.claims += 1
            for kind in kinds:
                key = case.case_id.split("-", 1)[-1]  # the content hash: same answer, same rng
                rng = random.Random(f"{seed}:{key}:{index}:{kind}")
                mutations = claim_mutations(
                    kind, case.answer, index, case.materials, inventory, rng
                )
                if not mutations:
                    report.not_applicable[kind] += 1
                for mutation in mutations:
                    _score(report.kinds[kind], mutation, case, impl, keep_misses)
    return report


def _language(text: str) -> str:
    plain = CITATION_RE.sub(" ", text)
    chinese = len(re.findall(r"[\u4e00-\u9fff]", plain))
    return "zh" if chinese > len(re.findall(r"[A-Za-z]+", plain)) else "en"


def _score(
    result: KindResult, mutation: Mutation, case: Case, backend: SupportBackend, keep: int
) -> None:
    checked = verify_citations(mutation.answer, case.materials, backend=backend)
    verdict = checked.claims[mutation.claim_index]
    result.total += 1
    counts = result.by_language.setdefault(_language(mutation.original), [0, 0])
    counts[1] += 1
    if verdict.verdict != SUPPORTED:
        result.intercepted += 1
        counts[0] += 1
    elif len(result.misses) < keep:
        result.misses.append(
            {
                "case": case.case_id,
                "question": case.question,
                "original": mutation.original,
                "mutated": mutation.mutated,
                "detail": mutation.detail,
                "verdict": verdict.verdict,
                "score": verdict.score,
                "reason": verdict.reason,
            }
        )


# ----------------------------------------------------------------------------------------------
# Command line


def parse_floors(texts: Sequence[str] | None) -> dict[str, float]:
    """``["fabricated=1.0,number=0.95", "date=95%"]`` → floors per mutation kind."""
    floors = dict(DEFAULT_FLOORS)
    for text in texts or []:
        for item in filter(None, (p.strip() for p in text.split(","))):
            name, sep, value = item.partition("=")
            name = name.strip().replace("-", "_")
            if not sep or name not in MUTATION_KINDS:
                raise InputError(
                    f"cannot read floor {item!r}: use KIND=RATE with KIND one of "
                    f"{', '.join(MUTATION_KINDS)}"
                )
            value = value.strip()
            rate = float(value[:-1]) / 100 if value.endswith("%") else float(value)
            if not 0.0 <= rate <= 1.0:
                raise InputError(f"floor {item!r} is not a rate between 0 and 1")
            floors[name] = rate
    return floors


def _run(args: argparse.Namespace) -> int:
    import tracerag.signals._judge  # noqa: F401  (so "--backend judge" says how to configure it)
    from tracerag.errors import ConfigurationError

    try:
        floors = parse_floors(args.floor)
        seeds = [int(s) for s in str(args.seeds).split(",") if s.strip()]
        backend = get_backend(args.backend)
    except (ValueError, ConfigurationError) as exc:
        print(f"tracerag audit adversarial: {exc}", file=sys.stderr)
        return 2
    if args.store:
        cases = store_cases(args.store, limit=args.limit)
        source = cases[0].source if cases else f"store {args.store}"
    else:
        cases = demo_cases(seeds)
        source = f"demo knowledge base, extractive model, seeds {','.join(map(str, seeds))}"
    report = run_adversarial(
        cases,
        backend=backend,
        floors=floors,
        max_false_alarm=args.max_false_alarm,
        seed=args.seed,
        source=source,
    )
    if args.json:
        json.dump(report.to_dict(), sys.stdout, ensure_ascii=False, indent=2)
        print()
    else:
        print(report.render(show_misses=args.show_misses))
    return 0 if report.ok else 1


def _configure(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group()
    where.add_argument("--store", metavar="URL", help="mutate the answers of stored requests")
    where.add_argument(
        "--demo",
        action="store_true",
        help="mutate answers to the demo knowledge base's questions (default)",
    )
    p.add_argument("--limit", type=int, default=500, help="stored requests to read (newest)")
    p.add_argument(
        "--seeds",
        default=",".join(map(str, DEFAULT_SEEDS)),
        help="demo: seeds of the extractive model (default 1,2,3)",
    )
    p.add_argument("--backend", default="lexical", help="support backend (default lexical)")
    p.add_argument(
        "--floor",
        action="append",
        metavar="KIND=RATE,...",
        help="minimum interception rate per mutation kind (default "
        + ",".join(f"{k}={v}" for k, v in DEFAULT_FLOORS.items())
        + f"); kinds: {', '.join(MUTATION_KINDS)}",
    )
    p.add_argument(
        "--max-false-alarm",
        type=float,
        default=DEFAULT_MAX_FALSE_ALARM,
        help="highest acceptable false-alarm rate (default 0.05)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the mutations")
    p.add_argument("--show-misses", type=int, default=3, help="missed mutations shown per kind")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_run)


_HELP = "mutate real answers and check that the citation verifier catches them"


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``tracerag audit adversarial`` in the ``tracerag audit`` group."""
    from tracerag.tools._audit import add_audit_command

    add_audit_command("adversarial", _HELP, _configure)
