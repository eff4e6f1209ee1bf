"""Fitted confidence: learn from labelled responses how often answers with given signals are right.

``tracerag calibrate DATA.jsonl`` fits a calibration and writes it to a versioned JSON file
(``--from-desk`` adds, or alone uses, the review desk's decisions in the audit store as labels:
approve is a correct answer, edit and reject are not — see ``desk_examples``);
``CalibratedCombiner.from_file(path)`` turns it into a ``Combiner`` whose ``name`` — the
calibration id, e.g. ``logistic-3f2a9c1b`` — every Response records in ``calibration``. Set
``TRACERAG_CALIBRATION=path`` to have ``default_combiner()`` load it.

Data: one JSON object per line (a JSON array is accepted too). Either a row of signals::

    {"signals": {"citation_score": 1.0, "self_consistency": 0.8, "plan_ok": true,
                 "fabricated": false, "retrieval_margin": 0.12, "semantic_entropy": 0.5,
                 "citation_coverage": 1.0, "samples_ok": 5}, "correct": true}

or a stored record or Response — anything with ``signal_detail`` at the top level or under
``response`` (``fabricated_citations`` and ``rules`` are read from it) — plus the label. The
label is ``correct`` or ``label``: true/false, 1/0, or a word (``correct``, ``right``, ``yes``,
``approve`` are true; ``incorrect``, ``wrong``, ``no``, ``reject``, ``edit`` are false). Rows
without a label are skipped and counted. Missing signals are allowed (``null``).

Methods (numpy only):

``logistic``
    L2-regularised logistic regression on the signals above (standardised; a missing value
    takes the training mean), fitted by Newton's method (IRLS).
``isotonic``
    a monotone map from the heuristic confidence (``heuristic-v1``) to the observed share of
    right answers, fitted by pool-adjacent-violators and interpolated linearly.

Either way the combiner keeps the heuristic's hard rules: a fabricated citation or a failed
required rule caps the confidence at ``cap`` (just below the escalation line), each failed
optional rule multiplies it by 0.85, and no successful sample gives 0.

The calibration file: ``format`` ("tracerag.calibration"), ``format_version``, ``id``,
``method``, ``features``, ``model`` (coefficients or breakpoints), ``fitted_at``, ``n``,
``n_correct``, and ``provenance`` (data hash and evaluation figures). The id is the method and
the first 8 hex digits of the SHA-256 of the canonical JSON of format version, method,
features, model and n; loading a file whose content does not match its id fails.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tracerag._routing import Thresholds
from tracerag.demo.kb import load_documents
from tracerag.demo.models.extractive import ExtractiveChatModel
from tracerag.errors import ConfigurationError, InputError
from tracerag.signals._claims import split_claims
from tracerag.signals._confidence import Combined, HeuristicCombiner, Signals
from tracerag.signals._rules import RuleResult
from tracerag.signals._types import Material
from tracerag.signals.calibrated import (
    CALIBRATION_ENV,
    FEATURES,
    METHODS,
    CalibratedCombiner,
    Calibration,
    feature_values,
    heuristic_confidence,
)
from tracerag.store._audit_record import AuditRecord
from tracerag.tools._command import (
    Subparsers,
    add_command,
    add_json_argument,
    add_store_argument,
    cli_store,
)
from tracerag.tools._desk_dataset import desk_rows
from tracerag.tools._scoring import DEFAULT_BINS, summarize
from tracerag.tools.adversarial import (
    MUTATION_KINDS,
    MutatingChatModel,
    demo_records,
    relevant_documents,
)

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

    from tracerag.store._base import AuditStore

__all__ = ["Example", "fit_calibration", "read_examples"]


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


def _examples_hash(examples: Sequence[Example]) -> str:
    digest = hashlib.sha256()
    for e in examples:
        line = json.dumps(
            [e.meta.get("request_id"), e.correct, e.meta.get("action")], ensure_ascii=False
        )
        digest.update(line.encode("utf-8") + b"\n")
    return "sha256:" + digest.hexdigest()


# ----------------------------------------------------------------------------------------------
# Features and the two fits


def fit_logistic(
    x: np.ndarray, y: np.ndarray, *, l2: float = 1.0, max_iter: int = 100, tol: float = 1e-10
) -> tuple[float, np.ndarray]:
    """Intercept and weights of L2-regularised logistic regression, by Newton's method (IRLS).

    The intercept is not penalised; the penalty is ``l2/2 * ||w||²``.
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    n, d = x.shape
    design = np.hstack([np.ones((n, 1)), x])
    penalty = np.full(d + 1, float(l2))
    penalty[0] = 0.0
    beta = np.zeros(d + 1)
    prior = float(np.clip(y.mean() if n else 0.5, 1e-3, 1 - 1e-3))
    beta[0] = math.log(prior / (1 - prior))
    for _ in range(max_iter):
        p = _sigmoid(design @ beta)
        gradient = design.T @ (p - y) + penalty * beta
        weights = np.maximum(p * (1 - p), 1e-12)
        hessian = (design * weights[:, None]).T @ design + np.diag(penalty) + 1e-9 * np.eye(d + 1)
        step = np.linalg.solve(hessian, gradient)
        beta = beta - step
        if float(np.max(np.abs(step))) < tol:
            break
    return float(beta[0]), beta[1:]


