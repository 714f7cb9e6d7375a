#!/usr/bin/env bash
# Run directories keep their data: fp8train deletes only what it wrote (its own checkpoint
# directories, matched exactly), never trains into another run's directory unasked
# (--overwrite), locks the directory against a second training, keeps the checkpoints a resumed
# run came from and moves the old run's later steps aside, stops with a clear error when a log
# or checkpoint write fails (a file size limit stands in for a full disk), and import/export
# never write into a non-empty --to unasked.
set -u
BIN=${FP8TRAIN_BIN:-build/fp8train}
SUITE=rundir
TMP=$(mktemp -d /tmp/fp8t_rundir.XXXXXX)
BG=""
cleanup() {
  [ -n "$BG" ] && kill -9 "$BG" 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
SMALL=(--layers 2 --dim 32 --heads 2 --max-seq-len 16 --mlp-hidden 64 --batch 4 --seq-len 16
       --val-every 0 --quiet)

pass() { echo "PASS $SUITE: $1"; }
fail() { echo "FAIL $SUITE: $1: $2"; }
has_python=0
command -v python3 >/dev/null 2>&1 && has_python=1
# every line of a JSONL file is a whole JSON object (and the file ends with a newline)
jsonl_whole() {
  [ -s "$1" ] || return 0
  [ "$(tail -c1 "$1" | od -An -c | tr -d ' ')" = '\n' ] || return 1
  if [ $has_python -eq 1 ]; then
    python3 -c 'import json,sys
for l in open(sys.argv[1]): json.loads(l)' "$1" 2>/dev/null
  else
    ! grep -qv '^{.*}$' "$1"
  fi
}
steps_of() { grep -o '"step":[0-9]*' "$1" | cut -d: -f2 | tr '\n' ' ' | sed 's/ $//'; }
loss_at() { grep "\"step\":$2," "$1" | grep -o '"loss":[^,]*'; }

# --- 1. another run's directory: refused, nothing touched (also with --quiet)
R="$TMP/run"
"$BIN" train "${SMALL[@]}" --steps 12 --ckpt-every 4 --keep-ckpts 0 --out "$R" >/dev/null 2>&1
mkdir -p "$R/checkpoints/mine" "$R/checkpoints/step_20" "$R/checkpoints/step_000099"
echo keep >"$R/checkpoints/mine/notes.txt"
echo keep >"$R/checkpoints/model_final.pt"
cp "$R/checkpoints/step_000004/state.json" "$R/checkpoints/step_20/"   # not our name exactly
echo keep >"$R/checkpoints/step_000099/weights.bin"                     # our name, not ours
echo keep >"$R/checkpoints/step_000008/README"                          # ours + a user file
before=$(cd "$R" && find . -type f ! -name .lock -exec cksum {} + | sort)
"$BIN" train "${SMALL[@]}" --steps 5 --out "$R" >"$TMP/out" 2>"$TMP/err"; rc=$?
after=$(cd "$R" && find . -type f ! -name .lock -exec cksum {} + | sort)
if [ $rc -ne 2 ]; then fail refuse_other_run "exit status $rc, expected 2"
elif ! grep -q "holds another run" "$TMP/err" || ! grep -q -- "--overwrite" "$TMP/err"; then
  fail refuse_other_run "stderr does not say why and how: $(cat "$TMP/err")"
elif [ "$before" != "$after" ]; then fail refuse_other_run "the directory changed"
else pass refuse_other_run; fi

# --- 2. --overwrite: fp8train's checkpoints and logs replaced, nothing else deleted
"$BIN" train "${SMALL[@]}" --steps 5 --out "$R" --overwrite >"$TMP/out" 2>"$TMP/err"; rc=$?
missing=""
for f in checkpoints/mine/notes.txt checkpoints/model_final.pt checkpoints/step_20/state.json \
         checkpoints/step_000099/weights.bin checkpoints/step_000008/README; do
  [ -f "$R/$f" ] || missing="$missing $f"
done
left=$(ls "$R/checkpoints" | grep -E '^step_0000(04|12)$' | tr '\n' ' ')
if [ $rc -ne 0 ]; then fail overwrite_keeps_foreign "exit status $rc: $(cat "$TMP/err")"
elif [ -n "$missing" ]; then fail overwrite_keeps_foreign "deleted files fp8train did not write:$missing"
elif [ -n "$left" ]; then fail overwrite_keeps_foreign "the old run's checkpoints remain: $left"
elif [ -e "$R/checkpoints/step_000008/model.safetensors" ]; then
  fail overwrite_keeps_foreign "the old checkpoint's own files were not removed"
elif [ "$(steps_of "$R/metrics.jsonl")" != "1 2 3 4 5" ] || [ ! -d "$R/checkpoints/step_000005" ]; then
  fail overwrite_keeps_foreign "the new run's files: steps '$(steps_of "$R/metrics.jsonl")'"
elif grep -q '"overwrite"' "$R/config.json"; then
  fail overwrite_keeps_foreign "config.json records --overwrite (a --config of it would overwrite unasked)"
else pass overwrite_keeps_foreign; fi

# --- 3. resume into its own run (the report's case): checkpoints 20, 25, 30 existed;
#        --steps 24 --ckpt-every 2 from 20 keeps 20 and the new 22, 24 (retention 3), and
#        moves the old 25, 30 and the old rows after 20 aside
R="$TMP/resume"
"$BIN" train "${SMALL[@]}" --steps 30 --ckpt-every 5 --out "$R" >/dev/null 2>&1
"$BIN" train "${SMALL[@]}" --steps 24 --ckpt-every 2 --resume "$R/checkpoints/step_000020" \
  --out "$R" >"$TMP/out" 2>"$TMP/err"; rc=$?
A="$R/superseded/after_step_000020"
ck=$(ls "$R/checkpoints" | tr '\n' ' ')
aside=$(ls "$A/checkpoints" 2>/dev/null | tr '\n' ' ')
want_steps=$(seq -s ' ' 1 24)
if [ $rc -ne 0 ]; then fail resume_own_run "exit status $rc: $(cat "$TMP/err")"
elif [ "$ck" != "step_000020 step_000022 step_000024 " ]; then fail resume_own_run "checkpoints: $ck"
elif [ "$aside" != "step_000025 step_000030 " ]; then fail resume_own_run "moved aside: '$aside'"
elif [ "$(steps_of "$R/metrics.jsonl")" != "$want_steps" ]; then
  fail resume_own_run "metrics.jsonl steps: $(steps_of "$R/metrics.jsonl")"
elif [ "$(steps_of "$A/metrics.jsonl")" != "$(seq -s ' ' 21 30)" ]; then
  fail resume_own_run "superseded metrics steps: $(steps_of "$A/metrics.jsonl")"
elif [ "$(loss_at "$R/metrics.jsonl" 21)" != "$(loss_at "$A/metrics.jsonl" 21)" ]; then
  # step 21's loss is the forward before its update, on the weights of step 20 (the LR
  # schedule, which ends at --steps, changes only the steps after it)
  fail resume_own_run "the resumed step 21 differs from the old one (not resumed from step 20?)"
else pass resume_own_run; fi
# the moved checkpoint still loads; a second resume from 20 gets its own directory
"$BIN" train "${SMALL[@]}" --steps 26 --resume "$A/checkpoints/step_000025" --out "$TMP/from_aside" \
  >/dev/null 2>"$TMP/err"; rc1=$?
"$BIN" train "${SMALL[@]}" --steps 21 --resume "$R/checkpoints/step_000020" --out "$R" \
  >/dev/null 2>"$TMP/err"; rc2=$?
if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ -d "$R/superseded/after_step_000020.2/checkpoints/step_000022" ] &&
   [ -d "$A/checkpoints/step_000030" ] && [ "$(steps_of "$R/metrics.jsonl")" = "$(seq -s ' ' 1 21)" ]; then
  pass resume_twice
