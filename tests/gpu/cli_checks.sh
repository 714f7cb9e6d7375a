#!/usr/bin/env bash
# End-to-end checks of the fp8train command on the CUDA backend (an NVIDIA Hopper GPU), the
# parts gpu_test cannot reach: the run directory, the tokenizer, Hugging Face Llama/Qwen2
# checkpoints (GQA, untied head, llama3 RoPE, QKV bias) against the CPU backend, bit-exact
# resume from --init, the NCCL path at world size 1 against the plain path, TensorBoard files,
# the inference model (generate with the KV cache against the CPU, eval --infer, bench-infer).
#   tests/gpu/cli_checks.sh [FP8TRAIN_BIN] [WORK_DIR]
# Prints PASS/FAIL lines and "N passed, N failed"; exit 0 only if nothing failed.
set -u
cd "$(dirname "$0")/../.."
BIN=${1:-build/fp8train}
W=${2:-$(mktemp -d "${TMPDIR:-/tmp}/fp8t_gpu_cli.XXXXXX")}
mkdir -p "$W"
passed=0; failed=0
pass() { echo "PASS gpu_cli: $1"; passed=$((passed + 1)); }
fail() { echo "FAIL gpu_cli: $1: $2"; failed=$((failed + 1)); }
# loss column of metrics.jsonl, one value a line (the same bits print the same digits)
losses() { grep -o '"loss":[^,}]*' "$1/metrics.jsonl"; }
# eval's loss for one precision from its table
eval_loss() { awk -v p="$2" '$1 == p && NF >= 3 { print $2 }' "$1"; }
rel_close() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d;
  m = (a < 0 ? -a : a); exit !(a != "" && b != "" && d <= t * m) }'; }
T=(--device cuda --quiet)

# --- run directory: refusal without --overwrite, then --overwrite
"$BIN" train "${T[@]}" --preset tiny --steps 20 --ckpt-every 10 --out "$W/rd" >"$W/rd1.log" 2>&1
r1=$?
"$BIN" train "${T[@]}" --preset tiny --steps 20 --out "$W/rd" >"$W/rd2.log" 2>&1; r2=$?
"$BIN" train "${T[@]}" --preset tiny --steps 20 --out "$W/rd" --overwrite >"$W/rd3.log" 2>&1; r3=$?
if [ $r1 -eq 0 ] && [ $r2 -eq 2 ] && [ $r3 -eq 0 ]; then pass rundir
else fail rundir "exit codes $r1 $r2 $r3 (want 0 2 0): $(tail -2 "$W/rd2.log")"; fi

# --- tokenizer: train on text through a tokenizer.json, generate from a text prompt
"$BIN" train "${T[@]}" --preset tiny --data tests/data/tokenizer/shakespeare.txt \
  --tokenizer tests/data/tokenizer/gpt2.json --steps 50 --precision fp8 --out "$W/tok" \
  >"$W/tok.log" 2>&1; r1=$?
"$BIN" generate "$W/tok/checkpoints/step_000050" --device cuda --prompt "ROMEO:" --tokens 20 \
  >"$W/gen.log" 2>&1; r2=$?
first=$(losses "$W/tok" | head -1 | cut -d: -f2)
if [ $r1 -eq 0 ] && [ $r2 -eq 0 ] && grep -q "ROMEO:" "$W/gen.log" &&
   awk -v l="$first" 'BEGIN { exit !(l > 6.0 && l < 7.8) }'; then
  pass "tokenizer train+generate (first loss $first, ln 1001 = 6.91)"
else fail tokenizer "train $r1 generate $r2 first loss '$first': $(tail -3 "$W/gen.log")"; fi

# --- Hugging Face Llama-3 / Qwen2 fixtures: CUDA eval against the CPU backend
for m in llama_gqa4_untied_rope3 llama_gqa2_tied_bf16 qwen2_gqa2_untied; do
  for d in cpu cuda; do
    "$BIN" eval "tests/data/hf/$m" --device $d --precision all --batch 2 --seq-len 32 \
      --batches 4 >"$W/eval_${m}_$d.log" 2>&1
  done
  c=$(eval_loss "$W/eval_${m}_cpu.log" fp32); g=$(eval_loss "$W/eval_${m}_cuda.log" fp32)
  cb=$(eval_loss "$W/eval_${m}_cpu.log" bf16); gb=$(eval_loss "$W/eval_${m}_cuda.log" bf16)
  if rel_close "$c" "$g" 1e-5 && rel_close "$cb" "$gb" 2e-3; then
    pass "hf eval $m: fp32 cpu $c cuda $g, bf16 cpu $cb cuda $gb"
  else fail "hf eval $m" "fp32 cpu '$c' cuda '$g', bf16 cpu '$cb' cuda '$gb'"; fi
