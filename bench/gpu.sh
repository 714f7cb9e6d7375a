#!/usr/bin/env bash
# GPU training-step benchmark: GPT-2 124M (32x1024) and 1.5B (16x1024, the issue's shapes) in
# bf16, fp8 delayed and fp8 current scaling on the CUDA backend; prints one table per model
# (tokens/s, step time, device memory, MFU). Needs nvcc and a Hopper GPU. 1.5B at 16x1024 holds
# about 97 GiB in BF16 (FP32 activations), so it needs an H200 (141 GB), not an 80 GB H100:
# there, use `bench/gpu.sh -- --model gpt2-1.5b --batch 8`.
#
#   bench/gpu.sh                 both models, default batch sizes
#   bench/gpu.sh --quick         124M only, batch 8, fewer steps (a smoke run)
#   bench/gpu.sh --inspect-cost  the cost of the debugging instruments, FP8 delayed, both
#                                models: plain vs --inspect every=100 / every=10 / every=1
#                                (all layers, GEMMs and tensors) vs --shadow-every 100, as
#                                ratios to the plain step (issue 15's targets: <= 3%, <= 15%,
#                                <= 2x, <= 2%). --inspect-cost --quick (or gpt2-124m):
#                                124M only; --inspect-cost gpt2-1.5b: 1.5B only.
#   bench/gpu.sh --detect-cost   the cost of NaN detection and the spike / drift detectors
#                                (issue 15: <= 0.5%): `fp8train train --device cuda` of GPT-2
#                                124M 32x1024 FP8 delayed, 40 steps, with them off and on in
#                                two alternating pairs; the median tokens/s of steps 6-40 of
#                                each run (metrics.jsonl) and the pairs' ratios. FP8TRAIN_BIN:
#                                a prebuilt fp8train (else $BUILD/fp8train is built).
#   bench/gpu.sh --peers         issue 14's four rows (GPT-2 124M b32, 350M b32, 1.5B b16,
#                                llama-1b b16; T=1024): fp8train BF16 and FP8 delayed
#                                (gpu_bench) and the PyTorch reference (bench/peers/
#                                pytorch_gpt.py: torch.compile, autocast BF16; torchao float8
#                                when importable) in one call, then the markdown table with the
#                                ratios fp8train / PyTorch BF16 (tokens/s; memory: gpu_bench's
#                                held GiB vs torch.cuda.max_memory_allocated). Writes
#                                $OUT/peers.jsonl (every run), $OUT/fp8train_MODEL.txt and
#                                $OUT/peers_table.md (OUT defaults to a new /tmp directory).
#   bench/gpu.sh -- ARGS...      one run of gpu_bench with ARGS (see gpu_bench --help)
# Environment: BUILD (build directory, default build), GPU_BENCH_BIN (use this prebuilt binary
# instead of building), PYTHON (the peers' Python, default python3), FP8TRAIN_CUDA_PLAIN=1
# etc. (the debugging switches, read by the option layer as fp8train's commands read them).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=${GPU_BENCH_BIN:-}
# --detect-cost runs fp8train alone: no gpu_bench to build
if [ -z "$BIN" ] && [ "${1:-}" != "--detect-cost" ]; then
  NVCC=${NVCC:-$(command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)}
  if [ -z "$NVCC" ]; then
    echo "bench/gpu.sh: nvcc not found; install the CUDA toolkit or set NVCC" >&2
    exit 1
  fi
  make -s BUILD="$BUILD" -j"$(nproc)" "$BUILD/bench/gpu_bench_cuda"
  BIN=$BUILD/bench/gpu_bench_cuda
fi
if [ "${1:-}" = "--" ]; then
  shift
  exec "$BIN" "$@"
fi
if [ "${1:-}" = "--inspect-cost" ]; then
  COST=(--prec fp8-delayed --warmup 3 --steps 20 --inspect every=100 --inspect every=10
        --inspect every=1 --shadow-every 100 --inspect-out "${TMPDIR:-/tmp}/gpu_bench_inspect.$$")
  case "${2:-}" in
  --quick | gpt2-124m) MODELS=("gpt2-124m 32") ;;
  gpt2-1.5b) MODELS=("gpt2-1.5b 16") ;;
  "") MODELS=("gpt2-124m 32" "gpt2-1.5b 16") ;;
  *) echo "bench/gpu.sh --inspect-cost: $2: expected --quick, gpt2-124m or gpt2-1.5b" >&2; exit 2 ;;
  esac
  for row in "${MODELS[@]}"; do
    read -r M B <<<"$row"
    "$BIN" --model "$M" --batch "$B" --seq 1024 "${COST[@]}"
    echo
  done
  rm -rf "${TMPDIR:-/tmp}/gpu_bench_inspect.$$"
  exit
