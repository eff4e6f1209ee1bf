"""The cases the adversarial self-test mutates: answered questions with their materials.

The probe questions beside the demo's, the demo's records answered offline, and cases from
any stored or captured records (an evaluation's, a store's).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.language_models import BaseChatModel

from tracerag._adaptive import DEFAULT_MIN_SAMPLES
from tracerag._pipeline import RAGPipeline
from tracerag._routing import Ticket
from tracerag.demo.kb import build_retriever, load_questions
from tracerag.demo.models.extractive import ExtractiveChatModel
from tracerag.prompts import DEFAULT_PROMPT_VERSION
from tracerag.signals._confidence import Combiner
from tracerag.signals._types import Material
from tracerag.store import open_store
from tracerag.store._audit_record import AuditRecord
from tracerag.store._open import resolve_store_url

__all__ = [
    "DEFAULT_ENTITY_GROUPS",
    "DEFAULT_SEEDS",
    "PROBE_QUESTIONS",
    "Case",
    "cases_from_records",
    "demo_cases",
    "demo_questions",
    "demo_records",
    "relevant_documents",
    "store_cases",
]


#: The extractive model's seeds the demo cases are answered with.
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
    store = open_store(url)
    try:
        records = [store.get(s.request_id).record for s in store.list_requests(limit=limit)]
    finally:
        store.close()
    return cases_from_records(records, source=f"store {resolve_store_url(url)}")
