"""``tracerag serve``: the answer API and the review desk over HTTP (uvicorn).

Serves the demo knowledge base, or with ``--app module:attribute`` your own ``wrap()``-ed app
or ``RAGPipeline`` (``--factory`` when the attribute is a function that builds it). Binds
127.0.0.1 by default. The review desk needs reviewer credentials
(``TRACERAG_REVIEWER_TOKEN`` or a reviewers file); without them the command refuses to start
unless told ``--no-review-desk``. A store that can be down while the server runs (PostgreSQL)
needs an audit journal (``--journal DIR`` or ``TRACERAG_AUDIT_JOURNAL``), or ``--no-journal``
to run without one. Forwarded headers are believed only from ``--forwarded-allow-ips`` (see
``tracerag.server._uvicorn``). ``--hash-token NAME`` prints a reviewers-file line for a
token read from standard input. Log lines at WARNING and above (store failures, failed
sign-ins) go to standard error.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING, TextIO

from tracerag.config import get_config
from tracerag.errors import ConfigurationError

if TYPE_CHECKING:
    from tracerag._runnable import StagedRunnable
    from tracerag.server._answerer import DemoOptions

DEFAULT_PORT = 8000
#: the demo pipeline's settings: with --app the app's own hold, and these are refused
DEMO_DEFAULTS = {"model": None, "samples": 5, "temperature": 0.7, "plan": "separate", "seed": None}


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


if TYPE_CHECKING:
    _StreamHandler = logging.StreamHandler[TextIO]
else:  # generic at run time from Python 3.11 on
    _StreamHandler = logging.StreamHandler


class _Stderr(_StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of each record."""

    #: marks the handler ``configure_logging`` added (added once however often it is called)
    _tracerag_serve = True

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


