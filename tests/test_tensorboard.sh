#!/usr/bin/env bash
# `fp8train train --tensorboard DIR` from the outside: the option in --help, a run that writes
# an event file next to its logs (and says where), bad values refused with exit status 2 before
# anything is written, `fp8train tensorboard RUN` (the same files after the fact), and, when the `tensorboard` Python package is installed, the files read
# by TensorBoard itself (tests/check_tensorboard.py: its event loader and its HTTP server).
# Without the package that check prints SKIP (CI has no tensorboard): pip install tensorboard,
# or point FP8TRAIN_PYTHON at a Python that has it.
set -u
BIN=${FP8TRAIN_BIN:-build/fp8train}
PY=${FP8TRAIN_PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
SUITE=tensorboard_cli
TMP=$(mktemp -d /tmp/fp8t_tensorboard_cli.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
SMALL=(--layers 2 --dim 32 --heads 2 --max-seq-len 16 --mlp-hidden 64 --batch 4 --seq-len 16
       --progress-every 100)

pass() { echo "PASS $SUITE: $1"; }
fail() { echo "FAIL $SUITE: $1: $2"; }

"$BIN" train --help >"$TMP/help" 2>&1
if grep -q -- "--tensorboard DIR" "$TMP/help"; then pass help; else fail help "--tensorboard not in train --help"; fi

# --- a run: event file in DIR, its path in the banner, the usual logs beside it
run="$TMP/run"
"$BIN" train "${SMALL[@]}" --steps 10 --val-every 5 --inspect "every=2,layers=1+head,modules=fc2+head" \
  --ckpt-every 5 --out "$run" --tensorboard "$run/tb" >"$TMP/out" 2>"$TMP/err"
rc=$?
files=("$run"/tb/events.out.tfevents.*)
if [ $rc -eq 0 ] && [ ${#files[@]} -eq 1 ] && [ -s "${files[0]}" ]; then
  pass run_writes_event_file
else
  fail run_writes_event_file "exit $rc, files: ${files[*]} ($(head -c 300 "$TMP/err"))"
fi
if grep -qF "tensorboard: ${files[0]} (tensorboard --logdir $run/tb)" "$TMP/out"; then
  pass banner_names_file
else
  fail banner_names_file "$(grep -i tensorboard "$TMP/out")"
fi
# the config records the option, so `--config run/config.json` repeats it
if grep -qE "\"tensorboard\":[[:space:]]*\"$run/tb\"" "$run/config.json"; then
  pass config_json
else
  fail config_json "$(grep -o '"tensorboard[^,]*' "$run/config.json")"
fi

# --- resumed into the same directories under another precision: a second event file; the
# re-run steps 6..10 differ from the first take, which TensorBoard must drop (checked below)
"$BIN" train "${SMALL[@]}" --steps 10 --val-every 5 --inspect "every=2,layers=1+head,modules=fc2+head" \
  --resume "$run/checkpoints/step_000005" --precision bf16 --out "$run" --tensorboard "$run/tb" \
  >"$TMP/out2" 2>"$TMP/err2"
rc=$?
files=("$run"/tb/events.out.tfevents.*)
if [ $rc -eq 0 ] && [ ${#files[@]} -eq 2 ]; then pass resume_adds_file
else fail resume_adds_file "exit $rc, files: ${files[*]} ($(head -c 300 "$TMP/err2"))"; fi

# --- bad values: exit 2, the option named, nothing written
touch "$TMP/plainfile"
"$BIN" train "${SMALL[@]}" --steps 2 --out "$TMP/never1" --tensorboard "$TMP/plainfile" >"$TMP/out" 2>"$TMP/err"
rc=$?
if [ $rc -eq 2 ] && grep -qF -- "--tensorboard $TMP/plainfile: exists and is not a directory" "$TMP/err" &&
   [ ! -e "$TMP/never1" ]; then
  pass file_refused
else
  fail file_refused "exit $rc: $(head -c 300 "$TMP/err")"
fi
"$BIN" train "${SMALL[@]}" --steps 2 --out "$TMP/never2" --tensorboard >"$TMP/out" 2>"$TMP/err"
rc=$?
if [ $rc -eq 2 ] && grep -qF -- "--tensorboard needs a value" "$TMP/err" && [ ! -e "$TMP/never2" ]; then
  pass missing_value
else
  fail missing_value "exit $rc: $(head -c 300 "$TMP/err")"
fi
# a directory that cannot be created (under a regular file: refused even for root): the run
# stops with an error naming it, and writes no metrics
"$BIN" train "${SMALL[@]}" --steps 2 --quiet --out "$TMP/run_nodir" --tensorboard "$TMP/plainfile/tb" >"$TMP/out" 2>"$TMP/err"
rc=$?
if [ $rc -ne 0 ] && grep -qF -- "--tensorboard $TMP/plainfile/tb" "$TMP/err" &&
   [ ! -s "$TMP/run_nodir/metrics.jsonl" ]; then
  pass uncreatable_dir
else
  fail uncreatable_dir "exit $rc: $(head -c 300 "$TMP/err")"
fi

# --- fp8train tensorboard RUN: event files after the fact (compared event for event with the
# live ones in test_tensorboard.c); bad input: exit 2 and a message naming the fix
if "$BIN" tensorboard "$run" --out "$TMP/conv" >"$TMP/out" 2>"$TMP/err" &&
   grep -q "10 steps, [1-9][0-9]* statistics -> $TMP/conv/events.out.tfevents" "$TMP/out" &&
   [ -s "$(ls "$TMP"/conv/events.out.tfevents.* | head -1)" ]; then
  pass convert
else
  fail convert "$(cat "$TMP/out" "$TMP/err" | head -c 300)"
fi
"$BIN" tensorboard "$TMP/plainfile" >"$TMP/out" 2>"$TMP/err"; rc=$?
if [ $rc -eq 2 ] && grep -qF "has no metrics.jsonl: name a run directory" "$TMP/err"; then pass convert_not_a_run
else fail convert_not_a_run "exit $rc: $(head -c 300 "$TMP/err")"; fi
mkdir -p "$TMP/badrun" && printf '{"step":1,"loss":2}\nnot json\n{"step":2}\n' >"$TMP/badrun/metrics.jsonl"
"$BIN" tensorboard "$TMP/badrun" >"$TMP/out" 2>"$TMP/err"; rc=$?
if [ $rc -eq 2 ] && grep -qF "$TMP/badrun/metrics.jsonl:2: not a JSON object" "$TMP/err" &&
   [ ! -e "$TMP/badrun/tb" ]; then
  pass convert_bad_metrics
else
  fail convert_bad_metrics "exit $rc: $(head -c 300 "$TMP/err")"
fi
mkdir -p "$TMP/badrun2" && printf '{"step":1,"loss":2}\n{"loss":3}\n' >"$TMP/badrun2/metrics.jsonl"
"$BIN" tensorboard "$TMP/badrun2" >"$TMP/out" 2>"$TMP/err"; rc=$?
if [ $rc -eq 2 ] && grep -qF "$TMP/badrun2/metrics.jsonl: row 2 has no step" "$TMP/err" &&
   [ ! -e "$TMP/badrun2/tb" ]; then
  pass convert_row_without_step
else
  fail convert_row_without_step "exit $rc: $(head -c 300 "$TMP/err")"
fi
"$BIN" tensorboard "$run" --bogus >"$TMP/out" 2>"$TMP/err"; rc=$?
if [ $rc -eq 2 ] && grep -qF "unknown option '--bogus'" "$TMP/err"; then pass convert_bad_option
else fail convert_bad_option "exit $rc: $(head -c 300 "$TMP/err")"; fi

# --- data parallel: rank 0 alone writes events (one file, the run's steps once)
dprun="$TMP/dp"
if command -v mpirun >/dev/null 2>&1 && ldd "$BIN" 2>/dev/null | grep -q libmpi; then
  # under AddressSanitizer, Open MPI's own allocations at exit count as leaks (also without
  # --tensorboard); fp8train's are checked by the single-process runs above
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0} OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none \
    mpirun --oversubscribe -np 2 "$BIN" train "${SMALL[@]}" --grad-accum 2 --steps 6 --quiet \
    --val-every 3 --inspect "every=3,layers=1" --out "$dprun" --tensorboard "$dprun/tb" \
    >"$TMP/dp.log" 2>&1
  rc=$?
  files=("$dprun"/tb/*tfevents*)
  if [ $rc -eq 0 ] && [ ${#files[@]} -eq 1 ] && [ -s "${files[0]}" ]; then pass data_parallel_one_file
  else fail data_parallel_one_file "exit $rc, files: ${files[*]} ($(tail -c 300 "$TMP/dp.log"))"; fi
else
  dprun=""
  echo "SKIP $SUITE: data_parallel_one_file (no mpirun, or $BIN built without MPI)"
fi

# --- TensorBoard itself reads the files (optional)
if "$PY" -c "import tensorboard" >/dev/null 2>&1; then
  "$PY" "$HERE/check_tensorboard.py" "$run" "$run/tb" --serve 2>"$TMP/py_err"
  rc=$?
  [ $rc -eq 0 ] || fail tensorboard_package "check_tensorboard.py exit $rc ($(tail -c 400 "$TMP/py_err"))"
  if [ -n "$dprun" ]; then
    "$PY" "$HERE/check_tensorboard.py" "$dprun" "$dprun/tb" 2>"$TMP/py_err" | sed 's/^\(PASS\|FAIL\) tensorboard_py: /&data parallel: /'
    rc=${PIPESTATUS[0]}
    [ $rc -eq 0 ] || fail tensorboard_package_dp "check_tensorboard.py exit $rc ($(tail -c 400 "$TMP/py_err"))"
  fi
  "$PY" "$HERE/check_tensorboard.py" "$run" "$TMP/conv" 2>"$TMP/py_err" | sed 's/^\(PASS\|FAIL\) tensorboard_py: /&converted: /'
  rc=${PIPESTATUS[0]}
  [ $rc -eq 0 ] || fail tensorboard_package_converted "check_tensorboard.py exit $rc ($(tail -c 400 "$TMP/py_err"))"
else
  echo "SKIP $SUITE: tensorboard_package (the tensorboard Python package is not installed for $PY; pip install tensorboard, or set FP8TRAIN_PYTHON)"
fi
