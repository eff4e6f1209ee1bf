"""What attribution tiers 1 and 2 cost per request: CPU time, and model calls (none).

Two measurements, on the demo knowledge base and its questions answered by the offline
extractive model:

1. direct: the work the two call sites do per request (score shape on retrieve; attribution,
   its record, the Response's ``materials`` and their validation on assemble), timed with
   ``time.process_time`` over many repetitions (the least of five blocks) — with the term
   caches cleared before every request (cold: materials never seen before) and kept (warm: a
   knowledge base whose documents recur, the usual case);
2. in the pipeline: CPU per request of the whole pipeline before (both call sites replaced by
   no-ops that return an empty attribution, as on a build without this feature) and after,
   interleaved so machine noise falls on both alike, with a zero-latency model. The model
   calls per request are counted in both.

    PYTHONPATH=. python benchmarks/attribution.py [--repeat 2000] [--requests 200]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from contextlib import contextmanager

from opentelemetry.trace import NoOpTracerProvider
from tracerag.context import Material

from tracerag import RAGPipeline
from tracerag.contract import MaterialUse, validate_response
from tracerag.demo.kb import build_retriever, load_questions
from tracerag.demo.models.extractive import ExtractiveChatModel
from tracerag.signals import _attribution as attr
from tracerag.stages import _assemble as assemble
from tracerag.stages import _retrieve as retrieve

BUDGET_MS = 0.3


CALLS = [0]  # model calls, counted across the copies the sample stage makes


class CountingModel(ExtractiveChatModel):
    """The extractive model, counting the calls made to it and to its copies."""

    def respond(self, messages, temperature=None):
        CALLS[0] += 1
        return super().respond(messages, temperature)


def records() -> list[dict]:
    """One audit record per demo question, from the real pipeline."""
    captured: list[dict] = []
    pipeline = RAGPipeline(
        build_retriever(k=4),
        ExtractiveChatModel(seed=7),
        prompt_version="bench",
        model_version="extractive",
        n_samples=5,
        tracer_provider=NoOpTracerProvider(),
        audit=lambda rec: captured.append(rec) or True,
    )
    for q in load_questions():
        pipeline.invoke(q["question"])
    return captured


def inputs(record: dict) -> tuple[str, list[Material], list[attr.ClaimLink], dict]:
    materials = [
        Material(
            m["id"],
            m["text"],
            m.get("title", ""),
            score=m.get("score"),
            metadata=m.get("metadata") or {},
        )
        for m in record["materials"]
    ]
    claims = [
        attr.ClaimLink(c["verdict"], tuple(c["cited_ids"]), c.get("material_id"))
        for c in record["signals"]["citations"]["claims"]
    ]
    return record["question"], materials, claims, record["response"]


def clear_caches() -> None:
    attr._token_set.cache_clear()
    attr.question_terms.cache_clear()


def one_request(question, materials, claims, response) -> None:
    """The two call sites' work for one request."""
    attr.explain_retrieval([(m.id, m.score) for m in materials])  # retrieve
    result = attr.attribute(question, materials, claims)  # assemble
    result.to_record()
    uses = [MaterialUse(**m) for m in result.summary()]
    validate_response({**response, "materials": [u.model_dump(mode="json") for u in uses]})


def _per_request(fn, repeat: int) -> float:
    """CPU seconds per call of ``fn``: the least of five blocks (noise only adds time)."""
    block = max(1, repeat // 5)
    best = float("inf")
    for _ in range(5):
        t0 = time.process_time()
        for _ in range(block):
            fn()
        best = min(best, (time.process_time() - t0) / block)
    return best


def direct(recs: list[dict], repeat: int, cold: bool) -> list[float]:
    """CPU ms per request the two call sites add, for each record's inputs."""
    out = []
    for rec in recs:
        args = inputs(rec)
        bare = {**args[3], "materials": []}

        # the validation a Response without materials costs anyway, and clearing the caches,
        # are not part of the work
        def baseline(bare=bare) -> None:
            if cold:
                clear_caches()
            validate_response(bare)

        def work(args=args) -> None:
            if cold:
                clear_caches()
            one_request(*args)

        out.append((_per_request(work, repeat) - _per_request(baseline, repeat)) * 1000)
    return out


@contextmanager
def without_attribution():
    """Both call sites as no-ops returning an empty attribution (the build before)."""
    empty = attr.Attribution(
        retrieval=attr.explain_retrieval([]), materials=(), n_claims=0, unattributed=0.0
    )
    saved = assemble.attribution_of, retrieve.record_shape
    assemble.attribution_of = lambda ctx, settings, span: empty
    retrieve.record_shape = lambda ctx, span, thresholds: None
    try:
        yield
    finally:
        assemble.attribution_of, retrieve.record_shape = saved


def pipeline_cpu(requests: int) -> tuple[float, float, int, int]:
    """CPU ms per request before and after, and model calls per request before and after."""
    questions = [q["question"] for q in load_questions()]
    llm = CountingModel(seed=7)
    pipeline = RAGPipeline(
        build_retriever(k=4),
        llm,
        prompt_version="bench",
        model_version="extractive",
        n_samples=5,
        tracer_provider=NoOpTracerProvider(),
        audit=None,
    )
    spent = {"before": 0.0, "after": 0.0}
    calls = {"before": 0, "after": 0}
    for i in range(requests + len(questions)):
        question = questions[i % len(questions)]
        for label in ("before", "after"):
            n0 = CALLS[0]
            t0 = time.process_time()
            if label == "before":
                with without_attribution():
                    pipeline.invoke(question)
            else:
                pipeline.invoke(question)
            if i >= len(questions):  # the first round warms up both
                spent[label] += time.process_time() - t0
                calls[label] += CALLS[0] - n0
    return (
        spent["before"] / requests * 1000,
        spent["after"] / requests * 1000,
        calls["before"] // requests,
        calls["after"] // requests,
    )


def main() -> None:
    logging.getLogger("tracerag.escalation").setLevel(logging.ERROR)
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=2000)
    ap.add_argument("--requests", type=int, default=200)
    args = ap.parse_args()
    recs = records()
    print(
        f"attribution tiers 1+2 per request, {len(recs)} demo questions, k=4, budget "
        f"{BUDGET_MS} ms CPU\n"
    )
    print(
        "1. the call sites' work alone (CPU ms per request, least of 5 blocks, "
        f"{args.repeat} repetitions per question):"
    )
    for label, cold in (("cold caches", True), ("warm caches", False)):
        values = direct(recs, args.repeat, cold)
        print(
            f"   {label:12} median {statistics.median(values):.3f} ms, "
            f"max {max(values):.3f} ms  ({max(values) / BUDGET_MS:.2f}x of budget at max)"
        )
    before, after, calls_before, calls_after = pipeline_cpu(args.requests)
    print(
        f"\n2. the whole pipeline, zero-latency extractive model, N=5, plan separate, "
        f"{args.requests} requests each, interleaved:"
    )
    print(f"   {'':8} {'CPU ms/request':>15} {'model calls/request':>20}")
    print(f"   {'before':8} {before:15.3f} {calls_before:20d}")
    print(f"   {'after':8} {after:15.3f} {calls_after:20d}")
    print(
        f"   after/before {after / before:.3f}x, difference {after - before:+.3f} ms "
        "(noisier than 1.: the whole request's CPU varies by more than the difference)"
    )


if __name__ == "__main__":
    main()
