"""Value-aware reranking under planted wrong materials and feedback arriving over time.

The demo knowledge base (Northwind Gadgets) gets a wrong twin for several policy documents:
the same text with its numbers changed (a partner feed that went wrong), so it retrieves about
as well as the right one. A stream of questions (one per policy, in seeded random order) runs
through the real pipeline (in-memory vector store, offline extractive model, SQLite audit store
and material registry) in three arms, side by side, over the same stream:

* ``baseline`` — the plain vector-store retriever (feedback is recorded but changes nothing);
* ``rerank`` — ``CredibilityRetriever`` ordering by similarity × credibility × recency, with
  quarantine switched off, so only the reranking acts;
* ``rerank+quarantine`` — the same, with the denial rule proposing a quarantine after 3
  denials while the EMA is below ``--quarantine-below`` (0.4; 0: on denials alone) and an
  operator confirming every proposal as it appears (until confirmed, answers citing the
  material go to review).

After each answer a user gives feedback with probability ``--feedback-rate``: ``deny`` when the
answer cited a planted wrong material, else ``confirm`` — each flipped with probability
``--noise``. A *wrong answer* is one that cites a planted wrong material. Good materials are not
starved when they keep their share of retrievals: the script reports, per arm, retrievals of
good materials relative to the baseline and how many good materials were quarantined.

    python benchmarks/rerank.py [--requests 300] [--feedback-rate 0.5] [--noise 0.05]
"""

from __future__ import annotations

import argparse
import logging
import random
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from langchain_core.documents import Document

ARMS = ("baseline", "rerank", "rerank+quarantine")
_NUMBER = re.compile(r"\d+")


def twist(text: str) -> str:
    """The same text with every number changed (doubled, plus one)."""
    return _NUMBER.sub(lambda m: str(int(m.group(0)) * 2 + 1), text)


def knowledge_base(n_wrong: int, seed: int) -> tuple[list[Document], set[str], list[str]]:
    """The demo documents plus wrong twins; returns (documents, wrong ids, question topics)."""
    from tracerag.demo.kb import load_documents

    docs = load_documents()
    current = [d for d in docs if not d.metadata.get("superseded_by")]
    with_numbers = [d for d in current if _NUMBER.search(d.page_content)]
    rng = random.Random(seed)
    planted = rng.sample(with_numbers, min(n_wrong, len(with_numbers)))
    wrong = []
    for d in planted:
        meta = dict(d.metadata)
        meta["id"] = f"{d.metadata['id']}-feed"
        meta["source"] = f"feed://partner/{d.metadata['id']}"
        wrong.append(Document(page_content=twist(d.page_content), metadata=meta))
    topics = [str(d.metadata.get("title") or d.metadata["id"]) for d in current]
    return docs + wrong, {str(w.metadata["id"]) for w in wrong}, topics


