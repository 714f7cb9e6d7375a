#!/usr/bin/env bash
# Data parallel on the CPU backend: `mpirun -np 2 fp8train train` against one process.
#   - the data-parallel path in one process (--dp-force, also with --zero 1) is the plain path
#     bit for bit (every collective of a world of one is the identity)
#   - N = 2 trains the same model as N = 1: step 1 bit-exact, every step of 50 within 1% (the
#     gradient of the two micro-batches is summed in another order; see docs/parallel.md)
#   - ZeRO-1 equals plain data parallel bit for bit at N = 2
#   - the gradient reduction in buckets during the backward (--bucket-mb) equals the one
#     reduction after it bit for bit (N = 1 with --dp-force, N = 2; plain, ZeRO-1, BF16)
#   - resume at N = 2 reproduces the uninterrupted N = 2 run bit for bit, also with --zero 1
#     from a plain checkpoint (resharding on load); resume at N = 1 from an N = 2 checkpoint
#   - ZeRO-1 checkpoints: a shard file per rank; resume at N = 2 and N = 1 from N = 2, and at
#     N = 2 and N = 1 from N = 1, continue exactly as from the plain checkpoint of that state
#   - a bad split (--grad-accum not a multiple of N) is refused; a NaN on the ranks stops all
#     of them naming the rank and tensor; a killed rank ends the run within seconds and the
#     last checkpoint resumes
#   - bisect under mpirun runs its experiments at N = 2 and reaches the one-process conclusion
set -u
BIN=${FP8TRAIN_BIN:-build/fp8train}
SUITE=dp
pass() { echo "PASS $SUITE: $1"; }
fail() { echo "FAIL $SUITE: $1: $2"; }
if ! command -v mpirun >/dev/null 2>&1; then
  echo "SKIP $SUITE: no mpirun (apt-get install openmpi-bin libopenmpi-dev; make test installs it)"
  exit 0
fi
if ! ldd "$BIN" 2>/dev/null | grep -q libmpi; then
  echo "SKIP $SUITE: $BIN was built without MPI (mpicc was missing at build time: make clean && make)"
  exit 0
fi
TMP=$(mktemp -d /tmp/fp8t_dp.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
# Under the sanitizer build (make test-sanitize) LeakSanitizer reports OpenMPI's own allocations
# (its dlopen'ed components, freed by nobody at MPI_Finalize) and turns every mpirun's exit status
# into 1; fp8train's own leaks are checked by the one-process tests.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
# Each mpirun gets a session directory of its own: two mpiruns started at the same moment race
# on creating a shared one under /tmp ("orte_session_dir failed", Open MPI issue #8510).
MPIRUN=(mpirun --oversubscribe -np 2)
mpirun2() { "${MPIRUN[@]}" --mca orte_tmpdir_base "$(mktemp -d "$TMP/ompi.XXXXXX")" "$@"; }
COMMON=(--preset tiny --batch 8 --seq-len 32 --grad-accum 2 --lr 1e-3 --quiet --val-every 0)

# metrics NAME A B MODE [TOL]: compare two runs' metrics.jsonl
#   exact: every loss and grad_norm equal; tol: step 1 equal, every loss within TOL (relative)
metrics() {
  python3 - "$@" <<'PY'
import json, sys
name, a, b, mode = sys.argv[1:5]
tol = float(sys.argv[5]) if len(sys.argv) > 5 else 0
rd = lambda d: [json.loads(l) for l in open(d + "/metrics.jsonl")]
try:
    A, B = rd(a), rd(b)
except OSError as e:
    # the run's own words: the last lines of its log (run1 / run2 write OUT.log)
    logs = []
    for d in (a, b):
        try:
            logs.append(f"{d}.log: " + " | ".join(open(d + ".log").read().splitlines()[-8:]))
        except OSError:
            pass
    print(f"FAIL dp: {name}: {e}" + "".join("\n    " + l for l in logs)); sys.exit()
if [r["step"] for r in A] != [r["step"] for r in B] or not A:
    print(f"FAIL dp: {name}: steps differ ({len(A)} vs {len(B)} rows)"); sys.exit()
gap = max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(A, B))
if mode == "exact":
    bad = [x["step"] for x, y in zip(A, B) if x["loss"] != y["loss"] or x["grad_norm"] != y["grad_norm"]]
    ok = not bad
    why = f"first differing step {bad[0]}" if bad else ""
else:
    ok = A[0]["loss"] == B[0]["loss"] and gap <= tol
    why = f"step-1 losses {A[0]['loss']} vs {B[0]['loss']}, max relative gap {gap:.3g} > {tol}"
print(f"{'PASS' if ok else 'FAIL'} dp: {name}" + ("" if ok else f": {why}") +
      (f" ({len(A)} steps, max relative loss gap {gap:.2e})" if ok else ""))
PY
}

