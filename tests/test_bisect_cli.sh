#!/usr/bin/env bash
# `fp8train bisect` from the outside: help, bad usage (exit 2 with a message naming the
# option), a clean run (exit 0, "no FP8 problem", stops after two experiments) and the seeds'
# case (a Dgrad fault in layers 1-2 that only delayed scaling suffers): exit 0, the culprit,
# a ready-to-paste override that a fresh `fp8train train` confirms, bisect.json, report.html.
# Then the noise check: the clean run judged at a threshold (0.005%) below the spread of runs
# that differ only by rounding must be reported unreliable (WARNING first, UNCONFIRMED
# culprit, "reliable": false) with the usual exit status.
set -u
BIN=${FP8TRAIN_BIN:-build/fp8train}
SUITE=bisect_cli
TMP=$(mktemp -d /tmp/fp8t_bisect_cli.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# the model of tests/test_bisect.c: 4 layers so the span search has something to narrow
SMALL=(--layers 4 --dim 64 --heads 2 --mlp-hidden 256 --max-seq-len 32 --seq-len 32 --batch 4
       --warmup 5 --lr 1e-3 --seed 7)

pass() { echo "PASS $SUITE: $1"; }
fail() { echo "FAIL $SUITE: $1: $2"; }

# expect_usage NAME NEEDLE ARGS...: exit status 2, stderr contains NEEDLE, nothing written
expect_usage() {
  local name=$1 needle=$2; shift 2
  local out="$TMP/never_$name"
  "$BIN" bisect "$@" --out "$out" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  if [ $rc -ne 2 ]; then fail "$name" "exit status $rc, expected 2 ($(head -c 300 "$TMP/err"))"; return; fi
  if ! grep -qF -- "$needle" "$TMP/err"; then fail "$name" "stderr lacks '$needle': $(head -c 300 "$TMP/err")"; return; fi
  if [ -e "$out/bf16" ]; then fail "$name" "an experiment ran"; return; fi
  pass "$name"
}

# --- help
"$BIN" bisect --help >"$TMP/h"; rc=$?
if [ $rc -eq 0 ] && grep -q -- "--threshold" "$TMP/h" && grep -q -- "--steps" "$TMP/h" &&
   grep -q -- "--preset" "$TMP/h"; then pass help; else fail help "rc $rc"; fi
"$BIN" bisect --help-inject >"$TMP/h"; rc=$?
if [ $rc -eq 0 ] && grep -q "when=fp8" "$TMP/h" && grep -q "stale-amax" "$TMP/h"; then pass help_inject
else fail help_inject "rc $rc"; fi
if "$BIN" help bisect | grep -q -- "--threshold"; then pass help_via_main; else fail help_via_main "fp8train help bisect"; fi
if "$BIN" bisect --help | grep -q '"reliable": false'; then pass help_noise; else fail help_noise "no word on noise"; fi

# --- bad usage
expect_usage no_steps "--steps N is required" "${SMALL[@]}"
expect_usage bad_threshold "--threshold" "${SMALL[@]}" --steps 10 --threshold 2
expect_usage bad_threshold_word "--threshold" "${SMALL[@]}" --steps 10 --threshold lots
expect_usage no_threshold_value "--threshold needs a value" "${SMALL[@]}" --steps 10 --threshold
expect_usage bad_tail "--tail" "${SMALL[@]}" --steps 10 --tail 0
expect_usage bad_inject "kind" "${SMALL[@]}" --steps 10 --inject "layer=1,gemm=dgrad,kind=explode"
expect_usage bad_option "--frobnicate" "${SMALL[@]}" --steps 10 --frobnicate 3
expect_usage short_steps "--steps must be at least 2" "${SMALL[@]}" --steps 1
expect_usage missing_resume "no/such/ckpt" "${SMALL[@]}" --steps 10 --resume "$TMP/no/such/ckpt"

# --- --out is bisect's own directory: one holding anything else is refused, untouched (a
# `--out runs` must not clear the user's runs/bf16)
mkdir -p "$TMP/foreign/bf16" && echo keep >"$TMP/foreign/bf16/config.json" && echo mine >"$TMP/foreign/notes.txt"
"$BIN" bisect "${SMALL[@]}" --steps 10 --out "$TMP/foreign" >"$TMP/out" 2>"$TMP/err"; rc=$?
if [ $rc -eq 2 ] && grep -q "already holds files of something else" "$TMP/err" &&
   [ "$(cat "$TMP/foreign/bf16/config.json")" = keep ] && [ -f "$TMP/foreign/notes.txt" ] &&
   [ ! -e "$TMP/foreign/bisect.json" ]; then pass out_foreign_refused
else fail out_foreign_refused "rc $rc: $(head -c 300 "$TMP/err")"; fi

# --- a clean run: no FP8 problem, two experiments, exit 0 (written into --out itself, not
# into OUT/bisect/)
"$BIN" bisect "${SMALL[@]}" --steps 40 --out "$TMP/clean" >"$TMP/clean.out" 2>&1; rc=$?
n=$(ls "$TMP/clean" 2>/dev/null | grep -cv '\.')
if [ $rc -eq 0 ] && grep -q "no FP8 problem found" "$TMP/clean.out" && [ "$n" -eq 2 ] &&
   grep -q '"outcome":[[:space:]]*"no_problem"' "$TMP/clean/bisect.json" &&
   grep -q '"reliable":[[:space:]]*true' "$TMP/clean/bisect.json"; then pass clean
else fail clean "rc $rc, $n experiment dirs: $(tail -5 "$TMP/clean.out")"; fi

# --- the seeds' case: Dgrad of layers 1-2 broken in delayed scaling
FAULT="layer=1-2,module=fc2,gemm=dgrad,kind=scale:64,from=3,when=delayed"
"$BIN" bisect "${SMALL[@]}" --steps 40 --inject "$FAULT" --out "$TMP/dgrad" >"$TMP/dgrad.out" 2>&1; rc=$?
ov=$(sed -n "s/^  --override '\(.*\)'$/\1/p" "$TMP/dgrad.out")
if [ $rc -eq 0 ] && grep -q "culprit: dgrad of layers 1-2" "$TMP/dgrad.out" &&
   [ "$ov" = "layers=1-2,gemm=dgrad,precision=current" ]; then pass seeds_case
else fail seeds_case "rc $rc, override '$ov': $(tail -8 "$TMP/dgrad.out")"; fi
if grep -q "ETA" "$TMP/dgrad.out" && grep -qE "^fake .*matches" "$TMP/dgrad.out" &&
   grep -qE "^dgrad-bf16 .*closes the gap" "$TMP/dgrad.out"; then pass evidence_table
else fail evidence_table "$(grep -E '^(fake|dgrad-bf16)' "$TMP/dgrad.out")"; fi
J="$TMP/dgrad/bisect.json"
if [ -f "$J" ] && grep -q '"outcome":[[:space:]]*"found"' "$J" &&
   grep -qE "\"override\":[[:space:]]*\"$ov\"" "$J" &&
   grep -q '"precision":[[:space:]]*"current"' "$J" && grep -q '"reliable":[[:space:]]*true' "$J" &&
   ! grep -q "WARNING\|UNCONFIRMED" "$TMP/dgrad.out"; then pass bisect_json
else fail bisect_json "$(head -c 400 "$J" 2>/dev/null)"; fi
# the FP8 alternatives were all tried on the culprit, each with a verdict, and named in the
# conclusion and bisect.json: current, the cheapest, closes; block and rowwise are reported too
if grep -qE "^layers-1-2-dgrad-current .*cheapest fix" "$TMP/dgrad.out" &&
   grep -qE "^layers-1-2-dgrad-block " "$TMP/dgrad.out" &&
   grep -qE "^layers-1-2-dgrad-rowwise " "$TMP/dgrad.out" &&
   grep -q "FP8 alternatives to BF16, cheapest first: current closes" "$TMP/dgrad.out" &&
   grep -qE '"alternatives":[[:space:]]*"current closes[^"]*; block [^"]*; rowwise ' "$J"; then
  pass alternatives
else fail alternatives "$(grep -E 'layers-1-2-dgrad-|alternatives' "$TMP/dgrad.out")"; fi
H="$TMP/dgrad/report.html"
if [ -f "$H" ] && grep -q "<table" "$H" && grep -q "<svg" "$H" && grep -qF "$ov" "$H" &&
   grep -q "</html>" "$H"; then pass report_html; else fail report_html "missing or incomplete"; fi

# the printed override, pasted into fp8train train, closes the gap against the bisect baseline
if [ -n "$ov" ]; then
  "$BIN" train "${SMALL[@]}" --steps 40 --val-every 0 --quiet --inject "$FAULT" --override "$ov" \
    --out "$TMP/confirm" >/dev/null 2>&1
  # median over the last 5 steps of the relative loss difference, as bisect judges it
  loss_at() { sed -n 's/.*"step":\([0-9]*\),"loss":\([-0-9.e+]*\).*/\1 \2/p' "$1"; }
  gap=$(join <(loss_at "$TMP/dgrad/bf16/metrics.jsonl" | sort -k1,1) \
             <(loss_at "$TMP/confirm/metrics.jsonl" | sort -k1,1) |
        awk '$1 >= 36 && $1 <= 40 { d = ($3 - $2) / $2; print (d < 0 ? -d : d) }' | sort -g |
        awk '{ v[NR] = $1 } END { if (NR == 5) print v[3]; else print "missing" }')
  if awk -v g="$gap" 'BEGIN { exit !(g != "missing" && g + 0 < 0.01) }'; then pass override_confirms
  else fail override_confirms "gap $gap"; fi
else
  fail override_confirms "no override printed"
fi

# --- too noisy to trust: a broken BF16 reference. Beside the planted FP8 fault, a fault that
# fires only while layer 3's fc2 runs in BF16 (when=bf16) puts the baseline itself off, so the
# runs that avoid both faults end about 1.5% BELOW it, past the 0.5% threshold on any host
# (asserted: the premise), and the result is flagged. Rounding alone is not used: how far a
# rounding-only run lands from BF16 depends on the host's OpenBLAS kernels.
"$BIN" bisect "${SMALL[@]}" --steps 40 --threshold 0.005 \
  --inject "$FAULT;layer=3,module=fc2,gemm=fprop,tensor=output,kind=scale:8,when=bf16" \
  --out "$TMP/noise" >"$TMP/noise.out" 2>&1; rc=$?
J="$TMP/noise/bisect.json"
# gaps of the experiments (the "gap" keys; the baseline's is 0), lowest first
lowest=$(grep -oE '"gap":[[:space:]]*[-0-9.e+]+' "$J" 2>/dev/null | sed 's/.*:[[:space:]]*//' | sort -g | head -1)
if awk -v g="$lowest" 'BEGIN { exit !(g != "" && g + 0 < -0.005) }'; then pass noise_premise
else fail noise_premise "no experiment ends more than 0.5% below BF16 (lowest gap '$lowest')"; fi
name=$(sed -n 's/^[[:space:]]*"noise_experiment":[[:space:]]*"\([^"]*\)".*/\1/p' "$J")
outcome=$(sed -n 's/^[[:space:]]*"outcome":[[:space:]]*"\([^"]*\)".*/\1/p' "$J")
want_rc=0; [ "$outcome" = no_fix ] && want_rc=1
warn_line=$(grep -n "^WARNING: unreliable" "$TMP/noise.out" | head -1 | cut -d: -f1)
table_line=$(grep -n "^experiment " "$TMP/noise.out" | head -1 | cut -d: -f1)
if [ $rc -eq $want_rc ] && [ -n "$name" ] && [ -n "$warn_line" ] && [ -n "$table_line" ] &&
   [ "$warn_line" -lt "$table_line" ] &&
   grep -q "^WARNING: unreliable, these experiments are too noisy to trust: $name ends " "$TMP/noise.out" &&
   grep -q "UNCONFIRMED" "$TMP/noise.out" && grep -q -- "--threshold [0-9.]* or more" "$TMP/noise.out"; then
  pass noise_printed
else fail noise_printed "rc $rc (want $want_rc), noise_experiment '$name': $(grep -A2 WARNING "$TMP/noise.out" | head -3)"; fi
if grep -q '"reliable":[[:space:]]*false' "$J" && grep -qE '"noise":[[:space:]]*(0\.[0-9]|[1-9])' "$J" &&
   grep -q '"warning":[[:space:]]*"WARNING: unreliable' "$J"; then pass noise_json
else fail noise_json "$(grep -E '"(reliable|noise|noise_experiment)"' "$J")"; fi
H="$TMP/noise/report.html"
if grep -q 'class="warn"' "$H" && grep -q "UNCONFIRMED" "$H"; then pass noise_html; else fail noise_html "no warning box"; fi
