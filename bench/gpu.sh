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
#                                <= 2x, <= 2%). --inspect-cost --quick: 124M only.
#   bench/gpu.sh -- ARGS...      one run of gpu_bench with ARGS (see gpu_bench --help)
# Environment: BUILD (build directory, default build), GPU_BENCH_BIN (use this prebuilt binary
# instead of building), FP8TRAIN_CUDA_PLAIN=1 etc. pass through to the backend.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN=${GPU_BENCH_BIN:-}
if [ -z "$BIN" ]; then
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
  "$BIN" --model gpt2-124m --batch 32 --seq 1024 "${COST[@]}"
  if [ "${2:-}" != "--quick" ]; then
    echo
    "$BIN" --model gpt2-1.5b --batch 16 --seq 1024 "${COST[@]}"
  fi
  rm -rf "${TMPDIR:-/tmp}/gpu_bench_inspect.$$"
  exit
fi
if [ "${1:-}" = "--quick" ]; then
  "$BIN" --model gpt2-124m --batch 8 --seq 1024 --warmup 2 --steps 5
  exit
fi
"$BIN" --model gpt2-124m --batch 32 --seq 1024 --warmup 3 --steps 10
echo
"$BIN" --model gpt2-1.5b --batch 16 --seq 1024 --warmup 2 --steps 4
