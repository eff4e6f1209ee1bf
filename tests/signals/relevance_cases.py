"""Hand-written questions for the answer-relevance check against the demo knowledge base.

Shared by ``tests/signals/test_relevance.py`` and ``benchmarks/relevance.py``. The off-topic
questions are general-knowledge questions a customer-service bot gets (written as parallel
English and Chinese lists, not from the knowledge base's wording); the paraphrases are real
questions about the knowledge base asked in other words, each with the knowledge-base sentence
that answers it (as a cited answer).
"""

from __future__ import annotations

OFF_TOPIC_EN = (
    "What is the capital of Mars?",
    "Who won the 1998 World Cup?",
    "What is the boiling point of water at sea level?",
    "Who wrote Pride and Prejudice?",
    "How far is the Moon from the Earth?",
    "What is the tallest mountain in Africa?",
    "How do I bake sourdough bread at home?",
    "What is the population of Brazil?",
    "When did the Berlin Wall fall?",
    "How many moons does Jupiter have?",
    "Who painted the Mona Lisa?",
    "What causes the northern lights?",
)

OFF_TOPIC_ZH = (
    "火星的首都是哪里？",
    "谁赢得了1998年世界杯？",
    "水在海平面的沸点是多少度？",
    "《红楼梦》的作者是谁？",
    "月球离地球有多远？",
    "非洲最高的山是哪座？",
    "在家怎么烤面包？",
    "巴西有多少人口？",
    "柏林墙是哪一年倒塌的？",
    "木星有几颗卫星？",
    "蒙娜丽莎是谁画的？",
    "极光是怎么形成的？",
)

#: (question, the cited answer that addresses it) — the answer is the knowledge base's sentence.
PARAPHRASES_EN = (
    (
        "How long do I have to send something back?",
        "Under Clause 4.2, unopened items can be returned within 15 days of delivery for a full "
        "refund. [returns]",
    ),
    (
        "When will I see my money again after sending an item back?",
        "Refunds are issued to the original payment method within 3 business days after the "
        "returned item passes inspection. [refund-timing]",
    ),
    (
        "Do I pay postage if the product I got was broken?",
        "Return shipping is free when the item arrived damaged, defective or not as described. "
        "[return-shipping]",
    ),
    (
        "What's the delivery charge for a small order?",
        "Standard domestic shipping costs ¥12 per order. [shipping-fees]",
    ),
    (
        "How fast will my parcel arrive?",
        "Standard delivery reaches most mainland cities within 3 to 5 business days. "
        "[delivery-times]",
    ),
    (
        "Is my notebook computer covered if it stops working?",
        "Under Clause 6.1, laptops and tablets are covered by an extended 24-month warranty. "
        "[warranty]",
    ),
    (
        "What do I pay to get a TV mounted on the wall?",
        "Wall-mount TV installation, including the bracket, costs ¥299 per television. "
        "[tv-installation]",
    ),
    (
        "Can I spread the cost over several months?",
        "Instalment plans of 3, 6 or 12 months are available for orders over ¥1,000. "
        "[payment-methods]",
    ),
    (
        "How soon will someone reply to my complaint?",
        "Complaints are acknowledged within 24 hours, and a first resolution is offered within "
        "3 business days. [complaints]",
    ),
    (
        "Do you keep my purchase history forever?",
        "Northwind Gadgets keeps order records for 5 years to meet tax and accounting rules. "
        "[privacy]",
    ),
    (
        "What's the most I can cover with reward points?",
        "Reward points can pay for at most 20% of an order's value. [points-redemption]",
    ),
    (
        "Can I turn a gift card into cash?",
        "A Northwind gift card is valid for 3 years from the date of purchase and cannot be "
        "exchanged for cash. [gift-cards]",
    ),
    (
        "Can I get my money back if I change my mind?",
        "Under Clause 4.2, unopened items can be returned within 15 days of delivery for a full "
        "refund. [returns]",
    ),
)

PARAPHRASES_ZH = (
    (
        "买完降价了能退差价吗？",
        "根据第5.1条，商品签收后7天内降价的，可申请价格保护并退还差价。[price-protection]",
    ),
    (
        "发票开错了还能改吗？",
        "已开具的发票抬头或税号有误的，可在开票后30天内申请重开1次。[invoice-reissue]",
    ),
    ("修东西的师傅多久能到？", "预约成功后，维修工程师将在48小时内上门。[onsite-repair]"),
    (
        "学生买电脑有优惠吗？",
        "在校学生完成学生认证后，购买笔记本电脑和平板电脑可享受5%的折扣。[student-discount]",
    ),
    ("两张券能一起用吗？", "每个订单限用1张优惠券，优惠券之间不可叠加使用。[coupons]"),
    (
        "手机号换了怎么改绑？",
        "更换绑定手机号需要通过原手机号短信或人脸识别验证。[account-security]",
    ),
    ("不想要预售的东西了，定金能退吗？", "客户放弃支付尾款的，定金不予退还。[pre-orders]"),
    (
        "旧手机里的照片会被删掉吗？",
        "回收的旧设备在检测前会按照国家标准进行数据擦除。[trade-in-data]",
    ),
    ("会员日是每个月哪天？", "每月18日为北风数码会员日。[member-day]"),
    ("电子发票多久能收到？", "电子发票会在申请后3个工作日内发送至账户绑定的邮箱。[invoices]"),
    (
        "过了保修期上门修要多少钱？",
        "保修期内上门维修免费，保修期外每次上门收取80元服务费，配件费用另计。[onsite-repair]",
    ),
    ("密码忘了试错太多次会怎样？", "登录密码连续输错5次后，账户将被锁定30分钟。[account-security]"),
)
