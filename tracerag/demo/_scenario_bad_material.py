"""``tracerag demo --scenario bad-material``: a bad material is found and quarantined.

A partner feed writes a returns policy with the wrong window (60 days instead of 7) into the
Northwind knowledge base. The write gate holds it (it conflicts with the returns policy); an
operator approves the feed anyway. Customers get answers that cite it, deny them, and after the
third denial the denial rule proposes its quarantine; an operator confirms it on the desk (here,
in code) and the material leaves retrieval. ``tracerag trace-back`` on a
complained-about request names the write that caused it in one command.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
from pathlib import Path
from typing import Any

from langchain_core.documents import Document

from tracerag import RAGPipeline
from tracerag.demo._store import writable_store
from tracerag.demo.kb import build_vectorstore, load_documents
from tracerag.demo.models.extractive import ExtractiveChatModel
from tracerag.materials import MaterialRegistry, Provenance, answer_conflicts
from tracerag.materials._investigate import trace_back
from tracerag.materials._render import render_trace_back
from tracerag.materials._rerank import CredibilityRetriever
from tracerag.materials.feedback import record_feedback, record_usage
from tracerag.store import open_store

BAD_ID = "returns-partner-feed"
BAD_TEXT = (
    "Opened items in resalable condition can be returned within 60 days of delivery, "
    "with no restocking fee."
)
FEED_RULE = "partner-feed-sync@3"
QUESTIONS = [
    "Can I return an opened item, and is there a fee?",
    "How long do I have to return an opened item?",
    "I opened the box. Can I still send it back?",
    "Is there a restocking fee on opened returns?",
]
#: the scenario's own audit store (recreated on every run) when --store is not given
DEFAULT_STORE = Path(".tracerag") / "bad-material.sqlite"


def _say(text: str = "") -> None:
    print(text)


def run_scenario(args: argparse.Namespace) -> int:
    """Play the scenario against a fresh audit store and print each step."""
    logger = logging.getLogger("tracerag")
    level = logger.level
    logger.setLevel(logging.ERROR)  # the scenario's own lines, not the library's, for its run
    url = args.store
    if not url:
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                Path(str(DEFAULT_STORE) + suffix).unlink()
        url = str(DEFAULT_STORE)

    writable_store(url, default=not args.store)  # one line and exit 1 if it cannot be written
    registry = MaterialRegistry(open_store(url), owns_store=True)
    try:
        _say(f"tracerag demo — scenario bad-material (audit store {url})\n")
        docs = load_documents()
        registry.observe(docs)
        _say(f"1. the knowledge base: {len(docs)} documents registered on first sight")

        with registry.batch() as batch:
            held = registry.register(
                BAD_ID,
                BAD_TEXT,
                operator="feed-bot",
                written_by=FEED_RULE,
                provenance=Provenance(
                    source_type="third_party",
                    document_id="partner/returns.csv",
                    origin_url="https://partner.example.com/feed/returns",
                ),
                source_snippet="returns_window_opened=60d;restocking_fee=0 (row 12)",
                title="Returns (partner feed)",
                reason="nightly partner feed",
            )
        reasons = "; ".join(
            f"{r['rule']}: {r['match']}" for r in (held.gate or {}).get("reasons", [])
        )
        _say(f"2. {FEED_RULE} writes {BAD_ID} in batch {batch}")
        _say(f"   the write gate holds it ({held.status}): {reasons}")
        registry.approve(BAD_ID, operator="ops-lead", reason="bulk approval of the partner feed")
        _say("   ops-lead approves the whole feed without reading it → active")
        for c in registry.conflicts():
            _say(
                f"   conflict recorded: {c.material_a} says {c.value_a}, "
                f"{c.material_b} says {c.value_b}"
            )

        kb = [*docs, Document(page_content=BAD_TEXT, metadata={"id": BAD_ID})]
        inner = build_vectorstore(kb).as_retriever(search_kwargs={"k": 6})

        def sink(record: dict[str, Any]) -> bool:
            registry.store.append_record(record)
            record_usage(record, registry=registry)
            return True

        rag = RAGPipeline(
            CredibilityRetriever(retriever=inner, registry=registry, k=4),
            ExtractiveChatModel(seed=args.seed),
            prompt_version="demo-bad-material",
            model_version="extractive",
            n_samples=args.samples,
            audit=sink,
        )
        _say("\n3. customers ask; answers are checked for open conflicts (assemble call site)")
        asked = []
        for i, question in enumerate(QUESTIONS, 1):
            response = rag.invoke(question)
            cited = [c.material_id for c in response.evidence]
            flagged = answer_conflicts(cited, [c.to_dict() for c in registry.conflicts()])
            uses_bad = BAD_ID in cited
            asked.append((response.request_id, uses_bad))
            _say(
                f"   [{i}] {question}\n       {response.decision.upper()}: {response.answer}\n"
                f"       cites {', '.join(cited) or 'nothing'}"
                + ("  ← conflict: would go to review" if flagged else "")
            )

        _say("\n4. customers who got the 60-day answer say it is wrong")
        complained = [rid for rid, bad in asked if bad]
        for n, rid in enumerate(complained, 1):
            result = record_feedback(
                rid,
                "deny",
                "the shop charged a restocking fee after 7 days",
                registry=registry,
                operator=f"customer-{n}",
            )
            state = registry.get(BAD_ID)
            _say(
                f"   deny on {rid}: {BAD_ID} EMA {state.ema:.3f}, denials {state.denials}, "
                f"status {state.status}"
                + ("  ← QUARANTINE PROPOSED" if BAD_ID in result.proposed else "")
            )
            if state.proposed_quarantine:
                registry.quarantine(
                    BAD_ID, operator="ops-lead", reason="confirmed: the returns window is 7 days"
                )
                _say(f"   ops-lead confirms the proposal on the desk → {BAD_ID} QUARANTINED")
                break

        if complained:
            _say(f"\n5. investigation: tracerag trace-back {complained[0]}")
            text = render_trace_back(trace_back(registry, complained[0]))
            _say("   " + "\n   ".join(text.rstrip().splitlines()[:12]))
            _say("   time to locate: 1 command (the first lines name the write)")
            scope = registry.by_rule(FEED_RULE)
            _say(
                f"   scope: tracerag materials by-rule {FEED_RULE} → {len(scope)} version(s): "
                + ", ".join(f"{s.version.material_id} v{s.version.version}" for s in scope)
            )

        after = rag.invoke(QUESTIONS[0])
        cited = [c.material_id for c in after.evidence]
        _say(f"\n6. asked again: {after.decision.upper()}: {after.answer}")
        _say(f"   cites {', '.join(cited)}; {BAD_ID} retrieved: {BAD_ID in cited}")
        chain = registry.store.verify_chain()
        check = registry.verify()
        _say(f"\naudit: {chain.summary()}\n       {check.summary()}")
        return 0 if registry.get(BAD_ID).status == "quarantined" else 1
    finally:
        registry.close()
        logger.setLevel(level)


__all__ = ["run_scenario"]