def configure_logging(level: str) -> None:
    """Send tracerag's log lines at ``level`` (default WARNING) and above to standard error."""
    logger = logging.getLogger("tracerag")
    numeric = logging.getLevelName(level.upper())
    logger.setLevel(numeric if isinstance(numeric, int) else logging.WARNING)
    if not any(getattr(h, "_tracerag_serve", False) for h in logger.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        logger.addHandler(handler)
        logger.propagate = False


def hash_token_line(name: str, stream: TextIO | None = None) -> int:
    """Print ``name:sha256:<hex>`` for a token read from standard input."""
    # CLI start-up light: the server modules load only when a serve command runs
    from tracerag.server._auth import GENERATE_HINT, hash_token, token_problem, valid_reviewer_name

    if not valid_reviewer_name(name):
        print(
            "tracerag serve: a name is up to 64 letters, digits, spaces or .@+-_", file=sys.stderr
        )
        return 2
    stream = stream or sys.stdin
    if stream.isatty():
        import getpass

        token = getpass.getpass(f"token for {name}: ")
    else:
        token = stream.readline().rstrip("\r\n")
    problem = token_problem(token)
    if problem:
        print(f"tracerag serve: {problem}; {GENERATE_HINT}", file=sys.stderr)
        return 2
    print(f"{name}:{hash_token(token)}")
    return 0


def _pipeline(
    args: argparse.Namespace,
) -> tuple[StagedRunnable | None, str, str, DemoOptions]:
    """What to serve: the ``--app`` target (or None for the demo), how to name it, and the
    demo's model and options (``create_app`` builds the demo pipeline over the store's
    material registry)."""
    given = [name for name, default in DEMO_DEFAULTS.items() if getattr(args, name) is not None]
    if args.app is None:
        if args.factory:
            raise ConfigurationError("--factory goes with --app module:function")
        options = {name: getattr(args, name) for name in DEMO_DEFAULTS}
        for name, default in DEMO_DEFAULTS.items():
            if options[name] is None:
                options[name] = default
        model = options.pop("model") or get_config().model or "extractive"
        demo: DemoOptions = {
            "n_samples": options["samples"],
            "temperature": options["temperature"],
            "plan": options["plan"],
            "seed": options["seed"],
        }
        return None, "the demo knowledge base", model, demo
    if given:
        flags = ", ".join(f"--{name}" for name in given)
        raise ConfigurationError(
            f"{flags} set the demo pipeline; with --app the app's own settings hold"
        )
    from tracerag.server._target import load_app  # CLI start-up light, as above

    app = load_app(args.app, factory=args.factory, app_dir=args.app_dir)
    return app, args.app, "extractive", {}


def run(args: argparse.Namespace) -> int:
    """Build the app and serve it until interrupted."""
    if args.hash_token is not None:
        return hash_token_line(args.hash_token)
    configure_logging(args.log_level)
    try:
        import uvicorn

        from tracerag.server._asgi import create_app  # CLI start-up light, as above
    except ImportError as exc:
        print(
            "tracerag serve needs the 'server' extra: from the tracerag source tree, "
            f'pip install ".[server]" ({exc})',
            file=sys.stderr,
        )
        return 2

    try:
        pipeline, serving, model, demo_options = _pipeline(args)
        app = create_app(
            pipeline,
            model=model,
            demo_options=demo_options,
            store=args.store,
            review_desk=not args.no_review_desk,
            on_decision=args.webhook,
            max_body_bytes=args.max_body,
            secure_cookies=args.secure_cookies,
            reviewers=args.reviewers_file,
            cors_origins=args.cors_origin,
            trace_ui=args.trace_ui,
            journal=False if args.no_journal else args.journal,
            replay_seconds=args.replay_seconds,
            desk_config=args.desk_config,
        )
    except ConfigurationError as exc:
        print(f"tracerag serve: {exc}", file=sys.stderr)
        return 2
    from tracerag.server._uvicorn import uvicorn_options  # CLI start-up light, as above

    options = uvicorn_options(args.forwarded_allow_ips)
    desk = "off" if args.no_review_desk else f"http://{args.host}:{args.port}/review"
    print(
        f"tracerag serve: {serving}: answers at http://{args.host}:{args.port}/v1/answer, "
        f"review desk {desk}",
        file=sys.stderr,
    )
    if args.no_journal:
        print(
            "tracerag serve: no audit journal (--no-journal): while the store is down, answers "
            "say audit_persisted: false and their records are lost if this process dies",
            file=sys.stderr,
        )
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, **options)
    return 0


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``tracerag serve``."""
    # CLI start-up light: every command's parser is built at start, its modules load on use
    from tracerag.tools._store_args import add_store_argument

    p = subparsers.add_parser(
        "serve",
        help="serve the answer API and the review desk over HTTP",
        description="Serve POST /v1/answer (and /v1/answer/stream, POST /v1/requests with its "
        "EventSource stream, GET /v1/requests/ID) over the demo knowledge base or your own "
        "app (--app module:attribute), and the review desk at /review. Reviewer token: "
        "TRACERAG_REVIEWER_TOKEN; optional frontend key: TRACERAG_API_KEY (header X-API-Key); "
        "optional decision webhook: TRACERAG_DECISION_WEBHOOK.",
    )
    p.add_argument(
        "--app",
        metavar="MODULE:ATTRIBUTE",
        default=None,
        help="serve your own app: a tracerag.wrap(...) result or a RAGPipeline, e.g. "
        "myproject.rag:app (default: the demo knowledge base)",
    )
    p.add_argument(
        "--factory",
        action="store_true",
        help="--app names a function that takes no arguments and returns the app",
    )
    p.add_argument(
        "--app-dir",
        default=".",
        help="directory put first on the import path for --app (default: the current one)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="port (default 8000)")
    add_store_argument(p)
    p.add_argument(
        "--model",
        choices=["extractive", "local"],
        default=None,
        help="the demo's model: extractive (offline, default) or local; default from "
        "$TRACERAG_MODEL",
    )
    p.add_argument(
        "--samples", type=int, default=None, help="the demo's samples per question (default 5)"
    )
    p.add_argument(
        "--temperature", type=float, default=None, help="the demo's temperature (default 0.7)"
    )
    p.add_argument(
        "--plan",
        default=None,
        choices=["separate", "inline"],
        help="the demo's planning (default separate)",
    )
    p.add_argument("--seed", type=int, default=None, help="seed of the demo's extractive model")
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
    p.add_argument(
        "--reviewers-file",
        default=None,
        help="named reviewer tokens, one 'name:sha256:<hex>' a line (default "
        "$TRACERAG_REVIEWERS_FILE); make a line with --hash-token NAME",
    )
    p.add_argument(
        "--hash-token",
        metavar="NAME",
        default=None,
        help="print a reviewers-file line for NAME and the token on standard input, and exit",
    )
    p.add_argument(
        "--cors-origin",
        action="append",
        default=None,
        metavar="ORIGIN",
        help="an exact origin (https://app.example.com) whose pages may call /v1; repeatable "
        "(default $TRACERAG_CORS_ORIGINS, comma-separated)",
    )
    p.add_argument(
        "--trace-ui",
        default=None,
        help="link review items to their trace: jaeger, tempo or phoenix, optionally =BASE_URL "
        "(default $TRACERAG_TRACE_UI)",
    )
    journal = p.add_mutually_exclusive_group()
    journal.add_argument(
        "--journal",
        metavar="DIR",
        default=None,
        help="the audit journal's directory, on a persistent local disk (default "
        "$TRACERAG_AUDIT_JOURNAL, else beside a SQLite store; a PostgreSQL store needs one)",
    )
    journal.add_argument(
        "--no-journal",
        action="store_true",
        help="run without an audit journal: while the store is down, answers say "
        "audit_persisted: false and their records live in memory only",
    )
    p.add_argument(
        "--forwarded-allow-ips",
        metavar="ADDRS",
        default=None,
        help="comma-separated addresses (or *) of the reverse proxies whose X-Forwarded-For "
        "and X-Forwarded-Proto are believed (default $TRACERAG_FORWARDED_ALLOW_IPS, else none: "
        "the client address is the TCP peer's)",
    )
    p.add_argument(
        "--replay-seconds",
        type=float,
        default=600.0,
        help="how long a request's events are kept for reconnects and its Idempotency-Key "
        "honoured (default 600)",
    )
    p.add_argument(
        "--desk-config",
        default=None,
        metavar="FILE",
        help="the desk's queues as JSON: per queue, the rubric reviewers score and how many "
        "reviewers each item needs (default $TRACERAG_DESK_CONFIG)",
    )
    p.add_argument(
        "--log-level",
        default="warning",
        help="log level of uvicorn and tracerag (default warning: store failures, failed sign-ins)",
    )
    p.set_defaults(func=run)
