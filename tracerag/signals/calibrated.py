"""Calibrated confidence: a fitted calibration file turned into a ``Combiner``.

``CalibratedCombiner.from_file(path)`` reads a file written by ``tracerag calibrate`` (see
``tracerag.tools.calibration`` for the fitting); its ``name`` is the calibration id, e.g.
``logistic-3f2a9c1b``, which every Response records in ``calibration``. Setting
``TRACERAG_CALIBRATION=path`` makes ``default_combiner()`` load it.

The calibration file: ``format`` ("tracerag.calibration"), ``format_version``, ``id``,
``method``, ``features``, ``model`` (coefficients or breakpoints), ``fitted_at``, ``n``,
``n_correct``, and ``provenance`` (data hash and evaluation figures). The id is the method and
the first 8 hex digits of the SHA-256 of the canonical JSON of format version, method,
features, model and n; loading a file whose content does not match its id fails.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracerag._routing import Thresholds
from tracerag.config import get_config
from tracerag.errors import ConfigurationError
from tracerag.signals._confidence import Combined, Combiner, HeuristicCombiner, Signals, finish

__all__ = [
    "CalibratedCombiner",
    "Calibration",
    "default_combiner",
    "heuristic_confidence",
    "load_calibration",
]

FORMAT = "tracerag.calibration"
FORMAT_VERSION = 1
CALIBRATION_ENV = "TRACERAG_CALIBRATION"
METHODS = ("logistic", "isotonic")
#: The signals the logistic calibration reads, in order.
FEATURES = (
    "citation_score",
    "self_consistency",
    "plan_ok",
    "fabricated",
    "retrieval_margin",
    "semantic_entropy",
    "citation_coverage",
)
FAILED_RULE_FACTOR = 0.85


def feature_values(signals: Signals) -> dict[str, float | None]:
    """The logistic features of a response (None: not measured)."""
    consistency = signals.self_consistency if signals.consistency_informative else None
    return {
        "citation_score": signals.citation_score,
        "self_consistency": consistency,
        "plan_ok": None if signals.plan_ok is None else float(signals.plan_ok),
        "fabricated": float(signals.fabricated),
        "retrieval_margin": signals.retrieval_margin,
        "semantic_entropy": signals.semantic_entropy,
        "citation_coverage": signals.citation_coverage,
    }


def heuristic_confidence(signals: Signals, cap: float | None = None) -> float:
    """The default combiner's (``heuristic-v1``) confidence for these signals."""
    cap = Thresholds().cap if cap is None else cap
    return HeuristicCombiner()(signals, cap=cap).value


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-min(40.0, max(-40.0, z))))


def _interp(x: float, xs: Sequence[float], ys: Sequence[float]) -> float:
    """Piecewise-linear interpolation, clamped at the ends (as numpy.interp)."""
    if x <= xs[0]:
        return float(ys[0])
    if x >= xs[-1]:
        return float(ys[-1])
    i = bisect.bisect_right(xs, x)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    if x1 == x0:
        return float(y1)
    return float(y0 + (y1 - y0) * (x - x0) / (x1 - x0))


# ----------------------------------------------------------------------------------------------
# The calibration and its file


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _round(values: Iterable[float], digits: int = 10) -> list[float]:
    return [round(float(v), digits) for v in values]


