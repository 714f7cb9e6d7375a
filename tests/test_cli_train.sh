#!/usr/bin/env bash
# `fp8train` and `fp8train train` from the outside: help, version, every bad-usage case (exit 2,
# a message naming the option, nothing written), --config precedence, a short run's files,
# the NaN exit status, and `fp8train curves`.
set -u
BIN=${FP8TRAIN_BIN:-build/fp8train}
SUITE=cli_train
TMP=$(mktemp -d /tmp/fp8t_cli_train.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# a small model so each run takes a fraction of a second
SMALL=(--layers 2 --dim 32 --heads 2 --max-seq-len 16 --mlp-hidden 64 --batch 4 --seq-len 16
       --quiet --val-every 0)

pass() { echo "PASS $SUITE: $1"; }
fail() { echo "FAIL $SUITE: $1: $2"; }

# expect_usage NAME NEEDLE ARGS...: exit status 2, stderr contains NEEDLE, OUT not created
expect_usage() {
  local name=$1 needle=$2; shift 2
  local out="$TMP/never_$name"
  "$BIN" train "$@" --out "$out" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  if [ $rc -ne 2 ]; then fail "$name" "exit status $rc, expected 2 ($(head -c 300 "$TMP/err"))"; return; fi
  if ! grep -qF -- "$needle" "$TMP/err"; then fail "$name" "stderr lacks '$needle': $(head -c 300 "$TMP/err")"; return; fi
  if [ -e "$out" ]; then fail "$name" "$out was created"; return; fi
  pass "$name"
}

# --- help and version
if "$BIN" --help >"$TMP/h" && grep -q "train" "$TMP/h" && grep -q "compare" "$TMP/h"; then pass help; else fail help "fp8train --help"; fi
if "$BIN" --version | grep -qE '^fp8train [0-9]+\.[0-9]+'; then pass version; else fail version "no version line"; fi
"$BIN" train --help >"$TMP/th"; rc=$?
missing=""
for o in preset data val-data steps batch seq-len grad-accum precision recipe format amax-history \
         amax-algo margin pow2-scales lr min-lr-frac warmup weight-decay grad-clip seed out device \
         ckpt-every keep-ckpts val-every val-batches resume reset-fp8 override config inspect inject \
         baseline drift-threshold shadow-every shadow-action shadow-threshold quiet progress-every overwrite \
         head-precision fast-accum-fprop fast-accum-grad layers dim heads vocab mlp-hidden arch; do
  grep -q -- "--$o\b" "$TMP/th" || missing="$missing --$o"
done
ndef=$(grep -c "(default" "$TMP/th")
if [ $rc -eq 0 ] && [ -z "$missing" ] && [ "$ndef" -ge 45 ]; then pass train_help
else fail train_help "rc $rc, missing:$missing, $ndef defaults"; fi
"$BIN" >/dev/null 2>&1; rc=$?
if [ $rc -eq 2 ]; then pass no_command; else fail no_command "exit $rc"; fi
"$BIN" frobnicate >/dev/null 2>"$TMP/err"; rc=$?
if [ $rc -eq 2 ] && grep -q "unknown command 'frobnicate'" "$TMP/err"; then pass unknown_command; else fail unknown_command "exit $rc"; fi

# --- bad usage: exit 2, a clear message, nothing written
expect_usage unknown_option "unknown option '--frobnicate'" --frobnicate 3
expect_usage bad_precision "fp8, delayed, current, block, rowwise, mxfp8, fake, bf16 or fp32" --precision fp9
expect_usage bad_recipe "delayed or current" --recipe later
expect_usage bad_format "hybrid" --format e5m2
expect_usage bad_int "--batch: bad value 'abc'" --batch abc
expect_usage bad_float "--lr: bad value 'fast'" --lr fast
expect_usage negative_steps "--steps" --steps -5
expect_usage missing_value "--steps needs a value" --steps
expect_usage positional "unexpected argument 'extra'" extra
expect_usage bad_override "--override" --override 'layers=x,precision=bf16'
expect_usage bad_shadow_action "warn, fallback:M" --shadow-action fallback:0
expect_usage bad_device "cpu or cuda" --device tpu
expect_usage bad_amax_algo "max or most_recent" --amax-algo mean
expect_usage heads_not_dividing "divisible" "${SMALL[@]}" --heads 3
expect_usage seq_len_too_long "more than the model's maximum sequence length 16" "${SMALL[@]}" --seq-len 64
expect_usage seq_len_too_long_msg "--max-seq-len" "${SMALL[@]}" --seq-len 64
expect_usage unknown_preset "tiny, tiny-llama" --preset huge
expect_usage missing_data "cannot open data file" "${SMALL[@]}" --data "$TMP/nothing.txt"
printf 'short' >"$TMP/short.txt"
expect_usage short_data "too short" "${SMALL[@]}" --data "$TMP/short.txt"
head -c 1060 /dev/zero >"$TMP/zeros.bin"
expect_usage bad_shard "bad token shard" "${SMALL[@]}" --data "$TMP/zeros.bin"
expect_usage missing_resume "--resume" "${SMALL[@]}" --resume "$TMP/no_checkpoint"
expect_usage bad_inject "--inject" "${SMALL[@]}" --inject 'kind=boom'
echo '{"precision": "fp8", "batch": ' >"$TMP/bad.json"
expect_usage bad_config_json "not a JSON object" --config "$TMP/bad.json"
echo '{"frobnicate": 1}' >"$TMP/unknown.json"
expect_usage unknown_config_key 'unknown key "frobnicate"' --config "$TMP/unknown.json"
expect_usage missing_config "--config" --config "$TMP/none.json"

# --- a short run: files and exit status
"$BIN" train "${SMALL[@]}" --steps 3 --ckpt-every 2 --out "$TMP/run" >"$TMP/out" 2>"$TMP/err"; rc=$?
n=$(wc -l <"$TMP/run/metrics.jsonl" 2>/dev/null || echo 0)
ok=1
for f in config.json metrics.jsonl events.jsonl checkpoints/step_000002/model.safetensors \
         checkpoints/step_000003/optimizer.safetensors checkpoints/step_000003/fp8_meta.safetensors \
         checkpoints/step_000003/state.json; do
  [ -s "$TMP/run/$f" ] || [ "$f" = events.jsonl -a -e "$TMP/run/$f" ] || { ok=0; echo "  missing $f"; }
done
if [ $rc -eq 0 ] && [ "$n" -eq 3 ] && [ $ok -eq 1 ]; then pass short_run; else fail short_run "rc $rc, $n rows: $(head -c 300 "$TMP/err")"; fi
if grep -q '"loss":' "$TMP/run/metrics.jsonl" && grep -q '"tokens_per_s":' "$TMP/run/metrics.jsonl" &&
   grep -q '"precision":"fp8"' "$TMP/run/metrics.jsonl"; then pass metrics_fields; else fail metrics_fields "$(head -1 "$TMP/run/metrics.jsonl")"; fi

# the banner prints the resolved policy and progress lines
"$BIN" train --layers 2 --dim 32 --heads 2 --max-seq-len 16 --mlp-hidden 64 --batch 4 --seq-len 16 \
  --steps 2 --progress-every 1 --override 'gemm=dgrad,precision=bf16' --out "$TMP/loud" >"$TMP/out" 2>&1
if grep -q "precision policy" "$TMP/out" && grep -q "dgrad" "$TMP/out" && grep -q "step 2/2" "$TMP/out" &&
   grep -q "ETA" "$TMP/out"; then pass banner_and_progress; else fail banner_and_progress "$(head -c 600 "$TMP/out")"; fi

# --- config file < environment < command line
cat >"$TMP/cfg.json" <<EOF
{"precision": "bf16", "overrides": ["layers=0,precision=current"], "layers": 2, "dim": 32,
 "heads": 2, "max_seq_len": 16, "mlp_hidden": 64, "batch": 4, "seq_len": 16, "steps": 1,
 "quiet": true, "val_every": 0}
EOF
"$BIN" train --config "$TMP/cfg.json" --out "$TMP/cfg1" >/dev/null 2>"$TMP/err"
c1=$(tr -d ' \n\t' <"$TMP/cfg1/config.json")
FP8TRAIN_PRECISION=fake "$BIN" train --config "$TMP/cfg.json" --out "$TMP/cfg2" >/dev/null 2>"$TMP/err"
c2=$(tr -d ' \n\t' <"$TMP/cfg2/config.json")
FP8TRAIN_PRECISION=fake "$BIN" train --config "$TMP/cfg.json" --precision current --out "$TMP/cfg3" >/dev/null 2>"$TMP/err"
c3=$(tr -d ' \n\t' <"$TMP/cfg3/config.json")
if grep -q '"default":"bf16"' <<<"$c1" && grep -q '"overrides":\["layers=0,precision=current"\]' <<<"$c1" &&
   grep -q '"n_layer":2' <<<"$c1" && grep -q '"default":"fake"' <<<"$c2" &&
   grep -q '"overrides":\["layers=0,precision=current"\]' <<<"$c2" && grep -q '"default":"current"' <<<"$c3"; then
  pass config_precedence
else
  fail config_precedence "c1=$(head -c 400 <<<"$c1") c2=... c3=..."
fi
# a run's config.json is itself a valid --config
"$BIN" train --config "$TMP/cfg1/config.json" --out "$TMP/cfg4" >/dev/null 2>"$TMP/err"; rc=$?
if [ $rc -eq 0 ] && diff <(grep -v '"out"' "$TMP/cfg1/config.json") <(grep -v '"out"' "$TMP/cfg4/config.json") >/dev/null; then
  pass config_json_round_trip; else fail config_json_round_trip "rc $rc $(head -c 300 "$TMP/err")"; fi

# --- the debugging switches: --disable all-fusion (every plain path) gives the default run's
# losses bit for bit at FP32 saves (bf16-saves, a numerics switch of its own, on both sides),
# and config.json records it; the old variable spelling is the default
"$BIN" train "${SMALL[@]}" --steps 3 --disable bf16-saves --out "$TMP/fused" >/dev/null 2>"$TMP/err"
"$BIN" train "${SMALL[@]}" --steps 3 --disable all-fusion,bf16-saves --out "$TMP/plain" >/dev/null 2>"$TMP/err"
FP8TRAIN_NO_LN_FUSION=1 FP8TRAIN_CUDA_ATTN=tiled "$BIN" train "${SMALL[@]}" --steps 1 \
  --out "$TMP/envdis" >/dev/null 2>"$TMP/err"
lf=$(grep -o '"loss":[^,]*' "$TMP/fused/metrics.jsonl" 2>/dev/null)
lp=$(grep -o '"loss":[^,]*' "$TMP/plain/metrics.jsonl" 2>/dev/null)
if [ -n "$lf" ] && [ "$(wc -l <<<"$lf")" -eq 3 ] && [ "$lf" = "$lp" ] &&
   tr -d ' \n\t' <"$TMP/plain/config.json" | grep -q '"disable":"all-fusion,bf16-saves"' &&
   tr -d ' \n\t' <"$TMP/fused/config.json" | grep -q '"disable":"bf16-saves"' &&
   tr -d ' \n\t' <"$TMP/envdis/config.json" | grep -q '"disable":"ln-fusion","cuda_attn":"tiled"'; then
  pass disable_all_fusion
else
  fail disable_all_fusion "fused [$lf] plain [$lp] $(head -c 300 "$TMP/err")"
fi
expect_usage disable_bad_name "gelu-bwd-fusion" "${SMALL[@]}" --disable gelu
FP8TRAIN_CUDA_ATTN=fastest expect_usage cuda_attn_env "FP8TRAIN_CUDA_ATTN=fastest" "${SMALL[@]}"

# --- resume from the CLI: the model comes from the checkpoint when no model option is given
"$BIN" train --resume "$TMP/run/checkpoints/step_000002" --steps 3 --batch 4 --seq-len 16 --quiet \
  --val-every 0 --out "$TMP/resumed" >/dev/null 2>"$TMP/err"; rc=$?
a=$(grep '"step":3,' "$TMP/run/metrics.jsonl" | grep -o '"loss":[^,]*')
b=$(grep '"step":3,' "$TMP/resumed/metrics.jsonl" 2>/dev/null | grep -o '"loss":[^,]*')
if [ $rc -eq 0 ] && [ -n "$a" ] && [ "$a" = "$b" ]; then pass cli_exact_resume; else fail cli_exact_resume "rc $rc, '$a' vs '$b' $(head -c 300 "$TMP/err")"; fi
# a damaged checkpoint: clear error naming the file, exit 2, nothing written
cp -r "$TMP/run/checkpoints/step_000002" "$TMP/damaged"
truncate -s 100 "$TMP/damaged/optimizer.safetensors"
expect_usage damaged_checkpoint "optimizer.safetensors" --resume "$TMP/damaged" --steps 3 --batch 4 --seq-len 16

# --- the NaN detector's exit status
"$BIN" train "${SMALL[@]}" --steps 5 --inject 'layer=0,module=qkv,gemm=fprop,kind=nan,from=3' \
  --out "$TMP/nan" >/dev/null 2>"$TMP/err"; rc=$?
if [ $rc -eq 3 ] && grep -q "layer 0 qkv fprop" "$TMP/err" && grep -q '"kind":"nan"' "$TMP/nan/events.jsonl"; then
  pass nan_exit_status; else fail nan_exit_status "rc $rc: $(head -c 300 "$TMP/err")"; fi

# --- a byte-level text file and llm.c-style shards as data
for i in $(seq 1 400); do echo "line $i: the quick brown fox jumps over the lazy dog ($((i % 7)))"; done >"$TMP/text.txt"
"$BIN" train "${SMALL[@]}" --steps 2 --val-every 2 --data "$TMP/text.txt" --out "$TMP/text" >/dev/null 2>"$TMP/err"; rc=$?
if [ $rc -eq 0 ] && grep -q '"val_loss"' "$TMP/text/metrics.jsonl" && grep -q 'text.txt' "$TMP/text/config.json"; then pass text_data
else fail text_data "rc $rc: $(head -c 300 "$TMP/err")"; fi

# --- inspect: statistics through the trainer's hook
"$BIN" train "${SMALL[@]}" --steps 2 --inspect 'every=1,layers=0,gemms=fprop' --out "$TMP/insp" >/dev/null 2>"$TMP/err"; rc=$?
if [ $rc -eq 0 ] && [ -s "$TMP/insp/stats.jsonl" ] && grep -q '"step":2' "$TMP/insp/stats.jsonl"; then pass inspect
else fail inspect "rc $rc: $(head -c 300 "$TMP/err")"; fi

# --- curves
"$BIN" train "${SMALL[@]}" --steps 3 --precision bf16 --out "$TMP/run_bf16" >/dev/null 2>&1
"$BIN" curves "$TMP/run_bf16" "$TMP/run" >"$TMP/curves" 2>"$TMP/err"; rc=$?
if [ $rc -eq 0 ] && grep -q "final loss" "$TMP/curves" && grep -q "gap vs" "$TMP/curves"; then pass curves
else fail curves "rc $rc: $(head -c 300 "$TMP/err")"; fi
"$BIN" curves "$TMP/none" >/dev/null 2>&1; rc=$?
if [ $rc -eq 2 ]; then pass curves_bad_input; else fail curves_bad_input "exit $rc"; fi
exit 0
