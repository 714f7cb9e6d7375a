#!/usr/bin/env bash
# Two fp8train binaries, the same short runs, the same bits?
#
#   scripts/compare_builds.sh BASE_BIN NEW_BIN [DATA] [WORKDIR]
#
# Trains short runs of the tiny presets (GPT-2-like `tiny`, Llama-like `tiny-llama`) on a text
# file (default /work/shared/data/tinyshakespeare.txt) with both binaries across the
# precisions, a per-GEMM mix, `--disable all-fusion` and the chunked head, then compares each
# pair: every step's loss, grad_norm and val_loss in metrics.jsonl exactly (tokens_per_s is a
# time and is left out), and every file of the final checkpoint byte for byte (cmp). It also
# generates greedily from the fp8/bf16 checkpoints with the inference model (its fused operand
# path: the residual add + norm, GELU, SwiGLU into FP8 codes or BF16 operands) and compares
# the output text. A refactoring that claims "the same bits" must print "all identical".
# DEVICE=cuda trains on the GPU (both binaries CUDA builds); ARCHS picks the presets (default
# "tiny tiny-llama").
# Exit status 0 when every pair is identical, 1 otherwise.
set -u
BASE=${1:?usage: compare_builds.sh BASE_BIN NEW_BIN [DATA] [WORKDIR]}
NEW=${2:?usage: compare_builds.sh BASE_BIN NEW_BIN [DATA] [WORKDIR]}
DATA=${3:-/work/shared/data/tinyshakespeare.txt}
WORK=${4:-$(mktemp -d /tmp/compare_builds.XXXXXX)}
mkdir -p "$WORK"
STEPS=${STEPS:-6}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

common=(--data "$DATA" --batch 4 --seq-len 64 --steps "$STEPS" --warmup 2 --val-every 3
        --val-batches 2 --progress-every 100 --quiet --overwrite)
[ -n "${DEVICE:-}" ] && common+=(--device "$DEVICE")

# name | options
cases=()
for arch in ${ARCHS:-tiny tiny-llama}; do
    for p in fp32 bf16 "fp8 --recipe delayed" "fp8 --recipe current" block rowwise mxfp8 fake; do
        cases+=("$arch|--preset $arch --precision $p")
    done
    cases+=("$arch|--preset $arch --precision fp8 --override gemm=wgrad,precision=bf16")
    cases+=("$arch|--preset $arch --precision rowwise --override gemm=wgrad,precision=bf16")
    cases+=("$arch|--preset $arch --precision fp8 --override layers=0,module=mlp,precision=current --override gemm=dgrad,precision=bf16")
    for p in bf16 "fp8 --recipe delayed" "fp8 --recipe current" block; do
        cases+=("$arch|--preset $arch --precision $p --disable all-fusion")
        cases+=("$arch|--preset $arch --precision $p --head-chunk 64")
        cases+=("$arch|--preset $arch --precision $p --head-chunk 0")
    done
    cases+=("$arch|--preset $arch --precision fp8 --disable gelu-fusion,bias-grad-fusion")
    cases+=("$arch|--preset $arch --precision bf16 --disable ln-fusion,bf16-operands")
    cases+=("$arch|--preset $arch --precision fp8 --disable fp8-save,code-reuse,residual-bias")
    cases+=("$arch|--preset $arch --precision fp8 --disable bf16-saves")
    cases+=("$arch|--preset $arch --precision fp8 --head-precision fp8")
done

fail=0
n=0
metrics() { # the exact fields of each step, as text
    if command -v jq >/dev/null; then
        jq -c '{step, loss, grad_norm, val_loss}' "$1/metrics.jsonl"
    else
        python3 -c 'import json, sys
for l in open(sys.argv[1]):
    d = json.loads(l)
    print([d.get(k) for k in ("step", "loss", "grad_norm", "val_loss")])' "$1/metrics.jsonl"
    fi
}
for c in "${cases[@]}"; do
    n=$((n + 1))
    opts=${c#*|}
    dir="$WORK/case$(printf %02d $n)"
    # shellcheck disable=SC2086
    "$BASE" train $opts "${common[@]}" --out "$dir/base" >"$dir.base.log" 2>&1 || true
    # shellcheck disable=SC2086
    "$NEW" train $opts "${common[@]}" --out "$dir/new" >"$dir.new.log" 2>&1 || true
    what=""
    if [ ! -s "$dir/base/metrics.jsonl" ] || [ ! -s "$dir/new/metrics.jsonl" ]; then
        what="no metrics (see $dir.*.log)"
    elif ! cmp -s <(metrics "$dir/base") <(metrics "$dir/new"); then
        what="metrics differ"
    else
        bc=$(ls -d "$dir"/base/checkpoints/step_* 2>/dev/null | tail -1)
        nc=$(ls -d "$dir"/new/checkpoints/step_* 2>/dev/null | tail -1)
        if [ -z "$bc" ] || [ -z "$nc" ]; then
            what="no checkpoint"
        else
            for f in "$bc"/*.safetensors; do
                cmp -s "$f" "$nc/$(basename "$f")" || what="$what $(basename "$f") differs"
            done
        fi
    fi
    if [ -z "$what" ]; then
        echo "identical  $opts"
    else
        echo "DIFFERENT  $opts: $what"
        fail=1
    fi
done

# the inference model's operand path, from two of the checkpoints above (tiny fp8 delayed,
# tiny-llama fp8 delayed): greedy text in each weight precision and activation scaling
for c in 3 $(( ${#cases[@]} / 2 + 3 )); do
    dir="$WORK/case$(printf %02d $c)"
    ck=$(ls -d "$dir"/base/checkpoints/step_* 2>/dev/null | tail -1)
    [ -n "$ck" ] || { echo "DIFFERENT  generate case $c: no checkpoint"; fail=1; continue; }
    for g in "--precision bf16" "--precision fp32" "--precision fp8" \
             "--precision fp8 --act-scale delayed" \
             "--precision fp8 --act-scale calibrated --calib-data $DATA --calib-batches 1" \
             "--precision fp8 --kv-cache fp8"; do
        # shellcheck disable=SC2086
        a=$("$BASE" generate "$ck" --prompt "ROMEO:" --tokens 24 --temperature 0 $g 2>&1)
        # shellcheck disable=SC2086
        b=$("$NEW" generate "$ck" --prompt "ROMEO:" --tokens 24 --temperature 0 $g 2>&1)
        if [ "$a" = "$b" ]; then
            echo "identical  generate case $c $g"
        else
            echo "DIFFERENT  generate case $c $g"
            fail=1
        fi
    done
done

if [ $fail = 0 ]; then
    echo "compare_builds: all identical ($n training runs, generation) in $WORK"
else
    echo "compare_builds: DIFFERENCES (runs in $WORK)"
fi
exit $fail
