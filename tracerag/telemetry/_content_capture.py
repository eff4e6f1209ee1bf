"""What text may go onto a span: the content-capture policy, redaction and length caps.

The policy is resolved once (from ``TRACERAG_CAPTURE_CONTENT``, ``TRACERAG_CAPTURE_MAX_CHARS``
and ``OTEL_(SPAN_)ATTRIBUTE_VALUE_LENGTH_LIMIT``) the first time it is needed, and again only
after ``set_capture_content`` / ``set_redactor`` / ``set_capture_max_chars`` change it.

- mode ``true`` keeps prompt, answer and material text, ``false`` omits it, ``redact`` masks
  personal data with the redactor (``set_redactor``; ``default_redactor`` when none is set).
  A redactor installed with ``set_redactor`` applies in ``true`` mode as well.
- every captured text is cut to the cap (``TRACERAG_CAPTURE_MAX_CHARS``, default 8192
  characters, or the OpenTelemetry attribute value limit when that is lower) and a cut text
  ends with ``…[truncated N chars]`` so a reader sees it is not whole.

Ids, scores and verdicts are never affected.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from tracerag.config import get_config
from tracerag.errors import ConfigurationError

logger = logging.getLogger("tracerag.tracing")

CAPTURE_ENV = "TRACERAG_CAPTURE_CONTENT"  # "true" (default) | "false" | "redact"
MAX_CHARS_ENV = "TRACERAG_CAPTURE_MAX_CHARS"
DEFAULT_MAX_CHARS = 8192
OTEL_LIMIT_ENVS = ("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT")
TRUNCATION_MARK = "…[truncated {n} chars]"

CaptureMode = Literal["true", "false", "redact"]


@dataclass(frozen=True)
class CapturePolicy:
    """The content-capture policy in force: mode, redactor and the length cap (characters)."""

    mode: CaptureMode = "true"
    redactor: Callable[[str], str] | None = None
    max_chars: int | None = DEFAULT_MAX_CHARS

    @property
    def enabled(self) -> bool:
        """Whether any content (possibly redacted) goes onto spans."""
        return self.mode != "false"

    def apply(self, text: str | None) -> str | None:
        """Text as it may appear on a span, or None when content is omitted."""
        if text is None or self.mode == "false":
            return None
        if self.redactor is not None:
            text = self.redactor(text)
        elif self.mode == "redact":
            text = default_redactor(text)
        return truncate(text, self.max_chars)


def truncate(text: str, max_chars: int | None) -> str:
    """``text`` cut to ``max_chars`` characters, the truncation marker included, when longer."""
    if max_chars is None or len(text) <= max_chars:
        return text
    keep = max_chars
    while True:  # the marker's length depends on the count it reports
        mark = TRUNCATION_MARK.format(n=len(text) - keep)
        shorter = max(0, max_chars - len(mark))
        if shorter == keep:
            break
        keep = shorter
    if keep + len(mark) > max_chars:  # a cap shorter than the marker: plain cut
        return text[:max_chars]
    return text[:keep] + mark


_lock = threading.Lock()
_policy: CapturePolicy | None = None
_mode_override: CaptureMode | None = None
_redactor: Callable[[str], str] | None = None
_max_chars_override: int | None = None
_max_chars_set = False


def policy() -> CapturePolicy:
    """The policy in force (resolved from the environment once, then kept)."""
    found = _policy
    if found is None:
        found = _resolve()
    return found


def _resolve() -> CapturePolicy:
    global _policy
    with _lock:
        if _policy is not None:
            return _policy
        configured = get_config().capture_content
        mode = _mode_override or _normalise_mode(configured or "true", strict=False)
        max_chars = _max_chars_override if _max_chars_set else _env_max_chars()
        _policy = CapturePolicy(mode=mode, redactor=_redactor, max_chars=max_chars)
        return _policy


def _env_int(name: str) -> int | None:
    return _whole(name, os.environ.get(name, "").strip())


def _whole(name: str, value: str) -> int | None:
    if not value:
        return None
    try:
        number = int(value)
    except ValueError:
        logger.warning("tracerag: %s=%r is not a whole number; ignored", name, value)
        return None
    return number if number > 0 else None


def _env_max_chars() -> int | None:
    configured = (get_config().capture_max_chars or "").strip()
    own = _whole(MAX_CHARS_ENV, configured)
    if own is None and configured == "0":
        own = None  # 0: no cap of tracerag's own
    elif own is None:
        own = DEFAULT_MAX_CHARS
    otel = next((v for v in (_env_int(n) for n in OTEL_LIMIT_ENVS) if v is not None), None)
    limits = [v for v in (own, otel) if v is not None]
    return min(limits) if limits else None


def _invalidate() -> None:
    global _policy
    with _lock:
        _policy = None


def set_capture_content(mode: bool | str | None) -> None:
    """Set the capture policy in code (True/"true", False/"false", "redact"); None: use env."""
    global _mode_override
    _mode_override = None if mode is None else _normalise_mode(mode, strict=True)
    _invalidate()


def set_redactor(redactor: Callable[[str], str] | None) -> None:
    """Install a function applied to all captured text (e.g. to mask personal data)."""
    global _redactor
    _redactor = redactor
    _invalidate()


def set_capture_max_chars(max_chars: int | Literal["env"] | None) -> None:
    """Cap captured text at ``max_chars`` characters (None: no cap; "env": from the env)."""
    global _max_chars_override, _max_chars_set
    if max_chars == "env":
        _max_chars_set, _max_chars_override = False, None
    else:
        if max_chars is not None and (not isinstance(max_chars, int) or max_chars < 1):
            raise ConfigurationError(f"max_chars must be a positive int or None, not {max_chars!r}")
        _max_chars_set, _max_chars_override = True, max_chars
    _invalidate()


def reset() -> None:
    """Forget code settings and the resolved policy (the env is read again on next use)."""
    global _mode_override, _redactor, _max_chars_override, _max_chars_set
    _mode_override = None
    _redactor = None
    _max_chars_override, _max_chars_set = None, False
    _invalidate()


def capture_content_mode() -> CaptureMode:
    """The capture policy in force: "true", "false" or "redact"."""
    return policy().mode


def capture(text: str | None) -> str | None:
    """Text as it may appear on a span under the capture policy, or None when it is omitted."""
    if text is None:
        return None
    return policy().apply(text)


def capture_enabled() -> bool:
    """Whether any content (possibly redacted) goes onto spans."""
    return policy().enabled


def _normalise_mode(mode: bool | str, *, strict: bool) -> CaptureMode:
    if isinstance(mode, bool):
        return "true" if mode else "false"
    value = str(mode).strip().lower()
    if value in {"true", "1", "yes", "on", "full", ""}:
        return "true"
    if value in {"false", "0", "no", "off", "omit", "none"}:
        return "false"
    if value in {"redact", "redacted", "mask"}:
        return "redact"
    if strict:
        raise ConfigurationError(f"capture mode must be true, false or redact, not {mode!r}")
    logger.warning("tracerag: %s=%r not understood; omitting content", CAPTURE_ENV, mode)
    return "false"


_CN_ID = re.compile(
    r"(?<![0-9A-Za-z])[1-9]\d{5}(?:18|19|20)\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])\d{3}"
    r"[\dXx](?![0-9A-Za-z])"
)
_EMAIL = re.compile(r"(?<![\w.+-])[\w.+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
_CARD = re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])")
_CN_MOBILE = re.compile(r"(?<![\d+])(?:(?:\+|00)86[ -]?)?1[3-9]\d(?:[ -]?\d{4}){2}(?!\d)")
_PHONE_INTL = re.compile(r"(?<![\w+])\+\d{1,3}(?:[ .-]?\(?\d{1,4}\)?){2,5}(?!\d)")
_PHONE_LOCAL = re.compile(r"(?<!\d)(?:\(\d{2,4}\)[ .-]?|\d{3,4}[ .-])\d{3,4}[ .-]\d{4}(?!\d)")

REDACTION_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("[EMAIL]", _EMAIL),
    ("[ID_NUMBER]", _CN_ID),
    ("[PHONE]", _CN_MOBILE),
    ("[CARD_NUMBER]", _CARD),
    ("[PHONE]", _PHONE_INTL),
    ("[PHONE]", _PHONE_LOCAL),
)


def default_redactor(text: str) -> str:
    """Mask e-mail addresses, Chinese ID numbers, phone numbers (incl. Chinese mobiles) and
    card-like numbers (13-19 digits, spaces or dashes allowed) with ``[EMAIL]``,
    ``[ID_NUMBER]``, ``[PHONE]`` and ``[CARD_NUMBER]``."""
    for token, pattern in REDACTION_PATTERNS:
        text = pattern.sub(token, text)
    return text


__all__ = [
    "CAPTURE_ENV",
    "DEFAULT_MAX_CHARS",
    "MAX_CHARS_ENV",
    "REDACTION_PATTERNS",
    "CaptureMode",
    "CapturePolicy",
    "capture",
    "capture_content_mode",
    "capture_enabled",
    "default_redactor",
    "policy",
    "reset",
    "set_capture_content",
    "set_capture_max_chars",
    "set_redactor",
    "truncate",
]


#: ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` values that put content on spans
_GENAI_ON_SPANS = frozenset({"true", "1", "yes", "on", "span_only", "span_and_event"})


def genai_content_on_spans() -> bool:
    """Whether GenAI content attributes (``gen_ai.retrieval.documents``) go onto spans.

    Opt-in, as the OpenTelemetry GenAI instrumentations do it:
    ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` = ``true`` (or ``SPAN_ONLY`` /
    ``SPAN_AND_EVENT``), read at each call; unset or anything else, they are left out. The text
    they carry is then still under tracerag's own policy (``capture``: omitted, redacted, cut).
    """
    value = os.environ.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "")
    return value.strip().lower() in _GENAI_ON_SPANS
