#!/usr/bin/env bash
# Install what the frontend check needs: TypeScript, openapi-typescript (types generated from the
# served OpenAPI document) and axe-core (accessibility checks of the desk), from npm, into
# tests/frontend/node_modules. Needs Node 20 and npm; downloads no browser.
#
#   bash .ci/frontend.sh
set -euo pipefail
cd "$(dirname "$0")/../tests/frontend"

log() { echo "frontend.sh: $*" >&2; }

if ! command -v npm >/dev/null; then
    log "installing Node.js and npm from Debian's packages"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi
if [ -x node_modules/.bin/tsc ] && [ -x node_modules/.bin/openapi-typescript ] \
    && [ -f node_modules/axe-core/axe.min.js ]; then
    log "present: $(node_modules/.bin/tsc --version)"
else
    log "installing the pinned versions of package.json"
    npm install --no-audit --no-fund --no-package-lock --loglevel=error
fi