fi
if [ "${1:-}" = "--detect-cost" ]; then
  F=${FP8TRAIN_BIN:-}
  if [ -z "$F" ]; then
    make -s BUILD="$BUILD" -j"$(nproc)" "$BUILD/fp8train"
    F=$BUILD/fp8train
  fi
  DIR=$(mktemp -d "${TMPDIR:-/tmp}/fp8train_detect.XXXXXX")
  T=(train --device cuda --preset gpt2-124m --batch 32 --seq-len 1024 --steps 40 --precision fp8
     --val-every 0 --ckpt-every 0 --quiet --overwrite)
  # median tokens/s of steps 6.. of a run's metrics.jsonl
  med() {
    grep -o '"step":[0-9]*,.*"tokens_per_s":[0-9.e+]*' "$1/metrics.jsonl" |
      awk -F'[:,]' '{ s = $2; t = $NF; if (s > 5) print t }' | sort -g |
      awk '{ v[NR] = $1 } END { if (NR == 0) exit 1; print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'
  }
  "$F" "${T[@]}" --detect-nan 0 --spike-window 0 --out "$DIR/base"  # the drift detector's baseline
  for k in 1 2; do
    "$F" "${T[@]}" --detect-nan 0 --spike-window 0 --out "$DIR/off$k"
    "$F" "${T[@]}" --detect-nan 1 --baseline "$DIR/base" --out "$DIR/on$k"
    off=$(med "$DIR/off$k") on=$(med "$DIR/on$k")
    awk -v k="$k" -v a="$off" -v b="$on" 'BEGIN { printf "pair %d: off %.0f tok/s, on %.0f tok/s: cost %+.2f%% (target <= 0.5%%)\n", k, a, b, 100 * (a / b - 1) }'
  done
  rm -rf "$DIR"
  exit
fi
if [ "${1:-}" = "--peers" ]; then
  PY=${PYTHON:-python3}
  DIR=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/fp8train_peers.XXXXXX")}
  mkdir -p "$DIR"
  RES=$DIR/peers.jsonl
  : >"$RES"
  for row in "gpt2-124m 32" "gpt2-350m 32" "gpt2-1.5b 16" "llama-1b 16"; do
    read -r M B <<<"$row"
    echo "== $M, batch $B"
    # fp8train: gpu_bench's rows (precision, step ms, tokens/s, MFU, held GiB, ...) as JSON
    "$BIN" --model "$M" --batch "$B" --seq 1024 --warmup 2 --steps 5 --prec bf16,fp8-delayed \
      | tee "$DIR/fp8train_$M.txt" || true
    awk -v m="$M" -v b="$B" '$1 == "bf16" || $1 == "fp8-delayed" {
      printf "{\"source\": \"fp8train\", \"model\": \"%s\", \"batch\": %d, \"seq\": 1024, " \
             "\"precision\": \"%s\", \"step_ms\": %s, \"tokens_per_s\": %s, \"peak_gib\": %s}\n",
             m, b, $1, $2, $3, $5 }' "$DIR/fp8train_$M.txt" >>"$RES"
    # PyTorch: one process per model, so each starts with an empty allocator
    "$PY" bench/peers/pytorch_gpt.py --model "$M" --batch "$B" --seq 1024 --warmup 3 --steps 8 \
      | tee -a "$RES" || true
  done
  echo
  "$PY" bench/peers/pytorch_gpt.py --table "$RES" | tee "$DIR/peers_table.md"
  echo "(results: $DIR)"
  exit
fi
if [ "${1:-}" = "--quick" ]; then
  "$BIN" --model gpt2-124m --batch 8 --seq 1024 --warmup 2 --steps 5
  exit
fi
"$BIN" --model gpt2-124m --batch 32 --seq 1024 --warmup 3 --steps 10
echo
"$BIN" --model gpt2-1.5b --batch 16 --seq 1024 --warmup 2 --steps 4
