#!/usr/bin/env bash
# A minimal OpenTelemetry Collector (the components in .ci/otelcol-builder.yaml), built with the
# Collector's own builder from the Go module proxy, for the tracerag → Collector → Jaeger test.
#
#   bash .ci/otelcol.sh build             # build (once) and print the binary's path
#   bash .ci/otelcol.sh validate CONFIG   # check a Collector config with that binary
#
# The binary is kept in $TRACERAG_OTELCOL_CACHE (default ~/.cache/tracerag/otelcol) and reused
# on later runs on the same machine. Everything goes to stderr except the path (build).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
version=v0.165.0
cache=${TRACERAG_OTELCOL_CACHE:-$HOME/.cache/tracerag/otelcol}
manifest="$here/otelcol-builder.yaml"
stamp=$(sha256sum "$manifest" | cut -c1-12)
bin="$cache/otelcol-min-$version-$stamp"

log() { echo "otelcol.sh: $*" >&2; }

build() {
    if [ -x "$bin" ]; then
        log "using cached $bin"
        echo "$bin"
        return 0
    fi
    command -v go >/dev/null || { log "Go is needed to build the Collector (go version)"; exit 1; }
    log "building the Collector $version (builder $version) with $(go version)"
    local started work
    started=$(date +%s)
    mkdir -p "$cache"
    work=$(mktemp -d "$cache/build.XXXXXX")
    trap 'rm -rf "$work"' RETURN
    go run "go.opentelemetry.io/collector/cmd/builder@$version" \
        --config "$manifest" --output-path "$work" >&2
    mv "$work/otelcol-min" "$bin"
    log "built $bin in $(( $(date +%s) - started ))s"
    echo "$bin"
}

case "${1:-build}" in
    build) build ;;
    validate) shift; binary=$(build); "$binary" validate --config "$1" ;;
    *) log "usage: $0 [build|validate CONFIG]"; exit 2 ;;
esac
