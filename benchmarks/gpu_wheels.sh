#!/usr/bin/env bash
# The few wheels relayrl needs on the bare GPU box (benchmarks/gpu_check.sh) beyond what it has installed, downloaded
# HERE (where the package index is reachable) into runs/gpu_wheels, to travel with the check's command.
#
# The box: Python 3.12, torch 2.11 (CUDA 13), transformers 5.17, peft, safetensors, xxhash, pyyaml, rich,
# tensorboard; no vLLM, no Ray, no pydantic. On the paths the check's steps use, relayrl imports (beyond those and
# their own dependencies: numpy, tokenizers, huggingface_hub, tqdm, sympy) only pydantic, for relayrl.config.
# So the set is pydantic and its dependencies, for cp312 manylinux x86_64, at requirements/cpu.lock's versions:
#   pydantic 2.14.4          494 kB  (pure Python)
#   pydantic_core 2.50.5     2.3 MB  (cp312, manylinux_2_17 / manylinux2014 x86_64: the tag its wheel carries)
#   annotated-types 0.8.0     13 kB
#   typing-inspection 0.4.5   15 kB
#   typing_extensions 4.16.0  46 kB  (pydantic 2.14 needs >= 4.16; the box's torch may have installed an older one)
# In all 2.8 MB (measured 2026-12-01), well under the ~20 MB allowed beside the source tree.
# math-verify (and its latex2sympy2_extended, antlr4) is left out: no step scores math.
#
# pip's --platform takes one tag per flag and matches it exactly: pydantic_core's wheel says manylinux_2_17 and
# manylinux2014, which `--platform manylinux_2_28_x86_64` alone does not match, so the older tags are given too.
# Usage: bash benchmarks/gpu_wheels.sh [DIR]   (default runs/gpu_wheels; then carry that folder with the command)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="${1:-$ROOT/runs/gpu_wheels}"
VENV="${VENV:-$ROOT/.venv}"
if [ -x "$VENV/bin/python" ]; then PY="$VENV/bin/python"; else PY="$(command -v python3)"; fi
LOCK="$ROOT/requirements/cpu.lock"
pin() {  # the package's line of requirements/cpu.lock (name==version); fails if the lock has none
  local line
  line="$(grep -iE "^$1==" "$LOCK" | head -1)"
  [ -n "$line" ] || { echo "gpu_wheels: $1 is not pinned in $LOCK" >&2; exit 1; }
  echo "$line"
}
PINS=(
  "$(pin pydantic)"
  "$(pin pydantic_core)"
  "$(pin annotated-types)"
  "$(pin typing-inspection)"
  "$(pin typing_extensions)"
)
mkdir -p "$DEST"
rm -f "$DEST"/*.whl
"$PY" -m pip download --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any --no-deps -d "$DEST" "${PINS[@]}"
echo "gpu_wheels: $(ls "$DEST"/*.whl | wc -l) wheels, $(du -sh "$DEST" | cut -f1) in $DEST:"
ls -l "$DEST"
