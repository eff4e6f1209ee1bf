"""Labelled rows for ``tracerag calibrate``: a JSON-lines file, or the review desk's decisions.

Each row gives the signals a request recorded and whether its answer was right; a row that
cannot be read is an error that names it, not a row dropped.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracerag.errors import InputError
from tracerag.signals._confidence import Signals
from tracerag.signals._rules import RuleResult
from tracerag.tools._desk_dataset import desk_rows

if TYPE_CHECKING:
    from tracerag.store._base import AuditStore

__all__ = [
    "Example",
    "desk_examples",
    "examples_hash",
    "label_of",
    "read_examples",
    "signals_from_row",
]


_TRUE_WORDS = frozenset(
    {"correct", "right", "true", "yes", "y", "1", "approve", "approved", "good", "pass"}
)
_FALSE_WORDS = frozenset(
    {
        "incorrect",
        "wrong",
        "false",
        "no",
        "n",
        "0",
        "reject",
        "rejected",
        "edit",
        "edited",
        "bad",
        "fail",
    }
)


# ----------------------------------------------------------------------------------------------
# Reading labelled data


@dataclass(frozen=True)
class Example:
    """One labelled response: its signals and whether the answer was right."""

    signals: Signals
    correct: bool
    meta: dict[str, Any] = field(default_factory=dict)


def label_of(row: Mapping[str, Any]) -> bool | None:
    """The row's label (``correct`` or ``label``) as a bool; None when it has none."""
    for key in ("correct", "label"):
        if key not in row or row[key] is None:
            continue
        value = row[key]
        if isinstance(value, bool):
            return value
        if isinstance(value, (int, float)) and value in (0, 1):
            return bool(value)
        if isinstance(value, str):
            word = value.strip().lower()
            if word in _TRUE_WORDS:
                return True
            if word in _FALSE_WORDS:
                return False
        raise InputError(f"cannot read label {key}={value!r}: use true/false, 1/0 or a word")
    return None


def _float(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None if value is None else float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    raise InputError(f"expected a number, got {value!r}")


def _bool(value: Any) -> bool | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return bool(value)
    if isinstance(value, list):  # e.g. fabricated_citations
        return bool(value)
    raise InputError(f"expected true/false, got {value!r}")


def _rules(raw: Any) -> tuple[RuleResult, ...]:
    out = []
    for r in raw or []:
        if isinstance(r, Mapping):
            out.append(
                RuleResult(
                    name=str(r.get("name", "rule")),
                    passed=bool(r.get("passed")),
                    required=bool(r.get("required")),
                    detail=str(r.get("detail") or ""),
                )
            )
    return tuple(out)


def signals_from_row(row: Mapping[str, Any]) -> Signals:
    """The Signals of a data row: a ``signals`` object, or a record's/Response's detail."""
    if (
        isinstance(row.get("signals"), Mapping)
        and "signal_detail" not in row
        and not (isinstance(row.get("response"), Mapping) and "signal_detail" in row["response"])
    ):
        s = row["signals"]
        fabricated = s.get("fabricated", s.get("fabricated_citations"))
    else:
        detail = row.get("signal_detail")
        if detail is None and isinstance(row.get("response"), Mapping):
            detail = row["response"].get("signal_detail")
        if not isinstance(detail, Mapping):
            raise InputError("row has neither 'signals' nor 'signal_detail'")
        s = detail
        fabricated = s.get("fabricated_citations", s.get("fabricated"))
    samples_ok = s.get("samples_ok")
    informative = s.get("consistency_informative")
    return Signals(
        citation_score=_float(s.get("citation_score")),
        fabricated=bool(_bool(fabricated)),
        self_consistency=_float(s.get("self_consistency")),
        consistency_informative=True if informative is None else bool(informative),
        plan_ok=_bool(s.get("plan_ok")),
        rules=_rules(s.get("rules")),
        retrieval_margin=_float(s.get("retrieval_margin")),
        retrieval_top_score=_float(s.get("retrieval_top_score")),
        samples_ok=1 if samples_ok is None else int(samples_ok),
        n_samples=int(s.get("n_samples") or s.get("samples_ok") or 1),
        semantic_entropy=_float(s.get("semantic_entropy")),
        citation_coverage=_float(s.get("citation_coverage")),
    )


def _rows(text: str, where: str) -> Iterable[tuple[str, Any]]:
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise InputError(f"{where}: not valid JSON ({exc})") from None
        for i, row in enumerate(data, 1):
            yield f"{where} item {i}", row
        return
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield f"{where}:{number}", json.loads(line)
        except ValueError as exc:
            reason = getattr(exc, "msg", exc)
            raise InputError(f"{where}:{number}: not valid JSON ({reason})") from None


def read_examples(path: str | Path) -> tuple[list[Example], int]:
    """The labelled examples of a JSON-lines file, and how many rows had no label."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    examples: list[Example] = []
    unlabelled = 0
    for where, row in _rows(text, str(path)):
        if not isinstance(row, Mapping):
            raise InputError(f"{where}: expected a JSON object")
        try:
            label = label_of(row)
            if label is None:
                unlabelled += 1
                continue
            signals = signals_from_row(row)
        except InputError as exc:
            raise InputError(f"{where}: {exc}") from None
        meta = {k: row[k] for k in ("question", "mutation", "seed") if k in row}
        examples.append(Example(signals, label, meta))
    return examples, unlabelled


def desk_examples(store: AuditStore, route: str | None = None) -> tuple[list[Example], int]:
    """The review desk's decided items as labelled examples (``tracerag desk export``): the
    signals the pipeline recorded for the answer, and the reviewers' verdict on it. Returns the
    examples and how many decided items had no recorded signals (records from before
    ``signal_detail``) and were skipped.

    The desk only sees answers routed to people, so these labels cover the confidence range
    below the pass threshold; labelled passed answers (a DATA.jsonl) cover the rest.
    """
    examples: list[Example] = []
    skipped = 0
    for row in desk_rows(store, route=route):
        label = label_of(row)
        if label is None:
            continue
        if not isinstance(row.get("signal_detail"), Mapping):
            skipped += 1
            continue
        decision = row.get("decision") or {}
        meta = {
            "request_id": row.get("request_id"),
            "question": row.get("question"),
            "action": decision.get("action"),
            "reviewer": decision.get("reviewer"),
            "confidence": row.get("confidence"),
        }
        examples.append(Example(signals_from_row(row), label, meta))
    return examples, skipped


def examples_hash(examples: Sequence[Example]) -> str:
    digest = hashlib.sha256()
    for e in examples:
        line = json.dumps(
            [e.meta.get("request_id"), e.correct, e.meta.get("action")], ensure_ascii=False
        )
        digest.update(line.encode("utf-8") + b"\n")
    return "sha256:" + digest.hexdigest()
