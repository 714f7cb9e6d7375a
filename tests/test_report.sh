#!/usr/bin/env bash
# `fp8train compare` end to end through the binary: exit codes for CI (0 match, 1 mismatch,
# 2 bad input), --json, and --report writing one self-contained HTML file. The runs are
# constructed metrics.jsonl files (awk, deterministic), so no training is needed.
set -u
BIN=${FP8TRAIN_BIN:-build/fp8train}
suite=report
pass() { echo "PASS $suite: $1"; }
fail() { echo "FAIL $suite: $1"; failed=1; }
failed=0
if [ ! -x "$BIN" ]; then echo "FAIL $suite: binary $BIN not built (make, or set FP8TRAIN_BIN)"; exit 1; fi
dir=$(mktemp -d /tmp/fp8t_test_report_XXXXXX)
trap 'rm -rf "$dir"' EXIT

# run NAME SEED KIND: 300 steps of 3 + 7.8 exp(-s/35) with 0.3% noise; KIND shapes run B
run() {
  mkdir -p "$dir/$1"
  awk -v seed="$2" -v kind="$3" 'BEGIN {
    srand(seed);
    for (s = 1; s <= 300; s++) {
      l = (3 + 7.8 * exp(-s / 35)) * (1 + 0.006 * (rand() - 0.5) * 1.7);
      if (kind == "drift" && s > 150) l *= 1 + 0.03 * (s - 150) / 150;
      if (kind == "early") l *= 1.08;
      if (kind == "nan" && s == 120) { printf("{\"step\":%d,\"loss\":nan}\n", s); exit }
      printf("{\"step\":%d,\"loss\":%.9g,\"lr\":0.0006}\n", s, l);
    } }' > "$dir/$1/metrics.jsonl"
}
run base 1 none; run same 2 none; run drift 3 drift; run early 4 early; run nan 5 nan

"$BIN" compare "$dir/base" "$dir/same" > "$dir/out.txt" 2>&1; rc=$?
if [ $rc -eq 0 ] && grep -q "^verdict: match" "$dir/out.txt"; then pass "match exits 0"; else fail "match: rc $rc: $(head -c 400 "$dir/out.txt")"; fi

"$BIN" compare "$dir/base" "$dir/drift" --report "$dir/drift.html" > "$dir/out.txt" 2>&1; rc=$?
if [ $rc -eq 1 ] && grep -q "^verdict: drift" "$dir/out.txt"; then pass "drift exits 1"; else fail "drift: rc $rc: $(head -c 400 "$dir/out.txt")"; fi
if [ -s "$dir/drift.html" ] && [ "$(grep -c '<svg' "$dir/drift.html")" -ge 2 ] && grep -q '</html>' "$dir/drift.html" \
   && ! grep -q '<script' "$dir/drift.html" && grep -q '>drift</div>' "$dir/drift.html"; then
  pass "--report writes a self-contained HTML file with charts"
else fail "--report: $(ls -la "$dir" | head)"; fi

"$BIN" compare "$dir/base/metrics.jsonl" "$dir/early" --json > "$dir/out.json" 2>"$dir/err.txt"; rc=$?
if [ $rc -eq 1 ] && grep -q '"class":[[:space:]]*"early-divergence"' "$dir/out.json" && grep -q '"exit_code":[[:space:]]*1' "$dir/out.json"; then
  pass "early divergence, --json, a metrics.jsonl path"
else fail "early/json: rc $rc: $(head -c 400 "$dir/out.json") $(cat "$dir/err.txt")"; fi

"$BIN" compare "$dir/base" "$dir/nan" > "$dir/out.txt" 2>&1; rc=$?
if [ $rc -eq 1 ] && grep -q "^verdict: NaN: run B" "$dir/out.txt"; then pass "NaN exits 1"; else fail "nan: rc $rc: $(head -c 400 "$dir/out.txt")"; fi

"$BIN" compare "$dir/base" "$dir/missing" > "$dir/out.txt" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q "missing: no such file or directory" "$dir/out.txt"; then pass "missing run exits 2 and names it"; else fail "missing: rc $rc: $(cat "$dir/out.txt")"; fi

"$BIN" compare "$dir/base" "$dir/same" --threshold abc > "$dir/out.txt" 2>&1; rc=$?
if [ $rc -eq 2 ] && grep -q -- "--threshold" "$dir/out.txt"; then pass "bad option value exits 2"; else fail "bad option: rc $rc: $(cat "$dir/out.txt")"; fi

"$BIN" compare "$dir/base" > "$dir/out.txt" 2>&1; rc=$?
if [ $rc -eq 2 ]; then pass "one run exits 2"; else fail "one run: rc $rc"; fi

exit $failed
