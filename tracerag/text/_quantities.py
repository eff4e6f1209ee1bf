"""Amounts, percentages, dates, durations and numbers in Chinese and English text.

Each quantity has a normalised ``key`` so that equal quantities compare equal across languages
and formats: ``500元``, ``¥500``, ``500 yuan``, ``RMB 500`` and ``五百元`` all have the key
``("money", 500.0, "CNY")``; ``2 years``, ``24 months`` and ``两年`` the key
``("duration", 24.0, "month")``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache

from tracerag.errors import InputTypeError
from tracerag.text._sentences import CITATION_MARKER_RE

__all__ = [
    "Quantity",
    "extract_quantities",
    "parse_chinese_number",
    "quantities_match",
]

KINDS = ("money", "percent", "date", "duration", "number")


@dataclass(frozen=True)
class Quantity:
    """A quantity found in text.

    ``value`` is normalised: money in the currency's units, percentages as 0–100, durations in
    months (years, months), days (days, weeks) or seconds (hours, minutes, seconds), dates as an
    ISO string (``"2024-03-15"``, ``"2024-03"``, ``"2024"``, or ``"--03-15"`` without a year).
    ``unit`` is the currency code, ``"%"``, the duration base unit, ``"time"`` for a time of day
    (value in minutes after midnight), or ``""``. ``number`` is the number as written before
    any unit conversion (``2`` for "2 years"), when there is one.
    """

    kind: str  # "money" | "percent" | "date" | "duration" | "number"
    value: float | str
    unit: str
    start: int
    end: int
    raw: str
    number: float | None = None

    @cached_property
    def key(self) -> tuple[str, float | str, str]:
        """A hashable normalised form: equal for equal quantities in any language or format."""
        value = self.value
        if isinstance(value, float):
            value = round(value, 6)
        return (self.kind, value, self.unit)

    def __str__(self) -> str:
        return self.raw


# ----------------------------------------------------------------------------------------------
# Numbers

_CN_DIGITS = {
    "零": 0,
    "〇": 0,
    "○": 0,
    "一": 1,
    "壹": 1,
    "二": 2,
    "贰": 2,
    "两": 2,
    "俩": 2,
    "三": 3,
    "叁": 3,
    "四": 4,
    "肆": 4,
    "五": 5,
    "伍": 5,
    "六": 6,
    "陆": 6,
    "七": 7,
    "柒": 7,
    "八": 8,
    "捌": 8,
    "九": 9,
    "玖": 9,
}
_CN_SMALL_UNITS = {"十": 10, "拾": 10, "百": 100, "佰": 100, "千": 1000, "仟": 1000}
_CN_BIG_UNITS = {"万": 10_000, "萬": 10_000, "亿": 100_000_000, "億": 100_000_000}
_CN_NUM_CHARS = "".join(_CN_DIGITS) + "".join(_CN_SMALL_UNITS) + "".join(_CN_BIG_UNITS)
_CN = rf"[{_CN_NUM_CHARS}]+"
_CN_DIGIT_CLASS = "[" + "".join(k for k, v in _CN_DIGITS.items() if v) + "]"


def parse_chinese_number(text: str) -> float | None:
    """The value of a Chinese numeral (``三十`` → 30, ``一百零五`` → 105, ``二〇二四`` → 2024).

    ``None`` when ``text`` is not a well-formed Chinese numeral.
    """
    if not text or any(c not in _CN_NUM_CHARS for c in text):
        return None
    if all(c in _CN_DIGITS for c in text):
        if len(text) == 1:
            return float(_CN_DIGITS[text])
        return float("".join(str(_CN_DIGITS[c]) for c in text))
    total = 0.0
    section = 0.0
    num: float | None = None
    last_small = 10_000
    for c in text:
        if c in _CN_DIGITS:
            if num is not None and _CN_DIGITS[c] != 0 and num != 0:
                return None  # two digits in a row ("三五十")
            num = float(_CN_DIGITS[c])
        elif c in _CN_SMALL_UNITS:
            unit = _CN_SMALL_UNITS[c]
            if unit >= last_small:
                return None
            last_small = unit
            if num is None:
                if section or total or c not in "十拾":
                    return None
                num = 1.0
            section += num * unit
            num = None
        else:
            unit = _CN_BIG_UNITS[c]
            if num is None and not section:
                return None
            section += num or 0.0
            if unit == 100_000_000:
                total = (total + section) * unit
            else:
                total += section * unit
            section = 0.0
            num = None
            last_small = 10_000
    return total + section + (num or 0.0)


_EN_UNITS = {
    "zero": 0,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
    "thirteen": 13,
    "fourteen": 14,
    "fifteen": 15,
    "sixteen": 16,
    "seventeen": 17,
    "eighteen": 18,
    "nineteen": 19,
}
_EN_TENS = {
    "twenty": 20,
    "thirty": 30,
    "forty": 40,
    "fifty": 50,
    "sixty": 60,
    "seventy": 70,
    "eighty": 80,
    "ninety": 90,
}
_EN_SCALES = {"hundred": 100, "thousand": 1000, "million": 1e6, "billion": 1e9, "trillion": 1e12}
_EN_UNIT_ALT = "|".join(sorted(_EN_UNITS, key=len, reverse=True))
_EN_TENS_ALT = "|".join(_EN_TENS)
_EN_WORD_NUM = (
    rf"(?:(?:{_EN_TENS_ALT})(?:[- ](?:{'|'.join(k for k in _EN_UNITS if 0 < _EN_UNITS[k] < 10)}))?"
    rf"|{_EN_UNIT_ALT})(?:\s+(?:hundred|thousand|million|billion))?"
)


def _parse_en_number(text: str) -> float | None:
    words = re.split(r"[\s-]+", text.lower().strip())
    value = 0.0
    for w in words:
        if w in _EN_UNITS:
            value += _EN_UNITS[w]
        elif w in _EN_TENS:
            value += _EN_TENS[w]
        elif w in _EN_SCALES:
            value = (value or 1) * _EN_SCALES[w]
        else:
            return None
    return value


_MAGNITUDES = {
    "thousand": 1e3,
    "k": 1e3,
    "million": 1e6,
    "m": 1e6,
    "mn": 1e6,
    "mio": 1e6,
    "billion": 1e9,
    "bn": 1e9,
    "b": 1e9,
    "trillion": 1e12,
    "tn": 1e12,
    "千": 1e3,
    "万": 1e4,
    "萬": 1e4,
    "十万": 1e5,
    "百万": 1e6,
    "千万": 1e7,
    "亿": 1e8,
    "億": 1e8,
    "万亿": 1e12,
}
# A number written with digits, or a Chinese numeral, or (in some places) English words.
_DIGITS = r"\d+(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+"
_NUM = rf"(?:{_DIGITS}|{_CN})"
_MAG = (
    r"(?:\s?(?:thousand|million|billion|trillion|mn|bn|tn)\b"
    r"|(?:万亿|十万|百万|千万|千|万|萬|亿|億))"
)
_MAG_SHORT = r"(?:[kKmMbB](?![A-Za-z]))"


def _num_value(raw: str) -> float | None:
    raw = raw.strip()
    if not raw:
        return None
    if raw[0].isdigit() or raw[0] == ".":
        try:
            return float(raw.replace(",", ""))
        except ValueError:
            return None
    if raw[0] in _CN_NUM_CHARS:
        return parse_chinese_number(raw)
    return _parse_en_number(raw)


def _apply_magnitude(value: float, mag: str | None) -> float:
    if not mag:
        return value
    return value * _MAGNITUDES.get(mag.strip().lower(), 1.0)


# ----------------------------------------------------------------------------------------------
# Patterns, tried in order; a later match never overlaps an earlier one.

_MONTHS = {
    "january": 1,
    "jan": 1,
    "february": 2,
    "feb": 2,
    "march": 3,
    "mar": 3,
    "april": 4,
    "apr": 4,
    "may": 5,
    "june": 6,
    "jun": 6,
    "july": 7,
    "jul": 7,
    "august": 8,
    "aug": 8,
    "september": 9,
    "sep": 9,
    "sept": 9,
    "october": 10,
    "oct": 10,
    "november": 11,
    "nov": 11,
    "december": 12,
    "dec": 12,
}
_MONTH = (
    r"(?P<mon>January|February|March|April|May|June|July|August|September|October|November|"
    r"December|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept|Sep|Oct|Nov|Dec)\.?"
)
_DAY = r"(?P<day>[0-3]?\d)(?:st|nd|rd|th)?"
_YEAR = r"(?P<year>[12]\d{3})"
_CN_OR_D12 = rf"(?:\d{{1,2}}|{_CN})"

_CURRENCY_SYMBOLS = {
    "US$": "USD",
    "HK$": "HKD",
    "NT$": "TWD",
    "S$": "SGD",
    "A$": "AUD",
    "C$": "CAD",
    "$": "USD",
    "¥": "CNY",
    "￥": "CNY",
    "€": "EUR",
    "£": "GBP",
    "₹": "INR",
    "₩": "KRW",
}
_CURRENCY_CODES = {
    "RMB": "CNY",
    "CNY": "CNY",
    "USD": "USD",
    "EUR": "EUR",
    "GBP": "GBP",
    "HKD": "HKD",
    "JPY": "JPY",
    "TWD": "TWD",
    "SGD": "SGD",
    "AUD": "AUD",
    "CAD": "CAD",
    "INR": "INR",
    "KRW": "KRW",
    "CHF": "CHF",
}
_CURRENCY_WORDS = {
    "元人民币": "CNY",
    "块人民币": "CNY",
    "元": "CNY",
    "块钱": "CNY",
    "块": "CNY",
    "圆": "CNY",
    "人民币": "CNY",
    "美元": "USD",
    "美金": "USD",
    "欧元": "EUR",
    "英镑": "GBP",
    "港元": "HKD",
    "港币": "HKD",
    "日元": "JPY",
    "yuan": "CNY",
    "renminbi": "CNY",
    "us dollars": "USD",
    "us dollar": "USD",
    "dollars": "USD",
    "dollar": "USD",
    "bucks": "USD",
    "euros": "EUR",
    "euro": "EUR",
    "pounds sterling": "GBP",
    "yen": "JPY",
    **{code.lower(): cur for code, cur in _CURRENCY_CODES.items()},
}
_SYMBOL_ALT = "|".join(re.escape(s) for s in sorted(_CURRENCY_SYMBOLS, key=len, reverse=True))
_CODE_ALT = "|".join(_CURRENCY_CODES)
_CUR_WORD_ALT = "|".join(re.escape(s) for s in sorted(_CURRENCY_WORDS, key=len, reverse=True))

# Duration units: (base unit, factor).
_DURATION_UNITS: dict[str, tuple[str, float]] = {
    "decade": ("month", 120),
    "year": ("month", 12),
    "yr": ("month", 12),
    "month": ("month", 1),
    "mo": ("month", 1),
    "week": ("day", 7),
    "wk": ("day", 7),
    "day": ("day", 1),
    "business day": ("workday", 1),
    "working day": ("workday", 1),
    "workday": ("workday", 1),
    "calendar day": ("day", 1),
    "hour": ("second", 3600),
    "hr": ("second", 3600),
    "minute": ("second", 60),
    "min": ("second", 60),
    "second": ("second", 1),
    "sec": ("second", 1),
    "年": ("month", 12),
    "个月": ("month", 1),
    "個月": ("month", 1),
    "周": ("day", 7),
    "个星期": ("day", 7),
    "星期": ("day", 7),
    "礼拜": ("day", 7),
    "个礼拜": ("day", 7),
    "天": ("day", 1),
    "日": ("day", 1),
    "个自然日": ("day", 1),
    "自然日": ("day", 1),
    "个工作日": ("workday", 1),
    "工作日": ("workday", 1),
    "个小时": ("second", 3600),
    "小时": ("second", 3600),
    "分钟": ("second", 60),
    "秒钟": ("second", 1),
    "秒": ("second", 1),
}
_EN_DURATION = (
    r"(?P<unit>decades?|years?|yrs?|months?|mos|weeks?|wks?|business[ -]days?|working[ -]days?|"
    r"workdays?|calendar[ -]days?|days?|hours?|hrs?|minutes?|mins?|seconds?|secs?)\b"
)
_CN_DURATION = (
    r"(?P<unit>个工作日|工作日|个自然日|自然日|个月|個月|个星期|星期|个礼拜|礼拜|个小时|小时|分钟|秒钟|"
    r"年|周|天|日|秒)"
)


def _duration_unit(unit: str) -> tuple[str, float]:
    u = unit.lower().replace("-", " ")
    if u in _DURATION_UNITS:
        return _DURATION_UNITS[u]
    if u.endswith("s") and u[:-1] in _DURATION_UNITS:
        return _DURATION_UNITS[u[:-1]]
    if u == "mos":
        return _DURATION_UNITS["mo"]
    return _DURATION_UNITS[u.rstrip("s")]


@dataclass
class _Found:
    kind: str
    value: float | str
    unit: str
    start: int
    end: int
    number: float | None = None


def _date_value(year: int | None, month: int | None, day: int | None) -> str | None:
    if month is not None and not 1 <= month <= 12:
        return None
    if day is not None and not 1 <= day <= 31:
        return None
    if year is None:
        if month is None:
            return None
        return f"--{month:02d}" + (f"-{day:02d}" if day is not None else "")
    out = f"{year:04d}"
    if month is not None:
        out += f"-{month:02d}"
        if day is not None:
            out += f"-{day:02d}"
    return out


def _int_of(raw: str | None) -> int | None:
    if raw is None:
        return None
    v = _num_value(raw)
    return None if v is None or v != int(v) else int(v)


_NOT_AFTER_LETTER = r"(?<![A-Za-z0-9_.])"
_NOT_BEFORE_LETTER = r"(?![A-Za-z0-9_])"

_DATE_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    # 2024-03-15, 2024/03/15, 2024.03.15
    (
        re.compile(
            r"(?<![\d.])(?P<year>[12]\d{3})(?P<sep>[-/.])(?P<mon>\d{1,2})(?P=sep)(?P<day>\d{1,2})"
            r"(?![\d])"
        ),
        "ymd",
    ),
    # 2024年3月15日, 二〇二四年三月十五日, 2024年3月
    (
        re.compile(
            rf"(?P<year>[12]\d{{3}}|{_CN_DIGIT_CLASS}[〇零一二三四五六七八九]{{3}})\s*年"
            rf"\s*(?P<mon>{_CN_OR_D12})\s*月(?:份)?(?:\s*(?P<day>{_CN_OR_D12})\s*[日号號])?"
        ),
        "ymd",
    ),
    # 15.03.2024, 15-03-2024 (day first), 03/15/2024 (month first unless impossible)
    (
        re.compile(
            r"(?<![\d.])(?P<a>\d{1,2})(?P<sep>[-/.])(?P<b>\d{1,2})(?P=sep)(?P<year>[12]\d{3})"
            r"(?![\d])"
        ),
        "abY",
    ),
    # 15 March 2024, 15th of March, 2024
    (re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH},?\s+{_YEAR}\b"), "dmy"),
    # March 15, 2024
    (re.compile(rf"\b{_MONTH}\s+{_DAY},?\s+{_YEAR}\b"), "mdy"),
    # March 2024
    (re.compile(rf"\b{_MONTH},?\s+(?:of\s+)?{_YEAR}\b"), "my"),
    # 3月15日
    (re.compile(rf"(?P<mon>{_CN_OR_D12})\s*月\s*(?P<day>{_CN_OR_D12})\s*[日号號]"), "md"),
    # 15 March, March 15
    (re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH}(?![A-Za-z])"), "dm"),
    (re.compile(rf"\b{_MONTH}\s+{_DAY}(?![\d:])(?!\s*(?:%|percent))"), "md"),
    # 2024年 (a year), 3月 / 3月份 (a month)
    (re.compile(r"(?<![\d.])(?P<year>[12]\d{3})\s*年(?![代级])"), "y"),
    (
        re.compile(
            r"(?<![\d个個])(?P<mon>1[0-2]|0?[1-9]|十[一二]?|[一二三四五六七八九])\s*月(?:份)?"
            r"(?![亮球饼光])"
        ),
        "m",
    ),
]


def _match_date(m: re.Match[str], form: str) -> tuple[str, float | None] | None:
    g = m.groupdict()
    year = _int_of(g.get("year"))
    month: int | None
    day: int | None
    if form == "abY":
        a, b = int(g["a"]), int(g["b"])
        if g["sep"] == "/" and a <= 12:
            month, day = a, b  # 03/15/2024
        elif a > 12 or g["sep"] != "/":
            day, month = a, b  # 15.03.2024, 15/03/2024
        else:
            return None
        value = _date_value(year, month, day)
    else:
        mon = g.get("mon")
        if mon is None:
            month = None
        elif mon[0].isalpha() and mon.lower().rstrip(".") in _MONTHS:
            month = _MONTHS[mon.lower().rstrip(".")]
        else:
            month = _int_of(mon)
        day = _int_of(g.get("day"))
        if form == "y":
            if year is None or not 1000 <= year <= 2999:
                return None
            return str(year), None
        if month is None:
            return None
        value = _date_value(year, month, day)
    return (value, None) if value else None


_TIME_PATTERNS = [
    re.compile(
        r"(?<![\d:.])(?P<h>[01]?\d|2[0-3]):(?P<m>[0-5]\d)(?::[0-5]\d)?(?![\d:])"
        r"(?:\s*(?P<ap>[ap]\.?m\.?)(?![A-Za-z]))?",
        re.I,
    ),
    re.compile(r"(?<![\d:.])(?P<h>1[0-2]|0?[1-9])\s*(?P<ap>[ap]\.?m\.?)(?![A-Za-z])", re.I),
    re.compile(
        r"(?P<pre>上午|早上|早晨|凌晨|中午|下午|傍晚|晚上)?\s*(?<![\d.])(?P<h>[01]?\d|2[0-3])\s*[点點时時]"
        r"(?:\s*(?P<half>半)|\s*(?P<m>[0-5]?\d)\s*分)?"
    ),
]


def _match_time(m: re.Match[str]) -> float | None:
    g = m.groupdict()
    h = int(g["h"])
    minutes = int(g["m"]) if g.get("m") else (30 if g.get("half") else 0)
    ap = (g.get("ap") or "").lower().replace(".", "")
    pre = g.get("pre") or ""
    if ap == "pm" and h < 12:
        h += 12
    elif ap == "am" and h == 12:
        h = 0
    elif (pre in {"下午", "傍晚", "晚上"} and h < 12) or (pre == "中午" and h < 6):
        h += 12
    return float(h * 60 + minutes)


_PERCENT_PATTERNS = [
    re.compile(
        rf"(?P<num>{_DIGITS}|{_CN})\s*(?:%|％|percent\b|per\s?cent\b|pct\b|个百分点|個百分點)",
        re.I,
    ),
    re.compile(rf"百分之\s*(?P<num>{_DIGITS}|{_CN})"),
    re.compile(rf"\b(?P<num>{_EN_WORD_NUM})\s+(?:percent|per\s?cent)\b", re.I),
]

_MONEY_PATTERNS = [
    # $20, ¥1,200.50, US$3 million, $2.5m
    re.compile(rf"(?P<sym>{_SYMBOL_ALT})\s?(?P<num>{_DIGITS})(?P<mag>{_MAG}|{_MAG_SHORT})?"),
    # RMB 500, USD 20
    re.compile(rf"\b(?P<code>{_CODE_ALT})\s?(?P<num>{_DIGITS})(?P<mag>{_MAG})?"),
    # 500元, 5万元, 五百元, 20 USD, 20 dollars, 500 yuan
    re.compile(
        rf"(?P<num>{_DIGITS}|{_CN}|\b{_EN_WORD_NUM})(?P<mag>{_MAG})?\s*(?P<word>{_CUR_WORD_ALT})(?![A-Za-z])",
        re.I,
    ),
]

_DURATION_PATTERNS = [
    re.compile(rf"(?<![A-Za-z0-9_.])(?P<num>{_DIGITS})(?P<mag>)\s*-?\s*{_EN_DURATION}", re.I),
    re.compile(rf"\b(?P<num>{_EN_WORD_NUM}|an?(?!\s+second))(?P<mag>)[\s-]+{_EN_DURATION}", re.I),
    re.compile(
        rf"(?P<num>{_DIGITS}|{_CN}|半)(?P<mag>)\s*(?P<half>半)?\s*{_CN_DURATION}(?P<half2>半)?"
    ),
]

_NUMBER_PATTERNS = [
    # digits, with an optional magnitude: 1,200 / 3.5 / 1.5 million / 3万 / 21st
    re.compile(
        rf"(?<![A-Za-z0-9_])(?<!\d\.)(?<![A-Za-z]-)(?P<num>{_DIGITS})(?P<mag>{_MAG})?"
        rf"(?:st|nd|rd|th)?(?![A-Za-z0-9_])"
    ),
    # 第三, 第十五条
    re.compile(rf"第\s*(?P<num>{_CN})"),
    # 三十, 十五, 一百二十 (a digit and a unit character); 三个, 五位 (measure words, not 一)
    re.compile(
        rf"(?P<num>(?:{_CN_DIGIT_CLASS}[十百千万亿]|十{_CN_DIGIT_CLASS})[{_CN_NUM_CHARS}]*)"
    ),
    re.compile(r"(?P<num>[二两三四五六七八九])(?=[个位名次件家条项种张台份人])"),
    # "one" as a rate or count ("one per year", "one a day", "one each"): a number
    re.compile(r"\b(?P<num>one)(?=\s+(?:per|a|an|each|every)\b)", re.I),
    # English number words: two, twenty-five, five hundred ("one" and "zero" only with a scale)
    re.compile(rf"\b(?P<num>{_EN_WORD_NUM})\b", re.I),
]
_LONE_WORDS = frozenset({"one", "zero"})
_ONE_RATE = _NUMBER_PATTERNS[-2]
# A range of years with the second one shortened: 2018–19.
_YEAR_RANGE_RE = re.compile(r"(?<![\d.])(?P<y1>[12]\d{3})\s*[–—-]\s*(?P<y2>\d{2})(?![\d])")


def _mask_citations(text: str) -> str:
    return CITATION_MARKER_RE.sub(lambda m: " " * len(m.group()), text)


def extract_quantities(text: str) -> list[Quantity]:
    """All quantities of ``text`` in reading order.

    Numbers that are part of a date, amount, percentage or duration are not reported again as
    plain numbers; citation markers such as ``[M03]`` are not numbers.
    """
    if not isinstance(text, str):
        raise InputTypeError(f"text must be str, not {type(text).__name__}")
    return list(_extract_cached(text))


@lru_cache(maxsize=8192)
def _extract_cached(text: str) -> tuple[Quantity, ...]:
    # the same materials are analysed by many requests; Quantity is immutable
    return tuple(_extract(text))


def _extract(text: str) -> list[Quantity]:
    masked = _mask_citations(text)
    taken = bytearray(len(masked))
    found: list[_Found] = []

    def free(a: int, b: int) -> bool:
        return not any(taken[a:b])

    def take(f: _Found) -> None:
        for i in range(f.start, f.end):
            taken[i] = 1
        found.append(f)

    for pattern, form in _DATE_PATTERNS:
        for m in pattern.finditer(masked):
            if not free(m.start(), m.end()):
                continue
            got = _match_date(m, form)
            if got is not None:
                take(_Found("date", got[0], "", m.start(), m.end()))

    for pattern in _TIME_PATTERNS:
        for m in pattern.finditer(masked):
            if not free(m.start(), m.end()):
                continue
            minutes = _match_time(m)
            start = m.start("pre") if m.groupdict().get("pre") else m.start("h")
            if minutes is not None:
                take(_Found("number", minutes, "time", start, m.end()))

    for pattern in _PERCENT_PATTERNS:
        for m in pattern.finditer(masked):
            value: float | None = _num_value(m.group("num"))
            if value is None or not free(m.start(), m.end()):
                continue
            take(_Found("percent", value, "%", m.start(), m.end(), value))

    for pattern in _MONEY_PATTERNS:
        for m in pattern.finditer(masked):
            if not free(m.start(), m.end()):
                continue
            g = m.groupdict()
            value = _num_value(g["num"])
            if value is None:
                continue
            if g.get("sym"):
                currency = _CURRENCY_SYMBOLS[g["sym"]]
            elif g.get("code"):
                currency = _CURRENCY_CODES[g["code"]]
            else:
                currency = _CURRENCY_WORDS[g["word"].lower()]
            mag = g.get("mag")
            take(_Found("money", _apply_magnitude(value, mag), currency, m.start(), m.end(), value))

    for pattern in _DURATION_PATTERNS:
        for m in pattern.finditer(masked):
            if not free(m.start(), m.end()):
                continue
            g = m.groupdict()
            raw_num = g["num"]
            if raw_num.lower() in {"a", "an"}:
                value = 1.0
            elif raw_num == "半":
                value = 0.5
            else:
                value = _num_value(raw_num)
            if value is None:
                continue
            unit = g["unit"]
            if unit == "年" and len(raw_num) == 4 and (value >= 1000 or raw_num.isdigit()):
                continue  # a year, not a duration
            if g.get("half") or g.get("half2"):
                value += 0.5
            base, factor = _duration_unit(unit)
            take(_Found("duration", value * factor, base, m.start(), m.end(), value))

    for m in _YEAR_RANGE_RE.finditer(masked):
        if not free(m.start(), m.end()):
            continue
        first, second = int(m.group("y1")), int(m.group("y2"))
        century = first - first % 100
        if not first % 100 < second:
            continue
        take(_Found("number", float(first), "", m.start("y1"), m.end("y1"), float(first)))
        take(
            _Found(
                "number",
                float(century + second),
                "",
                m.start("y2"),
                m.end("y2"),
                float(century + second),
            )
        )

    for pattern in _NUMBER_PATTERNS:
        for m in pattern.finditer(masked):
            start, end = m.start("num"), m.end()
            if not free(start, end):
                continue
            if m.group("num").lower() in _LONE_WORDS and pattern is not _ONE_RATE:
                continue
            value = _num_value(m.group("num"))
            if value is None:
                continue
            value = _apply_magnitude(value, m.groupdict().get("mag"))
            take(_Found("number", value, "", start, end, value))

    found.sort(key=lambda f: f.start)
    _spread_ranges(masked, found)
    return [
        Quantity(f.kind, f.value, f.unit, f.start, f.end, text[f.start : f.end], f.number)
        for f in found
    ]


_RANGE_GAP_RE = re.compile(r"\s*(?:-|–|—|~|～|〜|至|到|to|or|或)\s*$", re.I)


def _spread_ranges(text: str, found: list[_Found]) -> None:
    """Give the first number of a range its second number's unit ("3-5 days", "3到5天")."""
    for i in range(len(found) - 1, 0, -1):
        q, nxt = found[i - 1], found[i]
        if q.kind != "number" or q.unit or nxt.kind not in {"duration", "percent", "money"}:
            continue
        if not nxt.number or not text[nxt.start : nxt.start + 1].isdigit():
            continue
        if not _RANGE_GAP_RE.fullmatch(text[q.end : nxt.start]):
            continue
        factor = float(nxt.value) / nxt.number
        found[i - 1] = _Found(nxt.kind, float(q.value) * factor, nxt.unit, q.start, q.end, q.number)