done

# --- --init from a GQA checkpoint, FP8, resume on the GPU bit-exact
I=(--init tests/data/hf/llama_gqa4_untied_rope3 --precision fp8 --steps 20 --ckpt-every 10
   --keep-ckpts 0 --batch 2 --seq-len 32 --val-every 0)
"$BIN" train "${T[@]}" "${I[@]}" --out "$W/i1" >"$W/i1.log" 2>&1; r1=$?
"$BIN" train "${T[@]}" --resume "$W/i1/checkpoints/step_000010" --precision fp8 --steps 20 \
  --ckpt-every 10 --keep-ckpts 0 --batch 2 --seq-len 32 --val-every 0 --out "$W/i2" \
  >"$W/i2.log" 2>&1; r2=$?
if [ $r1 -eq 0 ] && [ $r2 -eq 0 ] &&
   cmp -s "$W/i1/checkpoints/step_000020/model.safetensors" \
          "$W/i2/checkpoints/step_000020/model.safetensors" &&
   [ "$(losses "$W/i1" | tail -10)" = "$(losses "$W/i2" | tail -10)" ]; then
  pass "init GQA + fp8 resume bit-exact"
else fail "init resume" "exit $r1 $r2; $(tail -2 "$W/i2.log")"; fi

# --- GQA + untied + QKV bias + llama3 RoPE: 100 steps CUDA against CPU, compare says match
G=(--preset tiny-llama --kv-heads 2 --tie-head 0 --qkv-bias 1 --rope-scaling llama3:8
   --steps 100 --precision fp8 --quiet)
"$BIN" train --device cpu "${G[@]}" --out "$W/gqa_cpu" >"$W/gqa_cpu.log" 2>&1; r1=$?
"$BIN" train --device cuda "${G[@]}" --out "$W/gqa_cuda" >"$W/gqa_cuda.log" 2>&1; r2=$?
"$BIN" compare "$W/gqa_cpu" "$W/gqa_cuda" >"$W/gqa_cmp.log" 2>&1; r3=$?
if [ $r1 -eq 0 ] && [ $r2 -eq 0 ] && [ $r3 -eq 0 ]; then pass "gqa cuda vs cpu: match"
else fail "gqa cuda vs cpu" "exit $r1 $r2 compare $r3: $(grep -i -m2 'verdict\|class' "$W/gqa_cmp.log")"; fi

# --- the NCCL path at world size 1 (mpirun -np 1, data parallel forced) against the plain path
MR=(mpirun --allow-run-as-root -np 1)
P=(--preset tiny --steps 50 --val-every 0 --precision fp8)
"$BIN" train "${T[@]}" "${P[@]}" --out "$W/dp_plain" >"$W/dp_plain.log" 2>&1; r1=$?
"${MR[@]}" "$BIN" train "${T[@]}" "${P[@]}" --dp-force --out "$W/dp_nccl" >"$W/dp_nccl.log" 2>&1
r2=$?
"${MR[@]}" "$BIN" train "${T[@]}" "${P[@]}" --dp-force --zero 1 --out "$W/dp_zero" \
  >"$W/dp_zero.log" 2>&1; r3=$?
if [ $r1 -eq 0 ] && [ $r2 -eq 0 ] && [ "$(losses "$W/dp_plain")" = "$(losses "$W/dp_nccl")" ]
then pass "nccl world of one == plain (50 fp8 steps, losses bit for bit)"
else fail "nccl world of one" "exit $r1 $r2: $(tail -3 "$W/dp_nccl.log")"; fi
if [ $r3 -eq 0 ] && [ "$(losses "$W/dp_plain")" = "$(losses "$W/dp_zero")" ]
then pass "nccl zero-1 world of one == plain"
else fail "nccl zero-1 world of one" "exit $r3: $(tail -3 "$W/dp_zero.log")"; fi
# the gradient buckets on the comm stream (one per layer), plain and ZeRO-1, and none at all
"${MR[@]}" "$BIN" train "${T[@]}" "${P[@]}" --dp-force --bucket-mb 0.001 --out "$W/dp_bk" \
  >"$W/dp_bk.log" 2>&1; r4=$?
"${MR[@]}" "$BIN" train "${T[@]}" "${P[@]}" --dp-force --zero 1 --bucket-mb 0.001 \
  --out "$W/dp_bkz" >"$W/dp_bkz.log" 2>&1; r5=$?
"${MR[@]}" "$BIN" train "${T[@]}" "${P[@]}" --dp-force --bucket-mb 0 --out "$W/dp_bk0" \
  >"$W/dp_bk0.log" 2>&1; r6=$?