def fit_isotonic(
    x: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Breakpoints of the non-decreasing least-squares fit of ``y`` on ``x`` (pool-adjacent-
    violators); equal ``x`` are pooled first. Returns the distinct ``x`` and fitted values."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    w = np.ones_like(y) if weights is None else np.asarray(weights, dtype=float)
    if not x.size:
        return np.array([]), np.array([])
    order = np.argsort(x, kind="mergesort")
    xs, inverse = np.unique(x[order], return_inverse=True)
    sums = np.bincount(inverse, weights=(y * w)[order])
    totals = np.bincount(inverse, weights=w[order])
    # blocks: [value, weight, count of distinct x]
    values: list[float] = []
    block_w: list[float] = []
    sizes: list[int] = []
    for s, t in zip(sums, totals, strict=True):
        values.append(s / t)
        block_w.append(t)
        sizes.append(1)
        while len(values) > 1 and values[-2] > values[-1]:
            v2, w2, n2 = values.pop(), block_w.pop(), sizes.pop()
            v1, w1, n1 = values.pop(), block_w.pop(), sizes.pop()
            values.append((v1 * w1 + v2 * w2) / (w1 + w2))
            block_w.append(w1 + w2)
            sizes.append(n1 + n2)
    fitted = np.repeat(values, sizes)
    return xs, fitted


def fit_calibration(
    examples: Sequence[Example],
    method: str = "logistic",
    *,
    l2: float = 1.0,
    cap: float | None = None,
    provenance: Mapping[str, Any] | None = None,
) -> Calibration:
    """Fit a calibration of ``method`` to labelled examples."""
    if method not in METHODS:
        raise ConfigurationError(f"unknown method {method!r}: choose {' or '.join(METHODS)}")
    if not examples:
        raise InputError("no labelled examples to fit")
    y = np.array([e.correct for e in examples], dtype=float)
    cap = Thresholds().cap if cap is None else cap
    if method == "isotonic":
        x = np.array([heuristic_confidence(e.signals, cap) for e in examples])
        xs, ys = fit_isotonic(x, y)
        model: dict[str, Any] = {"x": _round(xs), "y": _round(ys), "heuristic_cap": cap}
        features: tuple[str, ...] = ("heuristic-v1",)
    else:
        features = FEATURES
        raw = [feature_values(e.signals) for e in examples]
        columns = []
        impute, mean, scale = [], [], []
        for name in features:
            col = np.array([np.nan if r[name] is None else r[name] for r in raw], dtype=float)
            known = col[~np.isnan(col)]
            fill = float(known.mean()) if known.size else 0.0
            col = np.where(np.isnan(col), fill, col)
            mu = float(col.mean())
            sd = float(col.std())
            sd = sd if sd > 1e-9 else 1.0
            impute.append(fill)
            mean.append(mu)
            scale.append(sd)
            columns.append((col - mu) / sd)
        design = np.column_stack(columns)
        intercept, weights = fit_logistic(design, y, l2=l2)
        model = {
            "intercept": round(intercept, 10),
            "coefficients": _round(weights),
            "mean": _round(mean),
            "scale": _round(scale),
            "impute": _round(impute),
            "l2": l2,
            "standardised": True,
        }
    return Calibration(
        method=method,
        features=features,
        model=model,
        n=len(examples),
        n_correct=int(y.sum()),
        fitted_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        provenance=dict(provenance or {}),
    )


# ----------------------------------------------------------------------------------------------
# Evaluation


def split_holdout(
    examples: Sequence[Example], share: float, seed: int = 0
) -> tuple[list[Example], list[Example]]:
    """A (fit, held-out) split with ``share`` of each label held out, reproducible by seed."""
    if not 0.0 < share < 1.0:
        raise InputError(f"holdout share must be between 0 and 1, got {share}")
    rng = random.Random(seed)
    fit: list[Example] = []
    held: list[Example] = []
    for label in (True, False):
        group = [e for e in examples if e.correct is label]
        rng.shuffle(group)
        k = round(len(group) * share)
        held.extend(group[:k])
        fit.extend(group[k:])
    return fit, held


def compare(
    examples: Sequence[Example],
    combiners: Mapping[str, Callable[..., Combined]],
    *,
    bins: int = DEFAULT_BINS,
    thresholds: Thresholds | None = None,
) -> dict[str, dict[str, Any]]:
    """ECE, Brier, AUROC and risk–coverage of each combiner on the examples."""
    thresholds = thresholds or Thresholds()
    labels = [e.correct for e in examples]
    out = {}
    for name, combiner in combiners.items():
        confidences = [combiner(e.signals, cap=thresholds.cap).value for e in examples]
        out[name] = summarize(
            confidences,
            labels,
            bins=bins,
            pass_at=thresholds.pass_at,
            review_at=thresholds.review_at,
        )
    return out


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def render_comparison(title: str, results: Mapping[str, Mapping[str, Any]], bins: int) -> str:
    """A side-by-side table of ``compare`` results, for people."""
    names = list(results)
    width = max(16, *(len(n) + 2 for n in names))
    first = next(iter(results.values()))
    lines = [f"{title} (n={first['n']}, {_pct(first['accuracy'])} right)"]
    lines.append(" " * 26 + "".join(f"{n:>{width}}" for n in names))
    rows: list[tuple[str, Callable[[Mapping[str, Any]], str]]] = [
        (f"ECE ({bins} bins)", lambda r: _num(r["ece"])),
        ("Brier", lambda r: _num(r["brier"])),
        ("AUROC", lambda r: _num(r["auroc"])),
        ("mean confidence", lambda r: _num(r["mean_confidence"])),
        ("auto-passed", lambda r: _pct(r["risk_coverage"]["passed"])),
        ("  wrong among passed", lambda r: _pct(r["risk_coverage"]["pass_error_rate"])),
        ("reviewed", lambda r: _pct(r["risk_coverage"]["reviewed"])),
        ("  wrong among reviewed", lambda r: _pct(r["risk_coverage"]["review_error_rate"])),
        ("escalated", lambda r: _pct(r["risk_coverage"]["escalated"])),
        ("  wrong among escalated", lambda r: _pct(r["risk_coverage"]["escalate_error_rate"])),
    ]
    for label, get in rows:
        lines.append(f"  {label:<24}" + "".join(f"{get(results[n]):>{width}}" for n in names))
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# A synthetic labelled set from the demo knowledge base


def _label(record: AuditRecord, mutated: Mapping[str, Any], relevant: Sequence[str]) -> bool:
    chosen = record.chosen_sample
    answer = chosen.answer if chosen is not None else None
    if not answer:
        return False
    claims = split_claims(answer)
    cited = [c for claim in claims for c in claim.cited_ids]
    if not cited:  # a refusal answers nothing: even where it is apt, a person should take over
        return False
    if answer in mutated or any(not claim.cited_ids for claim in claims):
        return False
    materials = {str(m.id): m.to_material() for m in record.materials}
    if any(c not in materials or materials[c].stale_reason() for c in cited):
        return False
    return bool(set(cited) & set(relevant))


def _always(model: BaseChatModel) -> Callable[[int], BaseChatModel]:
    """An ``llm_factory`` giving the same model for every seed."""
    return lambda _seed: model


def demo_calibration_rows(
    seeds: Sequence[int] = (1, 2, 3),
    *,
    questions: Sequence[str] | None = None,
    kinds: Sequence[str] | None = None,
    rates: Sequence[float] = (0.4, 0.8, 1.0),
    n_samples: int = 5,
    min_samples: int | None = None,
    paired: bool = False,
) -> list[dict[str, Any]]:
    """A synthetic labelled set: demo questions answered clean and with mutated samples.

    For each seed, the demo and probe questions are answered through ``RAGPipeline`` by the
    extractive model, once as is and once per mutation kind with a share (cycling through
    ``rates``) of the samples mutated. A row is right when the chosen answer is not mutated,
    cites only current materials, and cites a document that answers the question; a refusal
    is not right (the customer got no answer). Returns rows in the data format, each with
    what it took: ``samples_drawn``, ``model_calls``, ``input_tokens``, ``output_tokens`` and
    its ``decision`` (``min_samples``: adaptive sampling's first round; ``n_samples`` draws
    every sample, fixed N). ``paired``: a fresh model for each question, so two runs that
    differ only in ``min_samples`` draw the same first samples for each request (the
    comparison benchmarks/cost.py makes).
    """
    relevant = relevant_documents()
    questions = list(questions) if questions is not None else list(relevant)
    kb: dict[str, Any] = {
        str(d.id): Material(
            id=str(d.id),
            text=d.page_content,
            title=d.metadata.get("title", ""),
            metadata=dict(d.metadata),
        )
        for d in load_documents()
    }
    kinds = list(kinds) if kinds is not None else list(MUTATION_KINDS)
    rows: list[dict[str, Any]] = []
    runs: list[tuple[int, str | None, float]] = []
    for seed in seeds:
        runs.append((seed, None, 0.0))
        for i, mutation in enumerate(kinds):
            runs.append((seed, mutation, rates[(seed + i) % len(rates)]))
    # paired: a fresh model per question (seeded by the run's seed and the question), so a
    # request's samples do not depend on how many the requests before it drew
    batches: list[tuple[int, str | None, float, list[str], int]] = []
    for seed, kind, rate in runs:
        if paired:
            batches.extend(
                (seed, kind, rate, [q], seed * 1000 + i) for i, q in enumerate(questions)
            )
        else:
            batches.append((seed, kind, rate, questions, seed))
    for seed, kind, rate, asked, model_seed in batches:
        base = ExtractiveChatModel(seed=model_seed)
        mutating = (
            MutatingChatModel(
                base=base,
                kind=kind,
                rate=rate,
                seed=model_seed,
                materials=kb,
                model_name=base.model_name,
            )
            if kind is not None
            else None
        )
        model: BaseChatModel = base if mutating is None else mutating
        records = demo_records(
            [seed],
            asked,
            llm_factory=_always(model),
            n_samples=n_samples,
            min_samples=min_samples,
        )
        mutated = mutating.mutated if mutating is not None else {}
        for data in records:
            record = AuditRecord.parse(data)
            question = str(record.question)
            detail = record.response.signal_detail if record.response is not None else {}
            rows.append(
                {
                    "question": question,
                    "seed": seed,
                    "mutation": kind,
                    "mutation_rate": rate,
                    # the samples drawn: a calibration fitted on fixed N meets adaptive rows
                    "signals": {
                        **_row_signals(detail),
                        "n_samples": len(data.get("samples") or ()),
                    },
                    "heuristic_confidence": record.confidence,
                    "correct": _label(record, mutated, relevant.get(question, ())),
                    **_cost_of(data),
                }
            )
    return rows


def _cost_of(data: Mapping[str, Any]) -> dict[str, Any]:
    """What a request took: samples drawn, model calls and tokens, and its route."""
    usage = data.get("usage") or {}
    return {
        "decision": data.get("decision"),
        "retrieval_shape": (data.get("retrieval") or {}).get("shape"),
        **_group_of(data),
        "samples_drawn": len(data.get("samples") or ()),
        "model_calls": usage.get("calls"),
        "input_tokens": usage.get("input_tokens"),
        "output_tokens": usage.get("output_tokens"),
    }


def _group_of(data: Mapping[str, Any]) -> dict[str, int]:
    """The chosen answer's group: its size and how many of its members verify fully."""
    signals = data.get("signals") or {}
    group = (signals.get("selection") or {}).get("group") or []
    reports = signals.get("citations_by_sample") or {}
    full = 0
    for i in group:
        r = reports.get(str(i)) or {}
        full += (
            bool(r.get("valid")) and (r.get("score") or 0) >= 1 and (r.get("coverage") or 0) >= 1
        )
    return {"group_size": len(group), "group_verified": full}


def _row_signals(detail: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "citation_score": detail.get("citation_score"),
        "self_consistency": detail.get("self_consistency"),
        "consistency_informative": detail.get("consistency_informative"),
        "plan_ok": detail.get("plan_ok"),
        "fabricated": bool(detail.get("fabricated_citations")),
        "retrieval_margin": detail.get("retrieval_margin"),
        "semantic_entropy": detail.get("semantic_entropy"),
        "citation_coverage": detail.get("citation_coverage"),
        "samples_ok": detail.get("samples_ok"),
    }


# ----------------------------------------------------------------------------------------------
# Command line


def _data_hash(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def _gather(args: argparse.Namespace) -> tuple[list[Example], int, dict[str, Any], list[str]]:
    """The examples of DATA.jsonl and/or the desk; unlabelled rows; provenance; notes."""
    examples: list[Example] = []
    unlabelled = 0
    provenance: dict[str, Any] = {}
    notes: list[str] = []
    if args.data:
        found, unlabelled = read_examples(args.data)
        examples += found
        provenance["data"] = Path(args.data).name
        provenance["data_sha256"] = _data_hash(Path(args.data))
    if args.from_desk:
        with cli_store(args) as store:
            desk, skipped = desk_examples(store, args.route)
            location = getattr(store, "location", "the audit store")
        if not desk:
            raise InputError(
                f"the review desk of {location} has no decided item with recorded signals"
                + (f" ({skipped} decided without signals)" if skipped else "")
            )
        examples += desk
        provenance["desk"] = {
            "store": str(location),
            "route": args.route,
            "decisions": len(desk),
            "skipped_without_signals": skipped,
            "labels_sha256": _examples_hash(desk),
        }
        confidences = [e.meta["confidence"] for e in desk if e.meta.get("confidence") is not None]
        span = f"{min(confidences):.2f}–{max(confidences):.2f}" if confidences else "unknown"
        notes.append(
            f"{len(desk)} desk decision(s) used as labels (approve = correct; edit, reject = "
            f"incorrect); their recorded confidence spans {span}. The desk only sees answers "
            "routed to people: add labelled passed answers (DATA.jsonl) to calibrate above the "
            "review line."
        )
        if skipped:
            notes.append(f"{skipped} decided item(s) had no recorded signals and were skipped")
    return examples, unlabelled, provenance, notes


def _run(args: argparse.Namespace) -> int:
    prog = "tracerag calibrate"
    source = " and ".join(
        [*([str(args.data)] if args.data else []), *(["the review desk"] if args.from_desk else [])]
    )
    try:
        if not args.data and not args.from_desk:
            raise InputError("give DATA.jsonl, --from-desk, or both")
        thresholds = Thresholds(pass_at=args.pass_at, review_at=args.review_at)
        examples, unlabelled, provenance, notes = _gather(args)
        if not examples:
            raise InputError(f"{source}: no labelled rows")
        if len({e.correct for e in examples}) < 2:
            raise InputError(f"{source}: every row has the same label; need both")
        fit_set, held = (
            split_holdout(examples, args.holdout, args.seed) if args.holdout else (examples, [])
        )
        provenance.update({"holdout": args.holdout or 0.0, "split_seed": args.seed})
        calibration = fit_calibration(
            fit_set, args.method, l2=args.l2, cap=thresholds.cap, provenance=provenance
        )
    except (InputError, ConfigurationError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    combiners: dict[str, Callable[..., Combined]] = {
        "heuristic-v1": HeuristicCombiner(),
        calibration.id: CalibratedCombiner(calibration),
    }
    results = {"fit": compare(fit_set, combiners, bins=args.bins, thresholds=thresholds)}
    if held:
        results["holdout"] = compare(held, combiners, bins=args.bins, thresholds=thresholds)
    calibration.provenance["evaluation"] = results
    out = calibration.save(args.out)
    if args.json:
        json.dump(
            {
                "calibration": calibration.to_dict(),
                "file": str(out),
                "unlabelled": unlabelled,
                "notes": notes,
            },
            sys.stdout,
            ensure_ascii=False,
            indent=2,
        )
        print()
        return 0
    print(
        f"calibration {calibration.id} ({args.method}) fitted on {len(fit_set)} rows of "
        f"{source}" + (f"; {unlabelled} unlabelled rows skipped" if unlabelled else "")
    )
    for note in notes:
        print(f"note: {note}")
    print(
        f"thresholds: pass ≥ {thresholds.pass_at}, review ≥ {thresholds.review_at}, else escalate\n"
    )
    print(render_comparison("on the data it was fitted to", results["fit"], args.bins))
    if held:
        print()
        print(
            render_comparison(f"on the held-out {args.holdout:.0%}", results["holdout"], args.bins)
        )
    if args.method == "logistic":
        print("\ncoefficients (per standard deviation of each signal):")
        for name, coef in zip(calibration.features, calibration.model["coefficients"], strict=True):
            print(f"  {name:<20}{coef:+.3f}")
    print(f"\nwrote {out}")
    print(
        f"use it: {CALIBRATION_ENV}={out}  or  "
        f"RAGPipeline(..., combiner=CalibratedCombiner.from_file({str(out)!r}))"
    )
    return 0


def add_parser(subparsers: Subparsers) -> None:
    """Register ``tracerag calibrate``."""
    p = add_command(
        subparsers,
        "calibrate",
        _run,
        help="fit a confidence calibration to labelled responses",
        description="Fit a calibration to labelled responses (JSON lines, and/or the review "
        "desk's decisions with --from-desk) and compare it with the heuristic: ECE, Brier, "
        "AUROC and the routing it gives.",
    )
    p.add_argument(
        "data",
        metavar="DATA.jsonl",
        nargs="?",
        default=None,
        help="labelled rows (see tracerag.tools.calibration); optional with --from-desk",
    )
    p.add_argument(
        "--from-desk",
        action="store_true",
        help="use the review desk's decisions in the audit store as labels (approve: correct; "
        "edit, reject: incorrect), with or without DATA.jsonl",
    )
    add_store_argument(p)
    p.add_argument("--route", default=None, help="with --from-desk: one queue (escalate, review)")
    p.add_argument("--method", choices=METHODS, default="logistic")
    p.add_argument("--out", default="calibration.json", help="file to write (calibration.json)")
    p.add_argument("--bins", type=int, default=DEFAULT_BINS, help="ECE bins (default 15)")
    p.add_argument(
        "--holdout",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="hold out this share (e.g. 0.3) to evaluate on; the fit uses the rest",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the holdout split")
    p.add_argument("--l2", type=float, default=1.0, help="L2 penalty of the logistic fit")
    p.add_argument("--pass-at", type=float, default=Thresholds().pass_at)
    p.add_argument("--review-at", type=float, default=Thresholds().review_at)
    add_json_argument(p, "print the calibration file as JSON")


def _sigmoid(z: np.ndarray) -> np.ndarray:
    out: np.ndarray = 1.0 / (1.0 + np.exp(-np.clip(z, -40.0, 40.0)))
    return out


def _round(values: Iterable[float], digits: int = 10) -> list[float]:
    return [round(float(v), digits) for v in values]
