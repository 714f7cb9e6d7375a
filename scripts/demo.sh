#!/usr/bin/env bash
# `make demo`: train the tiny model on the built-in synthetic language twice — BF16 and FP8
# (delayed scaling, hybrid E4M3/E5M2), with the same seed and data order, side by side on the
# two cores (one thread each) — then show both loss curves and the final gap. A third run, BF16
# with another seed, measures the noise compare judges the gap against (seeds end a few
# percent apart at this size; DEMO_NOISE=0 skips it and compare estimates the noise instead).
# About 70 s on 2 CPU cores (45 s without the noise run); the loss falls from ln(256) = 5.55
# to about 1.1.
#   usage: scripts/demo.sh [path/to/fp8train]
#   env: DEMO_OUT (runs/demo), DEMO_STEPS (600), DEMO_NOISE (1)
set -euo pipefail
BIN=${1:-build/fp8train}
OUT=${DEMO_OUT:-runs/demo}
STEPS=${DEMO_STEPS:-600}
NOISE=${DEMO_NOISE:-1}
COMMON=(--preset tiny --data synthetic --steps "$STEPS" --batch 8 --seq-len 32 --lr 2e-3
        --warmup 20 --val-every 100 --val-batches 8 --progress-every 50 --seed 1337
        --keep-ckpts 1 --overwrite) # the demo's own runs: a second `make demo` replaces them
mkdir -p "$OUT"
start=$(date +%s)
echo "== training tiny for $STEPS steps, BF16 and FP8 at once (logs: $OUT/bf16.log, $OUT/fp8.log)"
OMP_NUM_THREADS=1 "$BIN" train "${COMMON[@]}" --precision bf16 --out "$OUT/bf16" >"$OUT/bf16.log" 2>&1 &
bf16_pid=$!
OMP_NUM_THREADS=1 "$BIN" train "${COMMON[@]}" --precision fp8 --recipe delayed --format hybrid \
  --out "$OUT/fp8" >"$OUT/fp8.log" 2>&1 &
fp8_pid=$!
runs=(bf16 fp8)
noise_args=()
if [ "$NOISE" != 0 ]; then
  echo "== and BF16 with --seed 1338, to measure the seed-to-seed noise (log: $OUT/bf16_seed2.log)"
  OMP_NUM_THREADS=1 "$BIN" train "${COMMON[@]}" --seed 1338 --precision bf16 --out "$OUT/bf16_seed2" \
    >"$OUT/bf16_seed2.log" 2>&1 &
  noise_pid=$!
  runs+=(bf16_seed2)
  noise_args=(--noise-run "$OUT/bf16_seed2")
fi
status=0
wait $bf16_pid || status=$?
wait $fp8_pid || status=$?
[ "$NOISE" = 0 ] || wait $noise_pid || status=$?
for run in "${runs[@]}"; do
  echo
  echo "== $run"
  cat "$OUT/$run.log"
done
[ $status -eq 0 ] || { echo "demo: a training run failed (exit $status)"; exit $status; }
echo
echo "== BF16 vs FP8 training loss"
"$BIN" curves "$OUT/bf16" "$OUT/fp8"
if "$BIN" compare --help >/dev/null 2>&1; then
  echo
  echo "== fp8train compare (HTML report: $OUT/report.html)"
  "$BIN" compare "$OUT/bf16" "$OUT/fp8" "${noise_args[@]}" --report "$OUT/report.html" || true
fi
echo
echo "demo done in $(( $(date +%s) - start ))s; runs in $OUT/"
