"""``tracerag serve``: the answer API and the review desk over HTTP (uvicorn).

Binds 127.0.0.1 by default. The review desk needs ``TRACERAG_REVIEWER_TOKEN``; without it the
command refuses to start unless told ``--no-review-desk``.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from tracerag.errors import ConfigurationError

DEFAULT_PORT = 8000


def run(args: argparse.Namespace) -> int:
    """Build the app and serve it until interrupted."""
    try:
        import uvicorn

        from tracerag.server.app import create_app, demo_pipeline
    except ImportError as exc:
        print(
            f"tracerag serve needs the 'server' extra: pip install 'tracerag[server]' ({exc})",
            file=sys.stderr,
        )
        return 2
    from tracerag.tools.replay import MODEL_ENV

    model = args.model or os.environ.get(MODEL_ENV, "").strip() or "extractive"
    try:
        app = create_app(
            demo_pipeline(
                model,
                n_samples=args.samples,
                temperature=args.temperature,
                plan=args.plan,
                seed=args.seed,
            ),
            store=args.store,
            review_desk=not args.no_review_desk,
            on_decision=args.webhook,
            max_body_bytes=args.max_body,
            secure_cookies=args.secure_cookies,
        )
    except ConfigurationError as exc:
        print(f"tracerag serve: {exc}", file=sys.stderr)
        return 2
    desk = "off" if args.no_review_desk else f"http://{args.host}:{args.port}/review"
    print(
        f"tracerag serve: answers at http://{args.host}:{args.port}/v1/answer, review desk {desk}",
        file=sys.stderr,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def add_parser(subparsers: Any) -> None:
    """Register ``tracerag serve``."""
    from tracerag.tools.cli_store import add_store_argument

    p = subparsers.add_parser(
        "serve",
        help="serve the answer API and the review desk over HTTP",
        description="Serve POST /v1/answer (and /v1/answer/stream, GET /v1/requests/ID) over "
        "the demo knowledge base, and the review desk at /review. Reviewer token: "
        "TRACERAG_REVIEWER_TOKEN; optional frontend key: TRACERAG_API_KEY (header X-API-Key); "
        "optional decision webhook: TRACERAG_DECISION_WEBHOOK.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="port (default 8000)")
    add_store_argument(p)
    p.add_argument(
        "--model",
        choices=["extractive", "local"],
        default=None,
        help="extractive (offline, default) or local; default from $TRACERAG_MODEL",
    )
    p.add_argument("--samples", type=int, default=5, help="samples per question (default 5)")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--plan", default="separate", choices=["separate", "inline"])
    p.add_argument("--seed", type=int, default=None, help="seed of the extractive model")
    p.add_argument(
        "--no-review-desk",
        action="store_true",
        help="serve the answer API only (no reviewer token needed)",
    )
    p.add_argument("--webhook", default=None, help="URL told of each review decision (POST)")
    p.add_argument(
        "--max-body", type=int, default=64 * 1024, help="largest request body in bytes (64 KiB)"
    )
    p.add_argument(
        "--secure-cookies",
        action="store_true",
        help="mark the reviewer cookie Secure (when served over HTTPS)",
    )
    p.add_argument("--log-level", default="warning", help="uvicorn log level (default warning)")
    p.set_defaults(func=run)