run1() { local out=$1; shift; "$BIN" train "${COMMON[@]}" "$@" --out "$TMP/$out" >"$TMP/$out.log" 2>&1; }
run2() { local out=$1; shift; mpirun2 "$BIN" train "${COMMON[@]}" "$@" --out "$TMP/$out" >"$TMP/$out.log" 2>&1; }

# --- one process: the data-parallel path is the plain path
run1 p1 --steps 12 --grad-accum 2 --ckpt-every 6 && run1 f1 --steps 12 --dp-force &&
  run1 z1 --steps 12 --dp-force --zero 1 --ckpt-every 6
metrics "dp-force at N=1 == plain" "$TMP/p1" "$TMP/f1" exact
metrics "dp-force --zero 1 at N=1 == plain" "$TMP/p1" "$TMP/z1" exact
run1 fb --steps 12 --dp-force --bucket-mb 0.001 && run1 zb --steps 12 --dp-force --zero 1 --bucket-mb 0.001
metrics "dp-force, a bucket per layer, at N=1 == plain" "$TMP/p1" "$TMP/fb" exact
metrics "dp-force --zero 1, a bucket per layer, at N=1 == plain" "$TMP/p1" "$TMP/zb" exact

# --- N = 2 vs N = 1, 50 steps (two trainings side by side: one core each)
run1 one --steps 50 & run2 two --steps 50 --ckpt-every 25; wait
metrics "N=2 vs N=1, 50 steps" "$TMP/one" "$TMP/two" tol 0.01
mpirun2 "$BIN" train --preset tiny --batch 4 --seq-len 16 --grad-accum 2 --steps 2 \
  --val-every 0 --out "$TMP/loud" >"$TMP/loud.log" 2>&1
if [ "$(grep -c '^done:' "$TMP/loud.log")" = 1 ] && grep -q "^data parallel: 2 ranks" "$TMP/loud.log"; then
  pass "rank 0 speaks: one banner and one summary"
else fail "rank 0 speaks: one banner and one summary" "$(cat "$TMP/loud.log")"; fi

# --- amax all-reduce: after step 1 the FP8 state (amax histories, scales) of N = 2 is N = 1's
# bit for bit (the max of the two ranks' amaxes is the amax of the whole batch); without the
# reduction rank 0 keeps the amaxes of its own micro-batch
run1 a1 --steps 1 & run2 a2 --steps 1; wait
run2 a0 --steps 1 --amax-reduce 0
M=checkpoints/step_000001/fp8_meta.safetensors
if cmp -s "$TMP/a1/$M" "$TMP/a2/$M" && [ -f "$TMP/a0/$M" ] && ! cmp -s "$TMP/a1/$M" "$TMP/a0/$M"; then
  pass "amax all-reduce: N=2 FP8 state == N=1 after step 1; --amax-reduce 0 differs"
else fail "amax all-reduce" "$(ls -l "$TMP"/a?/$M 2>&1)"; fi

# --- validation split over the ranks (batches r, r + N, ...), losses summed in batch order:
# with lr 1e-12 the weights do not move, so N = 2's validation loss must be N = 1's exactly
run1 v1 --steps 2 --lr 1e-12 --warmup 0 --val-every 2 --val-batches 3 &
run2 v2 --steps 2 --lr 1e-12 --warmup 0 --val-every 2 --val-batches 3; wait
python3 - "$TMP/v1" "$TMP/v2" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(d + "/metrics.jsonl")][-1].get("val_loss") for d in sys.argv[1:3])
ok = a is not None and a == b
print(("PASS" if ok else "FAIL") + f" dp: validation split over 2 ranks == one process ({a} vs {b})")
PY