# ----------------------------------------------------------------------------------------------
# Matching


def _date_parts(value: str) -> tuple[str | None, str | None, str | None]:
    if value.startswith("--"):
        parts = value[2:].split("-")
        return None, parts[0], parts[1] if len(parts) > 1 else None
    parts = value.split("-")
    return parts[0], parts[1] if len(parts) > 1 else None, parts[2] if len(parts) > 2 else None


def _dates_match(claim: str, material: str) -> bool:
    """Whether a material date states everything a claim date says (it may say more)."""
    c, m = _date_parts(claim), _date_parts(material)
    return all(cp is None or cp == mp for cp, mp in zip(c, m, strict=True))


def _one_match(c: Quantity, m: Quantity) -> bool:
    if c.key == m.key:
        return True
    if c.kind == "date" and m.kind == "date":
        return _dates_match(str(c.value), str(m.value))
    if c.kind == "number" and c.unit == "":
        value = float(c.value)
        if m.number is not None and m.number == value and m.unit != "time":
            return True
        prefix = f"{int(value):04d}" if value == int(value) else ""
        return m.kind == "date" and bool(prefix) and str(m.value).startswith(prefix)
    if m.kind == "number" and m.unit == "":
        if c.kind == "date":
            year = _date_parts(str(c.value))[0]
            return year is not None and str(c.value) == year and float(m.value) == float(year)
        return c.number is not None and c.unit != "time" and c.number == float(m.value)
    return False


