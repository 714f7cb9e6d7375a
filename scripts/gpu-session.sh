#!/usr/bin/env bash
# Everything the GPU checks need, in few calls on a lent H200 (device time is scarce):
#   here (no GPU):  scripts/gpu-session.sh prepare      builds build-gpu/ and .gpulibs/
#   there:          scripts/gpu-session.sh run          the checks
#                   scripts/gpu-session.sh inspect [PHASE...]  the statistics: checks, cost124,
#                                                       cost1.5b, detect (one call each, or two)
#                   scripts/gpu-session.sh bench        the training-step and inspect-cost tables
#                   carry: build-gpu/fp8train, build-gpu/gpu_test, build-gpu/bench/gpu_bench_cuda,
#                   .gpulibs (and build-gpu/dev/cuda/* where they fit the 64 MB a call carries)
# `run` executes make gpu-test's binary, compute-sanitizer memcheck passes over short training
# runs (gpu_bench_cuda on tiny and tiny-llama, BF16 and delayed FP8, and one with --inspect on
# every step with dumps), the command end to end (tests/gpu/cli_checks.sh), and the kernel
# ladders when they were carried, writing logs under $OUT (or ./gpu-out) and a summary last.
# `bench` runs bench/gpu.sh and bench/gpu.sh --inspect-cost; `inspect [PHASE...]` the
# statistics' checks and cost tables phase by phase (see below).
# The runtime libraries the device image lacks (cJSON, protobuf-c) travel in .gpulibs/; CUDA's
# own libraries, NCCL, OpenMPI, OpenBLAS (its pthread build) and PCRE2 are there.
set -euo pipefail
cd "$(dirname "$0")/.."
libs() {
  export LD_LIBRARY_PATH=$PWD/.gpulibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  out=${OUT:-gpu-out}
  mkdir -p "$out"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/card.txt"
  if ldd build-gpu/fp8train | grep 'not found'; then echo "missing libraries" >&2; exit 1; fi
}
case "${1:-}" in
prepare)
  make -s BUILD=build-gpu -j2 all build-gpu/gpu_test build-gpu/bench/gpu_bench_cuda
  mkdir -p .gpulibs
  rm -f .gpulibs/*
  for l in /usr/lib/x86_64-linux-gnu/libcjson.so.1 /lib/x86_64-linux-gnu/libprotobuf-c.so.1; do
    cp -L "$l" .gpulibs/
  done
  # the carried binaries without their host debug information (the 64 MB a call may carry)
  for f in build-gpu/fp8train build-gpu/gpu_test build-gpu/bench/gpu_bench_cuda; do
    strip --strip-debug "$f"
  done
  echo "prepared: carry build-gpu/fp8train build-gpu/gpu_test build-gpu/bench/gpu_bench_cuda .gpulibs;" \
       "then scripts/gpu-session.sh run|bench"
  ;;
run)
  libs
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
  echo "== tiny fp8-delayed --inspect every=1,dump=1,block=32" >>"$out/memcheck.log"
  compute-sanitizer --tool memcheck build-gpu/bench/gpu_bench_cuda --model tiny --batch 2 \
    --seq 64 --warmup 1 --steps 2 --prec fp8-delayed --inspect-out /tmp/gpu_memcheck_inspect \
    --inspect every=1,dump=1,block=32 >>"$out/memcheck.log" 2>&1 || c=1
  # without dumps the hook only reads: FP8 save of X, Wgrad X rows from the Fprop's
  echo "== tiny fp8-delayed --inspect every=1,block=32 (read-only hook)" >>"$out/memcheck.log"
  compute-sanitizer --tool memcheck build-gpu/bench/gpu_bench_cuda --model tiny --batch 2 \
    --seq 64 --warmup 1 --steps 2 --prec fp8-delayed --inspect-out /tmp/gpu_memcheck_inspect \
    --inspect every=1,block=32 >>"$out/memcheck.log" 2>&1 || c=1
  tests/gpu/cli_checks.sh build-gpu/fp8train /tmp/gpu_cli >"$out/cli.log" 2>&1; k=$?
  q=0
  if [ -x build-gpu/dev/cuda/quantize_ladder ]; then
    { build-gpu/dev/cuda/quantize_ladder && build-gpu/dev/cuda/misc_ladder &&
      { [ ! -x build-gpu/dev/cuda/stats_ladder ] || build-gpu/dev/cuda/stats_ladder; }; } \
      >"$out/ladder.log" 2>&1; q=$?
  fi
  set -e
  echo "== summary"
  grep -E '^FAIL' "$out/gpu_test.log" | head -40 || true
  tail -n 1 "$out/gpu_test.log"; echo "gpu_test exit $t"
  grep -E 'ERROR SUMMARY' "$out/memcheck.log" || tail -n 3 "$out/memcheck.log"
  echo "memcheck exit $c"
  grep -E '^(PASS|FAIL|SKIP)' "$out/cli.log" || true; tail -n 1 "$out/cli.log"; echo "cli_checks exit $k"
  if [ -f "$out/ladder.log" ]; then grep -E 'passed, .* failed' "$out/ladder.log" || true; fi
  echo "ladders exit $q"
  ;;
bench)
  libs
  export GPU_BENCH_BIN=${GPU_BENCH_BIN:-build-gpu/bench/gpu_bench_cuda}
  set +e
  bench/gpu.sh ${BENCH_ARGS:-} >"$out/bench.log" 2>&1; b=$?
  bench/gpu.sh --inspect-cost ${INSPECT_COST_ARGS:-} >"$out/inspect_cost.log" 2>&1; i=$?
  set -e
  cat "$out/bench.log"; echo "bench exit $b"
  cat "$out/inspect_cost.log"; echo "inspect-cost exit $i"
  ;;
inspect)
  # the statistics' checks and costs (issue 15) in phases that each fit one call with the
  # others: checks (gpu_test's --inspect rows, FP8TRAIN_TEST_SEED replays a failure; the stats
  # ladder when carried), cost124 / cost1.5b (plain vs every=100 / 10 / 1 and shadow-every
  # 100), detect (the detectors' cost); all four in order without arguments (more than one
  # call's 600 s: about 90 + 45 + 170 + 250 + 150 s). Each phase under its own timeout, its log
  # in $out as it ends.
  libs
  export GPU_BENCH_BIN=${GPU_BENCH_BIN:-build-gpu/bench/gpu_bench_cuda}
  shift
  phases=("$@")
  [ ${#phases[@]} -gt 0 ] || phases=(checks cost124 cost1.5b detect)
  set +e
  for ph in "${phases[@]}"; do
    case $ph in
    checks)
      timeout 120 build-gpu/gpu_test --quick --default-only --inspect-only \
        >"$out/gpu_test_inspect.log" 2>&1
      echo "gpu_test --inspect-only exit $?"
      grep -E '^FAIL|passed, .* failed|seed' "$out/gpu_test_inspect.log" | head -20
      if [ -x build-gpu/dev/cuda/stats_ladder ]; then
        timeout 60 build-gpu/dev/cuda/stats_ladder 3 >"$out/stats_ladder.log" 2>&1
        echo "stats_ladder exit $?"; grep -E 'passed, .* failed' "$out/stats_ladder.log"
      fi ;;
    cost124 | cost1.5b)
      m=gpt2-1.5b lim=400; [ "$ph" = cost1.5b ] || m=gpt2-124m lim=200
      timeout $lim bench/gpu.sh --inspect-cost "$m" >"$out/inspect_cost_$m.log" 2>&1
      echo "$ph exit $?"; grep -E '^fp8|cost' "$out/inspect_cost_$m.log" ;;
    detect)
      FP8TRAIN_BIN=${FP8TRAIN_BIN:-build-gpu/fp8train} timeout 200 bench/gpu.sh --detect-cost \
        >"$out/detect_cost.log" 2>&1
      echo "detect exit $?"; grep pair "$out/detect_cost.log" ;;
    *) echo "inspect: unknown phase $ph (checks, cost124, cost1.5b, detect)" >&2 ;;
    esac
  done
  set -e
  ;;
*)
  echo "usage: scripts/gpu-session.sh prepare|run|bench|inspect [PHASE...]" >&2
  exit 2
  ;;
esac