else
  fail resume_twice "rc $rc1/$rc2: $(ls -R "$R/superseded" | head -20 | tr '\n' ' ') $(cat "$TMP/err")"
fi
# resuming a superseded checkpoint of RUN into RUN with --overwrite: the run is replaced, but
# the checkpoint it resumes from is not deleted under it
"$BIN" train "${SMALL[@]}" --steps 27 --resume "$A/checkpoints/step_000025" --out "$R" --overwrite \
  >/dev/null 2>"$TMP/err"; rc=$?
if [ $rc -eq 0 ] && [ -f "$A/checkpoints/step_000025/state.json" ] && [ ! -e "$A/checkpoints/step_000030" ] &&
   [ "$(steps_of "$R/metrics.jsonl")" = "26 27" ]; then pass overwrite_spares_resume_source
else fail overwrite_spares_resume_source "exit status $rc, $(ls -R "$R/superseded" 2>&1 | tr '\n' ' ') $(cat "$TMP/err")"; fi
# --inspect's stats.jsonl rows and dumps after the resumed step move aside too
R="$TMP/resume_inspect"
"$BIN" train "${SMALL[@]}" --steps 6 --ckpt-every 3 --inspect every=2,layers=0,dump=1 --out "$R" >/dev/null 2>&1
"$BIN" train "${SMALL[@]}" --steps 4 --resume "$R/checkpoints/step_000003" --inspect every=2,layers=0,dump=1 \
  --out "$R" >/dev/null 2>"$TMP/err"; rc=$?
