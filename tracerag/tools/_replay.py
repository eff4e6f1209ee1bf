"""Replay a stored request and say what changed: ``tracerag replay REQUEST_ID``.

A replay re-runs the stored question through the six stages with the stored materials (the
retriever returns exactly the recorded documents, in their order, with their scores — no new
retrieval), the stored parameters (samples, temperature, plan mode, tier, k) and the model of
the current configuration. It is refused when the recorded prompt or model version differs
from the current one, unless forced. The replayed request is stored like any other (under a
new request_id, carrying ``replay_of``), and an ``operator_action`` entry on the original names
it. Replays are not put in the review queue.

Not recorded, so not replayed: the thresholds, rules and support backend of the original
pipeline — the replay uses the defaults unless the caller passes them to ``replay()``.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel
from langchain_core.retrievers import BaseRetriever
from langchain_core.vectorstores import VectorStore, VectorStoreRetriever

from tracerag._llm import model_name
from tracerag._pipeline import RAGPipeline
from tracerag.config import get_config
from tracerag.contract import Response
from tracerag.demo._run import build_model
from tracerag.errors import TraceragError
from tracerag.prompts import DEFAULT_PROMPT_VERSION
from tracerag.stages._retrieve import content_id
from tracerag.store import RequestNotFound
from tracerag.store._audit_record import AuditRecord, RecordMaterial
from tracerag.store._base import KIND_OPERATOR_ACTION, AuditStore
from tracerag.store._codec import RequestTrail
from tracerag.tools._command import (
    Subparsers,
    add_command,
    add_json_argument,
    add_store_argument,
    cli_store,
    emit,
)

MODEL_ENV = "TRACERAG_MODEL"
MODELS = ("extractive", "local")
ASPECTS = ("retrieved set", "plan", "conclusions", "citations", "confidence", "decision")


class ReplayRefused(TraceragError):
    """The stored request was made with other versions than the current configuration."""


# -- a retriever that gives back exactly the stored materials ------------------------------


def material_documents(
    materials: Sequence[RecordMaterial | Mapping[str, Any]],
) -> list[tuple[Document, Any]]:
    """The stored materials as (Document, score) pairs, in retrieved order."""
    typed = [RecordMaterial.model_validate(m) for m in materials]
    pairs: list[tuple[Document, Any]] = []
    ordered = sorted(enumerate(typed), key=lambda im: (im[1].rank is None, im[1].rank, im[0]))
    for _, m in ordered:
        text = m.text
        meta = dict(m.metadata)
        mid = m.id or ""
        if mid and str(meta.get("id") or content_id(text)).strip() != mid:
            meta["id"] = mid  # the id the original run gave it (e.g. made unique with #2)
        if m.title and not (meta.get("title") or meta.get("name")):
            meta["title"] = m.title
        if m.source is not None and meta.get("source") is None:
            meta["source"] = m.source
        pairs.append((Document(page_content=text, metadata=meta, id=mid or None), m.score))
    return pairs


class _NoEmbeddings(Embeddings):
    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        raise NotImplementedError("a replay store does not embed")

    def embed_query(self, text: str) -> list[float]:
        raise NotImplementedError("a replay store does not embed")


class ReplayVectorStore(VectorStore):
    """A read-only vector store that answers every query with the same scored documents."""

    def __init__(self, pairs: Sequence[tuple[Document, float]]) -> None:
        self.pairs = [(doc, float(score)) for doc, score in pairs]

    @property
    def embeddings(self) -> Embeddings:
        return _NoEmbeddings()

    def add_texts(
        self,
        texts: Iterable[str],
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> list[str]:
        raise NotImplementedError("a replay store is read-only")

    @classmethod
    def from_texts(
        cls,
        texts: list[str],
        embedding: Embeddings,
        metadatas: list[dict[str, Any]] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: Any,
    ) -> ReplayVectorStore:
        raise NotImplementedError("build a ReplayVectorStore from stored materials")

    def similarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
        return [doc for doc, _ in self.pairs]

    def similarity_search_with_relevance_scores(
        self, query: str, k: int = 4, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        return list(self.pairs)

    async def asimilarity_search_with_relevance_scores(
        self, query: str, k: int = 4, **kwargs: Any
    ) -> list[tuple[Document, float]]:
        return list(self.pairs)


class ReplayRetriever(BaseRetriever):
    """A retriever that answers every query with the same documents (no scores)."""

    documents: list[Document]

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        return list(self.documents)

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        return list(self.documents)


def replay_retriever(materials: Sequence[RecordMaterial | Mapping[str, Any]]) -> BaseRetriever:
    """A retriever returning exactly these stored materials, with their scores when all have one."""
    pairs = material_documents(materials)
    if pairs and all(isinstance(s, (int, float)) and not isinstance(s, bool) for _, s in pairs):
        store = ReplayVectorStore([(doc, float(score)) for doc, score in pairs])
        return VectorStoreRetriever(vectorstore=store, search_kwargs={"k": len(pairs)})
    return ReplayRetriever(documents=[doc for doc, _ in pairs])


# -- what a record concluded, and what changed -------------------------------------------------


def candidate_answer(record: AuditRecord | Mapping[str, Any]) -> str | None:
    """The answer the pipeline chose (also when it was withheld for a human)."""
    return AuditRecord.parse(record).candidate_answer


def _aspects(record: AuditRecord | Mapping[str, Any]) -> dict[str, Any]:
    rec = AuditRecord.parse(record)
    plan = rec.plan
    consistency = rec.signals.consistency
    selection = rec.signals.selection
    citations = rec.citations
    return {
        "retrieved set": [
            [str(m.id), None if m.score is None else round(m.score, 4)] for m in rec.materials
        ],
        "plan": None
        if plan is None
        else {
            "material_ids": list(plan.material_ids),
            "key_facts": list(plan.key_facts),
            "ok": plan.ok,
        },
        "conclusions": {
            "answer": rec.candidate_answer,
            "groups": consistency.n_groups if consistency is not None else None,
            "agreement": selection.share if selection is not None else None,
        },
        "citations": {
            "claims": [[c.text, list(c.cited_ids), c.verdict] for c in citations.claims],
            "fabricated": list(citations.fabricated),
            "stale": list(citations.stale),
        },
        "confidence": None if rec.confidence is None else round(rec.confidence, 4),
        "decision": rec.decision,
    }


@dataclass(frozen=True)
class Change:
    """One aspect of the answer before and after the replay."""

    aspect: str
    before: Any
    after: Any

    @property
    def changed(self) -> bool:
        return bool(self.before != self.after)

    def describe(self) -> list[str]:
        """What changed, in a few lines (empty when nothing did)."""
        if not self.changed:
            return []
        b, a = self.before, self.after
        if self.aspect == "retrieved set":
            bi, ai = [x[0] for x in b], [x[0] for x in a]
            out = []
            if bi != ai:
                out.append(f"ids {bi} -> {ai}")
            else:
                out += [
                    f"{x[0]} score {x[1]} -> {y[1]}" for x, y in zip(b, a, strict=True) if x != y
                ]
            return out
        if isinstance(b, dict) and isinstance(a, dict):
            return [
                f"{key}: {_short(b.get(key))} -> {_short(a.get(key))}"
                for key in dict.fromkeys([*b, *a])
                if b.get(key) != a.get(key)
            ]
        return [f"{_short(b)} -> {_short(a)}"]


def _short(value: Any, limit: int = 300) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def diff_records(
    before: AuditRecord | Mapping[str, Any], after: AuditRecord | Mapping[str, Any]
) -> list[Change]:
    """Retrieved set, plan, conclusions, citations, confidence and decision, before and after."""
    b, a = _aspects(before), _aspects(after)
    return [Change(name, b[name], a[name]) for name in ASPECTS]


@dataclass
class ReplayResult:
    """The original request, its replay, and what changed between them."""

    original_id: str
    replay_id: str
    versions_before: dict[str, Any]
    versions_now: dict[str, Any]
    forced: bool
    changes: list[Change] = field(default_factory=list)
    response: Response | None = None

    @property
    def changed(self) -> list[Change]:
        return [c for c in self.changes if c.changed]

    def render(self) -> str:
        """A plain-text account of the replay."""
        lines = [
            f"replayed {self.original_id} as {self.replay_id}"
            + ("  (FORCED despite other versions)" if self.forced else ""),
            f"  versions: prompt {self.versions_now.get('prompt')}, "
            f"model {self.versions_now.get('model')}",
        ]
        for c in self.changes:
            detail = c.describe()
            if not detail:
                lines.append(f"  {c.aspect:<14} unchanged")
                continue
            lines.append(f"  {c.aspect:<14} CHANGED")
            lines += [f"      {line}" for line in detail]
        verdict = "no change" if not self.changed else f"{len(self.changed)} aspect(s) changed"
        lines.append(f"  => {verdict}")
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form of the result."""
        return {
            "original_id": self.original_id,
            "replay_id": self.replay_id,
            "forced": self.forced,
            "versions_before": self.versions_before,
            "versions_now": self.versions_now,
            "changes": [
                {"aspect": c.aspect, "changed": c.changed, "before": c.before, "after": c.after}
                for c in self.changes
            ],
            "response": None if self.response is None else self.response.model_dump(mode="json"),
        }


