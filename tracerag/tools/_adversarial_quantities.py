"""Number and date mutations of a claim: a changed amount, count or day the verifier must catch.

The numbers are read with the text module's extractor and its EN/ZH numeral tables; a changed
value never repeats another number of the same claim.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from datetime import date, timedelta

from tracerag.text._quantities import (
    _EN_UNITS,
    Quantity,
    extract_quantities,
    parse_chinese_number,
)

__all__ = ["quantity_mutations"]


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


def quantity_mutations(
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