A2="$R/superseded/after_step_000003"
if [ $rc -eq 0 ] && [ "$(ls "$R/dumps" | tr '\n' ' ')" = "step_000002 step_000004 " ] &&
   [ "$(ls "$A2/dumps" | tr '\n' ' ')" = "step_000004 step_000006 " ] &&
   [ "$(steps_of "$R/stats.jsonl" | tr ' ' '\n' | sort -un | tr '\n' ' ')" = "2 4 " ] &&
   [ "$(steps_of "$A2/stats.jsonl" | tr ' ' '\n' | sort -un | tr '\n' ' ')" = "4 6 " ]; then
  pass resume_moves_inspect_output
else fail resume_moves_inspect_output "exit status $rc: $(ls -R "$R" | tr '\n' ' ' | head -c 600) $(cat "$TMP/err")"; fi
# a checkpoint of another directory into a directory holding a run: refused
"$BIN" train "${SMALL[@]}" --steps 26 --resume "$A/checkpoints/step_000025" --out "$TMP/run" \
  >/dev/null 2>"$TMP/err"; rc=$?
if [ $rc -eq 2 ] && grep -q "holds another run" "$TMP/err"; then pass resume_into_other_run
else fail resume_into_other_run "exit status $rc: $(cat "$TMP/err")"; fi

# --- 4. the lock: a second training into the same --out fails at once, naming the first
R="$TMP/locked"
"$BIN" train "${SMALL[@]}" --steps 1000000 --out "$R" >/dev/null 2>&1 &
BG=$!
# (a busy machine may take a while to start it; the lock is held from before the first row)
for _ in $(seq 600); do [ -s "$R/metrics.jsonl" ] && break; sleep 0.1; done
[ -s "$R/metrics.jsonl" ] || echo "note: the first training wrote no row in 60 s"
t0=$(date +%s)
"$BIN" train "${SMALL[@]}" --steps 3 --out "$R" --overwrite >/dev/null 2>"$TMP/err"; rc=$?
t1=$(date +%s)
if [ $rc -ne 2 ]; then fail lock "second training: exit status $rc, expected 2 ($(cat "$TMP/err"))"
elif ! grep -q "another fp8train (pid $BG) is training into $R" "$TMP/err"; then
  fail lock "message does not name the first run: $(cat "$TMP/err")"
elif ! kill -0 "$BG" 2>/dev/null; then fail lock "the first training died"
elif [ $((t1 - t0)) -gt 10 ]; then fail lock "the refusal took $((t1 - t0)) s"
else pass lock; fi
# killed (-9): the kernel drops the lock with the process; no stale lock blocks the next run
kill -9 "$BG" 2>/dev/null
wait "$BG" 2>/dev/null
BG=""
"$BIN" train "${SMALL[@]}" --steps 3 --out "$R" --overwrite >/dev/null 2>"$TMP/err"; rc=$?
if [ $rc -eq 0 ]; then pass lock_released_on_kill; else fail lock_released_on_kill "exit status $rc: $(cat "$TMP/err")"; fi

