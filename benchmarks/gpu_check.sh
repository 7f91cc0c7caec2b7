#!/usr/bin/env bash
# The prepared GPU check, for a BARE GPU box: one NVIDIA H200 (~139 GiB), 16 cores, no internet; Python 3.12 with
# torch 2.11 (CUDA 13), transformers 5.17, peft, safetensors, xxhash, pyyaml, rich, tensorboard installed system-wide;
# no vLLM, no Ray, no pydantic. It runs from the source tree (PYTHONPATH=the repository), in at most 9 minutes in
# all (GPU_CHECK_BUDGET, seconds), and prints ONE table: step | status | seconds | key figure.
#
#   1. learner    PolicyLearner on CUDA, tiny random Llama (relayrl/models/tiny.py): bf16 passes over fp32 master
#                 weights; one update's loss finite; learner.activation_checkpointing=true gives the same gradients;
#                 train.packing=groups vs none log-probs (fp32 within 1e-3; bf16 within bf16's own noise)
#   2. flex       group-packed rows through FlexAttention (model.attention=flex_attention): log-probs vs the padded
#                 forward, first-step gradients vs SDPA's dense mask, one update's seconds on long rows, SDPA vs flex
#                 (benchmarks/gpu_check_flex.py; the CPU rehearsal checks the forward only)
#   3. fsdp       one FSDP2 rank on NCCL (W=1, spawned, relayrl.learner.sharded.sharded_learner) with
#                 learner.offload=params (CPUOffloadPolicy): an update with gradient clipping, then named_weights'
#                 full_tensor gathers, against the one-process learner
#   4. hf_engine  relayrl's HF engine generates on CUDA; its behaviour log-probs vs the learner's (mismatch/*)
#   5. cuda_ipc   1 GiB of bf16 weights handed between two processes by CUDA IPC handle, vs a copy in one process
#   6. colocated  torch.cuda.mem_get_info per phase of a colocated step whose learner states leave the device;
#      colocated_memory  the colocated learner's peak allocated bytes per phase (load, passes, update, after the
#                 offload) beside relayrl plan's and the fake-tensor simulation's figures (gpu_check_memory.py)
#   7. step_0p5b  one RL step of a random 0.5B-shaped model: generate / update / sync seconds, the update's bf16 MFU
#   8. vllm, ray, two_gpus: skipped by name ("skipped: needs vLLM (not installed)") unless present: vLLM's CUDA
#                 build (generate, mismatch, a push through the weight-update session; with a second GPU, a NCCL
#                 broadcast from the learner's rank on cuda:1 straight into the engine's worker), Ray with real
#                 GPUs, a second GPU for two NCCL ranks (W=2 FSDP2 equivalence)
#   9. learner_speed  the update of a 1.5B shape at ~20k tokens a micro-batch: relayrl's GPU defaults, then each
#                 speed option one at a time (full logits, FlexAttention packing, learner.compile, no activation
#                 checkpointing): warm seconds, MFU, peak memory, the same gradient norm (gpu_check_speed.py); last,
#                 so the cheaper checks never wait on it
# On a GPU each step is `python benchmarks/gpu_check.py <step>` in its own process with its own timeout; its output
# is $OUT/<step>.log, whose last line is the JSON the table reads. What each step proves: benchmarks/gpu_check.py.
#
# What travels with the command (nothing is downloaded on the box): the source tree, and runs/gpu_wheels (2.8 MB:
# pydantic 2.14.4, pydantic_core 2.50.5 cp312 manylinux, annotated-types, typing-inspection, typing_extensions;
# written here by `bash benchmarks/gpu_wheels.sh`). When pydantic does not import, this script installs those
# wheels with `pip install --no-index --no-deps --target <tmp>` and puts <tmp> on PYTHONPATH; without them the
# steps that import relayrl are skipped, naming what is missing. The repository's own GPU environment is
# requirements/gpu.lock (`make setup` installs it where nvidia-smi lists a GPU); this check needs neither lock.
#
# Run:       bash benchmarks/gpu_check.sh [OUT_DIR]        (default runs/gpu_check; python: $VENV/bin/python if it
#            exists, else python3). From the device tool: command `bash benchmarks/gpu_check.sh $OUT`,
#            carry ["runs/gpu_wheels"], timeout_s 570.
# Rehearsal on a CPU machine, every CUDA part by its stand-in (gloo and offload=none, shared-memory CPU tensors and
# memcpy, RssAnon for free memory, fp32, smaller shapes, one torch thread; ~70 s on 2 loaded cores, budget 420 s):
#            GPU_CHECK_REHEARSE=1 bash benchmarks/gpu_check.sh /tmp/gpu_check
#            The rehearsal runs every step in one process (`gpu_check.py rehearse`: a process per step costs ~5 s
#            of imports each here); GPU_CHECK_EACH=1 gives each step its own process and timeout, as on a GPU.
# GPU_CHECK_STEPS=learner,fsdp runs only those steps (a rerun); GPU_CHECK_THREADS sets torch's CPU threads.
# Exit codes: 0 = every step ok or skipped by name, or no CUDA device ("no CUDA device; nothing to check");
#             1 = a step failed, timed out or found no time left, or pydantic was missing (the table says which;
#                 its log has the error);
#             2 = no python3, or torch does not import.
set -u
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
OUT="${1:-$ROOT/runs/gpu_check}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
VENV="${VENV:-$ROOT/.venv}"
if [ -x "$VENV/bin/python" ]; then PY="$VENV/bin/python"; else PY="$(command -v python3 || true)"; fi
if [ -z "$PY" ]; then
  echo "gpu_check: no python3 on PATH and no $VENV/bin/python"
  exit 2
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export GPU_CHECK_REHEARSE="${GPU_CHECK_REHEARSE:-0}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")"  # models and the wheels' target: never under $OUT
trap 'rm -rf "$WORK"' EXIT

