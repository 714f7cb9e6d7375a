#!/usr/bin/env bash
# Everything the GPU checks need, in ONE call on a lent H200 (device time is scarce):
#   here (no GPU):  scripts/gpu-session.sh prepare      builds build-gpu/ and .gpulibs/
#   there:          scripts/gpu-session.sh run
#                   carry only: build-gpu/gpu_test, build-gpu/bench/gpu_bench_cuda,
#                   build-gpu/dev/cuda/quantize_ladder, build-gpu/dev/cuda/misc_ladder, .gpulibs
#                   (≈59 MB of the 64 MB a call may carry; the CLI is not needed there)
# `run` executes make gpu-test's binary, compute-sanitizer memcheck passes over short training
# runs (gpu_bench_cuda on tiny and tiny-llama, BF16 and delayed FP8), the kernel ladders
# (dev/cuda) and bench/gpu.sh, writing logs under $OUT (or ./gpu-out) and a summary last.
# The runtime libraries (OpenBLAS, cJSON, gfortran/quadmath/gomp) travel in .gpulibs/ because
# the device image lacks them; CUDA's own libraries are there.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
prepare)
  make -s BUILD=build-gpu -j2 all build-gpu/gpu_test
  mkdir -p .gpulibs
  for l in /usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0 \
           /usr/lib/x86_64-linux-gnu/libcjson.so.1 /lib/x86_64-linux-gnu/libgfortran.so.5 \
           /lib/x86_64-linux-gnu/libquadmath.so.0 /lib/x86_64-linux-gnu/libgomp.so.1; do
    cp -L "$l" .gpulibs/
  done
  BUILD=build-gpu bench/gpu.sh -- --help >/dev/null  # builds build-gpu/bench/gpu_bench_cuda
  echo "prepared: carry build-gpu/{gpu_test,bench/gpu_bench_cuda,dev/cuda/quantize_ladder,dev/cuda/misc_ladder} and .gpulibs; run: scripts/gpu-session.sh run"
  ;;
run)
  export LD_LIBRARY_PATH=$PWD/.gpulibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  out=${OUT:-gpu-out}
  mkdir -p "$out"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/card.txt"
  set +e
  build-gpu/gpu_test ${GPU_TEST_ARGS:-} >"$out/gpu_test.log" 2>&1; t=$?
  c=0
  for m in tiny tiny-llama; do
    for p in bf16 fp8-delayed; do
      echo "== $m $p"
      compute-sanitizer --tool memcheck build-gpu/bench/gpu_bench_cuda --model $m --batch 2 \
        --seq 64 --warmup 1 --steps 2 --prec $p || c=1
    done
  done >"$out/memcheck.log" 2>&1
  { build-gpu/dev/cuda/quantize_ladder && build-gpu/dev/cuda/misc_ladder; } >"$out/ladder.log" 2>&1; q=$?
  GPU_BENCH_BIN=${GPU_BENCH_BIN:-build-gpu/bench/gpu_bench_cuda} bench/gpu.sh \
    >"$out/bench.log" 2>&1; b=$?
  set -e
  echo "== summary"
  tail -n 1 "$out/gpu_test.log"; echo "gpu_test exit $t"
  grep -E 'ERROR SUMMARY' "$out/memcheck.log" || tail -n 3 "$out/memcheck.log"
  echo "memcheck exit $c"
  grep -E 'passed, .* failed' "$out/ladder.log"; echo "ladders exit $q"
  tail -n 15 "$out/bench.log"; echo "bench exit $b"
  ;;
*)
  echo "usage: scripts/gpu-session.sh prepare|run" >&2
  exit 2
  ;;
esac
