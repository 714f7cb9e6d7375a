#!/usr/bin/env bash
# Where inference's GPU time goes, kernel by kernel: `fp8train bench-infer --device cuda` under
# Nsight Compute (each kernel's gpu__time_duration, in launch order; one process per model and
# precision), then bench/infer_kernels.py's tables: the passes grouped (calibration, timed
# prefill passes of --rows tokens, decode steps) with their GPU time and the kernels of each.
# The sums are kernel time without launch gaps or overlap: what a replayed decode graph costs,
# near enough (compare with bench-infer's tokens/s, which bench/gpu_infer.sh measures).
#
#   bench/gpu_infer_kernels.sh [DIR]   results in DIR (default $OUT, else a new /tmp directory):
#                                      ncu_MODEL_PREC.csv.gz, kernels.md
# Environment:
#   FP8TRAIN_BIN  default build-gpu/fp8train when present (scripts/gpu-session.sh prepare),
#                 else build/fp8train
#   NCU           default: ncu on the PATH, else /usr/local/cuda/bin/ncu
#   MODELS        default "gpt2-1.5b llama-1b";  PRECISIONS  default "bf16 fp8"
#   BATCH, PROMPT_LEN, GEN   default 64, 128, 4
#   FP8_ARGS      bench-infer options for the fp8 runs (default as bench/gpu_infer.sh's:
#                 "--act-scale calibrated --calib-batches 1 --fp8-head")
#   TIMEOUT       seconds per ncu run (default 240)
# ncu's clocks and caches are left alone (--clock-control none --cache-control none): the
# device machines' method, and the L2 state a real pass sees.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/fp8train_kernels.XXXXXX")}}
mkdir -p "$DIR"
PY=${PYTHON:-python3}
MODELS=${MODELS:-gpt2-1.5b llama-1b}
PRECISIONS=${PRECISIONS:-bf16 fp8}
BATCH=${BATCH:-64}
PROMPT_LEN=${PROMPT_LEN:-128}
GEN=${GEN:-4}
TIMEOUT=${TIMEOUT:-240}
FP8_ARGS=${FP8_ARGS---act-scale calibrated --calib-batches 1 --fp8-head}
# shellcheck source=bench/fp8train_bin.sh
. bench/fp8train_bin.sh
[ -x "$BIN" ] || { echo "gpu_infer_kernels.sh: no fp8train at $BIN (make, or scripts/gpu-session.sh prepare)" >&2; exit 2; }
NCU=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
[ -x "$NCU" ] || { echo "gpu_infer_kernels.sh: no Nsight Compute (ncu) at $NCU: set NCU" >&2; exit 2; }
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
echo "card: ${CARD:-unknown}; fp8train: $BIN; batch $BATCH, prompt $PROMPT_LEN + $GEN"
FILES=()
TITLES=()
start=$SECONDS
for M in $MODELS; do
  for P in $PRECISIONS; do
    extra=""
    [ "$P" = fp8 ] && extra=$FP8_ARGS
    csv=$DIR/ncu_${M}_$P.csv
    echo "== $M $P ($((SECONDS - start)) s)"
    # shellcheck disable=SC2086 # extra is a list of options
    if timeout "$TIMEOUT" "$NCU" --clock-control none --cache-control none \
         --metrics gpu__time_duration.sum --csv --log-file "$csv" \
         "$BIN" bench-infer --preset "$M" --device cuda --precisions "$P" --batch "$BATCH" \
         --prompt-len "$PROMPT_LEN" --gen "$GEN" --repeat 1 $extra >"$DIR/ncu_${M}_$P.log" 2>&1
    then
      gzip -f "$csv"
      FILES+=("$csv.gz")
      TITLES+=(--title "$M $P, batch $BATCH (${CARD:-unknown card})")
    else
      echo "   failed or timed out (see $DIR/ncu_${M}_$P.log)"
      rm -f "$csv"
    fi
  done
done
[ ${#FILES[@]} -gt 0 ] || { echo "gpu_infer_kernels.sh: no run finished" >&2; exit 1; }
"$PY" bench/infer_kernels.py "${TITLES[@]}" "${FILES[@]}" | tee "$DIR/kernels.md"
echo "(results: $DIR)"
