"""Comparing the two arms of ``tracerag eval``: the gate, the changed decisions, the report.

The gate fails when the candidate is worse than the baseline by more than the margin on a
gated indicator; the report renders both arms side by side (also for ``tracerag show``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tracerag.tools._eval_results import (
    DECISIONS,
    DEFAULT_GATE,
    DEFAULT_MARGIN,
    INDICATORS,
    ArmResult,
    Outcome,
)

__all__ = ["EvalReport", "changed_decisions", "gate", "render_report"]


# ---------------------------------------------------------------------------------------------
# Comparison


def gate(
    baseline: Mapping[str, float | None],
    candidate: Mapping[str, float | None],
    *,
    indicators: Sequence[str] = DEFAULT_GATE,
    margins: Mapping[str, float] | None = None,
    default_margin: float = DEFAULT_MARGIN,
) -> list[dict[str, Any]]:
    """The gated indicators on which the candidate is worse than the baseline by more than the
    margin, or not measurable where the baseline was (empty: the gate passes)."""
    failures = []
    for name in indicators:
        label, higher_is_better = INDICATORS[name]
        margin = (margins or {}).get(name, default_margin)
        base, cand = baseline.get(name), candidate.get(name)
        if base is None:
            continue  # nothing to hold the candidate to
        if cand is None:
            failures.append(
                {
                    "indicator": name,
                    "label": label,
                    "baseline": base,
                    "candidate": None,
                    "margin": margin,
                    "why": f"{label}: not measurable for the candidate (baseline {_pct(base)})",
                }
            )
            continue
        worse_by = (base - cand) if higher_is_better else (cand - base)
        if worse_by > margin + 1e-12:
            failures.append(
                {
                    "indicator": name,
                    "label": label,
                    "baseline": base,
                    "candidate": cand,
                    "margin": margin,
                    "why": f"{label} {_pct(base)} → {_pct(cand)}: worse by "
                    f"{worse_by * 100:.1f} pt (margin {margin * 100:.1f} pt)",
                }
            )
    return failures


def changed_decisions(
    baseline: Sequence[Outcome], candidate: Sequence[Outcome]
) -> list[dict[str, Any]]:
    """Questions whose decision differs between the two runs, with both request ids."""
    by_id = {o.question_id: o for o in candidate}
    out = []
    for b in baseline:
        c = by_id.get(b.question_id)
        if c is not None and c.decision != b.decision:
            out.append(
                {
                    "question_id": b.question_id,
                    "baseline": b.decision,
                    "candidate": c.decision,
                    "baseline_request_id": b.request_id,
                    "candidate_request_id": c.request_id,
                    "baseline_confidence": b.confidence,
                    "candidate_confidence": c.confidence,
                }
            )
    return out


@dataclass
class EvalReport:
    """Baseline against candidate over one question set, and the gate's verdict."""

    run_id: str
    questions_file: str
    questions: int
    settings: dict[str, Any]
    baseline: ArmResult
    candidate: ArmResult
    gated: list[str]
    margins: dict[str, float]
    failures: list[dict[str, Any]]
    changed: list[dict[str, Any]]

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "questions_file": self.questions_file,
            "questions": self.questions,
            "settings": self.settings,
            "baseline": self.baseline.to_dict(),
            "candidate": self.candidate.to_dict(),
            "gate": {
                "indicators": self.gated,
                "margins": self.margins,
                "ok": self.ok,
                "failures": self.failures,
            },
            "changed_decisions": self.changed,
        }

    def render(self) -> str:
        return render_report(self.to_dict())


def _pct(value: Any) -> str:
    return "-" if value is None else f"{float(value) * 100:.1f}%"


