#!/usr/bin/env bash
# Installs what the observability backend tests need:
#   - Debian's prometheus binary (tests/telemetry/test_backends_prometheus.py); the service is NOT started,
#     the test runs the binary itself on 127.0.0.1 with a temporary config and TSDB;
#   - opentelemetry-exporter-prometheus (tracerag.metrics.start_prometheus_server);
#   - arize-phoenix in its own virtualenv (tests/telemetry/test_backends_phoenix.py), so its many
#     dependencies never change the versions tracerag itself is tested with.
# Idempotent: what is already there is kept. Takes about 3 minutes on a fresh machine
# (apt ~40 s, Phoenix venv ~2 min), a few seconds when everything is installed.
set -euo pipefail

PHOENIX_VENV="${TRACERAG_PHOENIX_VENV:-$HOME/.cache/tracerag/phoenix-venv}"
PYTHON="${PYTHON:-python3}"
started=$(date +%s)
step() { echo "[observability] $* (+$(( $(date +%s) - started ))s)"; }

# --- Prometheus (Debian package), without starting it as a service -------------------------
if ! command -v prometheus >/dev/null 2>&1; then
  step "installing prometheus"
  created_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    # tell invoke-rc.d not to start services while installing
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    created_policy=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  if [ "$created_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
fi
step "prometheus: $(prometheus --version 2>&1 | head -n 1)"

# --- Prometheus exporter for OpenTelemetry metrics ----------------------------------------
if ! "$PYTHON" -c "import opentelemetry.exporter.prometheus" >/dev/null 2>&1; then
  step "installing opentelemetry-exporter-prometheus"
  "$PYTHON" -m pip install -q opentelemetry-exporter-prometheus
fi
step "opentelemetry-exporter-prometheus: $("$PYTHON" -m pip show opentelemetry-exporter-prometheus 2>/dev/null | sed -n 's/^Version: //p')"

# --- Arize Phoenix in its own venv ---------------------------------------------------------
if ! "$PHOENIX_VENV/bin/python" -m pip show -q arize-phoenix >/dev/null 2>&1; then
  step "installing arize-phoenix into $PHOENIX_VENV"
  rm -rf "$PHOENIX_VENV"
  mkdir -p "$(dirname "$PHOENIX_VENV")"
  "$PYTHON" -m venv "$PHOENIX_VENV"
  "$PHOENIX_VENV/bin/python" -m pip install -q --upgrade pip
  "$PHOENIX_VENV/bin/python" -m pip install -q arize-phoenix
  "$PHOENIX_VENV/bin/python" -m pip check
fi
step "arize-phoenix: $("$PHOENIX_VENV/bin/python" -m pip show arize-phoenix 2>/dev/null | sed -n 's/^Version: //p')"

# report (do not fail on) conflicts among packages this script did not install
"$PYTHON" -m pip check || echo "[observability] note: pip check reports the conflicts above"
step "done"