# --- gradient buckets (--bucket-mb) at N = 2: one reduction after the backward (0), the
# default (tiny's gradients fit one 25 MiB bucket), a bucket per layer (plain, ZeRO-1, BF16):
# the same sums of the same two values, so bit for bit the same run
run2 bk0 --steps 20 --bucket-mb 0 & run2 bk1 --steps 20 --bucket-mb 0.001; wait
run2 bkd --steps 20 & run2 bkz --steps 20 --zero 1 --bucket-mb 0.001; wait
metrics "N=2: a bucket per layer == one reduction after the backward" "$TMP/bk0" "$TMP/bk1" exact
metrics "N=2: the default buckets == one reduction after the backward" "$TMP/bk0" "$TMP/bkd" exact
metrics "N=2 --zero 1: a bucket per layer == one reduction after the backward" "$TMP/bk0" "$TMP/bkz" exact
if grep -qE "all-reduced in FP32 in [0-9]+ buckets? during the backward" "$TMP/loud.log"; then
  pass "the banner names the buckets"
else fail "the banner names the buckets" "$(grep '^data parallel' "$TMP/loud.log")"; fi

# --- ZeRO-1 == plain data parallel at N = 2
run2 twoz --steps 50 --zero 1 --ckpt-every 25
metrics "ZeRO-1 == plain DP at N=2" "$TMP/two" "$TMP/twoz" exact

# --- BF16 gradient all-reduce: the rounding shows in the norms, the run stays on course
run2 b16 --steps 10 --dp-reduce bf16 & run2 b16l --steps 10 --dp-reduce bf16 --bucket-mb 0.001; wait
run2 b160 --steps 10 --dp-reduce bf16 --bucket-mb 0
metrics "N=2 --dp-reduce bf16: a bucket per layer == one reduction after the backward" "$TMP/b160" "$TMP/b16l" exact
metrics "N=2 --dp-reduce bf16: the default buckets == one reduction after the backward" "$TMP/b160" "$TMP/b16" exact
python3 - "$TMP/two" "$TMP/b16" <<'PY'
import json, sys
A = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")][:10]
B = [json.loads(l) for l in open(sys.argv[2] + "/metrics.jsonl")]
gap = max(abs(x["loss"] - y["loss"]) / x["loss"] for x, y in zip(A, B))
differs = any(x["grad_norm"] != y["grad_norm"] for x, y in zip(A, B))
ok = len(B) == 10 and differs and gap < 0.02
print(("PASS" if ok else "FAIL") + f" dp: --dp-reduce bf16 at N=2 (norms differ from FP32: {differs}, max loss gap {gap:.2e})")
PY

# --- resume: N = 2 from N = 2 (plain, and ZeRO-1 from the plain checkpoint), N = 1 from N = 2
CK="$TMP/two/checkpoints/step_000025"
if [ -d "$CK" ]; then
  run2 rz --steps 50 --zero 1 --resume "$CK"
  python3 - "$TMP/twoz" "$TMP/rz" <<'PY'