class Arm:
    """One arm: its own audit store and registry, and a pipeline over the shared documents."""

    def __init__(
        self, name: str, docs: list[Document], directory: Path, seed: int, args_below: float | None
    ) -> None:
        from tracerag import RAGPipeline
        from tracerag.demo.kb import build_vectorstore
        from tracerag.demo.models.extractive import ExtractiveChatModel
        from tracerag.materials import CredibilityPolicy, MaterialRegistry
        from tracerag.materials._rerank import CredibilityRetriever, RerankWeights
        from tracerag.materials.feedback import record_usage
        from tracerag.store import open_store

        self.name = name
        quarantine_after = 3 if name == "rerank+quarantine" else 10**9
        self.registry = MaterialRegistry(
            open_store(str(directory / f"{name}.sqlite")),
            policy=CredibilityPolicy(
                rate=0.3, quarantine_after=quarantine_after, quarantine_below=args_below
            ),
            owns_store=True,
        )
        self.registry.observe(docs)  # everything registered up front, as a sync would do
        vectorstore = build_vectorstore(docs)
        if name == "baseline":
            retriever: Any = vectorstore.as_retriever(search_kwargs={"k": 4})
        else:
            retriever = CredibilityRetriever(
                retriever=vectorstore.as_retriever(search_kwargs={"k": 8}),
                registry=self.registry,
                weights=RerankWeights(similarity=1.0, credibility=2.0, recency=0.0),
                k=4,
            )

        def sink(record: dict[str, Any]) -> bool:
            self.registry.store.append_record(record)
            record_usage(record, registry=self.registry)
            return True

        self.pipeline = RAGPipeline(
            retriever,
            ExtractiveChatModel(seed=seed),
            prompt_version="bench",
            model_version="extractive",
            n_samples=3,
            audit=sink,
        )
        self.wrong: list[bool] = []
        self.wrong_passed = 0
        self.retrievals: Counter[str] = Counter()

    def ask(self, question: str, wrong_ids: set[str]) -> tuple[str, bool]:
        """Answer one question; returns (request id, whether the answer cited a wrong one)."""
        response = self.pipeline.invoke(question)
        record = self.registry.store.get(response.request_id).record
        cited = {
            str(c)
            for claim in (record.get("signals") or {}).get("citations", {}).get("claims", [])
            for c in claim.get("cited_ids") or []
        }
        for m in record.get("materials") or []:
            self.retrievals[str(m["id"])] += 1
        bad = bool(cited & wrong_ids)
        self.wrong.append(bad)
        if bad and response.decision == "pass":
            self.wrong_passed += 1
        return response.request_id, bad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--wrong", type=int, default=8, help="planted wrong materials")
    parser.add_argument("--feedback-rate", type=float, default=0.5)
    parser.add_argument("--noise", type=float, default=0.05, help="share of flipped verdicts")
    parser.add_argument("--windows", type=int, default=5, help="report in this many windows")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument(
        "--quarantine-below",
        type=float,
        default=0.4,
        help="quarantine after 3 denials only while the EMA is below this (0: on denials alone)",
    )
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)

    from tracerag.materials.feedback import record_feedback

    docs, wrong_ids, topics = knowledge_base(args.wrong, args.seed)
    rng = random.Random(args.seed)
    stream = [rng.choice(topics) for _ in range(args.requests)]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        below = args.quarantine_below if args.quarantine_below > 0 else None
        arms = [Arm(name, docs, Path(tmp), args.seed, below) for name in ARMS]
        for arm in arms:
            users = random.Random(args.seed + 1)  # the same users for every arm
            for i, question in enumerate(stream):
                rid, bad = arm.ask(question, wrong_ids)
                if users.random() < args.feedback_rate:
                    verdict = "deny" if bad else "confirm"
                    if users.random() < args.noise:
                        verdict = "confirm" if verdict == "deny" else "deny"
                    given = record_feedback(
                        rid, verdict, registry=arm.registry, operator=f"user-{i}"
                    )
                    for mid in given.proposed:  # an operator who confirms every proposal
                        arm.registry.quarantine(mid, operator="ops", reason="confirmed")
        elapsed = time.perf_counter() - started

        print(
            f"{args.requests} requests per arm; {len(wrong_ids)} planted wrong materials among "
            f"{len(docs)}; feedback on {args.feedback_rate:.0%} of answers, "
            f"{args.noise:.0%} of verdicts flipped; seed {args.seed}; {elapsed:.0f}s\n"
        )
        size = max(1, args.requests // args.windows)
        header = f"{'requests':>12}" + "".join(f"{name:>20}" for name in ARMS)
        print("wrong answers (cite a planted wrong material), per window:")
        print(header)
        for start in range(0, args.requests, size):
            end = min(args.requests, start + size)
            row = f"{f'{start + 1}-{end}':>12}"
            for arm in arms:
                n = sum(arm.wrong[start:end])
                row += f"{f'{n}/{end - start} ({n / (end - start):.0%})':>20}"
            print(row)
        row = f"{'total':>12}"
        for arm in arms:
            n = sum(arm.wrong)
            row += f"{f'{n}/{len(arm.wrong)} ({n / len(arm.wrong):.0%})':>20}"
        print(row)
        print(f"{'passed wrong':>12}" + "".join(f"{arm.wrong_passed:>20}" for arm in arms))

        base = arms[0]
        good = [str(d.metadata["id"]) for d in docs if str(d.metadata["id"]) not in wrong_ids]
        base_good = sum(base.retrievals[g] for g in good)
        print("\ngood materials (not starved):")
        print(header)
        row = f"{'retrievals':>12}"
        for arm in arms:
            n = sum(arm.retrievals[g] for g in good)
            row += f"{f'{n} ({n / base_good:.0%})':>20}"
        print(row)
        row = f"{'dropped':>12}"
        for arm in arms:
            gone = sum(1 for g in good if base.retrievals[g] and not arm.retrievals[g])
            row += f"{gone:>20}"
        print(row)
        row = f"{'quarantined':>12}"
        for arm in arms:
            q = {s.material_id for s in arm.registry.materials("quarantined")}
            row += f"{f'{len(q - wrong_ids)} good, {len(q & wrong_ids)} wrong':>20}"
        print(row)
        for arm in arms:
            arm.registry.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
