#!/usr/bin/env bash
# `make demo`: train the tiny model on the built-in synthetic language twice — BF16, then FP8
# (delayed scaling, hybrid E4M3/E5M2) with the same seed and data order — and show both loss
# curves side by side with the final gap. About a minute on 2 CPU cores.
#   usage: scripts/demo.sh [path/to/fp8train]     env: DEMO_OUT (runs/demo), DEMO_STEPS (400)
set -euo pipefail
BIN=${1:-build/fp8train}
OUT=${DEMO_OUT:-runs/demo}
STEPS=${DEMO_STEPS:-400}
COMMON=(--preset tiny --data synthetic --steps "$STEPS" --batch 8 --seq-len 32 --lr 1e-3
        --warmup 20 --val-every 100 --val-batches 8 --progress-every 50 --seed 1337
        --keep-ckpts 1)
start=$(date +%s)
echo "== 1/2  BF16 baseline"
"$BIN" train "${COMMON[@]}" --precision bf16 --out "$OUT/bf16"
echo
echo "== 2/2  FP8: delayed scaling, hybrid format (E4M3 forward, E5M2 gradients)"
"$BIN" train "${COMMON[@]}" --precision fp8 --recipe delayed --format hybrid --out "$OUT/fp8"
echo
echo "== BF16 vs FP8 training loss"
"$BIN" curves "$OUT/bf16" "$OUT/fp8"
if "$BIN" compare --help >/dev/null 2>&1; then
  echo
  echo "== fp8train compare (report: $OUT/report.html)"
  "$BIN" compare "$OUT/bf16" "$OUT/fp8" --report "$OUT/report.html" || true
fi
echo
echo "demo done in $(( $(date +%s) - start ))s; runs in $OUT/ (try: $BIN compare $OUT/bf16 $OUT/fp8)"
