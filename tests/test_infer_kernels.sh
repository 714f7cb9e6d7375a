#!/usr/bin/env bash
# bench/infer_kernels.py (bench/gpu_infer_kernels.sh's tables) without a GPU: a canned Nsight
# Compute CSV (tests/data/infer_kernels/ncu_sample.csv: ns, us and ms rows, a load-time kernel
# before the first embedding, two prefill passes of the same kernels and a decode step; the
# expected cells below are worked out by hand), gzip input, and bad input refused with exit 2.
# Prints one "PASS infer_kernels: ..." / "FAIL infer_kernels: ..." line per check.
set -u
cd "$(dirname "$0")/.." || exit 1
PY=${FP8TRAIN_PYTHON:-python3}
export PYTHONDONTWRITEBYTECODE=1 # the source tree stays clean
SCRIPT=bench/infer_kernels.py
D=tests/data/infer_kernels
TMP=$(mktemp -d /tmp/fp8t_infer_kernels.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
pass() { echo "PASS infer_kernels: $1"; }
fail() { echo "FAIL infer_kernels: $1"; }
command -v "$PY" >/dev/null || { echo "SKIP infer_kernels: no $PY"; exit 0; }
has() {
  if grep -qxF -- "$2" "$1"; then pass "${3:-$2}"; else
    fail "${3:-$2}: not in the output"; sed 's/^/    /' "$1" | head -30; fi
}

if "$PY" "$SCRIPT" --title sample "$D/ncu_sample.csv" >"$TMP/t.md" 2>"$TMP/t.err"; then
  pass "the sample exits 0"; else fail "the sample failed"; cat "$TMP/t.err"; fi
has "$TMP/t.md" "## sample"
# passes 10+100+50+20 and 12+110+48+30 us (mean 190); the load-time kernel is not in either
has "$TMP/t.md" "| 1 | prefill pass | 2 | 4 | 190.0 |" "two prefill passes grouped, mean 190 us"
# 2 us + 20 us + 0.03 ms + 8 us
has "$TMP/t.md" "| 2 | decode step | 1 | 4 | 60.0 |" "the decode step: ns, us and ms summed"
has "$TMP/t.md" "| \`nvjet_gemm_TNT<int>\` | 2 | 140.0 | 70.0 | 70.0% |" \
  "the last prefill pass's GEMMs: 110 + 30 us, 70% of 200"
has "$TMP/t.md" "| \`attn_decode_split_kernel<1, 4>\` | 1 | 30.0 | 30.0 | 50.0% |" \
  "template arguments kept, parameter list dropped"
if grep -q to_bf16 "$TMP/t.md"; then fail "the load-time kernel was counted"; else
  pass "kernels before the first embedding left out"; fi
# --top 1: the rest summed in one row
"$PY" "$SCRIPT" --top 1 "$D/ncu_sample.csv" >"$TMP/top.md" 2>&1
has "$TMP/top.md" "| (2 more) | | 60.0 | | 30.0% |" "--top 1: the other two kernels summed"
# gzip input gives the same tables
gzip -c "$D/ncu_sample.csv" >"$TMP/s.csv.gz"
"$PY" "$SCRIPT" --title sample "$TMP/s.csv.gz" >"$TMP/gz.md" 2>&1
if cmp -s "$TMP/t.md" "$TMP/gz.md"; then pass "a .csv.gz reads the same"; else
  fail "the .csv.gz tables differ"; diff "$TMP/t.md" "$TMP/gz.md" | head; fi

# bad input: exit 2 and a message naming the file
expect_bad() { # NAME PATTERN ARGS...
  local name=$1 pat=$2
  shift 2
  "$PY" "$SCRIPT" "$@" >"$TMP/bad.out" 2>"$TMP/bad.err"
  local rc=$?
  if [ $rc -eq 2 ] && grep -q -- "$pat" "$TMP/bad.err"; then pass "$name"; else
    fail "$name (exit $rc)"; cat "$TMP/bad.err"; fi
}
printf '==PROF== nothing profiled\n' >"$TMP/empty.csv"
expect_bad "a log with no CSV rows" "empty.csv: no CSV rows" "$TMP/empty.csv"
sed 's/"ms","0.03"/"ks","0.03"/' "$D/ncu_sample.csv" >"$TMP/unit.csv"
expect_bad "an unknown time unit" "unit.csv: unknown time unit 'ks'" "$TMP/unit.csv"
grep -v embedding "$D/ncu_sample.csv" >"$TMP/noemb.csv"
expect_bad "no embedding kernel" "not an inference pass" "$TMP/noemb.csv"
expect_bad "a missing file" "nope.csv" "$TMP/nope.csv"
"$PY" "$SCRIPT" --top 0 "$D/ncu_sample.csv" >/dev/null 2>"$TMP/top0.err"
if [ $? -eq 2 ] && grep -q "at least 1" "$TMP/top0.err"; then pass "--top 0 refused"; else
  fail "--top 0 accepted"; fi