def _num(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _money(value: Any) -> str:
    return "-" if value is None else f"{float(value):.4f}"


def render_report(report: Mapping[str, Any]) -> str:
    """A report (``EvalReport.to_dict()``) as a side-by-side table for people."""
    b, c = report["baseline"], report["candidate"]
    g = report["gate"]
    failed = {f["indicator"] for f in g["failures"]}
    s = report.get("settings") or {}
    lines = [
        f"tracerag eval — {report['questions']} questions from {report['questions_file']}, "
        f"run {report['run_id']}",
        f"  baseline   {b['arm']}  (prompt {b['prompt_version']}, model {b['model_version']})",
        f"  candidate  {c['arm']}  (prompt {c['prompt_version']}, model {c['model_version']})",
        f"  {s.get('samples')} samples at temperature {s.get('temperature')}, tier "
        f"{s.get('tier')}, seed {s.get('seed')}"
        + (f", prices {s['prices']}" if s.get("prices") else ", no price table (tokens only)"),
        "",
        f"{'':<34}{'baseline':>16}{'candidate':>16}{'change':>12}  gate",
    ]
    for name, (label, _) in INDICATORS.items():
        bv, cv = b["indicators"].get(name), c["indicators"].get(name)
        if bv is None and cv is None:
            continue
        change = f"{(cv - bv) * 100:+.1f} pt" if bv is not None and cv is not None else "-"
        mark = ""
        if name in g["indicators"]:
            mark = "FAIL" if name in failed else "ok"
        lines.append(f"{label:<34}{_pct(bv):>16}{_pct(cv):>16}{change:>12}  {mark}".rstrip())

    def row(label: str, left: str, right: str) -> None:
        lines.append(f"{label:<34}{left:>16}{right:>16}")

    def routes(a: Mapping[str, Any]) -> str:
        return " / ".join(str(a["counts"].get(d, 0)) for d in DECISIONS)

    row("pass / review / escalate", routes(b), routes(c))
    for key in ("mean", "p10", "p50", "p90"):
        row(f"confidence {key}", _num(b["confidence"][key]), _num(c["confidence"][key]))

    def bands(a: Mapping[str, Any]) -> str:
        bands = a["confidence"]["bands"]
        return " / ".join(str(bands[k]) for k in ("below_review", "review_band", "pass_band"))

    row("confidence <0.6 / mid / >=0.85", bands(b), bands(c))
    row("model calls", _num(b["cost"]["model_calls"]), _num(c["cost"]["model_calls"]))
    row(
        "calls / samples per request",
        f"{_num(b['cost'].get('calls_per_request'), 2)} / "
        f"{_num(b['cost'].get('samples_per_request'), 2)}",
        f"{_num(c['cost'].get('calls_per_request'), 2)} / "
        f"{_num(c['cost'].get('samples_per_request'), 2)}",
    )
    row(
        "tokens per request",
        _num(b["cost"]["tokens_per_request"], 1),
        _num(c["cost"]["tokens_per_request"], 1),
    )
    row(
        "tokens per passed answer",
        _num(b["cost"]["tokens_per_passed_answer"], 1),
        _num(c["cost"]["tokens_per_passed_answer"], 1),
    )
    if s.get("prices"):
        row(
            "cost per request",
            _money(b["cost"]["cost_per_request"]),
            _money(c["cost"]["cost_per_request"]),
        )
        row(
            "cost per passed answer",
            _money(b["cost"]["cost_per_passed_answer"]),
            _money(c["cost"]["cost_per_passed_answer"]),
        )
    row("latency p50 / p95 (s)", _lat(b["latency"]), _lat(c["latency"]))
    changed = report["changed_decisions"]
    lines += ["", f"decision changed on {len(changed)} of {report['questions']} questions"]
    for ch in changed:
        lines.append(
            f"  {ch['question_id']:<26} {ch['baseline']} → {ch['candidate']:<9} "
            f"baseline {ch['baseline_request_id']}  candidate {ch['candidate_request_id']}"
        )
    lines.append("")
    if g["ok"]:
        lines.append(
            "result: PASS — the candidate is nowhere worse than the baseline by more than the "
            "margin on " + ", ".join(g["indicators"])
        )
    else:
        lines.append("result: FAIL — " + "; ".join(f["why"] for f in g["failures"]))
    return "\n".join(lines) + "\n"


def _lat(latency: Mapping[str, Any]) -> str:
    return f"{_num(latency.get('p50_s'), 3)} / {_num(latency.get('p95_s'), 3)}"
