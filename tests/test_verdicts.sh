#!/usr/bin/env bash
# Verdicts that must not mislead, and small things a user hits (issue 13): --inject naming what
# the model lacks is refused, a checkpoint with NaN weights is never "the last good checkpoint",
# and the other cases below, each from the outside through the fp8train command.
set -u
BIN=${FP8TRAIN_BIN:-build/fp8train}
SUITE=verdicts
TMP=$(mktemp -d /tmp/fp8t_verdicts.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
LOUD=(--layers 2 --dim 32 --heads 2 --max-seq-len 16 --mlp-hidden 64 --batch 4 --seq-len 16
      --val-every 0)
SMALL=("${LOUD[@]}" --quiet)

pass() { echo "PASS $SUITE: $1"; }
fail() { echo "FAIL $SUITE: $1: $2"; }

# --- --inject naming a layer or module the model does not have: exit 2, nothing written
inject_refused() {
  local name=$1 needle=$2 spec=$3; shift 3
  local out="$TMP/never_$name"
  "$BIN" train "${SMALL[@]}" "$@" --steps 2 --precision fp8 --inject "$spec" --out "$out" \
    >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  if [ $rc -ne 2 ]; then fail "$name" "exit status $rc, expected 2"; return; fi
  if ! grep -qF -- "$needle" "$TMP/err"; then fail "$name" "stderr lacks '$needle': $(head -c 300 "$TMP/err")"; return; fi
  if [ -e "$out" ]; then fail "$name" "$out was created"; return; fi
  pass "$name"
}
inject_refused inject_layer_missing "layer=99 but the model has 2 layers" \
  'layer=99,module=fc2,gemm=dgrad,kind=scale:64'
inject_refused inject_module_missing "module=gate is not a module of this gpt2 model" \
  'layer=1,module=gate,gemm=dgrad,kind=scale:64'
inject_refused inject_module_missing_llama "module=fc2 is not a module of this llama model" \
  'module=fc2,gemm=dgrad,kind=scale:64' --arch llama

# --- a checkpoint with NaN weights (as an import of broken weights gives) is no "last good
# checkpoint": the NaN stop must not send the user back to it
"$BIN" train "${SMALL[@]}" --steps 2 --ckpt-every 2 --out "$TMP/good" >/dev/null 2>&1
ck="$TMP/good/checkpoints/step_000002"
python3 - "$ck/model.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]
b = bytearray(open(p, 'rb').read())
n = struct.unpack('<Q', b[:8])[0]
h = json.loads(b[8:8 + n])
k = sorted(x for x in h if x != '__metadata__')[0]
off = 8 + n + h[k]['data_offsets'][0]
b[off:off + 4] = struct.pack('<f', float('nan'))
open(p, 'wb').write(b)
PY
"$BIN" train "${SMALL[@]}" --steps 4 --resume "$ck" --out "$TMP/nanres" >"$TMP/out" 2>"$TMP/err"
rc=$?
ev="$TMP/nanres/events.jsonl"
if [ $rc -eq 0 ]; then fail nan_checkpoint_not_good "the run did not stop on the NaN weights"
elif ! grep -q '"kind":"nan"' "$ev" 2>/dev/null; then fail nan_checkpoint_not_good "no nan event"
elif grep -q 'last good checkpoint\|"last_checkpoint"' "$ev"; then
  fail nan_checkpoint_not_good "the NaN checkpoint is called good: $(head -c 400 "$ev")"
elif ! grep -q 'no good checkpoint' "$ev"; then fail nan_checkpoint_not_good "advice lacks 'no good checkpoint'"
else pass nan_checkpoint_not_good; fi
# the library's warning about those weights reaches the run log (events.jsonl, kind "warning")
# and stderr, --quiet or not
if grep -q '"kind":"warning","message":"--resume [^"]* holds 1 non-finite weight' "$ev" 2>/dev/null &&
   grep -q 'warning: --resume .* holds 1 non-finite weight' "$TMP/err"; then
  pass warning_in_run_log
else fail warning_in_run_log "events: $(grep warning "$ev" 2>&1 | head -c 300); stderr: $(head -c 300 "$TMP/err")"; fi

# --- the progress line: tok/s and s/step are one measurement over one window (named), so
# tok/s x s/step = the tokens of a step (64 here) up to the printed rounding
env -u OMP_WAIT_POLICY "$BIN" train "${LOUD[@]}" --steps 9 --progress-every 3 --ckpt-every 3 \
  --out "$TMP/prog" >"$TMP/prog.out" 2>&1
bad=$(awk '/^step / {
  n++; tok = ""; sps = ""
  for (i = 1; i <= NF; i++) { if ($(i+1) == "tok/s") tok = $i; if ($(i+1) == "s/step") sps = $i }
  if (!index($0, "s/step (last ")) { print "no window named: " $0; next }
  if (tok == "" || sps == "") { print "unparsed: " $0; next }
  err = tok * sps - 64; if (err < 0) err = -err
  if (err > tok * 0.0005 + sps * 0.5 + 0.5) print "tok/s x s/step = " tok * sps ": " $0
} END { if (n < 3) print "only " n " progress lines" }' "$TMP/prog.out")
if [ -z "$bad" ]; then pass progress_tok_s_agrees; else fail progress_tok_s_agrees "$bad"; fi

# --- OpenMP waits passively unless the user says otherwise (libgomp reads the variable at
# start, so fp8train re-executes itself with it set; the banner reports what the run got)
if grep -q "OMP_WAIT_POLICY=passive" "$TMP/prog.out"; then pass omp_passive_default
else fail omp_passive_default "$(grep threads "$TMP/prog.out")"; fi
OMP_WAIT_POLICY=active "$BIN" train "${LOUD[@]}" --steps 1 --out "$TMP/omp" >"$TMP/omp.out" 2>&1
if grep -q "OMP_WAIT_POLICY=active" "$TMP/omp.out"; then pass omp_user_setting_kept
else fail omp_user_setting_kept "$(grep threads "$TMP/omp.out")"; fi

# --- README's Shakespeare example works from the repository root (its --data path is in the
# repository), run as written with the steps and model made small (later options win)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
line=$(grep -m1 -- '--data [^ ]*tinyshakespeare' "$ROOT/README.md")
if [ -z "$line" ]; then fail readme_shakespeare "no Shakespeare example in README.md"
else
  read -r -a words <<<"${line#build/fp8train }"
  (cd "$ROOT" && "$BIN" "${words[@]}" "${SMALL[@]}" --steps 2 --out "$TMP/shk") >"$TMP/shk.out" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && [ -s "$TMP/shk/metrics.jsonl" ]; then pass readme_shakespeare
  else fail readme_shakespeare "'$line' from $ROOT: exit $rc: $(head -c 300 "$TMP/shk.out")"; fi
fi

# --- curves keeps the plot readable with a point off-scale: a 1e4 loss at step 40 is clipped
# to the top row and marked '^' (and listed); the curves keep the other rows
mkdir -p "$TMP/cv_a" "$TMP/cv_b"
awk 'BEGIN { for (s = 1; s <= 100; s++) printf "{\"step\": %d, \"loss\": %.6f}\n", s, 1.5 + 4 * exp(-s / 20) }' >"$TMP/cv_a/metrics.jsonl"
awk 'BEGIN { for (s = 1; s <= 100; s++) printf "{\"step\": %d, \"loss\": %.6f}\n", s, s == 40 ? 1e4 : 1.5 + 4 * exp(-s / 20) }' >"$TMP/cv_b/metrics.jsonl"
"$BIN" curves "$TMP/cv_a" "$TMP/cv_b" --width 50 --height 12 >"$TMP/cv.out" 2>&1; rc=$?
rows_used=$(grep -E '^ *[0-9.]+ \|' "$TMP/cv.out" | grep -cE '\|.*[o*=]')
top=$(grep -E '^ *[0-9.]+ \|' "$TMP/cv.out" | head -1 | awk '{print $1}')
if [ $rc -eq 0 ] && [ "$rows_used" -ge 10 ] && grep -q '\^' "$TMP/cv.out" &&
   grep -q "off-scale, clipped to the top row: cv_b step" "$TMP/cv.out" &&
   awk -v t="$top" 'BEGIN { exit !(t < 10) }'; then pass curves_offscale_clipped
else fail curves_offscale_clipped "rc $rc, $rows_used rows with a curve, top of scale $top"; fi
# ... and a bump on a plateau, or the high start of a falling curve, is no off-scale point
mkdir -p "$TMP/cv_c"
awk 'BEGIN { for (s = 1; s <= 40; s++) printf "{\"step\": %d, \"loss\": %.6f}\n", s, (s < 20 ? 5.5 - 0.12 * s : 3.2) + (s == 30 ? 0.1 : 0) + 0.02 * ((s * 7) % 3) }' >"$TMP/cv_c/metrics.jsonl"
"$BIN" curves "$TMP/cv_c" "$TMP/cv_a" >"$TMP/cv2.out" 2>&1; rc=$?
if [ $rc -eq 0 ] && ! grep -q "off-scale" "$TMP/cv2.out"; then pass curves_no_false_offscale
else fail curves_no_false_offscale "rc $rc: $(grep off-scale "$TMP/cv2.out")"; fi
