"""The ``tracerag audit adversarial`` command: its options, the cases it reads, the gate.

The floors per kind and the false-alarm ceiling decide the exit code.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tracerag.errors import ConfigurationError, InputError
from tracerag.signals._support import get_backend
from tracerag.tools._adversarial_cases import DEFAULT_SEEDS, demo_cases, store_cases
from tracerag.tools._adversarial_mutations import MUTATION_KINDS
from tracerag.tools._adversarial_report import (
    DEFAULT_FLOORS,
    DEFAULT_MAX_FALSE_ALARM,
    run_adversarial,
)
from tracerag.tools._audit import add_audit_command
from tracerag.tools._command import Subparsers, add_json_argument, print_json

__all__ = ["add_parser", "parse_floors"]


def parse_floors(texts: Sequence[str] | None) -> dict[str, float]:
    """``["fabricated=1.0,number=0.95", "date=95%"]`` → floors per mutation kind."""
    floors = dict(DEFAULT_FLOORS)
    for text in texts or []:
        for item in filter(None, (p.strip() for p in text.split(","))):
            name, sep, value = item.partition("=")
            name = name.strip().replace("-", "_")
            if not sep or name not in MUTATION_KINDS:
                raise InputError(
                    f"cannot read floor {item!r}: use KIND=RATE with KIND one of "
                    f"{', '.join(MUTATION_KINDS)}"
                )
            value = value.strip()
            rate = float(value[:-1]) / 100 if value.endswith("%") else float(value)
            if not 0.0 <= rate <= 1.0:
                raise InputError(f"floor {item!r} is not a rate between 0 and 1")
            floors[name] = rate
    return floors


def _run(args: argparse.Namespace) -> int:
    # imported when the command runs, not at the top: importing it registers the judge backend
    # (so "--backend judge" says how to configure it), a side effect only this command wants
    import tracerag.signals._judge  # noqa: F401

    try:
        floors = parse_floors(args.floor)
        seeds = [int(s) for s in str(args.seeds).split(",") if s.strip()]
        backend = get_backend(args.backend)
    except (ValueError, ConfigurationError) as exc:
        print(f"tracerag audit adversarial: {exc}", file=sys.stderr)
        return 2
    if args.store:
        cases = store_cases(args.store, limit=args.limit)
        source = cases[0].source if cases else f"store {args.store}"
    else:
        cases = demo_cases(seeds)
        source = f"demo knowledge base, extractive model, seeds {','.join(map(str, seeds))}"
    report = run_adversarial(
        cases,
        backend=backend,
        floors=floors,
        max_false_alarm=args.max_false_alarm,
        seed=args.seed,
        source=source,
    )
    if args.json:
        print_json(report.to_dict())
    else:
        print(report.render(show_misses=args.show_misses))
    return 0 if report.ok else 1


def _configure(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group()
    where.add_argument("--store", metavar="URL", help="mutate the answers of stored requests")
    where.add_argument(
        "--demo",
        action="store_true",
        help="mutate answers to the demo knowledge base's questions (default)",
    )
    p.add_argument("--limit", type=int, default=500, help="stored requests to read (newest)")
    p.add_argument(
        "--seeds",
        default=",".join(map(str, DEFAULT_SEEDS)),
        help="demo: seeds of the extractive model (default 1,2,3)",
    )
    p.add_argument("--backend", default="lexical", help="support backend (default lexical)")
    p.add_argument(
        "--floor",
        action="append",
        metavar="KIND=RATE,...",
        help="minimum interception rate per mutation kind (default "
        + ",".join(f"{k}={v}" for k, v in DEFAULT_FLOORS.items())
        + f"); kinds: {', '.join(MUTATION_KINDS)}",
    )
    p.add_argument(
        "--max-false-alarm",
        type=float,
        default=DEFAULT_MAX_FALSE_ALARM,
        help="highest acceptable false-alarm rate (default 0.05)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the mutations")
    p.add_argument("--show-misses", type=int, default=3, help="missed mutations shown per kind")
    add_json_argument(p, "print the report as JSON")
    p.set_defaults(func=_run)


_HELP = "mutate real answers and check that the citation verifier catches them"


def add_parser(subparsers: Subparsers) -> None:
    """Register ``tracerag audit adversarial`` in the ``tracerag audit`` group."""
    add_audit_command("adversarial", _HELP, _configure)
