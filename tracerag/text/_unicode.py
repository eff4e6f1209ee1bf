"""Text that can be encoded and seen: lone surrogates and invisible-only strings.

A Python ``str`` may hold UTF-16 surrogate code points (U+D800–U+DFFF), for instance from JSON
such as ``"\\ud800"``. A pair of them stands for one character; a lone one stands for nothing
and cannot be encoded as UTF-8.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["first_lone_surrogate", "fix_surrogates", "is_invisible"]

_SURROGATE = re.compile("[\ud800-\udfff]")
_REPLACEMENT = "\ufffd"
# Characters with a visible category that render as nothing (Hangul and Braille fillers).
_BLANK = frozenset("\u115f\u1160\u3164\uffa0\u2800")
_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp", "Mn", "Me"})


def fix_surrogates(text: str) -> str:
    """The text with surrogate pairs joined into their character and lone ones as U+FFFD."""
    if text.isascii() or _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def first_lone_surrogate(text: str) -> int | None:
    """The index of the first lone surrogate once pairs are joined, or None if there is none."""
    if text.isascii() or _SURROGATE.search(text) is None:
        return None
    joined = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    match = _SURROGATE.search(joined)
    return match.start() if match else None


def is_invisible(text: str) -> bool:
    """Whether the text shows nothing: only whitespace, zero-width, control, format or
    combining characters and blank fillers (an empty string is invisible)."""
    return all(
        ch.isspace() or ch in _BLANK or unicodedata.category(ch) in _INVISIBLE_CATEGORIES
        for ch in text
    )
