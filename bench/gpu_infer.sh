#!/usr/bin/env bash
# Issue 21's inference table in one call on a GPU machine: `fp8train bench-infer --device cuda`
# (BF16 and FP8, batch 1, 64 and 256, random weights of the preset) and the transformers BF16
# reference of the same shape (bench/peers/hf_infer.py: decode by a manual KV-cache loop and by
# model.generate, the faster one compared) for GPT-2 1.5B and llama-1b, then the markdown table:
# prefill and decode tokens/s, peak GiB, the FP8/BF16 ratios, BF16's peak beyond weights + KV
# cache, fp8train BF16 / transformers BF16, and the issue's targets met or missed.
#
#   bench/gpu_infer.sh [DIR]     results in DIR (default $OUT, else a new /tmp directory):
#                                fp8train_MODEL.json / .txt (bench-infer --out and its table),
#                                peers.jsonl (hf_infer.py's lines), infer_table.md
# Environment:
#   FP8TRAIN_BIN  the fp8train binary (default build-gpu/fp8train when present, as
#                 scripts/gpu-session.sh prepares it, else build/fp8train, built if missing)
#   PYTHON        the Python with torch and transformers (default python3)
#   MODELS        default "gpt2-1.5b llama-1b";  BATCH  default 1,64,256 (the issue's
#                 targets hold at every batch >= 64; 256 is where the FP8 KV cache's halved
#                 bytes weigh most in decode)
#   PROMPT_LEN, GEN, REPEAT   default 128, 32, 2 (bench-infer's defaults; both tools get them)
#   DEVICE        bench-infer's --device (default cuda; cpu: the plumbing alone, as
#                 tests/test_gpu_infer_table.sh runs it with a tiny preset and canned peers)
#   PEER_ARGS     more hf_infer.py options, e.g. "--compile" (StaticCache + torch.compile of
#                 the decode step: minutes of compilation per model and batch)
#   FP8_ARGS      bench-infer options for its fp8 rows (default "--act-scale calibrated
#                 --fp8-head": fixed activation scales calibrated on random tokens, the
#                 embedding table and head in E4M3 where the vocabulary allows; the fp8 rows'
#                 KV cache is FP8 by default, "--kv-cache bf16" keeps BF16); "" for current
#                 scaling and the BF16 head
# About 2-3 minutes on an H200 at batch 1,64 (random weights, 160-token sequences); batch 256
# adds to that (not yet timed).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/fp8train_infer.XXXXXX")}}
mkdir -p "$DIR"
PY=${PYTHON:-python3}
MODELS=${MODELS:-gpt2-1.5b llama-1b}
BATCH=${BATCH:-1,64,256}
PROMPT_LEN=${PROMPT_LEN:-128}
GEN=${GEN:-32}
REPEAT=${REPEAT:-2}
DEVICE=${DEVICE:-cuda}
FP8_ARGS=${FP8_ARGS---act-scale calibrated --fp8-head}
# shellcheck source=bench/fp8train_bin.sh
. bench/fp8train_bin.sh
if [ -z "${FP8TRAIN_BIN:-}" ] && [ ! -x "$BIN" ]; then make -s -j"$(nproc)" "$BIN"; fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
  >"$DIR/card.txt" 2>&1 || true
echo "card: $(cat "$DIR/card.txt"); fp8train: $BIN; prompt $PROMPT_LEN + $GEN, best of $REPEAT"
RES=$DIR/peers.jsonl
: >"$RES"
start=$SECONDS
for M in $MODELS; do
  echo "== $M: fp8train bench-infer ($((SECONDS - start)) s)"
  # a failed configuration is a row of its own (exit 2) and the table says n/a: go on
  # shellcheck disable=SC2086 # FP8_ARGS is a list of options
  "$BIN" bench-infer --preset "$M" --device "$DEVICE" --precisions bf16,fp8 --batch "$BATCH" \
    --prompt-len "$PROMPT_LEN" --gen "$GEN" --repeat "$REPEAT" --out "$DIR/fp8train_$M.json" \
    $FP8_ARGS | tee "$DIR/fp8train_$M.txt" || true
  echo "== $M: transformers BF16 ($((SECONDS - start)) s)"
  # one process per model: each starts with an empty allocator
  # shellcheck disable=SC2086 # PEER_ARGS is a list of options
  "$PY" bench/peers/hf_infer.py --model "$M" --batch "$BATCH" --prompt-len "$PROMPT_LEN" \
    --gen "$GEN" --repeat "$REPEAT" ${PEER_ARGS:-} | tee -a "$RES" || true
done
echo "== table ($((SECONDS - start)) s)"
FILES=()
for M in $MODELS; do
  [ -f "$DIR/fp8train_$M.json" ] && FILES+=("$DIR/fp8train_$M.json")
done
"$PY" bench/peers/hf_infer.py --table "${FILES[@]}" "$RES" | tee "$DIR/infer_table.md"
echo "(results: $DIR)"
