#!/usr/bin/env bash
# make demo-debug: the seeds' case study, reproduced. A fault is injected into the Dgrad of
# layers 1-2 of `tiny` (their output gradient is scaled 64x in delayed scaling only: a broken
# delayed-scaling path), and `fp8train bisect`, which is not told where, finds it: FP8 drifts
# from BF16, the all-fake-quantized run matches, Dgrad in BF16 closes the gap, the span search
# narrows it to layers 1-2, and current scaling for them closes it too, keeping FP8.
#   usage: scripts/demo-debug.sh [path/to/fp8train] [OUT]   (about two minutes on 2 cores)
set -eu
BIN=${1:-build/fp8train}
OUT=${2:-runs/demo-debug}
FAULT="layer=1-2,module=fc2,gemm=dgrad,kind=scale:64,from=5,when=delayed"
echo "== demo-debug: injected fault (bisect is not told): $FAULT"
echo
set +e
"$BIN" bisect --preset tiny --batch 4 --seq-len 64 --steps 60 --lr 1e-3 --warmup 5 \
  --inject "$FAULT" --out "$OUT/bisect"
rc=$?
set -e
echo
if [ $rc -eq 0 ]; then
  echo "== demo-debug: verdict above; evidence in $OUT/bisect/ (bisect.json, report.html)"
else
  echo "== demo-debug: bisect exited with status $rc"
fi
exit $rc