# --- 5. a full disk (here: the file size limit, SIGXFSZ ignored so write fails with EFBIG)
R="$TMP/full"
(trap '' XFSZ; ulimit -f 12; exec "$BIN" train "${SMALL[@]}" --steps 400 --out "$R") >/dev/null 2>"$TMP/err"; rc=$?
rows=$(grep -c . "$R/metrics.jsonl" 2>/dev/null || echo 0)
if [ $rc -ne 1 ]; then fail metrics_disk_full "exit status $rc, expected 1 ($(cat "$TMP/err"))"
elif ! grep -q "cannot append to $R/metrics.jsonl: File too large; training stopped" "$TMP/err"; then
  fail metrics_disk_full "stderr does not name metrics.jsonl: $(cat "$TMP/err")"
elif ! jsonl_whole "$R/metrics.jsonl"; then fail metrics_disk_full "metrics.jsonl ends in a torn line"
elif [ "$rows" -ge 400 ] || [ "$(steps_of "$R/metrics.jsonl" | wc -w)" -ne "$rows" ]; then
  fail metrics_disk_full "$rows rows: training went on"
else pass metrics_disk_full; fi
# a checkpoint that does not fit: stopped, the checkpoint named, no half checkpoint left
R="$TMP/full_ckpt"
(trap '' XFSZ; ulimit -f 40; exec "$BIN" train "${SMALL[@]}" --steps 20 --ckpt-every 10 --out "$R") >/dev/null 2>"$TMP/err"; rc=$?
if [ $rc -ne 1 ]; then fail checkpoint_disk_full "exit status $rc, expected 1 ($(cat "$TMP/err"))"
elif ! grep -q "checkpoint $R/checkpoints/step_000010 not written: .*model.safetensors.*File too large; training stopped at step 10" "$TMP/err"; then
  fail checkpoint_disk_full "stderr: $(cat "$TMP/err")"
elif [ -n "$(ls -A "$R/checkpoints")" ]; then fail checkpoint_disk_full "left behind: $(ls -A "$R/checkpoints")"
elif [ "$(steps_of "$R/metrics.jsonl")" != "$(seq -s ' ' 1 10)" ]; then
  fail checkpoint_disk_full "went on after the failed checkpoint: $(steps_of "$R/metrics.jsonl")"
else pass checkpoint_disk_full; fi

# a real full file system: a 48 KiB tmpfs in a private mount namespace (unshare -rm; skipped
# where user namespaces or tmpfs mounts are not allowed)
MNT="$TMP/mnt"
mkdir -p "$MNT"
if unshare -rm sh -c "mount -t tmpfs -o size=48k tmpfs '$MNT'" 2>/dev/null; then
  # inside: mount, train, copy the evidence out (the tmpfs vanishes with the namespace)
  unshare -rm bash -c 'mount -t tmpfs -o size=48k tmpfs "$1" || exit 99
    mnt=$1 tmp=$2; shift 2
    "$@" --out "$mnt/run" >/dev/null 2>"$tmp/enospc.err"; rc=$?
    cp "$mnt/run/metrics.jsonl" "$tmp/enospc_metrics.jsonl"
    exit $rc' _ "$MNT" "$TMP" "$BIN" train "${SMALL[@]}" --steps 3000; rc=$?
  rows=$(grep -c . "$TMP/enospc_metrics.jsonl" 2>/dev/null || echo 0)
  if [ $rc -ne 1 ]; then fail metrics_enospc "exit status $rc, expected 1 ($(cat "$TMP/enospc.err"))"
  elif ! grep -q "cannot append to .*/run/metrics.jsonl: No space left on device; training stopped" "$TMP/enospc.err"; then
    fail metrics_enospc "stderr: $(cat "$TMP/enospc.err")"
  elif ! jsonl_whole "$TMP/enospc_metrics.jsonl" || [ "$rows" -ge 3000 ] || [ "$rows" -lt 10 ]; then
    fail metrics_enospc "metrics.jsonl: $rows rows, whole lines: $(jsonl_whole "$TMP/enospc_metrics.jsonl" && echo yes || echo no)"
  else pass metrics_enospc; fi
