#!/usr/bin/env bash
# Install what the review-desk browser tests need: Debian's Chromium and Playwright for Python.
#
#   bash .ci/browser.sh
#
# Idempotent and quick when both are present. Playwright drives the system Chromium at
# /usr/bin/chromium; its own browser download (`playwright install`) is never used.
set -euo pipefail

log() { echo "browser.sh: $*" >&2; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
        log "need root (or sudo) to run: $*"; return 1
    fi
}

if [ -x /usr/bin/chromium ]; then
    log "chromium present: $(/usr/bin/chromium --version 2>/dev/null || echo unknown version)"
else
    log "installing chromium from Debian's packages"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        chromium >/dev/null
fi

PYTHON=${PYTHON:-python}
if "$PYTHON" -c "import playwright.sync_api" 2>/dev/null; then
    log "playwright present"
else
    log "installing playwright (the Python package only)"
    "$PYTHON" -m pip install --quiet "playwright>=1.40"
fi
