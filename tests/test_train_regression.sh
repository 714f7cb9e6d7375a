#!/usr/bin/env bash
# The seeds' FP8 regression suite: train `tiny` on the synthetic language for 600 steps in
#   bf16              the baseline
#   fp8               delayed scaling, hybrid format (the default recipe)
#   fp8-dgrad-bf16    fp8 with the Dgrad GEMMs in BF16 (NVTE_FP8_DGRAD=0 in the seeds)
#   fp8-current       current scaling
# and assert that each final validation loss is far below the initial ln(256) = 5.55, and
# that each FP8 mode ends within 2% of BF16. Same seed, same data order for all four. Runs two
# trainings at a time (one thread each): about 2.5 minutes on 2 cores.
# Batch 32x32: the threshold must sit well above the spread between runs that differ only in
# rounding. Measured: the same BF16 run built with -O2 and with the sanitizer build's flags
# (which sum some reductions in another order) ended 2.4% apart at batch 8x32 (1.0921 vs
# 1.0664: FP8 "failed" at +2.6% in one build and passed at -0.05% in the other) but 0.44% apart
# at batch 32x32 (0.8600 vs 0.8639), where 2% is a real signal. FP8 delayed vs BF16 at batch
# 32x32: +1.65% (-O2 build) and +0.34% (sanitizer build); current +0.83% / +0.57%; Dgrad in
# BF16 -0.71% / -0.13%. The sanitizer build takes about 8.5 minutes for the four runs.
set -u
BIN=${FP8TRAIN_BIN:-build/fp8train}
SUITE=train_regression
TMP=$(mktemp -d /tmp/fp8t_regression.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
MAX_FINAL=1.5     # final validation loss must be under this (uniform is 5.55; ~0.86 is reached)
MAX_GAP=0.02      # |loss_fp8 - loss_bf16| / loss_bf16
COMMON=(--preset tiny --data synthetic --steps 600 --batch 32 --seq-len 32 --lr 2e-3 --warmup 20
        --val-every 600 --val-batches 8 --seed 1337 --quiet --keep-ckpts 1)

train() { # name, extra options...
  local name=$1; shift
  OMP_NUM_THREADS=1 "$BIN" train "${COMMON[@]}" "$@" --out "$TMP/$name" >"$TMP/$name.log" 2>&1
  echo $? >"$TMP/$name.rc"
}
# The pairs take minutes (more on a busy machine): every 30 s, say which step each has reached.
ticker() { # run names
  while sleep 30; do
    local line="  [$(( $(date +%s) - start ))s]" n s
    for n in "$@"; do
      s=$(tail -n1 "$TMP/$n/metrics.jsonl" 2>/dev/null | grep -o '"step":[0-9]*' | cut -d: -f2)
      line="$line $n ${s:-0}/600"
    done
    echo "$line"
  done
}
pair() { # two runs at once: name1 opts1 -- name2 opts2
  local a=$1 b opts_a=() opts_b=(); shift
  while [ "$1" != -- ]; do opts_a+=("$1"); shift; done
  shift; b=$1; shift; opts_b=("$@")
  echo "  training $a and $b (600 steps each, one thread each)"
  train "$a" "${opts_a[@]}" & local pa=$!
  train "$b" "${opts_b[@]}" & local pb=$!
  ticker "$a" "$b" & local pt=$!
  wait $pa $pb
  kill $pt 2>/dev/null; wait $pt 2>/dev/null
  echo "  $a and $b done after $(( $(date +%s) - start ))s"
}
start=$(date +%s)
pair bf16 --precision bf16 -- fp8 --precision fp8 --recipe delayed --format hybrid
pair fp8-dgrad-bf16 --precision fp8 --override 'gemm=dgrad,precision=bf16' -- \
  fp8-current --precision fp8 --recipe current

# the last validation loss and the first training loss of a run
val_of() { grep -o '"val_loss":[0-9.eE+-]*' "$TMP/$1/metrics.jsonl" 2>/dev/null | tail -1 | cut -d: -f2; }
first_of() { head -1 "$TMP/$1/metrics.jsonl" 2>/dev/null | grep -o '"loss":[0-9.eE+-]*' | cut -d: -f2; }

base=$(val_of bf16)
printf '  %-16s %10s %10s %9s\n' mode first final "vs bf16"
for m in bf16 fp8 fp8-dgrad-bf16 fp8-current; do
  rc=$(cat "$TMP/$m.rc" 2>/dev/null || echo 1)
  v=$(val_of $m); f=$(first_of $m)
  if [ "$rc" != 0 ] || [ -z "$v" ] || [ -z "$f" ] || [ -z "$base" ]; then
    echo "FAIL $SUITE: $m: run failed (exit $rc): $(tail -3 "$TMP/$m.log")"
    continue
  fi
  gap=$(awk -v a="$v" -v b="$base" 'BEGIN { printf "%+.2f%%", 100 * (a - b) / b }')
  printf '  %-16s %10.4f %10.4f %9s\n' "$m" "$f" "$v" "$gap"
  if awk -v f="$f" 'BEGIN { exit !(f > 5.2 && f < 5.9) }'; then echo "PASS $SUITE: $m starts at ln(256)"
  else echo "FAIL $SUITE: $m: first loss $f, expected about 5.55"; fi
  if awk -v v="$v" -v t="$MAX_FINAL" 'BEGIN { exit !(v < t) }'; then echo "PASS $SUITE: $m learns (final $v < $MAX_FINAL)"
  else echo "FAIL $SUITE: $m: final validation loss $v is not under $MAX_FINAL"; fi
  if [ "$m" != bf16 ]; then
    if awk -v a="$v" -v b="$base" -v g="$MAX_GAP" 'BEGIN { d = (a - b) / b; if (d < 0) d = -d; exit !(d < g) }'; then
      echo "PASS $SUITE: $m within 2% of bf16 ($gap)"
    else
      echo "FAIL $SUITE: $m is $gap from bf16 (limit 2%)"
    fi
  fi
done
echo "  ($(( $(date +%s) - start ))s)"
exit 0
