#!/usr/bin/env bash
# scripts/device-check.sh — the CUDA backend on one H100 / H200 with no network, in about 5-8 minutes:
#   1. configure + build with CUDA (the default RelWithDebInfo, sm_90), using .deps/ when present (scripts/carry-deps.sh);
#   2. the GPU tests (ctest -L gpu: every CUDA op vs the CPU kernels, graph replay vs eager, whole
#      models and the engine vs the CPU backend, speculative decoding on the GPU);
#   3. decode benchmarks for random Qwen3-0.6B- and Qwen3-8B-shaped checkpoints made with
#      `graphswap mkmodel` (the 8B one is generated in the background while the tests run): forward-step
#      latency at batch 1, 8, 32 with CUDA graphs and eagerly, against the HBM floor measured in the
#      same run (a large device-to-device copy), and engine tokens/s;
#   4. `graphswap bench spec --backend cuda` (a DFlash drafter for the 0.6B model: the cost of a
#      speculative step, draft + verify + context, in decode steps) and `graphswap bench transfer
#      --backend cuda` (weight updates in the process: host -> device through the pinned staging
#      ring, device -> device as NCCL / CUDA IPC deliver it, the drafter's derived-buffer refill;
#      against the upload and device-copy rates of the same run), for both models;
#   5. a short table last.
# Full results (commit, GPU, driver, date, logs, JSON lines) go to $OUT when set (the device tool's
# folder), else bench/results/<date>-<gpu>/.
#
# usage: scripts/device-check.sh [--quick]      (--quick: skip the 8B model)
# env:   GS_BUILD_DIR (build-device), GS_MODELS_DIR (models-local/bench), GS_COMMIT (else git, else the
#        file .device-commit), GS_BENCH_CTX (512), GS_BENCH_ITERS (50)
# Carry when the machine lacks the -dev packages: run scripts/carry-deps.sh here and let .deps travel
# with the tree (and write `git rev-parse HEAD > .device-commit` when .git does not travel).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
T0=$(date +%s)
QUICK=0
[ "${1:-}" = "--quick" ] && QUICK=1
step() { printf '== [%4ds] %s\n' $(( $(date +%s) - T0 )) "$*"; }
FAILED=()

GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
GPU_NAME=${GPU_NAME:-unknown-gpu}
STAMP=$(date -u +%Y%m%d-%H%M%S)
if [ -n "${OUT:-}" ]; then RES="$OUT"; else
  RES="$ROOT/bench/results/$STAMP-$(printf '%s' "$GPU_NAME" | tr -c 'A-Za-z0-9' '-' | sed 's/--*/-/g;s/-$//')"
fi
mkdir -p "$RES"
BUILD=${GS_BUILD_DIR:-$ROOT/build-device}
MODELS=${GS_MODELS_DIR:-$ROOT/models-local/bench}
CTX=${GS_BENCH_CTX:-512}
ITERS=${GS_BENCH_ITERS:-50}
JOBS=$(nproc 2>/dev/null || echo 8)

if [ -f "$ROOT/.deps/env.sh" ]; then
  # shellcheck disable=SC1091
  source "$ROOT/.deps/env.sh"
fi
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDACXX=${CUDACXX:-/usr/local/cuda/bin/nvcc}
  export PATH="/usr/local/cuda/bin:$PATH"
fi
COMMIT=${GS_COMMIT:-$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || cat "$ROOT/.device-commit" 2>/dev/null || echo unknown)}

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $COMMIT"
  echo "gpu: $GPU_NAME"
  echo "driver: ${DRIVER:-unknown}"
  nvidia-smi --query-gpu=memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>/dev/null | sed 's/^/nvidia-smi: /'
  echo "nvcc: $( (nvcc --version 2>/dev/null || "${CUDACXX:-nvcc}" --version 2>/dev/null) | tail -2 | head -1)"
  echo "cmake: $(cmake --version 2>/dev/null | head -1)"
  echo "cc: $(cc --version 2>/dev/null | head -1)"
  echo "host: $(uname -srm), $JOBS CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM"
  echo "deps: $([ -n "${GS_DEPS_ROOT:-}" ] && echo ".deps (carried)" || echo "system packages")"
} > "$RES/env.txt"
cat "$RES/env.txt"