if ! DEVICES="$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>"$OUT/preflight.log")"; then
  echo "gpu_check: torch does not import with $PY ($(tail -1 "$OUT/preflight.log"))"
  exit 2
fi
if [ "$DEVICES" = "0" ] && [ "$GPU_CHECK_REHEARSE" != "1" ]; then
  echo "gpu_check: no CUDA device; nothing to check (torch.cuda.is_available() is False with $PY;"
  echo "           GPU_CHECK_REHEARSE=1 rehearses the check on this CPU)"
  exit 0
fi

# pydantic (relayrl.config) from the wheels that travel with the command, when the box lacks it
WHEELS="${GPU_WHEELS:-$ROOT/runs/gpu_wheels}"
PYDANTIC_OK='import pydantic, pydantic_core; assert pydantic.VERSION.startswith("2.")'
WHEEL_NOTE="pydantic: installed"
if ! "$PY" -c "$PYDANTIC_OK" 2>/dev/null; then
  if compgen -G "$WHEELS/*.whl" >/dev/null; then
    SITE="$WORK/site"
    if "$PY" -m pip --version >/dev/null 2>&1; then
      "$PY" -m pip install --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl >"$OUT/wheels.log" 2>&1
    else  # no pip: a wheel is a zip whose top level goes on sys.path as it is
      "$PY" -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' \
        "$SITE" "$WHEELS"/*.whl >"$OUT/wheels.log" 2>&1
    fi
    export PYTHONPATH="$ROOT:$SITE${PYTHONPATH#"$ROOT"}"
    if "$PY" -c "$PYDANTIC_OK" 2>>"$OUT/wheels.log"; then
      WHEEL_NOTE="pydantic: from $WHEELS ($(du -sh "$WHEELS" | cut -f1)) into a temporary --target"
    else
      WHEEL_NOTE="pydantic: the wheels in $WHEELS did not install (see $OUT/wheels.log)"
    fi
  else
    WHEEL_NOTE="pydantic: missing and no $WHEELS (run bash benchmarks/gpu_wheels.sh where there is a package index, carry runs/gpu_wheels): relayrl's steps skip"
  fi
fi

DESC="$("$PY" - <<'PYEOF' 2>/dev/null
import importlib.util, platform, torch, transformers
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    dev = f"{torch.cuda.device_count()} x {p.name} ({p.total_memory / 2**30:.0f} GiB), CUDA {torch.version.cuda}"
else:
    dev = "no CUDA device: REHEARSAL on CPU (gloo, CPU tensors, fp32, smaller shapes)"
have = ", ".join(f"{m} {'yes' if importlib.util.find_spec(m) else 'no'}" for m in ("vllm", "ray"))
print(f"{dev}; Python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}; {have}")
PYEOF
)"
echo "gpu_check: ${DESC:-?}"
echo "gpu_check: $WHEEL_NOTE; python $PY; logs in $OUT"

if [ "$GPU_CHECK_REHEARSE" = "1" ] && [ "$DEVICES" = "0" ]; then
  BUDGET="${GPU_CHECK_BUDGET:-420}"
  LIMITS=(learner=120 flex=90 fsdp=120 hf_engine=90 cuda_ipc=90 colocated=120 colocated_memory=60 step_0p5b=150 vllm=60 ray=60 two_gpus=60 learner_speed=120)
else
  BUDGET="${GPU_CHECK_BUDGET:-540}"
  LIMITS=(learner=60 flex=120 fsdp=90 hf_engine=60 cuda_ipc=60 colocated=90 colocated_memory=60 step_0p5b=150 vllm=120 ray=60 two_gpus=120 learner_speed=240)
fi
RESERVE=15  # seconds kept for the table (and a killed step's 10 s grace)
: >"$OUT/steps.tsv"
if [ "$GPU_CHECK_REHEARSE" = "1" ] && [ "$DEVICES" = "0" ] && [ "${GPU_CHECK_EACH:-0}" != "1" ]; then
  # the rehearsal: every step in one process under the whole budget (gpu_check.py rehearse says why)
  timeout -k 10 "$((BUDGET - SECONDS - RESERVE))" "$PY" benchmarks/gpu_check.py rehearse --work "$WORK" --out "$OUT"
  LIMITS=()
fi
for entry in "${LIMITS[@]}"; do
  name="${entry%%=*}"
  limit="${entry#*=}"
  if [ -n "${GPU_CHECK_STEPS:-}" ] && [[ ",$GPU_CHECK_STEPS," != *",$name,"* ]]; then continue; fi
  left=$((BUDGET - SECONDS - RESERVE))  # the budget counts from the script's start, preflight included
  if [ "$left" -lt 15 ]; then
    printf '%s\t-\t0\tskipped: out of time (%s s budget)\n' "$name" "$BUDGET" >>"$OUT/steps.tsv"
    echo "  $name: skipped, out of time"
    continue
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  t0=$SECONDS
  timeout -k 10 "$limit" "$PY" benchmarks/gpu_check.py "$name" --work "$WORK" >"$OUT/$name.log" 2>&1
  rc=$?
  printf '%s\t%s\t%s\t\n' "$name" "$rc" "$((SECONDS - t0))" >>"$OUT/steps.tsv"
  echo "  $name: exit $rc, $((SECONDS - t0)) s (limit $limit s)"
done

echo
echo "gpu_check on $(hostname): ${DESC:-?}; $SECONDS s"
"$PY" benchmarks/gpu_check.py table --out "$OUT"
exit $?