def _year_stated(year: str, material_qs: Sequence[Quantity]) -> bool:
    for m in material_qs:
        if m.kind == "date" and _date_parts(str(m.value))[0] == year:
            return True
        if m.kind == "number" and m.unit == "" and float(m.value) == float(year):
            return True
    return False


def _composed_date_match(c: Quantity, material_qs: Sequence[Quantity]) -> bool:
    """A claim date stated in pieces: month and day without a year, and the year elsewhere."""
    year, month, day = _date_parts(str(c.value))
    if year is None or month is None:
        return False
    for m in material_qs:
        if m.kind != "date":
            continue
        m_year, m_month, m_day = _date_parts(str(m.value))
        if m_year is None and m_month == month and (day is None or m_day == day):
            return _year_stated(year, material_qs)
    return False


def quantities_match(claim_q: Quantity, material_qs: Sequence[Quantity]) -> bool:
    """Whether the material states the claim's quantity.

    Equal keys match. A material date matches a claim date it makes more precise (claim
    "March 2024", material "2024-03-15"), and a claim date whose month and day the material
    states without a year matches when the material states that year elsewhere. A plain
    number matches a quantity written with the same number (claim "30", material "30 days")
    and a year matches a date in that year.
    """
    if any(_one_match(claim_q, m) for m in material_qs):
        return True
    return claim_q.kind == "date" and _composed_date_match(claim_q, material_qs)