# ---- 1. build ------------------------------------------------------------------------------------------
step "configure + build ($BUILD)"
if ! cmake -S "$ROOT" -B "$BUILD" -DCMAKE_CUDA_ARCHITECTURES=90 > "$RES/build.log" 2>&1; then
  tail -30 "$RES/build.log"
  echo "device-check: configure failed (see $RES/build.log)"
  exit 1
fi
if ! grep -q "CUDA backend for" "$RES/build.log"; then
  grep -i cuda "$RES/build.log" | tail -5
  echo "device-check: CMake did not enable the CUDA backend (nvcc not found?)"
  exit 1
fi
if ! cmake --build "$BUILD" -j "$JOBS" >> "$RES/build.log" 2>&1; then
  grep -E "error|Error" "$RES/build.log" | head -30
  echo "device-check: build failed (see $RES/build.log)"
  exit 1
fi
GS="$BUILD/graphswap"
BENCH="$BUILD/tests/gpu/gs_cuda_bench"

# ---- models (the 8B one in the background) --------------------------------------------------------------
mkdir -p "$MODELS"
Q06="$MODELS/qwen3-0.6b" Q8="$MODELS/qwen3-8b" Q06D="$MODELS/qwen3-0.6b-dflash"
mk_06() {
  [ -f "$Q06/config.json" ] || "$GS" mkmodel --arch qwen3 --out "$Q06" --hidden 1024 --layers 28 --heads 16 \
    --kv-heads 8 --head-dim 128 --intermediate 3072 --vocab 151936 --max-pos 40960 --tie --no-tokenizer --seed 1
}
mk_8b() {
  [ -f "$Q8/config.json" ] || "$GS" mkmodel --arch qwen3 --out "$Q8" --hidden 4096 --layers 36 --heads 32 \
    --kv-heads 8 --head-dim 128 --intermediate 12288 --vocab 151936 --max-pos 40960 --no-tie --shards 4 \
    --no-tokenizer --seed 2
}
step "mkmodel: Qwen3-0.6B-shaped (foreground), Qwen3-8B-shaped (background)"
: > "$RES/mkmodel.log"
MK8_PID=""
if [ $QUICK = 0 ]; then
  (time mk_8b) >> "$RES/mkmodel.log" 2>&1 &
  MK8_PID=$!
fi
(time mk_06) >> "$RES/mkmodel.log" 2>&1 || FAILED+=("mkmodel 0.6B")
# a DFlash drafter shaped like z-lab's Qwen3 ones (block 16, 1 layer here: random weights accept
# nothing, the figure is the cost of a step)
[ -f "$Q06D/config.json" ] || "$GS" mkmodel --arch dflash --target "$Q06" --out "$Q06D" --layers 1 --block-size 16 \
  --seed 3 >> "$RES/mkmodel.log" 2>&1 || FAILED+=("mkmodel 0.6B drafter")

# ---- 2. GPU tests -----------------------------------------------------------------------------------------
step "GPU tests (ctest -L gpu)"
(cd "$BUILD" && timeout 420 ctest -L gpu --output-on-failure) > "$RES/ctest-gpu.log" 2>&1
CT_RC=$?
grep -E "tests passed|tests failed|Skipped|\(Failed\)|Not Run|Timeout" "$RES/ctest-gpu.log" | tail -8
[ $CT_RC = 0 ] || FAILED+=("gpu tests (rc $CT_RC)")
if grep -q "Skipped" "$RES/ctest-gpu.log"; then FAILED+=("gpu tests were SKIPPED: no usable GPU?"); fi