else
  echo "SKIP $SUITE: metrics_enospc: cannot mount a tmpfs in a user namespace here (unshare -rm)"
fi

# stats.jsonl of --inspect: the same
R="$TMP/full_stats"
(trap '' XFSZ; ulimit -f 40; exec "$BIN" train "${SMALL[@]}" --steps 400 --inspect every=1 --out "$R") >/dev/null 2>"$TMP/err"; rc=$?
if [ $rc -eq 1 ] && grep -q "cannot write $R/stats.jsonl: File too large; training stopped at step" "$TMP/err" &&
   [ "$(grep -c . "$R/metrics.jsonl")" -lt 400 ]; then pass stats_disk_full
else fail stats_disk_full "exit status $rc, $(grep -c . "$R/metrics.jsonl") rows: $(cat "$TMP/err")"; fi

# --- 6. import / export --to a non-empty directory
CK="$TMP/run/checkpoints/step_000005"
D="$TMP/export_into"
mkdir -p "$D"
echo keep >"$D/notes.txt"
"$BIN" export "$CK" --to "$D" >/dev/null 2>"$TMP/err"; rc=$?
if [ $rc -eq 2 ] && grep -q "is not empty (it holds notes.txt)" "$TMP/err" && grep -q -- "--overwrite" "$TMP/err" &&
   [ "$(ls "$D")" = "notes.txt" ]; then pass export_refuses_nonempty
else fail export_refuses_nonempty "exit status $rc, $(ls "$D" | tr '\n' ' '): $(cat "$TMP/err")"; fi
"$BIN" export "$CK" --to "$D" --overwrite >/dev/null 2>"$TMP/err"; rc=$?
if [ $rc -eq 0 ] && [ "$(cat "$D/notes.txt")" = keep ] && [ -s "$D/model.safetensors" ]; then pass export_overwrite_keeps_foreign
else fail export_overwrite_keeps_foreign "exit status $rc: $(cat "$TMP/err")"; fi
: >"$TMP/model.bin"
"$BIN" export "$CK" --format llmc --dtype fp32 --to "$TMP/model.bin" >/dev/null 2>"$TMP/err"; rc=$?
if [ $rc -eq 2 ] && [ ! -s "$TMP/model.bin" ] && grep -q "exists" "$TMP/err"; then pass export_llmc_refuses_existing
else fail export_llmc_refuses_existing "exit status $rc: $(cat "$TMP/err")"; fi

I="$TMP/import_into"
mkdir -p "$I/sub"
echo keep >"$I/notes.txt"
echo keep >"$I/sub/data.txt"
"$BIN" import "$D" --to "$I" >/dev/null 2>"$TMP/err"; rc=$?
if [ $rc -eq 2 ] && grep -q "is not empty" "$TMP/err" && [ ! -e "$I/state.json" ] && [ -f "$I/notes.txt" ]; then
  pass import_refuses_nonempty
else fail import_refuses_nonempty "exit status $rc: $(cat "$TMP/err")"; fi
"$BIN" import "$D" --to "$I" --overwrite >/dev/null 2>"$TMP/err"; rc=$?
"$BIN" train "${SMALL[@]}" --steps 2 --resume "$I" --out "$TMP/from_import" >/dev/null 2>>"$TMP/err"; rc2=$?
if [ $rc -eq 0 ] && [ $rc2 -eq 0 ] && [ "$(cat "$I/notes.txt")" = keep ] && [ -f "$I/sub/data.txt" ] &&
   [ -f "$I/state.json" ]; then pass import_overwrite_keeps_foreign
else fail import_overwrite_keeps_foreign "exit status $rc/$rc2, $(ls "$I" | tr '\n' ' '): $(cat "$TMP/err")"; fi