def version_mismatches(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Lines naming each of prompt and model whose recorded version differs from the current."""
    return [
        f"{name}: recorded {recorded.get(name)!r}, configured {current.get(name)!r}"
        for name in ("prompt", "model")
        if recorded.get(name) != current.get(name)
    ]


def check_versions(
    record: AuditRecord | Mapping[str, Any], current: Mapping[str, Any], *, force: bool = False
) -> list[str]:
    """The version mismatches of a stored request; ``ReplayRefused`` if any and not ``force``."""
    record = AuditRecord.parse(record)
    mismatches = version_mismatches(record.versions.model_dump(exclude_unset=True), current)
    if mismatches and not force:
        raise ReplayRefused(
            f"request {record.request_id} was answered with other versions than "
            f"configured now ({'; '.join(mismatches)}). A re-run would not show what that "
            "request did; configure the recorded versions, or pass --force to re-run with the "
            "current ones."
        )
    return mismatches


def recorded_options(record: AuditRecord | Mapping[str, Any]) -> dict[str, Any]:
    """The ``RAGPipeline`` options a stored request ran with (samples, adaptive sampling's
    first round, temperature, plan, k)."""
    record = AuditRecord.parse(record)
    params = record.params
    n = int(params.get("n_samples") or 1)
    adaptive = params.get("adaptive")
    # a record from before adaptive sampling drew every sample (fixed N)
    first = adaptive.get("min_samples") if isinstance(adaptive, Mapping) else None
    return {
        "n_samples": n,
        "min_samples": int(first) if isinstance(first, int) and first >= 1 else n,
        "temperature": float(params.get("temperature", 0.7)),
        "plan": str(params.get("plan_mode") or "separate"),
        "tier": record.tier or "high",
        "k": params.get("k"),
    }


def replay(
    store: AuditStore,
    request_id: str,
    llm: BaseChatModel,
    *,
    prompt_version: str,
    model_version: str,
    force: bool = False,
    actor: str = "operator",
    **pipeline_options: Any,
) -> ReplayResult:
    """Re-run a stored request with its materials and parameters; store it, link it, diff it.

    Raises ``RequestNotFound`` for an unknown id and ``ReplayRefused`` when the recorded prompt
    or model version differs from ``prompt_version``/``model_version`` and ``force`` is False.
    ``pipeline_options`` go to ``RAGPipeline`` (thresholds, rules, support_backend, ...).
    """
    trail: RequestTrail = store.get(request_id)
    record = trail.audit
    recorded = record.versions.model_dump(exclude_unset=True)
    current = {"prompt": prompt_version, "model": model_version}
    mismatches = check_versions(record, current, force=force)
    captured: list[dict[str, Any]] = []

    def sink(rec: dict[str, Any]) -> bool:
        captured.append(rec)
        return True

    options: dict[str, Any] = {
        "prompt_version": prompt_version,
        "model_version": model_version,
        **recorded_options(record),
        "audit": sink,
    }
    options.update(pipeline_options)
    pipeline = RAGPipeline(replay_retriever(record.materials), llm, **options)
    question = {
        key: getattr(record, key)
        for key in ("question", "session_id", "user_id", "channel")
        if getattr(record, key) is not None
    }
    response = pipeline.invoke(question)
    new_record = dict(captured[-1]) if captured else {}
    new_record["replay_of"] = request_id
    store.append_record(new_record)
    changes = diff_records(record, new_record)
    store.append_action(
        request_id,
        KIND_OPERATOR_ACTION,
        actor,
        {
            "action": "replay",
            "replay_request_id": response.request_id,
            "forced": bool(force and mismatches),
            "versions": current,
            "changed": [c.aspect for c in changes if c.changed],
        },
        reason=f"replayed as {response.request_id}",
    )
    return ReplayResult(
        original_id=request_id,
        replay_id=response.request_id,
        versions_before=recorded,
        versions_now={**current, "tracerag": AuditRecord.parse(new_record).versions.tracerag},
        forced=bool(force and mismatches),
        changes=changes,
        response=response,
    )


# -- the command ----------------------------------------------------------------------------


def configured_model(name: str | None, seed: int | None = None) -> tuple[Any, str, str]:
    """The configured chat model with its prompt and model versions (``--model``/TRACERAG_MODEL)."""
    name = name or get_config().model or "extractive"
    if name not in MODELS:
        raise SystemExit(f"unknown model {name!r} (from --model or {MODEL_ENV}): choose {MODELS}")
    llm = build_model(name, seed)
    return llm, DEFAULT_PROMPT_VERSION, model_name(llm) or type(llm).__name__


def run(args: argparse.Namespace) -> int:
    """Replay one stored request and print what changed."""
    llm, prompt_version, model_version = configured_model(args.model, args.seed)
    with cli_store(args, auto_enqueue=False) as store:
        try:
            result = replay(
                store,
                args.request_id,
                llm,
                prompt_version=prompt_version,
                model_version=model_version,
                force=args.force,
                actor=args.actor,
            )
        except RequestNotFound as exc:
            print(f"tracerag replay: {exc}", file=sys.stderr)
            return 1
        except ReplayRefused as exc:
            print(f"tracerag replay: refused: {exc}", file=sys.stderr)
            return 3
    return emit(result, as_json=args.json)


def _default_actor() -> str:
    try:
        return getpass.getuser() or "operator"
    except Exception:
        return "operator"


def add_rerun_arguments(p: argparse.ArgumentParser, verb: str) -> None:
    """The options of a command that re-runs stored requests: model, seed, force, actor."""
    p.add_argument(
        "--model",
        choices=MODELS,
        default=None,
        help=f"the configured model (default: ${MODEL_ENV}, else extractive)",
    )
    p.add_argument("--seed", type=int, default=7, help="seed of the extractive model")
    p.add_argument(
        "--force",
        action="store_true",
        help=f"{verb} even when the recorded prompt or model version differs from the current",
    )
    p.add_argument("--actor", default=_default_actor(), help="who runs it (for the audit log)")


def add_parser(subparsers: Subparsers) -> None:
    """Register ``tracerag replay``."""
    p = add_command(
        subparsers,
        "replay",
        run,
        help="re-run a stored request with its materials and parameters; show what changed",
        description="Re-run a stored request with the same materials (no new retrieval), "
        "parameters and versions, store the replay linked to the original, and print what "
        "changed: retrieved set, plan, conclusions, citations, confidence, decision.",
    )
    p.add_argument("request_id", metavar="REQUEST_ID")
    add_store_argument(p)
    add_rerun_arguments(p, "replay")
    add_json_argument(p, "print the result as JSON")
