#!/usr/bin/env bash
# A minimal OpenTelemetry Collector (the components in .ci/otelcol-builder.yaml), built with the
# Collector's own builder from the Go module proxy, for the tracerag → Collector → Jaeger test
# and for checking examples/observability/otel-collector.yaml.
#
#   bash .ci/otelcol.sh build             # build (once) and print the binary's path
#   bash .ci/otelcol.sh validate CONFIG   # check a Collector config with that binary
#
# Nothing is compiled twice: Jaeger v2 (.ci/jaeger.sh) is itself a Collector distribution, and
# this Collector is built from the same code. The manifest pins the Collector and contrib
# versions of Jaeger's go.mod (checked here), the generated module requires every module Jaeger
# requires at Jaeger's version (and takes Jaeger's replace directives), and the builder is
# compiled, and compiles, with Jaeger's flags (-trimpath, CGO_ENABLED=0). So after
# `.ci/jaeger.sh build` on the same machine, Go's build cache already holds every package but
# the health_check extension's three and a few of the builder's, and this build takes seconds;
# built alone, it compiles what Jaeger would of those packages. Jaeger v1.76 is built on
# Collector v0.140, which names the OTLP/gRPC exporter `otlp` (v0.144 renamed it `otlp_grpc`).
#
# The binary is kept in $TRACERAG_OTELCOL_CACHE (default ~/.cache/tracerag/otelcol) and reused
# on later runs on the same machine. JAEGER_VERSION (default v1.76.0, as in .ci/jaeger.sh) is
# the Jaeger whose go.mod gives the versions. Everything goes to stderr except the path (build).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
manifest="$here/otelcol-builder.yaml"
version=v$(sed -n 's/^  version: *//p' "$manifest")  # the Collector, and the builder's version
jaeger_version=${JAEGER_VERSION:-v1.76.0}
cache=${TRACERAG_OTELCOL_CACHE:-$HOME/.cache/tracerag/otelcol}
stamp=$(sha256sum "$manifest" | cut -c1-12)
bin="$cache/otelcol-min-$version-$stamp"
builder="go.opentelemetry.io/collector/cmd/builder@$version"

log() { echo "otelcol.sh: $*" >&2; }

# jaeger_pins GO_MOD MANIFEST VERSION: check that the manifest and VERSION are what Jaeger's
# go.mod uses, then print the go mod edit flags that give the generated module Jaeger's versions
jaeger_pins() {
    python3 - "$1" "$2" "$3" <<'PY'
import json, re, subprocess, sys

go_mod, manifest, version = sys.argv[1:]
edit = subprocess.run(["go", "mod", "edit", "-json", go_mod], capture_output=True, check=True)
gomod = json.loads(edit.stdout)
jaeger = {r["Path"]: r["Version"] for r in gomod["Require"]}
wrong = []
otelcol = jaeger.get("go.opentelemetry.io/collector/otelcol")
if otelcol != version:
    wrong.append(f"go.opentelemetry.io/collector/otelcol {otelcol} (manifest: {version})")
for path, pinned in re.findall(r"gomod:\s*(\S+)\s+(\S+)", open(manifest).read()):
    if path in jaeger and jaeger[path] != pinned:
        wrong.append(f"{path} {jaeger[path]} (manifest: {pinned})")
if wrong:
    sys.exit("Jaeger's go.mod has other versions than the Collector build: " + "; ".join(wrong))
flags = [f"-require={p}@{v}" for p, v in jaeger.items()]
flags += [
    f"-replace={r['Old']['Path']}={r['New']['Path']}@{r['New']['Version']}"
    for r in gomod.get("Replace") or []
    if r["New"].get("Version")
]
print("\n".join(flags))
PY
}

ocb() {  # ocb DIR FLAG...: the Collector builder on the manifest, its output in DIR
    local dir=$1
    shift
    # the builder itself compiled as Jaeger is (-trimpath, no cgo): on Jaeger's standard library
    # packages, not a second set of them
    CGO_ENABLED=0 go run -trimpath "$builder" --config "$manifest" --output-path "$dir" "$@" >&2
}

build() {
    if [ -x "$bin" ]; then
        log "using cached $bin"
        echo "$bin"
        return 0
    fi
    command -v go >/dev/null || { log "Go is needed to build the Collector (go version)"; exit 1; }
    log "building the Collector $version (its builder; the module versions of Jaeger" \
        "$jaeger_version) with $(go version)"
    local started work jaeger_mod jaeger_dir pins
    started=$(date +%s)
    read -r jaeger_mod jaeger_dir < <(
        go mod download -json "github.com/jaegertracing/jaeger@$jaeger_version" |
            python3 -c 'import json,sys; m=json.load(sys.stdin); print(m["GoMod"], m["Dir"])'
    )
    pins=$(jaeger_pins "$jaeger_mod" "$manifest" "$version") ||
        { log "update the versions in .ci/otelcol-builder.yaml"; exit 1; }
    mkdir -p "$cache"
    work=$(mktemp -d "$cache/build.XXXXXX")
    trap 'rm -rf "$work"' RETURN
    ocb "$work" --skip-compilation
    (
        cd "$work"
        # shellcheck disable=SC2086  # one flag a line, none with spaces
        go mod edit $pins
        cat "$jaeger_dir/go.sum" >>go.sum
        sort -u -o go.sum go.sum
    )
    GOFLAGS="${GOFLAGS:+$GOFLAGS }-mod=mod" ocb "$work" --skip-generate --skip-get-modules
    mv "$work/otelcol-min" "$bin"
    log "built $bin in $(( $(date +%s) - started ))s"
    echo "$bin"
}

case "${1:-build}" in
    build) build ;;
    validate) shift; binary=$(build); "$binary" validate --config "$1" ;;
    *) log "usage: $0 [build|validate CONFIG]"; exit 2 ;;
esac
