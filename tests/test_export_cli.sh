#!/usr/bin/env bash
# fp8train export / import / eval / generate end to end: train a small model a few steps,
# export it in BF16, FP8 (per-tensor and 128x128 blocks) and FP32 and check each export
# reproduces the checkpoint's loss,
# catch an export of the wrong weights, threshold flagging, llm.c export -> import, import ->
# train --resume, tasks, deterministic sampling, and clear failures on bad input.
# Prints one "PASS export_cli: ..." / "FAIL export_cli: ..." line per check (tests/run.sh).
set -u
BIN=${FP8TRAIN_BIN:-$(dirname "$0")/../build/fp8train}
DATA=$(cd "$(dirname "$0")" && pwd)/data
TMP=$(mktemp -d /tmp/fp8t_export_cli.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
fails=0
pass() { echo "PASS export_cli: $1"; }
fail() { echo "FAIL export_cli: $1"; fails=$((fails + 1)); }
# run NAME EXPECTED_STATUS CMD...: output in $TMP/NAME.out
run() {
  local name=$1 want=$2; shift 2
  "$@" >"$TMP/$name.out" 2>&1; local rc=$?
  if [ "$rc" -ne "$want" ]; then
    fail "$name: exit status $rc, expected $want"; sed 's/^/    /' "$TMP/$name.out" | tail -8; return 1
  fi
  return 0
}
expect() { # expect NAME PATTERN: the output of NAME contains PATTERN
  if grep -q -- "$2" "$TMP/$1.out"; then pass "$1"; else
    fail "$1: output lacks '$2'"; sed 's/^/    /' "$TMP/$1.out" | tail -8; fi
}
[ -x "$BIN" ] || { echo "FAIL export_cli: $BIN is not built"; exit 1; }

SMALL="--preset tiny --layers 2 --dim 64 --heads 2 --mlp-hidden 256 --batch 4 --seq-len 32"
run train 0 "$BIN" train $SMALL --steps 4 --ckpt-every 2 --keep-ckpts 0 --val-every 0 --quiet \
  --out "$TMP/run" || { echo "0 passed"; exit 1; }
CK=$TMP/run/checkpoints/step_000004
CK2=$TMP/run/checkpoints/step_000002
[ -d "$CK" ] && pass "train wrote $CK" || fail "no checkpoint $CK"
EV="--batches 2 --batch 4 --seq-len 32 --seed 1337" # explicit: imports carry no run config

# each export dtype reproduces the checkpoint within its rounding bound
for dt in bf16 fp8 fp32; do
  run "export_$dt" 0 "$BIN" export "$CK" --to "$TMP/exp_$dt" --dtype "$dt" && expect "export_$dt" "config.json"
  run "check_$dt" 0 "$BIN" eval "$CK" $EV --check-export "$TMP/exp_$dt" && expect "check_$dt" "($dt export), bf16: .*: ok"
done
grep -q '"quant_method":[[:space:]]*"fp8"' "$TMP/exp_fp8/config.json" && grep -q '"activation_scheme":[[:space:]]*"static"' "$TMP/exp_fp8/config.json" \
  && pass "fp8 config.json has quantization_config" || fail "fp8 config.json lacks quantization_config"
grep -q '"model_type":[[:space:]]*"gpt2"' "$TMP/exp_bf16/config.json" && grep -q '"GPT2LMHeadModel"' "$TMP/exp_bf16/config.json" \
  && pass "bf16 config.json names GPT2LMHeadModel" || fail "bf16 config.json"
expect check_fp8 "(fp8 export), fp8: .*: ok"
# the FP32 export of another step is not this checkpoint: the check must fail
run export_other 0 "$BIN" export "$CK2" --to "$TMP/exp_other" --dtype fp32
run check_other 1 "$BIN" eval "$CK" $EV --check-export "$TMP/exp_other" && expect check_other "FAILED"

# block-scaled FP8 (transformers' fine-grained layout) of a Llama whose matrices are not
# multiples of 128: export, the export check, eval / generate / import of the directory
LL="--preset tiny-llama --layers 2 --dim 160 --heads 5 --kv-heads 1 --mlp-hidden 200 --batch 4 --seq-len 32"
run train_llama 0 "$BIN" train $LL --steps 2 --ckpt-every 2 --keep-ckpts 0 --val-every 0 --quiet \
  --out "$TMP/runl"
CKL=$TMP/runl/checkpoints/step_000002
run export_block 0 "$BIN" export "$CKL" --to "$TMP/exp_block" --dtype fp8 --block 128 \
  && expect export_block "14 weight matrices in E4M3 with 128x128 block weight_scale_inv"
grep -q '"weight_block_size":[[:space:]]*\[128, 128\]' "$TMP/exp_block/config.json" \
  && grep -q '"activation_scheme":[[:space:]]*"dynamic"' "$TMP/exp_block/config.json" \
  && pass "block config.json: weight_block_size [128, 128], activation_scheme dynamic" \
  || fail "block config.json lacks the fine-grained quantization_config"
run check_block 0 "$BIN" eval "$CKL" $EV --check-export "$TMP/exp_block" \
  && expect check_block "(fp8 export), bf16: .*: ok" && expect check_block "fp8: not compared"
run eval_block 0 "$BIN" eval "$TMP/exp_block" $EV && expect eval_block "128x128 block scales"
run gen_block 0 "$BIN" generate "$TMP/exp_block" --prompt "ab" --tokens 8 --seed 5 --print-tokens \
  && expect gen_block "^tokens: "
run import_block 0 "$BIN" import "$TMP/exp_block" --to "$TMP/from_block" && expect import_block "fresh FP8 state"
run resume_block 0 "$BIN" train --resume "$TMP/from_block" --steps 1 --batch 4 --seq-len 32 \
  --val-every 0 --out "$TMP/runl2" && expect resume_block "resumed from"
run export_pow2 0 "$BIN" export "$CKL" --to "$TMP/exp_pow2" --dtype fp8 --block 128 --pow2-scales \
  && expect export_pow2 "block weight_scale_inv (powers of two)"
run check_pow2 0 "$BIN" eval "$CKL" $EV --check-export "$TMP/exp_pow2" && expect check_pow2 "bf16: .*: ok"
# refused before anything is written (exit 2)
run block64 2 "$BIN" export "$CKL" --to "$TMP/exp_b64" --dtype fp8 --block 64 && expect block64 "128x128"
run block_bf16 2 "$BIN" export "$CKL" --to "$TMP/exp_bbf" --block 128 && expect block_bf16 "need --dtype fp8"
run pow2_bf16 2 "$BIN" export "$CKL" --to "$TMP/exp_p16" --pow2-scales && expect pow2_bf16 "need --dtype fp8"
run block_gpt2 2 "$BIN" export "$CK" --to "$TMP/exp_bg" --dtype fp8 --block 128 && expect block_gpt2 "Conv1D"
[ ! -e "$TMP/exp_b64" ] && [ ! -e "$TMP/exp_bbf" ] && [ ! -e "$TMP/exp_bg" ] && [ ! -e "$TMP/exp_p16" ] \
  && pass "refused block exports wrote nothing" || fail "a refused block export created its directory"

# threshold flagging and JSON
run json 0 "$BIN" eval "$CK" $EV --json && expect json '"flagged":false'
run flag 1 "$BIN" eval "$CK" $EV --threshold 0 && expect flag "FLAGGED"

# llm.c: export -> import -> the same BF16 loss (fp32 v3 is exact)
run llmc_export 0 "$BIN" export "$CK" --to "$TMP/model.bin" --format llmc --dtype fp32
run llmc_import 0 "$BIN" import "$TMP/model.bin" --to "$TMP/from_llmc" && expect llmc_import "step 0"
run eval_orig 0 "$BIN" eval "$CK" $EV --precision bf16
run eval_llmc 0 "$BIN" eval "$TMP/from_llmc" $EV --precision bf16
a=$(grep '^bf16' "$TMP/eval_orig.out"); b=$(grep '^bf16' "$TMP/eval_llmc.out")
[ -n "$a" ] && [ "$a" = "$b" ] && pass "llm.c round trip keeps the loss ($a)" || fail "llm.c round trip: '$a' vs '$b'"

# an imported FP8 export resumes training
run import_fp8 0 "$BIN" import "$TMP/exp_fp8" --to "$TMP/from_fp8" && expect import_fp8 "seeded FP8 state"
run resume 0 "$BIN" train --resume "$TMP/from_fp8" --steps 2 --batch 4 --seq-len 32 --val-every 0 \
  --out "$TMP/run2" && expect resume "resumed from"
# eval reads Hugging Face directories directly
run eval_hf 0 "$BIN" eval "$TMP/exp_bf16" $EV && expect eval_hf "hf-gpt2"

# a multiple-choice task file (llm.c format, byte-level)
run task 0 "$BIN" eval "$CK" $EV --task "$DATA/tiny_task.bin" && expect task "6 examples  bf16 [01]\.[0-9]* ([0-6]/6) fp8"

# sampling is deterministic per seed
run gen1 0 "$BIN" generate "$CK" --prompt "ab" --tokens 24 --seed 5 --print-tokens
run gen2 0 "$BIN" generate "$CK" --prompt "ab" --tokens 24 --seed 5 --print-tokens
run gen3 0 "$BIN" generate "$CK" --prompt "ab" --tokens 24 --seed 6 --print-tokens
t1=$(grep '^tokens:' "$TMP/gen1.out"); t2=$(grep '^tokens:' "$TMP/gen2.out"); t3=$(grep '^tokens:' "$TMP/gen3.out")
[ -n "$t1" ] && [ "$t1" = "$t2" ] && pass "generate: same seed, same tokens" || fail "generate: same seed differs"
[ "$t1" != "$t3" ] && pass "generate: another seed, other tokens" || fail "generate: seeds 5 and 6 agree"

# bad input: clear message, exit status 2
run bad_weights 2 "$BIN" eval "$TMP/nope" && expect bad_weights "does not exist"
run bad_prec 2 "$BIN" eval "$CK" --precision fp7 && expect bad_prec "expected bf16"
run bad_export 2 "$BIN" export "$CK" && expect bad_export "--to"
printf 'not a checkpoint at all, just text' >"$TMP/junk.bin"
run bad_import 2 "$BIN" import "$TMP/junk.bin" --to "$TMP/x" && expect bad_import "junk.bin"
run bad_task 2 "$BIN" eval "$CK" $EV --task "$TMP/junk.bin" && expect bad_task "truncated"
run bad_tok 2 "$BIN" generate "$CK" --prompt "x" --tokenizer "$TMP/junk.bin" && expect bad_tok "prompt must be token ids"

[ $fails -eq 0 ]
