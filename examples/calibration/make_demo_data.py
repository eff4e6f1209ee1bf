"""Write a synthetic labelled calibration set from the bundled demo knowledge base.

The demo and probe questions are answered offline through RAGPipeline by the extractive model,
once as is and once per mutation kind with a share of the samples made wrong (a changed number
or date, a swapped entity, an added or removed negation, a fabricated or moved citation). Each
row holds the response's signals and whether the chosen answer was right. The labels are known
by construction, not judged by people: this set shows how calibration works; it is no evidence
of how well any setting is calibrated on real traffic.

    python examples/calibration/make_demo_data.py [OUT.jsonl] [--seeds 1,2,3]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tracerag.tools.calibration import demo_calibration_rows

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default=str(HERE / "demo_labelled.jsonl"))
    parser.add_argument("--seeds", default="1,2,3")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    rows = demo_calibration_rows(seeds)
    with open(args.out, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
    right = sum(r["correct"] for r in rows)
    print(f"wrote {len(rows)} rows ({right} right, {len(rows) - right} wrong) to {args.out}")


if __name__ == "__main__":
    main()
