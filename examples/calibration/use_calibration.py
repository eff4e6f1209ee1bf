"""Answer the demo questions with the heuristic and with a fitted calibration, side by side.

Every Response names the calibration that produced its confidence (``Response.calibration``):
``heuristic-v1`` by default, the calibration id (e.g. ``logistic-07e631b1``) with a fitted one.

    python examples/calibration/use_calibration.py [calibration.json]
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from tracerag import RAGPipeline
from tracerag.demo.kb import build_retriever, load_questions
from tracerag.demo.models.extractive import ExtractiveChatModel
from tracerag.prompts import DEFAULT_PROMPT_VERSION
from tracerag.signals.calibrated import CalibratedCombiner

HERE = Path(__file__).resolve().parent


def pipeline(combiner=None) -> RAGPipeline:
    return RAGPipeline(
        build_retriever(k=4),
        ExtractiveChatModel(seed=7),
        prompt_version=DEFAULT_PROMPT_VERSION,
        model_version="tracerag-extractive-1",
        combiner=combiner,
    )


def main() -> None:
    logging.getLogger("tracerag.escalation").setLevel(logging.ERROR)
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "calibration.json"
    heuristic = pipeline()
    calibrated = pipeline(CalibratedCombiner.from_file(path))
    for q in load_questions():
        a = heuristic.invoke(q["question"])
        b = calibrated.invoke(q["question"])
        print(q["question"])
        for r in (a, b):
            print(f"    {r.calibration:<20} confidence {r.confidence:<7} → {r.decision}")


if __name__ == "__main__":
    main()
