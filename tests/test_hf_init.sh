#!/usr/bin/env bash
# train --init from a Hugging Face checkpoint made by transformers (tests/data/hf: Llama with
# grouped-query attention 4:1, an untied head and llama3 RoPE scaling): an FP8 fine-tune starts
# at step 0 from the imported weights and resumes bit-exactly from its own checkpoint (losses of
# the resumed steps and the final checkpoint's files identical); the other precision policies
# start from it too; model options that contradict the source, --init with --resume and a
# missing source fail with exit 2 and write nothing; the fine-tuned model exports as the same
# architecture, and (optional, SKIP without torch) transformers reproduces our FP32 loss on
# the export and on sharded Qwen2 FP8/BF16 exports. HF_INIT_STEPS=200 runs the long version (default 12 steps, resumed from the middle).
# Prints one "PASS hf_init: ..." / "FAIL hf_init: ..." line per check.
set -u
BIN=${FP8TRAIN_BIN:-$(dirname "$0")/../build/fp8train}
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$HERE/data/hf/llama_gqa4_untied_rope3
QWEN=$HERE/data/hf/qwen2_gqa2_untied
STEPS=${HF_INIT_STEPS:-12}
HALF=$((STEPS / 2))
TMP=$(mktemp -d /tmp/fp8t_hf_init.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
fails=0
pass() { echo "PASS hf_init: $1"; }
fail() { echo "FAIL hf_init: $1"; fails=$((fails + 1)); }
run() { # run NAME EXPECTED_STATUS CMD...: output in $TMP/NAME.out
  local name=$1 want=$2; shift 2
  "$@" >"$TMP/$name.out" 2>&1; local rc=$?
  if [ "$rc" -ne "$want" ]; then
    fail "$name: exit status $rc, expected $want"; sed 's/^/    /' "$TMP/$name.out" | tail -8; return 1
  fi
  return 0
}
expect() { # expect NAME PATTERN: the output of NAME contains PATTERN
  if grep -q -- "$2" "$TMP/$1.out"; then pass "$1: $2"; else
    fail "$1: output lacks '$2'"; sed 's/^/    /' "$TMP/$1.out" | tail -8; fi
}
[ -x "$BIN" ] || { echo "FAIL hf_init: $BIN is not built"; exit 1; }
[ -f "$SRC/config.json" ] || { echo "FAIL hf_init: fixture $SRC missing"; exit 1; }
step_dir() { printf '%s/checkpoints/step_%06d' "$1" "$2"; }
# the losses of steps > $2 in run $1's metrics.jsonl, one "step loss" line each
losses_after() {
  grep -o '"step":[0-9]*,[^}]*"loss":[^,]*' "$1/metrics.jsonl" |
    sed 's/"step":\([0-9]*\),.*"loss":\(.*\)/\1 \2/' | awk -v s="$2" '$1 > s'
}

OPTS="--batch 2 --seq-len 32 --lr 1e-3 --warmup 2 --val-every 0 --seed 7"
# 1. the FP8 fine-tune, checkpointed half way, and its resumption from there
run full 0 "$BIN" train --init "$SRC" --precision fp8 $OPTS --steps "$STEPS" --ckpt-every "$HALF" \
  --keep-ckpts 0 --out "$TMP/A" && expect full "initialized from $SRC (fresh AdamW moments, step 0)"
expect full "steps 1\.\.$STEPS"
ST=$(step_dir "$TMP/A" "$HALF")/state.json
grep -q '"n_kv_head":[[:space:]]*1,' "$ST" && grep -q '"untied_head":[[:space:]]*1' "$ST" &&
  grep -q '"type":[[:space:]]*"llama3"' "$ST" &&
  pass "checkpoint state.json keeps GQA, the untied head and llama3 RoPE" ||
  fail "checkpoint state.json lacks the model's GQA/untied/RoPE fields"
grep -q '"init":' "$TMP/A/config.json" && pass "run config.json records --init" ||
  fail "run config.json lacks init"
run resumed 0 "$BIN" train --resume "$(step_dir "$TMP/A" "$HALF")" --precision fp8 $OPTS \
  --steps "$STEPS" --ckpt-every "$HALF" --keep-ckpts 0 --out "$TMP/B" &&
  expect resumed "resumed from .* at step $HALF; FP8 scaling state restored"
losses_after "$TMP/A" "$HALF" >"$TMP/a.loss"
losses_after "$TMP/B" "$HALF" >"$TMP/b.loss"
if [ -s "$TMP/a.loss" ] && [ "$(wc -l <"$TMP/a.loss")" -eq $((STEPS - HALF)) ] &&
  cmp -s "$TMP/a.loss" "$TMP/b.loss"; then
  pass "resumed losses of steps $((HALF + 1))..$STEPS identical ($(tail -1 "$TMP/a.loss"))"
else
  fail "resumed losses differ"; diff "$TMP/a.loss" "$TMP/b.loss" | head -6 | sed 's/^/    /'
fi
same=1
for f in model.safetensors optimizer.safetensors fp8_meta.safetensors; do
  cmp -s "$(step_dir "$TMP/A" "$STEPS")/$f" "$(step_dir "$TMP/B" "$STEPS")/$f" || { same=0; echo "    $f differs"; }
done
[ $same = 1 ] && pass "step $STEPS checkpoint bit for bit (weights, AdamW, FP8 state)" ||
  fail "step $STEPS checkpoints differ"

# 2. any precision policy starts from the import (Qwen2 here: q/k/v biases)
for p in bf16 fake current; do
  run "prec_$p" 0 "$BIN" train --init "$QWEN" --precision "$p" $OPTS --steps 2 --out "$TMP/p_$p" &&
    expect "prec_$p" "done: step 2"
done

# 3. contradictions fail before anything is written
run layers 2 "$BIN" train --init "$SRC" --layers 4 --steps 2 --out "$TMP/bad1" &&
  expect layers "n_layer (--layers) is 2 in the checkpoint but 4 in this run"
run preset 2 "$BIN" train --init "$SRC" --preset tiny --steps 2 --out "$TMP/bad2" &&
  expect preset "drop --preset and the model options"
run both 2 "$BIN" train --init "$SRC" --resume "$(step_dir "$TMP/A" "$HALF")" --steps 20 --out "$TMP/bad3" &&
  expect both "exclude each other"
run missing 2 "$BIN" train --init "$TMP/nope" --steps 2 --out "$TMP/bad4" && expect missing "does not exist"
ls -d "$TMP"/bad* >/dev/null 2>&1 && fail "a refused run wrote its --out" || pass "refused runs wrote nothing"
run same_model 0 "$BIN" train --init "$SRC" --layers 2 --dim 64 $OPTS --steps 1 --out "$TMP/same" &&
  pass "model options that restate the source are accepted"

# 3b. the debugging procedure from the imported weights: bisect --init finds an injected fault
# (its recovery experiment resumes the bisection's own checkpoint, not --init)
run bisect 0 "$BIN" bisect --init "$SRC" --steps 10 --batch 2 --seq-len 32 --out "$TMP/bis" \
  --inject "layer=1,module=down,gemm=dgrad,kind=outliers:1e4" &&
  expect bisect "steps per experiment from $SRC" && expect bisect "culprit: dgrad of layer 1"

# 4. export of the fine-tuned model: the same architecture; transformers agrees (optional)
FINAL=$(step_dir "$TMP/A" "$STEPS")
run export 0 "$BIN" export "$FINAL" --to "$TMP/exp" --dtype fp32
grep -q '"num_key_value_heads":[[:space:]]*1' "$TMP/exp/config.json" &&
  grep -q '"tie_word_embeddings":[[:space:]]*false' "$TMP/exp/config.json" &&
  grep -q '"rope_type":[[:space:]]*"llama3"' "$TMP/exp/config.json" &&
  pass "export config.json: GQA 1 K/V head, untied, llama3 RoPE" || fail "export config.json"
if python3 -c "import torch, transformers, safetensors, numpy" 2>/dev/null; then
  run transformers 0 python3 "$HERE/check_hf_transformers.py" --fp8train "$BIN" --export "$TMP/exp" \
    --batches 2 --batch 2 --seq-len 32 --tol 1e-5 --device cpu &&
    pass "transformers loads the export: $(grep 'relative difference' "$TMP/transformers.out")"
  # Qwen2 (q/k/v biases, untied) in FP8 and BF16, sharded
  for dt in fp8 bf16; do
    run "qwen_export_$dt" 0 "$BIN" export "$QWEN" --to "$TMP/qwen_$dt" --dtype "$dt" --max-shard-size 100KB &&
      expect "qwen_export_$dt" "shards + model.safetensors.index.json"
    run "qwen_transformers_$dt" 0 python3 "$HERE/check_hf_transformers.py" --fp8train "$BIN" \
      --export "$TMP/qwen_$dt" --batches 2 --batch 2 --seq-len 32 --tol 1e-5 --device cpu &&
      pass "transformers loads the sharded Qwen2 $dt export: $(grep 'relative difference' "$TMP/qwen_transformers_$dt.out")"
  done
else
  echo "SKIP hf_init: transformers check (pip install torch transformers safetensors numpy)"
fi
echo "$fails failed"
[ $fails -eq 0 ]