import json, sys
A = {json.loads(l)["step"]: json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")}
B = [json.loads(l) for l in open(sys.argv[2] + "/metrics.jsonl")]
bad = [r["step"] for r in B if r["loss"] != A[r["step"]]["loss"]]
ok = B and B[0]["step"] == 26 and B[-1]["step"] == 50 and not bad
print(("PASS" if ok else "FAIL") + " dp: resume at N=2 --zero 1 from a plain N=2 checkpoint == uninterrupted"
      + ("" if ok else f": rows {len(B)}, differing steps {bad[:5]}"))
PY
  run1 r1 --steps 50 --resume "$CK"
  python3 - "$TMP/two" "$TMP/r1" <<'PY'
import json, sys
A = {json.loads(l)["step"]: json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")}
B = [json.loads(l) for l in open(sys.argv[2] + "/metrics.jsonl")]
gap = max((abs(r["loss"] - A[r["step"]]["loss"]) / A[r["step"]]["loss"] for r in B), default=1)
ok = B and B[0]["step"] == 26 and B[-1]["step"] == 50 and gap < 0.01
print(("PASS" if ok else "FAIL") + f" dp: resume at N=1 from an N=2 checkpoint (max gap {gap:.2e} vs N=2)")
PY
  run2 r2 --steps 50 --resume "$CK"
  python3 - "$TMP/two" "$TMP/r2" <<'PY'
import json, sys
A = {json.loads(l)["step"]: json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")}
B = [json.loads(l) for l in open(sys.argv[2] + "/metrics.jsonl")]
ok = B and B[0]["step"] == 26 and all(r["loss"] == A[r["step"]]["loss"] for r in B)
print(("PASS" if ok else "FAIL") + " dp: resume at N=2 from an N=2 checkpoint == uninterrupted")
PY
else
  fail "resume" "no checkpoint $CK ($(tail -3 "$TMP/two.log"))"
fi

# --- ZeRO-1 checkpoints: each rank writes its shard of the moments (a file per rank, named
# with rank and world size), rank 0 the replicated state; resume at the same N reads each
# rank's shard, at another N reshards on load. The ZeRO-1 and the plain runs are the same bits
# (tested above), so their checkpoints hold the same state: resuming either must continue
# exactly alike.
exact_from() { # NAME REF RUN: every step RUN logged equals REF's at that step
  python3 - "$@" <<'PY'
import json, sys
name, a, b = sys.argv[1:4]
try:
    A = {json.loads(l)["step"]: json.loads(l) for l in open(a + "/metrics.jsonl")}
    B = [json.loads(l) for l in open(b + "/metrics.jsonl")]
except OSError as e:
    # the run's own words: the last lines of its log (run1 / run2 write OUT.log)
    logs = []
    for d in (a, b):
        try:
            logs.append(f"{d}.log: " + " | ".join(open(d + ".log").read().splitlines()[-8:]))
        except OSError:
            pass
    print(f"FAIL dp: {name}: {e}" + "".join("\n    " + l for l in logs)); sys.exit()
bad = [r["step"] for r in B if r["step"] not in A or r["loss"] != A[r["step"]]["loss"]
       or r["grad_norm"] != A[r["step"]]["grad_norm"]]
ok = B and not bad
print(("PASS" if ok else "FAIL") + f" dp: {name}" + (f" (steps {B[0]['step']}-{B[-1]['step']})" if ok else
      f": rows {len(B)}, differing steps {bad[:5]}"))
PY
}
ZK="$TMP/twoz/checkpoints/step_000025"
if [ -f "$ZK/optimizer.rank-00000-of-00002.safetensors" ] &&
   [ -f "$ZK/optimizer.rank-00001-of-00002.safetensors" ] && [ ! -e "$ZK/optimizer.safetensors" ] &&
   grep -q '"optimizer_shards":[[:space:]]*2' "$ZK/state.json"; then
  pass "ZeRO-1 N=2 checkpoint: one optimizer shard file per rank, the rest once"
else fail "ZeRO-1 N=2 checkpoint files" "$(ls "$ZK" 2>&1 | tr '\n' ' ')"; fi
run2 rzz --steps 50 --zero 1 --resume "$ZK" & run1 r1z --steps 50 --resume "$ZK"; wait
exact_from "resume at N=2 --zero 1 from a ZeRO-1 N=2 checkpoint == uninterrupted" "$TMP/twoz" "$TMP/rzz"
exact_from "resume at N=1 from a ZeRO-1 N=2 checkpoint (resharded) == from the plain one" "$TMP/r1" "$TMP/r1z"
# N = 1 -> N = 2: the --dp-force --zero 1 run's one-shard checkpoint
ZK1="$TMP/z1/checkpoints/step_000006"
run2 r2zz --steps 12 --zero 1 --resume "$ZK1"; run2 r2p --steps 12 --resume "$TMP/p1/checkpoints/step_000006"
run1 rp1z --steps 12 --resume "$ZK1"
exact_from "resume at N=2 --zero 1 from a ZeRO-1 N=1 checkpoint == from the plain one" "$TMP/r2p" "$TMP/r2zz"
exact_from "resume at N=1 plain from a ZeRO-1 N=1 checkpoint == uninterrupted" "$TMP/p1" "$TMP/rp1z"
# --keep-ckpts removes old sharded checkpoints whole (the shard files are fp8train's)
run2 zk --steps 6 --zero 1 --ckpt-every 2 --keep-ckpts 1
if [ "$(ls "$TMP/zk/checkpoints" 2>&1)" = step_000006 ]; then pass "--keep-ckpts prunes ZeRO-1 checkpoints"
else fail "--keep-ckpts prunes ZeRO-1 checkpoints" "$(ls -R "$TMP/zk/checkpoints" 2>&1 | tr '\n' ' ')"; fi

# --- a split that does not divide: refused by every rank, nothing written
mpirun2 "$BIN" train "${COMMON[@]}" --steps 2 --grad-accum 3 --out "$TMP/bad" >"$TMP/bad.log" 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -q "not a multiple of the 2 ranks" "$TMP/bad.log" && [ ! -e "$TMP/bad" ]; then
  pass "--grad-accum 3 at N=2 refused"
else fail "--grad-accum 3 at N=2 refused" "rc $rc: $(tail -3 "$TMP/bad.log")"; fi

# --- inspect: rank 0's statistics, or every rank's
SMALLI=(--preset tiny --batch 4 --seq-len 16 --grad-accum 2 --quiet --val-every 0 --steps 2)
mpirun2 "$BIN" train "${SMALLI[@]}" --inspect 'every=1,layers=0,ranks=all' --out "$TMP/ia" >"$TMP/ia.log" 2>&1
mpirun2 "$BIN" train "${SMALLI[@]}" --inspect 'every=1,layers=0' --out "$TMP/i0" >"$TMP/i0.log" 2>&1
if [ -s "$TMP/ia/stats.jsonl" ] && [ -s "$TMP/ia/rank-1/stats.jsonl" ] && [ -s "$TMP/i0/stats.jsonl" ] &&
   [ ! -e "$TMP/i0/rank-1" ] && grep -q 'ranks=all' "$TMP/ia/config.json"; then
  pass "--inspect ranks=all writes OUT/rank-1/stats.jsonl, ranks=0 (default) does not"
else fail "--inspect ranks=" "$(tail -3 "$TMP/ia.log" "$TMP/i0.log"; ls -R "$TMP/ia" "$TMP/i0" | head -20)"; fi
"$BIN" train "${SMALLI[@]}" --inspect 'bogus=1,ranks=all' --out "$TMP/ic" >"$TMP/ic.log" 2>&1
if [ $? -eq 2 ] && grep -q "unknown key 'bogus'" "$TMP/ic.log" && [ ! -e "$TMP/ic" ]; then
  pass "a bad --inspect spec is refused before the run directory is made"
else fail "a bad --inspect spec is refused before the run directory is made" "$(tail -3 "$TMP/ic.log")"; fi
mpirun2 "$BIN" train "${SMALLI[@]}" --inspect 'ranks=2' --out "$TMP/ib" >"$TMP/ib.log" 2>&1
if [ $? -ne 0 ] && grep -q "ranks=2: expected ranks=0" "$TMP/ib.log"; then pass "--inspect ranks=2 refused"
else fail "--inspect ranks=2 refused" "$(tail -3 "$TMP/ib.log")"; fi

# --- a NaN stops every rank, naming the rank and the tensor
run2 nan --steps 10 --inject 'layer=1,module=fc2,gemm=fprop,kind=nan,from=4'
rc=$?
if [ $rc -ne 0 ] && grep -q '"kind":"nan"' "$TMP/nan/events.jsonl" 2>/dev/null &&
   grep -q 'rank 0: ' "$TMP/nan/events.jsonl"; then
  pass "NaN at N=2 stops all ranks ($(grep -o 'first non-finite tensor: [^"]*' "$TMP/nan/events.jsonl" | head -c 120))"
else fail "NaN at N=2 stops all ranks" "rc $rc: $(tail -3 "$TMP/nan.log"; cat "$TMP/nan/events.jsonl" 2>/dev/null)"; fi

# --- a killed rank: the other exits within seconds, the last checkpoint resumes
# (mpirun itself in the background, not mpirun2: $! must be mpirun, the parent of the ranks)
"${MPIRUN[@]}" --mca orte_tmpdir_base "$(mktemp -d "$TMP/ompi.XXXXXX")" "$BIN" train "${COMMON[@]}" \
  --steps 100000 --ckpt-every 3 --keep-ckpts 2 \
  --out "$TMP/kill" >"$TMP/kill.log" 2>&1 &
MP=$!
victim=""
for _ in $(seq 1 600); do
  sleep 0.1
  [ -d "$TMP/kill/checkpoints/step_000006" ] || continue
  for p in $(pgrep -P "$MP" 2>/dev/null); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1'; then victim=$p; fi
  done
  [ -n "$victim" ] && break
done
if [ -z "$victim" ]; then
  fail "killed rank" "no rank 1 process found ($(tail -3 "$TMP/kill.log"))"
  kill "$MP" 2>/dev/null; wait "$MP" 2>/dev/null
else
  kill -9 "$victim"
  t0=$(date +%s)
  for _ in $(seq 1 300); do kill -0 "$MP" 2>/dev/null || break; sleep 0.1; done
  dt=$(( $(date +%s) - t0 ))
  if kill -0 "$MP" 2>/dev/null; then
    fail "killed rank" "the run still goes on 30 s after rank 1 was killed"; kill "$MP"
  fi
  wait "$MP"; rc=$?
  last=$(ls -d "$TMP"/kill/checkpoints/step_* 2>/dev/null | sort | tail -1)
  if [ $rc -ne 0 ] && [ -n "$last" ] &&
     "$BIN" train "${COMMON[@]}" --steps $(( 10#${last##*step_} + 2 )) --resume "$last" \
       --out "$TMP/kill_resume" >"$TMP/kill_resume.log" 2>&1; then
    pass "killed rank: mpirun ended in ${dt}s (exit $rc), $(basename "$last") resumes"
  else fail "killed rank" "rc $rc, last checkpoint '$last': $(tail -3 "$TMP/kill.log" "$TMP/kill_resume.log" 2>/dev/null)"; fi
fi

# --- bisect under mpirun: every rank runs the same experiments as 2-rank runs, rank 0 writes
# the report. The conclusion is the one-process bisect's; the experiments really ran at N = 2
# (the baseline's losses equal N = 1's at step 1 and differ in the last bits later, as N = 2
# training does) and one voice printed the summary.
BIS=(--layers 2 --dim 32 --heads 2 --mlp-hidden 64 --max-seq-len 16 --seq-len 16 --batch 2
     --grad-accum 2 --warmup 2 --lr 1e-3 --seed 7 --steps 16
     --inject "layer=1,module=fc2,gemm=dgrad,kind=nan,from=3,when=delayed")
"$BIN" bisect "${BIS[@]}" --out "$TMP/bis1" >"$TMP/bis1.out" 2>&1; rc1=$?
mpirun2 "$BIN" bisect "${BIS[@]}" --out "$TMP/bis2" >"$TMP/bis2.out" 2>&1; rc2=$?
ov1=$(sed -n "s/^  --override '\(.*\)'$/\1/p" "$TMP/bis1.out")
ov2=$(sed -n "s/^  --override '\(.*\)'$/\1/p" "$TMP/bis2.out")
python3 - "$TMP/bis1/bf16" "$TMP/bis2/bf16" "$rc1" "$rc2" "$ov1" "$ov2" \
  "$(grep -c '^bisect: .* experiments; summary' "$TMP/bis2.out")" <<'PY'
import json, sys
a, b, rc1, rc2, ov1, ov2, nsum = sys.argv[1:8]
try:
    A, B = ([json.loads(l) for l in open(d + "/metrics.jsonl")] for d in (a, b))
except OSError as e:
    A = B = []
ok = (rc1 == rc2 == "0" and ov1 and ov1 == ov2 and nsum == "1" and len(A) == len(B) == 16
      and A[0]["loss"] == B[0]["loss"] and any(x["loss"] != y["loss"] for x, y in zip(A, B)))
print(("PASS" if ok else "FAIL") + f" dp: bisect under mpirun -np 2 (override '{ov2}', as one process: '{ov1}')"
      + ("" if ok else f": rc {rc1}/{rc2}, {nsum} summaries, {len(A)}/{len(B)} baseline rows"))
PY
