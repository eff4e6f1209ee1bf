"""The desk's queues: per queue, the rubric reviewers score and how many reviewers an item needs.

A queue is the kind of item (the route that sent a request to people: ``escalate``,
``review``; other item kinds name their own queue). Configure it with a JSON file
(``TRACERAG_DESK_CONFIG`` / ``create_app(desk_config=...)``)::

    {
      "default": {"reviews": 1},
      "queues": {
        "escalate": {
          "reviews": 2,
          "rubric": [
            {"name": "grounded", "label": "Every claim is backed by the sentence it cites",
             "scale": [1, 5], "low": "no", "high": "fully", "required": true},
            {"name": "tone", "label": "The tone suits a customer", "scale": [1, 3]}
          ]
        }
      }
    }

``reviews``: how many reviewers judge each item before it is settled (1 to 5; with more than
one, disagreeing judgements leave the item disputed until one more settles it). ``rubric``: the
score dimensions — ``name`` (a short identifier, the column of the exported dataset), ``label``
(the question reviewers see), ``scale`` (whole numbers from low to high, at most 11 steps),
optional ``low``/``high`` words for the ends, and ``required`` (the judgement is refused without
it). A queue without its own entry takes ``default``; without a file every queue takes
``DEFAULT_RUBRIC`` and one reviewer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracerag.errors import ConfigurationError

MAX_REVIEWS = 5
MAX_STEPS = 11
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,39}$")


@dataclass(frozen=True)
class Dimension:
    """One thing reviewers score, on a scale of whole numbers."""

    name: str
    label: str
    low: int = 1
    high: int = 5
    low_label: str = ""
    high_label: str = ""
    required: bool = False

    @property
    def steps(self) -> list[int]:
        return list(range(self.low, self.high + 1))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "label": self.label,
            "scale": [self.low, self.high],
            "low": self.low_label,
            "high": self.high_label,
            "required": self.required,
        }


DEFAULT_RUBRIC = (
    Dimension(
        "grounded",
        "Every claim is backed by the sentence it cites",
        1,
        5,
        "not at all",
        "fully",
    ),
    Dimension("complete", "It answers the whole question", 1, 5, "not at all", "fully"),
)


@dataclass(frozen=True)
class QueueRules:
    """How one queue's items are reviewed."""

    reviews: int = 1
    rubric: tuple[Dimension, ...] = DEFAULT_RUBRIC

    def scores_from(self, form: Mapping[str, str]) -> tuple[dict[str, int], list[str]]:
        """The rubric scores given in a form (``score.<name>`` fields), and what is wrong."""
        scores: dict[str, int] = {}
        problems: list[str] = []
        for dim in self.rubric:
            raw = (form.get(f"score.{dim.name}") or "").strip()
            if not raw:
                if dim.required:
                    problems.append(f"score “{dim.label}” ({dim.low}–{dim.high})")
                continue
            try:
                value = int(raw)
            except ValueError:
                problems.append(f"“{dim.label}” takes a whole number")
                continue
            if not dim.low <= value <= dim.high:
                problems.append(f"“{dim.label}” is scored {dim.low}–{dim.high}")
                continue
            scores[dim.name] = value
        return scores, problems

    def check_scores(self, scores: Mapping[str, Any]) -> list[str]:
        """What is wrong with scores given as JSON (unknown names, out of scale, missing)."""
        known = {d.name: d for d in self.rubric}
        problems = [f"unknown rubric dimension {name!r}" for name in scores if name not in known]
        for dim in self.rubric:
            value = scores.get(dim.name)
            if value is None:
                if dim.required:
                    problems.append(f"score {dim.name} ({dim.low}-{dim.high}) is required")
            elif (
                isinstance(value, bool)
                or not isinstance(value, int)
                or not dim.low <= value <= dim.high
            ):
                problems.append(f"score {dim.name} is a whole number {dim.low}-{dim.high}")
        return problems

    def to_dict(self) -> dict[str, Any]:
        return {"reviews": self.reviews, "rubric": [d.to_dict() for d in self.rubric]}