@dataclass(frozen=True)
class Calibration:
    """A fitted map from signals to the probability that an answer is right."""

    method: str
    features: tuple[str, ...]
    model: dict[str, Any]
    n: int
    n_correct: int
    fitted_at: str
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        """``<method>-<8 hex digits>``: a hash of what determines the predictions."""
        content = {
            "format_version": FORMAT_VERSION,
            "method": self.method,
            "features": list(self.features),
            "model": self.model,
            "n": self.n,
        }
        digest = hashlib.sha256(_canonical(content).encode("utf-8")).hexdigest()
        return f"{self.method}-{digest[:8]}"

    def probability(self, signals: Signals) -> float:
        """The calibrated probability that an answer with these signals is right (no caps)."""
        if self.method == "logistic":
            values = feature_values(signals)
            m = self.model
            z = float(m["intercept"])
            for name, coef, mean, scale, impute in zip(
                self.features, m["coefficients"], m["mean"], m["scale"], m["impute"], strict=True
            ):
                v = values.get(name)
                v = impute if v is None else v
                z += coef * (v - mean) / scale
            return _sigmoid(z)
        if self.method == "isotonic":
            x = heuristic_confidence(signals, self.model.get("heuristic_cap"))
            xs, ys = self.model["x"], self.model["y"]
            if not xs:
                return 0.0
            return _interp(x, xs, ys)
        raise ConfigurationError(f"unknown calibration method {self.method!r}")

    def to_dict(self) -> dict[str, Any]:
        """The file's JSON content."""
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "id": self.id,
            "method": self.method,
            "features": list(self.features),
            "model": self.model,
            "fitted_at": self.fitted_at,
            "n": self.n,
            "n_correct": self.n_correct,
            "provenance": self.provenance,
        }

    def save(self, path: str | Path) -> Path:
        """Write the calibration file (JSON) and return its path."""
        path = Path(path)
        if path.parent and not path.parent.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )
        return path

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "calibration") -> Calibration:
        """Read a calibration file's content; checks format, version, fields and id."""
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            raise ConfigurationError(f"{where} is not a tracerag calibration file")
        version = data.get("format_version")
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise ConfigurationError(
                f"{where} has format version {version!r}; this tracerag reads up to "
                f"{FORMAT_VERSION}: upgrade tracerag or refit"
            )
        method = data.get("method")
        if method not in METHODS:
            raise ConfigurationError(f"{where}: unknown method {method!r}")
        model = data.get("model")
        features = tuple(data.get("features") or ())
        needed: tuple[str, ...] = ("intercept", "coefficients", "mean", "scale", "impute")
        if method == "isotonic":
            needed = ("x", "y")
        if not isinstance(model, Mapping) or any(k not in model for k in needed):
            raise ConfigurationError(f"{where}: the {method} model needs {', '.join(needed)}")
        if method == "logistic":
            unknown = set(features) - set(FEATURES)
            if unknown or any(len(model[k]) != len(features) for k in needed[1:]):
                raise ConfigurationError(f"{where}: features and coefficients do not match")
        elif len(model["x"]) != len(model["y"]):
            raise ConfigurationError(f"{where}: isotonic x and y differ in length")
        calibration = cls(
            method=method,
            features=features,
            model=dict(model),
            n=int(data.get("n") or 0),
            n_correct=int(data.get("n_correct") or 0),
            fitted_at=str(data.get("fitted_at") or ""),
            provenance=dict(data.get("provenance") or {}),
        )
        if data.get("id") != calibration.id:
            raise ConfigurationError(
                f"{where}: its id {data.get('id')!r} does not match its content "
                f"({calibration.id}); the file was changed after fitting"
            )
        return calibration


def load_calibration(path: str | Path) -> Calibration:
    """Read and check a calibration file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigurationError(f"cannot read calibration {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ConfigurationError(f"calibration {path} is not valid JSON ({exc})") from None
    return Calibration.from_dict(data, where=f"calibration {path}")


class CalibratedCombiner:
    """A ``Combiner`` giving the fitted probability, with the heuristic's caps and rule factors.

    Its ``name`` is the calibration id, which every Response records in ``calibration``.
    """

    def __init__(
        self, calibration: Calibration, *, failed_rule_factor: float = FAILED_RULE_FACTOR
    ) -> None:
        self.calibration = calibration
        self.failed_rule_factor = failed_rule_factor
        self.name = calibration.id

    def __repr__(self) -> str:
        return f"CalibratedCombiner({self.name})"

    @classmethod
    def from_file(cls, path: str | Path, **options: Any) -> CalibratedCombiner:
        """The combiner of a calibration file written by ``tracerag calibrate``."""
        return cls(load_calibration(path), **options)

    def __call__(self, signals: Signals, *, cap: float) -> Combined:
        if signals.samples_ok == 0:
            return Combined(0.0, ["no successful sample"])
        value = self.calibration.probability(signals)
        parts = {"calibrated": round(value, 6)}
        return finish(value, signals, cap=cap, parts=parts, rule_factor=self.failed_rule_factor)


def default_combiner(path: str | None = None) -> Combiner:
    """The combiner of the calibration file at ``path`` (else ``TRACERAG_CALIBRATION``), or
    ``heuristic-v1`` when neither names one."""
    if path is None:
        path = get_config().calibration
    if not path:
        return HeuristicCombiner()
    try:
        return CalibratedCombiner.from_file(path)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{CALIBRATION_ENV}={path}: {exc}") from None