if [ $r4 -eq 0 ] && [ $r5 -eq 0 ] && [ $r6 -eq 0 ] &&
   [ "$(losses "$W/dp_plain")" = "$(losses "$W/dp_bk")" ] &&
   [ "$(losses "$W/dp_plain")" = "$(losses "$W/dp_bkz")" ] &&
   [ "$(losses "$W/dp_plain")" = "$(losses "$W/dp_bk0")" ]
then pass "nccl world of one, gradients in per-layer buckets (plain, zero-1) and unbucketed == plain"
else fail "nccl buckets world of one" "exit $r4 $r5 $r6: $(tail -3 "$W/dp_bk.log" "$W/dp_bkz.log")"; fi

# --- TensorBoard files with inspect statistics, read by the tensorboard package
"$BIN" train "${T[@]}" --preset tiny --steps 30 --val-every 10 --inspect every=10 \
  --out "$W/tb" --tensorboard "$W/tb/tb" >"$W/tb.log" 2>&1; r1=$?
if [ $r1 -ne 0 ]; then fail tensorboard "train exit $r1: $(tail -2 "$W/tb.log")"
elif python3 -c 'import tensorboard' 2>/dev/null; then
  if python3 tests/check_tensorboard.py "$W/tb" "$W/tb/tb" >"$W/tb_check.log" 2>&1
  then pass "tensorboard files read by the tensorboard package"
  else fail tensorboard "$(tail -3 "$W/tb_check.log")"; fi
else echo "SKIP gpu_cli: tensorboard (no tensorboard package)"; fi

# --- inference model: generate with the KV cache on CUDA = on the CPU (FP32, the FP32
#     attention kernels for the prefill; the same sampled tokens), a batch of prompts in FP8,
#     eval --infer against the training model, bench-infer's CUDA peak memory column
CKI=$W/tok/checkpoints/step_000050
G=(--prompt "ROMEO:" --tokens 24 --temperature 1 --seed 5 --precision fp32 --print-tokens)
"$BIN" generate "$CKI" --device cpu "${G[@]}" >"$W/inf_cpu.log" 2>&1; r1=$?
FP8TRAIN_CUDA_ATTN=tiled "$BIN" generate "$CKI" --device cuda "${G[@]}" >"$W/inf_cuda.log" 2>&1
r2=$?
tc=$(grep '^tokens:' "$W/inf_cpu.log"); tg=$(grep '^tokens:' "$W/inf_cuda.log")
if [ $r1 -eq 0 ] && [ $r2 -eq 0 ] && [ -n "$tc" ] && [ "$tc" = "$tg" ]; then
  pass "generate (KV cache) fp32 cuda = cpu"
else fail "generate fp32 cuda vs cpu" "exit $r1 $r2; cpu '$tc' cuda '$tg'"; fi
printf 'ROMEO:\nJULIET: O\nFirst Citizen:\n' >"$W/prompts.txt"
"$BIN" generate "$CKI" --device cuda --prompts "$W/prompts.txt" --tokens 16 --precision fp8 \
  >"$W/inf_fp8.log" 2>&1; r1=$?
if [ $r1 -eq 0 ] && [ "$(grep -c '^--- sample' "$W/inf_fp8.log")" -eq 3 ]; then
  pass "generate --prompts fp8 on cuda"
else fail "generate --prompts fp8" "exit $r1: $(tail -3 "$W/inf_fp8.log")"; fi
"$BIN" eval "$CKI" --device cuda --precision bf16 --batches 4 >"$W/ev_train.log" 2>&1; r1=$?
"$BIN" eval "$CKI" --device cuda --precision bf16 --batches 4 --infer >"$W/ev_infer.log" 2>&1; r2=$?
a=$(eval_loss "$W/ev_train.log" bf16); b=$(eval_loss "$W/ev_infer.log" bf16)
if [ $r1 -eq 0 ] && [ $r2 -eq 0 ] && rel_close "$a" "$b" 2e-3; then
  pass "eval --infer bf16 $b = training model $a (cuda)"
else fail "eval --infer cuda" "exit $r1 $r2: '$a' vs '$b'"; fi
"$BIN" bench-infer --preset tiny --device cuda --batch 1,8 --prompt-len 32 --gen 8 \
  --out "$W/bench_infer.json" >"$W/bench_infer.log" 2>&1; r1=$?
if [ $r1 -eq 0 ] && grep -q '"peak_bytes":' "$W/bench_infer.json" &&
   ! grep -q '"peak_bytes":[[:space:]]*null' "$W/bench_infer.json"; then
  pass "bench-infer on cuda (peak memory reported)"
else fail "bench-infer cuda" "exit $r1: $(tail -3 "$W/bench_infer.log")"; fi

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
