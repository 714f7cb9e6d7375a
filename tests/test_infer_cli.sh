#!/usr/bin/env bash
# fp8train generate with the inference model (KV cache, batches of prompts) and bench-infer,
# on the CPU: train a small FP8 model a few steps, then check that the cached FP32 generation
# samples the tokens of the uncached path (--no-cache: the training model's full window), that
# every prompt of a --prompts batch gets the tokens it gets alone (sequence i samples with seed
# S + i), --batch N samples of one prompt, FP8 with the learned (delayed) activation scales,
# clear failures, eval --infer against the training model's loss, and bench-infer's table and
# JSON on a tiny preset.
# Prints one "PASS infer_cli: ..." / "FAIL infer_cli: ..." line per check (tests/run.sh).
set -u
BIN=${FP8TRAIN_BIN:-$(dirname "$0")/../build/fp8train}
TMP=$(mktemp -d /tmp/fp8t_infer_cli.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
fails=0
pass() { echo "PASS infer_cli: $1"; }
fail() { echo "FAIL infer_cli: $1"; fails=$((fails + 1)); }
# run NAME EXPECTED_STATUS CMD...: output in $TMP/NAME.out (stdout) and $TMP/NAME.err
run() {
  local name=$1 want=$2; shift 2
  "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"; local rc=$?
  if [ "$rc" -ne "$want" ]; then
    fail "$name: exit status $rc, expected $want"; cat "$TMP/$name.out" "$TMP/$name.err" |
      sed 's/^/    /' | tail -8; return 1
  fi
  return 0
}
expect() { # expect NAME PATTERN: stdout or stderr of NAME contains PATTERN
  if cat "$TMP/$1.out" "$TMP/$1.err" | grep -q -- "$2"; then pass "$1"; else
    fail "$1: output lacks '$2'"; cat "$TMP/$1.out" "$TMP/$1.err" | sed 's/^/    /' | tail -8; fi
}
# tokens NAME [K]: the K-th (1-based) "tokens:" line of NAME's stdout
tokens() { grep '^tokens:' "$TMP/$1.out" | sed -n "${2:-1}p"; }
same() { # same LABEL A B: A and B are equal and not empty
  if [ -n "$2" ] && [ "$2" = "$3" ]; then pass "$1"; else fail "$1: '$2' vs '$3'"; fi
}
[ -x "$BIN" ] || { echo "FAIL infer_cli: $BIN is not built"; exit 1; }

SMALL="--preset tiny --layers 2 --dim 64 --heads 2 --mlp-hidden 256 --batch 4 --seq-len 32 --max-seq-len 48"
run train 0 "$BIN" train $SMALL --precision fp8 --steps 8 --ckpt-every 8 --keep-ckpts 0 \
  --val-every 0 --quiet --out "$TMP/run" || { echo "0 passed"; exit 1; }
CK=$TMP/run/checkpoints/step_000008

# 1. the KV cache samples what the full window samples (FP32: the same logits up to
#    summation order, the same random stream)
G="--tokens 20 --temperature 1 --seed 5 --precision fp32 --print-tokens"
run cached 0 "$BIN" generate "$CK" --prompt "ab" $G && expect cached "KV cache fp32"
run uncached 0 "$BIN" generate "$CK" --prompt "ab" $G --no-cache
same "cached fp32 sampling = uncached" "$(tokens cached)" "$(tokens uncached)"

# 2. a batch of prompts of different lengths: each as alone (sequence i: seed 5 + i)
printf 'hello there\nab\n\nthe quick brown fox\n' >"$TMP/prompts.txt"
run batch 0 "$BIN" generate "$CK" --prompts "$TMP/prompts.txt" $G && expect batch "batch 3"
grep -q -- '--- sample 2' "$TMP/batch.out" && pass "three samples printed (empty line skipped)" ||
  fail "batch output lacks sample 2"
i=0
for p in "hello there" "ab" "the quick brown fox"; do
  run "alone$i" 0 "$BIN" generate "$CK" --prompt "$p" --tokens 20 --temperature 1 \
    --seed $((5 + i)) --precision fp32 --print-tokens
  same "prompt $i in a batch = alone" "$(tokens batch $((i + 1)))" "$(tokens alone$i)"
  i=$((i + 1))
done
# the batch split into batches of 2 gives the same tokens
run batch2 0 "$BIN" generate "$CK" --prompts "$TMP/prompts.txt" $G --batch 2 &&
  expect batch2 "batch 2"
same "--batch 2 over 3 prompts = one batch" "$(tokens batch2 3)" "$(tokens batch 3)"

# 3. --batch N samples of one prompt, in bf16 and fp8 (learned activation scales)
run samples 0 "$BIN" generate "$CK" --prompt "ab" --tokens 8 --batch 3 --print-tokens &&
  expect samples "bf16 weights"
[ "$(grep -c '^tokens:' "$TMP/samples.out")" -eq 3 ] && pass "--batch 3: three samples" ||
  fail "--batch 3 printed $(grep -c '^tokens:' "$TMP/samples.out") samples"
run fp8_delayed 0 "$BIN" generate "$CK" --prompt "ab" --tokens 8 --precision fp8 \
  --act-scale delayed && expect fp8_delayed "activations delayed (learned) scales"
run fp8_current 0 "$BIN" generate "$CK" --prompt "ab" --tokens 8 --precision fp8 &&
  expect fp8_current "activations current scaling"

# 3b. fixed FP8 scales calibrated by the inference model; the FP8 cache; op by op
run fp8_calib 0 "$BIN" generate "$CK" --prompt "ab" --tokens 8 --precision fp8 \
  --act-scale calibrated --calib-batches 2 && expect fp8_calib "activations calibrated scales (2 batches of 1 x"
grep -q "KV cache fp8" "$TMP/fp8_calib.err" && pass "fp8: the KV cache is FP8 by default" ||
  fail "fp8 cache: $(grep KV "$TMP/fp8_calib.err")"
run fp8_kvbf16 0 "$BIN" generate "$CK" --prompt "ab" --tokens 8 --precision fp8 --kv-cache bf16 \
  --no-graphs && expect fp8_kvbf16 "KV cache bf16"
run bad_kv 2 "$BIN" generate "$CK" --kv-cache fp9 && expect bad_kv "bf16, fp8 or fp32"
run fp32_kv8 2 "$BIN" generate "$CK" --precision fp32 --kv-cache fp8 --tokens 8 &&
  expect fp32_kv8 "exact reference"

# 4. clear failures
printf "x%.0s" $(seq 1 45) >"$TMP/long.txt"; printf '\nab\n' >>"$TMP/long.txt"
run too_long 2 "$BIN" generate "$CK" --prompts "$TMP/long.txt" --tokens 8 &&
  expect too_long "seq_len 48"
run bad_act 2 "$BIN" generate "$CK" --act-scale soon && expect bad_act "current, delayed or calibrated"
run two_prompts 2 "$BIN" generate "$CK" --prompt a --prompts "$TMP/prompts.txt" &&
  expect two_prompts "one of --prompt"
# a prompt + tokens beyond seq_len: the sliding window, said so
run window 0 "$BIN" generate "$CK" --prompt "ab" --tokens 60 && expect window "without the KV cache"

# 5. eval --infer: the held-out loss through the inference model, as the training model's:
#    fp32 the same arithmetic (1e-5 covers the print's last digit); bf16 the same roundings but
#    for the inference model's BF16 embedding table (2^-9 per element: measured 1e-6 relative,
#    allowed 1e-4); fp8 near bf16
run eval_train 0 "$BIN" eval "$CK" --batches 2 --precision all
run eval_infer 0 "$BIN" eval "$CK" --batches 2 --precision all --infer &&
  expect eval_infer "activations current scaling"
for pt in "bf16 1e-4" "fp32 3e-6"; do
  set -- $pt
  a=$(awk -v p=$1 '$1 == p {print $2}' "$TMP/eval_train.out")
  b=$(awk -v p=$1 '$1 == p {print $2}' "$TMP/eval_infer.out")
  awk -v a="$a" -v b="$b" -v t="$2" 'BEGIN { d = (a - b) / a; exit !(a != "" && d <= t && d >= -t) }' &&
    pass "eval --infer $1 loss $b = the training model's $a" || fail "eval --infer $1: '$b' vs '$a'"
done
grep -q "ok: within" "$TMP/eval_infer.out" && pass "eval --infer: fp8 within 1% of bf16" ||
  fail "eval --infer fp8 gap"
run eval_delayed 0 "$BIN" eval "$CK" --batches 2 --infer --act-scale delayed --json &&
  expect eval_delayed '"act_scale":"delayed"'
# --task through the inference model: accuracy for every precision; fp32 picks what the
# training model picks (the same losses up to summation order)
TASK=$(dirname "$0")/data/tiny_task.bin
run task_train 0 "$BIN" eval "$CK" --batches 1 --precision all --task "$TASK"
run task_infer 0 "$BIN" eval "$CK" --batches 1 --precision all --infer --task "$TASK" &&
  expect task_infer "6 examples  bf16 [01]\.[0-9]* ([0-6]/6) fp8 [01]\.[0-9]* ([0-6]/6) fp32"
a=$(grep -o 'fp32 [01]\.[0-9]* ([0-6]/6)' "$TMP/task_train.out")
b=$(grep -o 'fp32 [01]\.[0-9]* ([0-6]/6)' "$TMP/task_infer.out")
same "eval --infer --task fp32 = the training model's" "$b" "$a"
run task_calib 0 "$BIN" eval "$CK" --batches 1 --infer --act-scale calibrated --task "$TASK" \
  --json && expect task_calib '"act_scale":"calibrated"'
run infer_export 2 "$BIN" eval "$CK" --infer --check-export "$TMP" &&
  expect infer_export "without --infer"
# the loss through the KV cache (decode steps): fp32 = the full window's
run decode_loss 0 "$BIN" eval "$CK" --batches 2 --precision fp32 --infer --decode-loss &&
  expect decode_loss "loss through the KV cache"
a=$(awk '$1 == "fp32" {print $2}' "$TMP/eval_infer.out")
b=$(awk '$1 == "fp32" {print $2}' "$TMP/decode_loss.out")
awk -v a="$a" -v b="$b" 'BEGIN { d = (a - b) / a; exit !(a != "" && d <= 3e-6 && d >= -3e-6) }' &&
  pass "eval --decode-loss fp32 $b = the full window's $a" || fail "decode loss '$b' vs '$a'"
run decode_noinfer 2 "$BIN" eval "$CK" --decode-loss && expect decode_noinfer "add --infer"

# 6. bench-infer on a tiny preset: the table, the ratios, the JSON
run bench_help 0 "$BIN" bench-infer --help && expect bench_help "prefill and decode"
run bench 0 "$BIN" bench-infer --preset tiny --batch 1,4 --prompt-len 16 --gen 4 --repeat 1 \
  --out "$TMP/bench.json" && expect bench "fp8/bf16 at batch 4"
for p in bf16 fp8 fp32; do
  [ "$(grep -c "^$p " "$TMP/bench.out")" -eq 2 ] && pass "bench: two $p rows" ||
    fail "bench: $p rows: $(grep -c "^$p " "$TMP/bench.out")"
done
if command -v python3 >/dev/null; then
  python3 - "$TMP/bench.json" <<'EOF' && pass "bench JSON: 6 results with throughput and bytes" || fail "bench JSON"
import json, sys
d = json.load(open(sys.argv[1]))
r = d["results"]
assert len(r) == 6 and d["device"] == "cpu" and d["random_weights"] is True
assert all(x["ok"] and x["prefill_tokens_per_s"] > 0 and x["decode_tokens_per_s"] > 0 for x in r)
w = {(x["precision"], x["batch"]): x["weight_bytes"] for x in r}
assert w[("fp8", 4)] < 0.6 * w[("bf16", 4)] and w[("bf16", 1)] < w[("fp32", 1)]
kv = {(x["precision"], x["batch"]): x["kv_cache_bytes"] for x in r}
assert kv[("bf16", 4)] == 4 * kv[("bf16", 1)] and kv[("fp32", 4)] == 2 * kv[("bf16", 4)]
EOF
fi
run bench_ckpt 0 "$BIN" bench-infer "$CK" --precisions fp8 --batch 2 --prompt-len 8 --gen 2 \
  --act-scale delayed --repeat 1 && expect bench_ckpt "activations delayed"
run bench_fixed 0 "$BIN" bench-infer --preset tiny --precisions bf16,fp8 --batch 2 --prompt-len 8 \
  --gen 2 --repeat 1 --act-scale calibrated --fp8-head --out "$TMP/bench2.json" &&
  expect bench_fixed "kv fp8, fp8 head"
grep -q '"fp8_activations":[[:space:]]*"calibrated scales (4 batches of 2 x 8 tokens)"' "$TMP/bench2.json" &&
  pass "bench JSON records the calibrated scales" || fail "bench JSON: fp8_activations"
run bench_bad 2 "$BIN" bench-infer --preset tiny --precisions fp9 && expect bench_bad "bf16, fp8, fp32"
run bench_len 2 "$BIN" bench-infer --preset tiny --prompt-len 120 --gen 32 && expect bench_len "seq_len 128"

echo "infer_cli: $fails failed"
[ "$fails" -eq 0 ]
