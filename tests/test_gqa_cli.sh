#!/usr/bin/env bash
# Llama-3 / Qwen2 model options from the outside: --kv-heads, --tie-head, --qkv-bias,
# --rope-scaling. Bad values exit 2 naming the option or field; a small model with all four
# trains in FP8, writes them into config.json and its checkpoint (lm_head.w, qkv.b, the k/v
# rows of qkv.w), resumes bit for bit from the CLI, and refuses a resume whose --kv-heads
# differs from the checkpoint's.
set -u
BIN=${FP8TRAIN_BIN:-build/fp8train}
SUITE=gqa_cli
TMP=$(mktemp -d /tmp/fp8t_gqa_cli.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# 4 query heads of 16 on 2 K/V heads; llama3 scaling with an original context of 16 so the
# 32 positions meet all three frequency bands
GQA=(--arch llama --layers 2 --dim 64 --heads 4 --kv-heads 2 --mlp-hidden 128 --max-seq-len 32
     --vocab 256 --tie-head 0 --qkv-bias 1 --rope-scaling llama3:8,1,4,16)
RUN=(--seq-len 32 --batch 2 --warmup 2 --lr 1e-3 --seed 5 --val-every 0 --quiet)

pass() { echo "PASS $SUITE: $1"; }
fail() { echo "FAIL $SUITE: $1: $2"; }

# expect_usage NAME NEEDLE ARGS...: exit status 2, stderr contains NEEDLE, nothing written
expect_usage() {
  local name=$1 needle=$2; shift 2
  local out="$TMP/never_$name"
  "$BIN" train "$@" --out "$out" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  if [ $rc -ne 2 ]; then fail "$name" "exit status $rc, expected 2 ($(head -c 300 "$TMP/err"))"; return; fi
  if ! grep -qF -- "$needle" "$TMP/err"; then fail "$name" "stderr lacks '$needle': $(head -c 300 "$TMP/err")"; return; fi
  if [ -e "$out/metrics.jsonl" ]; then fail "$name" "a run started"; return; fi
  pass "$name"
}

expect_usage kv_heads_not_dividing "n_kv_head" "${GQA[@]}" --kv-heads 3 --steps 2
expect_usage kv_heads_gpt2 "n_kv_head" --preset tiny --kv-heads 2 --steps 2
expect_usage tie_head_word "--tie-head" "${GQA[@]}" --tie-head maybe --steps 2
expect_usage qkv_bias_value "--qkv-bias" "${GQA[@]}" --qkv-bias 2 --steps 2
expect_usage rope_scaling_kind "--rope-scaling" "${GQA[@]}" --rope-scaling yarn:4 --steps 2
expect_usage rope_scaling_order "--rope-scaling" "${GQA[@]}" --rope-scaling llama3:8,4,1,8192 --steps 2

# --- a run with every feature: 6 FP8 steps, checkpoints every 3
"$BIN" train "${GQA[@]}" "${RUN[@]}" --precision fp8 --steps 6 --ckpt-every 3 \
  --out "$TMP/run" >"$TMP/run.out" 2>&1; rc=$?
if [ $rc -eq 0 ] && [ "$(wc -l <"$TMP/run/metrics.jsonl")" -eq 6 ]; then pass train
else fail train "rc $rc: $(tail -c 300 "$TMP/run.out")"; fi
if python3 - "$TMP/run/config.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["model"]
r = m["rope_scaling"]
ok = (m["n_kv_head"] == 2 and m["untied_head"] == 1 and m["qkv_bias"] == 1 and r["type"] == "llama3"
      and r["factor"] == 8 and r["low_freq_factor"] == 1 and r["high_freq_factor"] == 4
      and r["original_max_pos"] == 16)
sys.exit(0 if ok else 1)
PY
then pass config_fields; else fail config_fields "$(head -c 400 "$TMP/run/config.json")"; fi
# the checkpoint's tensors: qkv.w has (4 + 2*2) * 16 = 128 rows, qkv.b 128, lm_head.w last
if python3 - "$TMP/run/checkpoints/step_000006/model.safetensors" <<'PY'
import json, struct, sys
f = open(sys.argv[1], "rb")
h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
h.pop("__metadata__", None)
last = max(h, key=lambda k: h[k]["data_offsets"][0])
ok = (h["h.0.qkv.w"]["shape"] == [128, 64] and h["h.1.qkv.b"]["shape"] == [128]
      and h["lm_head.w"]["shape"] == [256, 64] and last == "lm_head.w")
sys.exit(0 if ok else 1)
PY
then pass checkpoint_tensors; else fail checkpoint_tensors "unexpected tensor table"; fi

# --- resume at step 3 from the CLI (the model from the checkpoint): the same losses, bit for bit
"$BIN" train --resume "$TMP/run/checkpoints/step_000003" --steps 6 "${RUN[@]}" \
  --out "$TMP/resumed" >/dev/null 2>"$TMP/err"; rc=$?
a=$(grep -o '"loss":[^,]*' "$TMP/run/metrics.jsonl" | tail -3 | tr '\n' ' ')
b=$(grep -o '"loss":[^,]*' "$TMP/resumed/metrics.jsonl" 2>/dev/null | tail -3 | tr '\n' ' ')
if [ $rc -eq 0 ] && [ -n "$a" ] && [ "$a" = "$b" ]; then pass exact_resume
else fail exact_resume "rc $rc, '$a' vs '$b' $(head -c 300 "$TMP/err")"; fi
# a resume that asks for another K/V head count is refused, naming the option
"$BIN" train "${GQA[@]}" --kv-heads 1 --resume "$TMP/run/checkpoints/step_000003" --steps 6 \
  "${RUN[@]}" --out "$TMP/mismatch" >/dev/null 2>"$TMP/err"; rc=$?
if [ $rc -ne 0 ] && grep -qF -- "--kv-heads" "$TMP/err"; then pass resume_mismatch
else fail resume_mismatch "rc $rc: $(head -c 300 "$TMP/err")"; fi
exit 0
