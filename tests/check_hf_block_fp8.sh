#!/usr/bin/env bash
# Issue 16's export check, in one call on the GPU machine (torch + transformers there): train a
# small Llama on tinyshakespeare whose every linear dimension is a multiple of 128 (transformers'
# FP8 kernels quantize activations in whole 1x128 groups, and its dequantizer wants whole
# blocks), export it block-scaled (export --dtype fp8 --block 128), and let
# tests/check_hf_transformers.py load the export as it is with AutoModelForCausalLM and compare
# its loss with `fp8train eval` of the same export on the same token windows.
#
# usage: tests/check_hf_block_fp8.sh [BIN [PYTHON]]
#   BIN     fp8train binary (default build/fp8train)
#   PYTHON  a python with torch and transformers (default python3)
#   env: STEPS (default 300), DEVICE (training backend, default cuda)
# Exit status: tests/check_hf_transformers.py's (0 agree, 1 disagree or failed, 3 the FP8
# forward could not run: transformers fetches its FP8 kernels from the Hub).
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${1:-$ROOT/build/fp8train}
PY=${2:-python3}
STEPS=${STEPS:-300}
TMP=$(mktemp -d /tmp/fp8t_hf_block.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
DATA=$ROOT/data/tinyshakespeare.txt
# C 256, 4 heads of 64, 2 K/V heads (k/v rows 128), MLP 512: every weight is whole 128x128 blocks
MODEL="--preset tiny-llama --layers 2 --dim 256 --heads 4 --kv-heads 2 --mlp-hidden 512"
"$BIN" train $MODEL --seq-len 128 --batch 8 --data "$DATA" --steps "$STEPS" --val-every 0 \
  --keep-ckpts 1 --quiet --device "${DEVICE:-cuda}" --out "$TMP/run"
CK=$(ls -d "$TMP"/run/checkpoints/step_* | tail -1)
"$BIN" export "$CK" --to "$TMP/block" --dtype fp8 --block 128
"$BIN" eval "$CK" --data "$DATA" --batches 4 --batch 4 --seq-len 128 --check-export "$TMP/block"
set +e
"$PY" "$ROOT/tests/check_hf_transformers.py" --fp8train "$BIN" --export "$TMP/block" \
  --data "$DATA" --batches 4 --batch 4 --seq-len 128 --device cuda
rc=$?
echo "check_hf_block_fp8: exit status $rc"
exit $rc
