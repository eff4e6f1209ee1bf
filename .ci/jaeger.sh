#!/usr/bin/env bash
# Jaeger v2 all-in-one (in-memory storage) for the real-Jaeger tests and for trying tracerag
# locally, bound to 127.0.0.1 only.
#
#   bash .ci/jaeger.sh build            # build (once) and print the binary's path
#   eval "$(bash .ci/jaeger.sh start)"  # build if needed, start on free ports, export:
#       TRACERAG_JAEGER_BIN, TRACERAG_JAEGER_URL (UI and query API), TRACERAG_JAEGER_OTLP_GRPC,
#       TRACERAG_JAEGER_OTLP_HTTP, TRACERAG_JAEGER_DIR (log, pid)
#   bash .ci/jaeger.sh stop [DIR]       # stop it (DIR defaults to $TRACERAG_JAEGER_DIR)
#
# Building: `go install github.com/jaegertracing/jaeger/cmd/jaeger@VERSION` is refused by Go
# because Jaeger's go.mod has replace directives, so the module is fetched with
# `go mod download`, copied to a writable directory (the module cache is read-only) and built
# there as the main module. The binary is kept in $TRACERAG_JAEGER_CACHE (default
# ~/.cache/tracerag/jaeger) and reused on later runs on the same machine; a fresh machine
# builds it (385 s measured on a fresh 2-core machine: module downloads and compiling; Go's
# build cache makes a rebuild quick). The binary from the module carries a placeholder page instead of the Jaeger UI (the UI
# is a separate JavaScript build), so the query API is what tests use.
#
# Environment: JAEGER_VERSION (default v1.76.0); JAEGER_OTLP_GRPC_PORT, JAEGER_OTLP_HTTP_PORT,
# JAEGER_QUERY_HTTP_PORT (default: free ports for start; set 4317/4318/16686 for the usual ones).
# Everything goes to stderr except the path (build) and the export lines (start) on stdout.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
version=${JAEGER_VERSION:-v1.76.0}
cache=${TRACERAG_JAEGER_CACHE:-$HOME/.cache/tracerag/jaeger}
bin="$cache/jaeger-$version"

log() { echo "jaeger.sh: $*" >&2; }

build() {
    if [ -x "$bin" ]; then
        log "using cached $bin"
        echo "$bin"
        return 0
    fi
    command -v go >/dev/null || { log "Go is needed to build Jaeger (go version)"; exit 1; }
    log "building Jaeger $version with $(go version)"
    local started dir work
    started=$(date +%s)
    dir=$(go mod download -json "github.com/jaegertracing/jaeger@$version" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
    mkdir -p "$cache"
    work=$(mktemp -d "$cache/build.XXXXXX")
    trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' RETURN
    cp -r "$dir" "$work/src"
    chmod -R u+w "$work/src"
    local pkg=github.com/jaegertracing/jaeger/internal/version
    (
        cd "$work/src"
        GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod" CGO_ENABLED=0 go build -trimpath \
            -ldflags "-s -w -X $pkg.latestVersion=$version -X $pkg.date=$(date -u +%F)" \
            -o "$work/jaeger" ./cmd/jaeger >&2
    )
    mv "$work/jaeger" "$bin"
    log "built $bin in $(( $(date +%s) - started ))s"
    echo "$bin"
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

start() {
    local binary dir
    binary=$(build)
    dir=$(mktemp -d "${TMPDIR:-/tmp}/tracerag-jaeger.XXXXXX")
    export JAEGER_OTLP_GRPC_PORT=${JAEGER_OTLP_GRPC_PORT:-$(free_port)}
    export JAEGER_OTLP_HTTP_PORT=${JAEGER_OTLP_HTTP_PORT:-$(free_port)}
    export JAEGER_QUERY_HTTP_PORT=${JAEGER_QUERY_HTTP_PORT:-$(free_port)}
    export JAEGER_QUERY_GRPC_PORT=${JAEGER_QUERY_GRPC_PORT:-$(free_port)}
    export JAEGER_HEALTH_PORT=${JAEGER_HEALTH_PORT:-$(free_port)}
    # setsid: the server outlives this script and is not stopped by the caller's job control
    setsid "$binary" --config "$here/jaeger.yaml" >"$dir/jaeger.log" 2>&1 < /dev/null &
    echo $! >"$dir/pid"
    local health="http://127.0.0.1:$JAEGER_HEALTH_PORT/status" i
    for i in $(seq 1 150); do
        if python3 - "$health" <<'PY' 2>/dev/null
import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=1).read()
PY
        then
            break
        fi
        if ! kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
            cat "$dir/jaeger.log" >&2
            log "Jaeger exited during start"
            exit 1
        fi
        sleep 0.2
    done
    local url="http://127.0.0.1:$JAEGER_QUERY_HTTP_PORT"
    log "Jaeger $version running (pid $(cat "$dir/pid"), log $dir/jaeger.log)"
    log "  OTLP gRPC: http://127.0.0.1:$JAEGER_OTLP_GRPC_PORT   OTLP HTTP: http://127.0.0.1:$JAEGER_OTLP_HTTP_PORT"
    log "  query API: $url/api/traces?service=tracerag   trace page: $url/trace/<trace id>"
    log "  send tracerag's spans there: OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:$JAEGER_OTLP_HTTP_PORT OTEL_METRICS_EXPORTER=none"
    echo "export TRACERAG_JAEGER_BIN='$binary'"
    echo "export TRACERAG_JAEGER_URL='$url'"
    echo "export TRACERAG_JAEGER_OTLP_GRPC='http://127.0.0.1:$JAEGER_OTLP_GRPC_PORT'"
    echo "export TRACERAG_JAEGER_OTLP_HTTP='http://127.0.0.1:$JAEGER_OTLP_HTTP_PORT'"
    echo "export TRACERAG_JAEGER_DIR='$dir'"
}

stop() {
    local dir=${1:-${TRACERAG_JAEGER_DIR:-}}
    if [ -z "$dir" ] || [ ! -f "$dir/pid" ]; then log "nothing to stop (${dir:-no dir})"; return 0; fi
    local pid
    pid=$(cat "$dir/pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -rf "$dir"
    log "stopped Jaeger (pid $pid)"
}

case "${1:-start}" in
    build) build ;;
    start) start ;;
    stop) shift; stop "$@" ;;
    *) log "usage: $0 [build|start|stop [DIR]]"; exit 2 ;;
esac
