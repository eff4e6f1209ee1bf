"""A synthetic labelled set from the demo knowledge base, for trying ``tracerag calibrate``.

The demo and probe questions answered offline, clean and deliberately made wrong, each row
labelled by construction.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tracerag.demo.kb import load_documents
from tracerag.demo.models.extractive import ExtractiveChatModel
from tracerag.signals._claims import split_claims
from tracerag.signals._types import Material
from tracerag.store._audit_record import AuditRecord
from tracerag.tools.adversarial import (
    MUTATION_KINDS,
    MutatingChatModel,
    demo_records,
    relevant_documents,
)

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel


__all__ = ["demo_calibration_rows"]


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
