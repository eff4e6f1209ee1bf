"""Correct answers over the demo knowledge base, each quoting the sentences that answer it.

Shared by ``tests/signals/test_false_unsupported.py`` and ``benchmarks/false_unsupported.py``.
``FACTS`` are hand-written questions (several phrasings of each, English over the English
documents, Chinese over the Chinese ones), each with the sentences of one document that answer
it. ``cases()`` builds the answers from the knowledge base's own sentences: the answering
sentences as they stand, the same followed by the next sentence of the document (a two-sentence
answer that says a little more), and every sentence of every current document answered to a
question made from the document's title. None of these answers may be called unsupported.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from tracerag.demo.kb import load_documents
from tracerag.signals._types import Material
from tracerag.text._sentences import split_sentences

# (document id, indices of the sentences that answer, phrasings of the question)
FACTS: tuple[tuple[str, tuple[int, ...], tuple[str, ...]], ...] = (
    (
        "shipping-fees",
        (1,),
        (
            "From what order value does standard shipping become free?",
            "How much do I need to spend to get free shipping?",
            "Is there a minimum order for free delivery?",
        ),
    ),
    (
        "shipping-fees",
        (0,),
        ("How much is standard shipping?", "What does standard domestic shipping cost?"),
    ),
    (
        "shipping-fees",
        (2,),
        ("How much is express delivery?", "Does express delivery cost more for big orders?"),
    ),
    (
        "returns",
        (0, 1),
        (
            "Can I return an opened item within 30 days for a full refund?",
            "How many days do I have to return something?",
            "What is the return window for opened and unopened items?",
        ),
    ),
    (
        "returns",
        (1,),
        (
            "Can I return an opened item within 30 days for a full refund?",
            "How long do I have to return an opened item?",
            "Is there a restocking fee on opened items?",
        ),
    ),
    (
        "returns",
        (0,),
        (
            "How long do I have to return an unopened item?",
            "Do unopened returns get a full refund?",
        ),
    ),
    (
        "refund-timing",
        (0,),
        ("How soon is my refund issued after the return is inspected?", "When do I get my refund?"),
    ),
    (
        "refund-timing",
        (1,),
        ("Why has my card refund not shown up yet?", "How long do bank card refunds take?"),
    ),
    (
        "return-shipping",
        (1,),
        (
            "Do I pay for return shipping if I changed my mind?",
            "How much is the return shipping fee?",
        ),
    ),
    (
        "return-shipping",
        (0,),
        (
            "Who pays return shipping for a damaged item?",
            "Is return shipping free if it arrived broken?",
        ),
    ),
    (
        "delivery-times",
        (0,),
        (
            "How long does standard delivery take?",
            "When will a standard parcel arrive?",
            "How fast will my parcel arrive?",
        ),
    ),
    (
        "delivery-times",
        (1,),
        ("How fast is express delivery?", "How many days does express delivery take in Beijing?"),
    ),
    (
        "delivery-times",
        (2,),
        ("How long does delivery to Tibet take?", "Do deliveries to Xinjiang take longer?"),
    ),
    (
        "international-shipping",
        (1,),
        (
            "How much does international shipping cost?",
            "Is international shipping ever free?",
            "What is the threshold for free international shipping?",
        ),
    ),
    (
        "warranty",
        (1,),
        (
            "How long is the warranty on a laptop?",
            "What warranty does a tablet have?",
            "Is my laptop covered for two years?",
        ),
    ),
    (
        "warranty",
        (0, 1),
        ("How long is the warranty on a laptop?", "How long is the warranty?"),
    ),
    (
        "warranty",
        (0,),
        ("How long is the warranty on a phone?", "What is the standard warranty period?"),
    ),
    (
        "warranty-claims",
        (1,),
        ("How long does a warranty repair take?", "Do you pick up devices for warranty claims?"),
    ),
    (
        "care-plus",
        (1,),
        (
            "How much is Care+ for a laptop?",
            "What does Care+ cost for a phone?",
            "How long after buying a device can I still get Care+?",
        ),
    ),
    (
        "care-plus",
        (2,),
        (
            "How many accidental-damage repairs does Care+ cover?",
            "Is there a fee per Care+ repair?",
        ),
    ),
    (
        "care-plus",
        (0,),
        ("How much longer does Care+ extend the warranty?", "Does Care+ cover accidental damage?"),
    ),
    (
        "membership-tiers",
        (1,),
        (
            "How much do I have to spend for Gold status?",
            "What spending does Platinum status require?",
        ),
    ),
    (
        "points-redemption",
        (2,),
        ("When do reward points expire?", "How long are my points valid?"),
    ),
    (
        "points-redemption",
        (1,),
        ("How much of an order can I pay with points?", "Is there a limit on paying with points?"),
    ),
    (
        "gift-cards",
        (1,),
        ("How long is a Northwind gift card valid?", "Do gift cards expire?"),
    ),
    (
        "gift-cards",
        (0,),
        ("What values do gift cards come in?", "What is the largest gift card I can buy?"),
    ),
    (
        "order-cancellation",
        (2,),
        ("How fast is a cancelled order refunded?", "When do I get my money back if I cancel?"),
    ),
    (
        "privacy",
        (0,),
        ("How long do you keep my order records?", "How many years are order records kept?"),
    ),
    (
        "privacy",
        (1,),
        ("How long does it take to delete my account data?", "How do I delete my data?"),
    ),
    (
        "tv-installation",
        (1,),
        (
            "How much is wall-mount TV installation?",
            "What does it cost to mount my TV on the wall?",
        ),
    ),
    (
        "tv-installation",
        (0,),
        (
            "How much does TV installation on a stand cost?",
            "What is the price of standard TV installation?",
        ),
    ),
    (
        "tv-installation",
        (2,),
        (
            "When will the TV installer come?",
            "How soon after delivery is TV installation scheduled?",
        ),
    ),
    (
        "appliance-installation",
        (1,),
        (
            "How much does air-conditioner installation cost?",
            "What is the price to install an air conditioner?",
        ),
    ),
    (
        "appliance-installation",
        (0,),
        ("How much is dishwasher installation?", "What does washing machine installation cost?"),
    ),
    (
        "trade-in",
        (1,),
        ("How long does the trade-in inspection take?", "When is my trade-in value confirmed?"),
    ),
    (
        "business-accounts",
        (1,),
        ("What payment terms do business accounts get?", "Can a business pay in 30 days?"),
    ),
    (
        "business-accounts",
        (2,),
        (
            "Is there a volume discount for businesses?",
            "How many units for the business volume discount?",
        ),
    ),
    (
        "complaints",
        (0,),
        ("How fast are complaints answered?", "When is a complaint acknowledged?"),
    ),
    (
        "complaints",
        (2,),
        (
            "When can I go to the consumer association with a complaint?",
            "What if my complaint is unresolved after two weeks?",
        ),
    ),
    (
        "payment-methods",
        (1, 2),
        ("Which instalment plans are interest-free?", "Can I pay in instalments?"),
    ),
    (
        "payment-methods",
        (1,),
        (
            "What is the minimum order for instalments?",
            "Can I pay for a ¥2,000 order over 12 months?",
        ),
    ),
    (
        "price-protection",
        (0,),
        ("买完降价了能退差价吗？", "签收后多少天内降价可以申请价保？", "价格保护的期限是几天？"),
    ),
    (
        "price-protection",
        (1,),
        ("一个订单能申请几次价保？", "价保退的差价退到哪里？"),
    ),
    (
        "price-protection",
        (3,),
        ("现在的价保规则什么时候生效？", "价格保护新规从哪天开始执行？"),
    ),
    (
        "invoices",
        (1,),
        (
            "订单签收后多久内可以申请开具发票？",
            "发票最晚什么时候开？",
            "签收三个月后还能开发票吗？",
        ),
    ),
    (
        "invoices",
        (3,),
        ("电子发票多久能收到？", "申请发票后几天发到邮箱？"),
    ),
    (
        "invoice-reissue",
        (0,),
        ("发票抬头开错了多久内可以重开？", "发票能重开几次？"),
    ),
    (
        "onsite-repair",
        (1,),
        ("过了保修期上门修要多少钱？", "保修期内上门维修收费吗？"),
    ),
    (
        "onsite-repair",
        (2,),
        ("预约上门维修后多久能到？", "修东西的师傅多久能到？"),
    ),
    (
        "onsite-repair",
        (0,),
        ("上门维修覆盖多少个城市？", "你们在几个城市有上门维修？"),
    ),
    (
        "student-discount",
        (0,),
        ("学生买笔记本电脑有优惠吗？", "学生买平板电脑打几折？"),
    ),
    (
        "student-discount",
        (2,),
        ("学生认证的有效期多长？", "学生认证多久要重新认证？"),
    ),
    (
        "student-discount",
        (1,),
        ("每个学生一年能买几台优惠设备？", "学生优惠每年限几台？"),
    ),
    (
        "pre-orders",
        (0,),
        ("预售商品的定金是多少？", "预售要先付多少钱定金？"),
    ),
    (
        "member-day",
        (0,),
        ("会员日是每个月哪天？", "北风数码会员日是几号？"),
    ),
    (
        "member-day",
        (1,),
        ("会员日白金会员有几倍积分？", "金卡会员在会员日积分翻倍吗？"),
    ),
    (
        "account-security",
        (0,),
        ("登录密码输错几次会锁定账户？", "账户被锁定后多久能解锁？", "密码输错太多次会怎样？"),
    ),
    (
        "coupons",
        (0,),
        ("一个订单能用几张优惠券？", "两张券能一起用吗？"),
    ),
)


# Small knowledge bases of other businesses, written for this audit (not the demo's wording), with
# natural questions: the rival check's rules were not tuned on them.
OTHER_KB: dict[str, str] = {
    "plans": "Our basic plan costs $30 per month. The premium plan costs $50 per month and "
    "includes international calls. Students get a 20% discount on the basic plan. Contracts "
    "last 12 months, and month-to-month plans can be cancelled with 30 days' notice.",
    "hotel": "Check-in starts at 3 pm and check-out is at 11 am. Late check-out until 2 pm costs "
    "$40. Breakfast is served from 7 am to 10 am and costs $18 per adult. Children under 6 eat "
    "breakfast free.",
    "bank": "Transfers between our own accounts are free. Domestic transfers to other banks cost "
    "$2 each. International wire transfers cost $25 and take 3 to 5 business days. Premium "
    "account holders pay no fee for domestic transfers.",
    "gym": "Membership costs $45 per month. Annual membership costs $450 if paid upfront. A "
    "guest pass costs $15 per visit. Members can freeze their membership for up to 3 months per "
    "year.",
    "zh-tel": "基础套餐每月收费30元。高级套餐每月收费50元，包含国际通话。"
    "学生办理基础套餐可享8折优惠。合约期为12个月，按月套餐需提前30天申请取消。",
    "zh-hotel": "入住时间为下午3点，退房时间为上午11点。延迟退房至下午2点需支付100元。"
    "早餐每位成人收费50元。6岁以下儿童免费享用早餐。",
    "zh-bank": "本行账户之间转账免费。跨行转账每笔收费2元。"
    "国际电汇每笔收费150元，到账需要3至5个工作日。高级账户持有人跨行转账免手续费。",
}
OTHER_FACTS: tuple[tuple[str, tuple[int, ...], tuple[str, ...]], ...] = (
    ("plans", (0,), ("How much is the basic plan?", "What does the cheapest plan cost per month?")),
    (
        "plans",
        (1,),
        (
            "How much is the premium plan?",
            "Which plan includes international calls and what does it cost?",
            "How much do international calls cost?",
        ),
    ),
    (
        "plans",
        (2,),
        (
            "What discount do students get?",
            "Is there a student discount on the premium plan?",
            "How much does the basic plan cost for students?",
        ),
    ),
    (
        "plans",
        (3,),
        ("How long is the contract?", "How much notice do I need to cancel a month-to-month plan?"),
    ),
    ("hotel", (1,), ("How much is late check-out?", "Can I check out at 2 pm?")),
    ("hotel", (2,), ("How much is breakfast?", "When is breakfast served?")),
    ("hotel", (3,), ("Do kids pay for breakfast?", "How much is breakfast for a 4 year old?")),
    (
        "bank",
        (1,),
        (
            "How much does a transfer to another bank cost?",
            "What is the fee for a domestic transfer?",
        ),
    ),
    (
        "bank",
        (2,),
        (
            "How much is an international wire?",
            "How long does an international transfer take?",
            "What does it cost to send money abroad?",
        ),
    ),
    (
        "bank",
        (3,),
        (
            "Do premium accounts pay transfer fees?",
            "What do premium account holders pay for domestic transfers?",
        ),
    ),
    ("gym", (0,), ("How much is a monthly membership?", "What does the gym cost?")),
    ("gym", (1,), ("How much is an annual membership?", "Is it cheaper to pay for a year?")),
    ("gym", (2,), ("How much is a guest pass?", "Can I bring a friend and what does it cost?")),
    (
        "gym",
        (3,),
        ("How long can I freeze my membership?", "Can I pause my membership for 6 months?"),
    ),
    ("zh-tel", (1,), ("高级套餐多少钱？", "国际通话包含在哪个套餐里，费用是多少？")),
    ("zh-tel", (2,), ("学生有优惠吗？", "学生办基础套餐打几折？")),
    ("zh-tel", (3,), ("合约期多长？", "取消按月套餐要提前多久？")),
    ("zh-hotel", (1,), ("延迟退房要多少钱？", "可以下午2点退房吗？")),
    ("zh-hotel", (2,), ("早餐多少钱？", "早餐每人收费多少？")),
    ("zh-hotel", (3,), ("小孩吃早餐收费吗？", "4岁孩子早餐要钱吗？")),
    ("zh-bank", (1,), ("跨行转账手续费多少？", "转到别的银行要收费吗？")),
    ("zh-bank", (2,), ("国际电汇多少钱？", "国际汇款多久到账？")),
    ("zh-bank", (3,), ("高级账户跨行转账收费吗？", "高级账户转账要手续费吗？")),
)


@dataclass(frozen=True)
class QuotedCase:
    """A question and a correct answer that quotes the knowledge base, with what it cites."""

    question: str
    answer: str
    material_id: str
    sentences: tuple[int, ...]
    lang: str  # "en" or "zh"
    # "hand" (a hand-written question), "title" (one made from the title) or "other-kb" (a
    # hand-written question over one of ``OTHER_KB``)
    origin: str

    @property
    def n_sentences(self) -> int:
        return len(self.sentences)


@lru_cache(maxsize=1)
def _current() -> dict[str, tuple[str, tuple[str, ...], str]]:
    """Each current document: its text, its sentences and its title."""
    out = {}
    for d in load_documents():
        if d.metadata.get("superseded_by") or d.metadata.get("status") == "superseded":
            continue
        sentences = tuple(s.text.strip() for s in split_sentences(d.page_content))
        out[str(d.id)] = (d.page_content, sentences, str(d.metadata["title"]))
    return out


@lru_cache(maxsize=1)
def _other() -> dict[str, tuple[str, tuple[str, ...], str]]:
    return {
        k: (text, tuple(s.text.strip() for s in split_sentences(text)), k)
        for k, text in OTHER_KB.items()
    }


def _doc(material_id: str) -> tuple[str, tuple[str, ...], str]:
    return _current().get(material_id) or _other()[material_id]


def material(material_id: str) -> Material:
    """The document (demo, or one of ``OTHER_KB``) as a verifier material."""
    text, _, title = _doc(material_id)
    return Material(id=material_id, text=text, title=title)


def _lang(text: str) -> str:
    return "zh" if any("\u4e00" <= ch <= "\u9fff" for ch in text) else "en"


def _answer(material_id: str, indices: tuple[int, ...]) -> str:
    sentences = _doc(material_id)[1]
    if _lang(sentences[0]) == "zh":
        return "".join(f"{sentences[i]}[{material_id}]" for i in indices)
    return " ".join(f"{sentences[i]} [{material_id}]" for i in indices)


def _title_question(title: str, lang: str) -> str:
    if lang == "zh":
        return f"{title}有哪些规定？"
    return f"What is the policy on {title.split(':')[0].strip().lower()}?"


def cases() -> list[QuotedCase]:
    """Every audit case: hand-written questions over the demo knowledge base, then over the
    other knowledge bases, then the title questions."""
    docs = _current()
    out: list[QuotedCase] = []
    for facts, origin in ((FACTS, "hand"), (OTHER_FACTS, "other-kb")):
        for material_id, indices, questions in facts:
            n = len(_doc(material_id)[1])
            # the answer and the sentence after it (or, at the end, the one before it)
            after = indices[-1] + 1 < n
            longer = (*indices, indices[-1] + 1) if after else (indices[0] - 1, *indices)
            for question in questions:
                for chosen in dict.fromkeys([indices, longer]):
                    out.append(
                        QuotedCase(
                            question,
                            _answer(material_id, chosen),
                            material_id,
                            chosen,
                            _lang(question),
                            origin,
                        )
                    )
    for material_id, (_, sentences, title) in docs.items():
        lang = _lang(sentences[0])
        question = _title_question(title, lang)
        for i in range(len(sentences)):
            out.append(
                QuotedCase(question, _answer(material_id, (i,)), material_id, (i,), lang, "title")
            )
    return out


# Answers a general (or sibling) sentence gives for a case the same material states with
# another value: each must be called unsupported. Written by hand for the audit, in both
# languages; the labelled data has no Chinese rows, so these and the quoted answers above are
# the only Chinese cases the rival check is measured on. (question, claim, material text, lang)
RIVAL_CASES: tuple[tuple[str, str, str, str], ...] = (
    (
        "How long is the warranty on a laptop?",
        "All new devices sold by Northwind Gadgets carry a 12-month warranty from the date of "
        "delivery.",
        "All new devices sold by Northwind Gadgets carry a 12-month warranty from the date of "
        "delivery. Under Clause 6.1, laptops and tablets are covered by an extended 24-month "
        "warranty. The warranty covers manufacturing defects but not accidental damage.",
        "en",
    ),
    (
        "What warranty does a tablet get?",
        "All new devices carry a 12-month warranty.",
        "All new devices carry a 12-month warranty. Tablets are covered for 24 months under the "
        "extended warranty.",
        "en",
    ),
    (
        "How long does delivery to Tibet take?",
        "Standard delivery reaches most mainland cities within 3 to 5 business days.",
        "Standard delivery reaches most mainland cities within 3 to 5 business days. Deliveries "
        "to remote regions such as Tibet and Xinjiang can take up to 10 business days.",
        "en",
    ),
    (
        "How much does shipping to Hong Kong cost?",
        "Shipping costs $5 per order.",
        "Shipping costs $5 per order. Orders to Hong Kong cost $25 to ship.",
        "en",
    ),
    (
        "What discount do gold members get?",
        "Members get 5% off.",
        "Members get 5% off. Gold members get 10% off every order.",
        "en",
    ),
    (
        "How much is air-conditioner installation?",
        "Installation of a washing machine or dishwasher costs ¥199 per appliance.",
        "Installation of a washing machine or dishwasher costs ¥199 per appliance. "
        "Air-conditioner installation costs ¥350 per unit.",
        "en",
    ),
    (
        "笔记本电脑的保修期多长？",
        "所有新设备均享有12个月保修。",
        "所有新设备均享有自签收之日起12个月的保修。根据第6.1条，笔记本电脑和平板电脑享有延长的24个月"
        "保修。",
        "zh",
    ),
    (
        "平板电脑保修多久？",
        "所有新设备均享有12个月保修。",
        "所有新设备均享有12个月保修。平板电脑享有24个月保修。",
        "zh",
    ),
    (
        "已拆封的商品多少天内可以退？",
        "所有商品可在签收后15天内退货。",
        "所有商品可在签收后15天内退货。已拆封的商品可在签收后7天内退货，并收取10%的手续费。",
        "zh",
    ),
    (
        "加急配送要多少钱？",
        "标准配送每单收费12元。",
        "标准配送每单收费12元。满299元的订单免运费。加急配送每单收费25元。",
        "zh",
    ),
    (
        "偏远地区配送要几天？",
        "标准配送3至5个工作日送达。",
        "标准配送3至5个工作日送达。偏远地区配送最长需要10个工作日。",
        "zh",
    ),
    (
        "白金会员购物有几折？",
        "会员购物享受95折优惠，即5%的折扣。",
        "会员购物享受5%的折扣。白金会员购物享受10%的折扣。",
        "zh",
    ),
)