@dataclass(frozen=True)
class DeskConfig:
    """The rules of every queue (``rules(queue)``)."""

    default: QueueRules = field(default_factory=QueueRules)
    queues: Mapping[str, QueueRules] = field(default_factory=dict)

    def rules(self, queue: str | None) -> QueueRules:
        return self.queues.get(queue or "", self.default)

    @property
    def dimensions(self) -> list[Dimension]:
        """Every dimension of every queue, each name once (the export's score columns)."""
        seen: dict[str, Dimension] = {}
        for rules in (self.default, *self.queues.values()):
            for dim in rules.rubric:
                seen.setdefault(dim.name, dim)
        return list(seen.values())

    @classmethod
    def from_mapping(cls, data: Any, where: str = "desk config") -> DeskConfig:
        if not isinstance(data, Mapping):
            raise ConfigurationError(f"{where}: expected a JSON object")
        unknown = set(data) - {"default", "queues"}
        if unknown:
            raise ConfigurationError(f"{where}: unknown keys {sorted(unknown)}")
        default = _rules(data.get("default", {}), f"{where}: default", QueueRules())
        raw_queues = data.get("queues", {})
        if not isinstance(raw_queues, Mapping):
            raise ConfigurationError(f"{where}: 'queues' is an object of queue names")
        queues = {
            str(name): _rules(spec, f"{where}: queue {name!r}", default)
            for name, spec in raw_queues.items()
        }
        return cls(default, queues)

    @classmethod
    def from_file(cls, path: str | Path) -> DeskConfig:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigurationError(f"desk config {path}: {exc.strerror or exc}") from None
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigurationError(f"desk config {path}: not valid JSON ({exc})") from None
        return cls.from_mapping(data, f"desk config {path}")


def _rules(spec: Any, where: str, fallback: QueueRules) -> QueueRules:
    if not isinstance(spec, Mapping):
        raise ConfigurationError(f"{where}: expected an object with 'reviews' and 'rubric'")
    unknown = set(spec) - {"reviews", "rubric"}
    if unknown:
        raise ConfigurationError(f"{where}: unknown keys {sorted(unknown)}")
    reviews = spec.get("reviews", fallback.reviews)
    if isinstance(reviews, bool) or not isinstance(reviews, int) or not 1 <= reviews <= MAX_REVIEWS:
        raise ConfigurationError(f"{where}: 'reviews' is a whole number from 1 to {MAX_REVIEWS}")
    if "rubric" not in spec:
        return QueueRules(reviews, fallback.rubric)
    raw = spec["rubric"]
    if not isinstance(raw, list):
        raise ConfigurationError(f"{where}: 'rubric' is a list of dimensions")
    dims: list[Dimension] = []
    for i, item in enumerate(raw, 1):
        dims.append(_dimension(item, f"{where}: rubric item {i}"))
    names = [d.name for d in dims]
    if len(set(names)) != len(names):
        raise ConfigurationError(f"{where}: rubric dimension names repeat")
    return QueueRules(reviews, tuple(dims))


def _dimension(item: Any, where: str) -> Dimension:
    if not isinstance(item, Mapping):
        raise ConfigurationError(f"{where}: expected an object")
    unknown = set(item) - {"name", "label", "scale", "low", "high", "required"}
    if unknown:
        raise ConfigurationError(f"{where}: unknown keys {sorted(unknown)}")
    name = item.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigurationError(
            f"{where}: 'name' is a short identifier (a letter, then letters, digits or _)"
        )
    label = item.get("label", name)
    if not isinstance(label, str) or not label.strip() or len(label) > 200:
        raise ConfigurationError(f"{where}: 'label' is text of up to 200 characters")
    scale = item.get("scale", [1, 5])
    if (
        not isinstance(scale, list)
        or len(scale) != 2
        or any(isinstance(v, bool) or not isinstance(v, int) for v in scale)
        or not scale[0] < scale[1]
        or scale[1] - scale[0] + 1 > MAX_STEPS
    ):
        raise ConfigurationError(
            f"{where}: 'scale' is [low, high], whole numbers, low < high, at most {MAX_STEPS} steps"
        )
    words = []
    for key in ("low", "high"):
        word = item.get(key, "")
        if not isinstance(word, str) or len(word) > 40:
            raise ConfigurationError(f"{where}: {key!r} is a word or two (up to 40 characters)")
        words.append(word)
    required = item.get("required", False)
    if not isinstance(required, bool):
        raise ConfigurationError(f"{where}: 'required' is true or false")
    return Dimension(name, label.strip(), scale[0], scale[1], words[0], words[1], required)


__all__ = ["DEFAULT_RUBRIC", "DeskConfig", "Dimension", "QueueRules"]