# ---- 3. benchmarks ----------------------------------------------------------------------------------------
: > "$RES/bench.jsonl"
: > "$RES/bench.txt"
run_bench() { # name dir
  step "bench $1"
  timeout 300 "$BENCH" --model "$2" --name "$1" --batches 1,8,32 --ctx "$CTX" --iters "$ITERS" \
    --engine-tokens 64 --json "$RES/bench.jsonl" 2>&1 | tee -a "$RES/bench.txt"
  local rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || FAILED+=("bench $1 (rc $rc)")
}
[ -f "$Q06/config.json" ] && run_bench qwen3-0.6b "$Q06"
: > "$RES/bench-spec.txt"
: > "$RES/bench-transfer.txt"
if [ -f "$Q06D/config.json" ]; then
  step "bench spec qwen3-0.6b + dflash b16 (--backend cuda)"
  timeout 300 "$GS" bench spec --backend cuda --model "$Q06" --draft "$Q06D" --tokens 128 2>&1 | tee -a "$RES/bench-spec.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || FAILED+=("bench spec")
  step "bench transfer qwen3-0.6b + dflash (--backend cuda)"
  timeout 300 "$GS" bench transfer --backend cuda --model "$Q06" --draft "$Q06D" --bucket-mb 512 2>&1 | tee -a "$RES/bench-transfer.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || FAILED+=("bench transfer 0.6B")
fi
if [ -n "$MK8_PID" ]; then
  step "waiting for the 8B checkpoint"
  wait "$MK8_PID" || FAILED+=("mkmodel 8B")
  [ -f "$Q8/config.json" ] && run_bench qwen3-8b "$Q8"
  if [ -f "$Q8/config.json" ]; then
    step "bench transfer qwen3-8b (--backend cuda)"
    timeout 300 "$GS" bench transfer --backend cuda --model "$Q8" --bucket-mb 1024 --repeat 2 2>&1 | tee -a "$RES/bench-transfer.txt"
    [ "${PIPESTATUS[0]}" = 0 ] || FAILED+=("bench transfer 8B")
  fi
fi

# ---- 4. summary -------------------------------------------------------------------------------------------
tail -n 400 "$RES/build.log" > "$RES/build.log.tail" && mv "$RES/build.log.tail" "$RES/build.log"
step "done"
{
  echo "graphswap device check: $GPU_NAME, driver ${DRIVER:-?}, commit ${COMMIT:0:12}, $(date -u +%Y-%m-%d)"
  echo "gpu tests: $(grep -E 'tests passed|tests failed' "$RES/ctest-gpu.log" | tail -1)"
  python3 - "$RES/bench.jsonl" <<'EOF' 2>/dev/null || awk '{print}' "$RES/bench.jsonl"
import json, sys
step, eng = {}, {}
for line in open(sys.argv[1]):
    line = line.strip()
    if not line:
        continue
    r = json.loads(line)
    (step if r["kind"] == "step" else eng)[(r["model"], r["batch"])] = r
if step:
    print("decode step, ctx %d (ms; floor = (weights + KV read) / copy bandwidth %.0f GB/s)"
          % (next(iter(step.values()))["ctx"], next(iter(step.values()))["copy_gbps"]))
    print("%-11s %5s %9s %9s %9s %8s %8s %11s %11s" % ("model", "batch", "graph", "eager", "floor",
          "g/floor", "e/g", "eng graph", "eng eager"))
    for k in sorted(step, key=lambda k: (k[0], k[1])):
        s, e = step[k], eng.get(k)
        print("%-11s %5d %9.3f %9.3f %9.3f %8.2f %8.2f %11s %11s" % (k[0], k[1], s["graph_ms"], s["eager_ms"],
              s["floor_ms"], s["graph_ms"] / s["floor_ms"], s["eager_ms"] / s["graph_ms"],
              "%.0f tok/s" % e["graph_tok_s"] if e else "-", "%.0f tok/s" % e["eager_tok_s"] if e else "-"))
EOF
  grep -E "^(batch|[0-9]+ +(plain|spec))" "$RES/bench-spec.txt" 2>/dev/null | cut -c1-100
  grep -E "^(floors|host|device|derived)" "$RES/bench-transfer.txt" 2>/dev/null
  if [ ${#FAILED[@]} -gt 0 ]; then printf 'FAILED: %s\n' "${FAILED[@]}"; else echo "all steps passed"; fi
  echo "results: $RES"
} | tee "$RES/summary.txt"
[ ${#FAILED[@]} -eq 0 ]
