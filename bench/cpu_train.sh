#!/usr/bin/env bash
# CPU training throughput, side by side in one run: tokens/s of `tiny` and of a small GPT-2
# shaped model in fp32, bf16, fp8 (delayed), fp8 current and fake quantization.
#   bench/cpu_train.sh [STEPS]        (default 12 steps; the first 2 are not timed)
# Figures are wall-clock CPU figures of this machine: compare the rows with each other, not
# with other machines. The FP8/BF16 rows cost MORE than fp32 here: the CPU emulates FP8 and
# BF16 exactly (cast, then FP32 GEMM); speed-ups from FP8 exist only on the GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${FP8TRAIN_BIN:-build/fp8train}
[ -x "$BIN" ] || make -s all
STEPS=${1:-12}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
models=("tiny|--preset tiny --batch 8"
        "gpt2-small-shaped (6L, C=384, T=256)|--preset tiny --layers 6 --dim 384 --heads 6 --mlp-hidden 1536 --max-seq-len 256 --batch 4")
precs=("fp32|--precision fp32" "bf16|--precision bf16" "fp8 delayed|--precision fp8"
       "fp8 current|--precision current" "fake|--precision fake")
printf '%-38s %-12s %12s %10s\n' model precision "tokens/s" "vs bf16"
for m in "${models[@]}"; do
  mname=${m%%|*}; margs=${m#*|}
  bf16=""
  for p in "${precs[@]}"; do
    pname=${p%%|*}; pargs=${p#*|}
    out="$TMP/run"; rm -rf "$out"
    # shellcheck disable=SC2086
    "$BIN" train $margs $pargs --steps "$STEPS" --warmup 2 --val-every 0 --quiet --out "$out" >/dev/null
    # median tokens/s over the steps after the first two
    tps=$(python3 - "$out/metrics.jsonl" <<'PY'
import json,sys,statistics
rows=[json.loads(l) for l in open(sys.argv[1]) if l.strip()]
v=[r["tokens_per_s"] for r in rows if r.get("step",0)>2 and "tokens_per_s" in r]
print(f"{statistics.median(v):.0f}")
PY
)
    [ "$pname" = bf16 ] && bf16=$tps
    ratio="-"; [ -n "$bf16" ] && ratio=$(python3 -c "print(f'{$tps/$bf16:.2f}x')")
    printf '%-38s %-12s %12s %10s\n' "$mname" "$pname" "$tps" "$ratio"
  done
done
echo "(machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
