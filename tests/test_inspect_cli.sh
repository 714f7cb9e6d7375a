#!/usr/bin/env bash
# `fp8train inspect WEIGHTS` from the outside: help; a checkpoint inspected on the micro-batches
# of its next step reproduces the training run's own --inspect rows of that step bit for bit;
# only the selected sites get rows; dumps are valid .npy files of the right shapes;
# --compare-bf16 prints cosines against an all-BF16 pass; an injected outlier fault is flagged
# (exit 1) in both tables, and vanishes under --precision bf16; weights without an amax history
# (an HF export) are calibrated; a rerun replaces the old output; bad input exits 2 and writes
# nothing.
set -u
BIN=${FP8TRAIN_BIN:-build/fp8train}
SUITE=inspect_cli
TMP=$(mktemp -d /tmp/fp8t_inspect_cli.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# a small model so each pass takes a fraction of a second: B*T = 64 rows, C = 32, hidden 64
SMALL=(--layers 2 --dim 32 --heads 2 --max-seq-len 16 --mlp-hidden 64 --batch 4 --seq-len 16
       --quiet --val-every 0 --seed 5)
HAVE_PY=0; command -v python3 >/dev/null 2>&1 && HAVE_PY=1

pass() { echo "PASS $SUITE: $1"; }
fail() { echo "FAIL $SUITE: $1: $2"; }

# expect_usage NAME NEEDLE ARGS...: exit status 2, stderr contains NEEDLE, OUT not created
expect_usage() {
  local name=$1 needle=$2; shift 2
  local out="$TMP/never_$name"
  "$BIN" inspect --out "$out" "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$?
  if [ $rc -ne 2 ]; then fail "$name" "exit status $rc, expected 2 ($(head -c 300 "$TMP/err"))"; return; fi
  if ! grep -qF -- "$needle" "$TMP/err"; then fail "$name" "stderr lacks '$needle': $(head -c 300 "$TMP/err")"; return; fi
  if [ -e "$out" ]; then fail "$name" "$out was created"; return; fi
  pass "$name"
}

# --- help
"$BIN" inspect --help >"$TMP/h"; rc=$?
missing=""
for o in spec out compare-bf16 precision override inject data data-position batches batch seq-len \
         seed cosine-flag sort top device json; do
  grep -q -- "--$o\b" "$TMP/h" || missing="$missing --$o"
done
if [ $rc -eq 0 ] && [ -z "$missing" ]; then pass help; else fail help "rc $rc, missing:$missing"; fi
if "$BIN" help inspect | grep -q -- "--compare-bf16"; then pass help_via_main
else fail help_via_main "fp8train help inspect"; fi
if "$BIN" inspect --help-inject | grep -q "outliers:V"; then pass help_inject
else fail help_inject "no fault syntax"; fi
if "$BIN" --help | grep -E "^  inspect " | grep -qv "not built"; then pass listed_as_built
else fail listed_as_built "fp8train --help"; fi

# --- a run to inspect: checkpoint at step 2; the run itself inspects step 3 (layer 1 operands)
RUN="$TMP/run"
SEL='layers=1,tensors=operands'
if ! "$BIN" train "${SMALL[@]}" --steps 4 --ckpt-every 2 --keep-ckpts 0 --out "$RUN" \
     --inspect "start=3,end=3,$SEL" >"$TMP/train.out" 2>&1; then
  fail train "$(tail -5 "$TMP/train.out")"; echo "(the other checks need the run)"; exit 1
fi
CK="$RUN/checkpoints/step_000002"

# --- default output directory, selection, reproduction of the training run's step 3
"$BIN" inspect "$CK" --spec "$SEL" >"$TMP/i1.out" 2>"$TMP/i1.err"; rc=$?
S1="$RUN/inspect/step_000002/stats.jsonl"
if [ $rc -eq 0 ] && [ -s "$S1" ] && [ -s "$RUN/inspect/step_000002/inspect.json" ]; then pass default_out
else fail default_out "rc $rc, $(head -c 300 "$TMP/i1.err")"; fi
# 4 modules x (fprop input+weight, dgrad weight+grad_output, wgrad input+grad_output) in layer 1
n=$(grep -c . "$S1" 2>/dev/null); n1=$(grep -c '"layer":1,' "$S1" 2>/dev/null)
nres=$(grep -cE '"tensor":"(output|dgrad|wgrad)"' "$S1" 2>/dev/null)
nstep=$(grep -c '"step":3,' "$S1" 2>/dev/null)
if [ "$n" -eq 24 ] && [ "$n1" -eq 24 ] && [ "$nres" -eq 0 ] && [ "$nstep" -eq 24 ]; then pass selection
else fail selection "$n rows, $n1 in layer 1, $nres results, $nstep at step 3 (expected 24, 24, 0, 24)"; fi
# amax_history_max is the amax the step's delayed scale came from, noted before the previous
# step's scale update: the training run saw that update, a replay from the checkpoint did not
# (the roll has dropped the oldest amax) and says null. Every other field must match.
strip_hist() { sed -E 's/"amax_history_max":[^,]*,//'; }
if diff <(grep '"step":3,' "$RUN/stats.jsonl" | strip_hist | sort) <(strip_hist <"$S1" | sort) >/dev/null; then pass matches_training_step
else fail matches_training_step "inspect rows differ from the training run's step 3 rows"; fi
# what-if statistics: every operand row carries the four default recipes (whatif=all adds
# MXFP8 after them, the others unchanged); compare and the report show the best of them next to
# the recipe in use
nwi=$(grep -c '"whatif":{"current_e4m3":{"underflow_pct":[0-9.e+-]*,"saturation_pct":[0-9.e+-]*,"sqnr_db":[^}]*},"current_e5m2":{[^}]*},"block128_e4m3":{[^}]*},"block128_e5m2":{[^}]*}}' "$S1")
if [ "$nwi" -eq 24 ]; then pass whatif_fields; else fail whatif_fields "$nwi of 24 rows with the four default what-if recipes"; fi
"$BIN" inspect "$CK" --spec "$SEL,whatif=all" --out "$TMP/wi_all" >"$TMP/i_all.out" 2>"$TMP/i_all.err"; rc=$?
S_ALL="$TMP/wi_all/stats.jsonl"
nmx=$(grep -c '"block128_e5m2":{[^}]*},"mxfp8":{"underflow_pct":[0-9.e+-]*,"saturation_pct":[0-9.e+-]*,"sqnr_db":[^}]*}}' "$S_ALL" 2>/dev/null)
if [ $rc -eq 0 ] && [ "$nmx" -eq 24 ] &&
   diff <(sed -E 's/,"mxfp8":\{[^}]*\}//' "$S_ALL") "$S1" >/dev/null; then pass whatif_all_adds_mxfp8
else fail whatif_all_adds_mxfp8 "rc $rc, $nmx of 24 rows with mxfp8, or the other fields differ: $(head -c 300 "$TMP/i_all.err")"; fi
expect_usage bad_whatif "whatif=most: expected default" "$CK" --spec "whatif=most"
"$BIN" compare "$RUN" "$RUN" --json >"$TMP/cmp.json" 2>/dev/null
"$BIN" compare "$RUN" "$RUN" --report "$TMP/cmp.html" >"$TMP/cmp.txt" 2>&1
if grep -q '"whatif_best":[[:space:]]*"[a-z0-9_]*"' "$TMP/cmp.json" && grep -q '"precision":[[:space:]]*"delayed"' "$TMP/cmp.json" &&
   grep -q 'best what-if recipe' "$TMP/cmp.txt" && grep -qE '<td>(current|block128|mxfp8)[a-z0-9_]*: [0-9.]+ dB' "$TMP/cmp.html"; then
  pass compare_shows_whatif
else fail compare_shows_whatif "no what-if column in compare's text, JSON or HTML report"; fi
nnull=$(grep -c '"amax_history_max":null' "$S1"); nnum=$(grep '"step":3,' "$RUN/stats.jsonl" | grep -c '"amax_history_max":[0-9]')
if [ "$nnull" -eq 24 ] && [ "$nnum" -eq 24 ]; then pass amax_history_max_known_only_after_an_update
else fail amax_history_max_known_only_after_an_update "replay nulls $nnull, training numbers $nnum (expected 24, 24)"; fi
rows=$(grep -cE '^1 +(qkv|proj|fc1|fc2) +(fprop|dgrad|wgrad) +(input|weight|grad_output) ' "$TMP/i1.out")
if [ "$rows" -eq 24 ] && grep -q "SQNR dB" "$TMP/i1.out" && grep -q "cosine" "$TMP/i1.out" &&
   grep -q "0 of 24 tensor sites flagged" "$TMP/i1.out" && grep -q "worst SQNR: layer 1" "$TMP/i1.out"; then
  pass table
else fail table "$rows rows: $(head -c 600 "$TMP/i1.out")"; fi

# a rerun into the same directory replaces stats.jsonl instead of appending to it
"$BIN" inspect "$CK" --spec "$SEL" >/dev/null 2>&1
if [ "$(grep -c . "$S1")" -eq 24 ]; then pass rerun_replaces; else fail rerun_replaces "$(grep -c . "$S1") rows"; fi

# --- dumps: valid .npy files of the dumped site only, shapes [B*T, C] and [out, in]
D="$TMP/dump"
"$BIN" inspect "$CK" --spec 'layers=0,modules=fc1,gemms=fprop,dump=1' --out "$D" >/dev/null 2>"$TMP/err"; rc=$?
DD="$D/dumps/step_000003"
P=0.fc1.fprop
want="$P.input.fp8.npy $P.input.npy $P.input.scale_inv.npy $P.output.npy $P.weight.fp8.npy"
want="$want $P.weight.npy $P.weight.scale_inv.npy"
got=$(ls "$DD" 2>/dev/null | sort | tr '\n' ' ' | sed 's/ $//')
if [ $rc -eq 0 ] && [ "$got" = "$want" ]; then pass dump_files; else fail dump_files "rc $rc, files: $got"; fi
if [ $HAVE_PY -eq 1 ]; then
  python3 - "$DD" >"$TMP/npy" 2>&1 <<'EOF'
import ast, os, struct, sys
d = sys.argv[1]
want = {"0.fc1.fprop.input.npy": ("<f4", (64, 32)), "0.fc1.fprop.weight.npy": ("<f4", (64, 32)),
        "0.fc1.fprop.output.npy": ("<f4", (64, 64)), "0.fc1.fprop.input.fp8.npy": ("|u1", (64, 32)),
        "0.fc1.fprop.input.scale_inv.npy": ("<f4", (1,))}
bad = []
for name, (descr, shape) in want.items():
    raw = open(os.path.join(d, name), "rb").read()
    if raw[:6] != b"\x93NUMPY":
        bad.append(name + ": no .npy magic"); continue
    major = raw[6]
    hl = struct.unpack("<H", raw[8:10])[0] if major == 1 else struct.unpack("<I", raw[8:12])[0]
    off = 10 if major == 1 else 12
    h = ast.literal_eval(raw[off:off + hl].decode("latin1"))
    size = 1 if descr == "|u1" else 4
    n = 1
    for s in shape: n *= s
    if h["descr"] != descr or tuple(h["shape"]) != shape or h["fortran_order"] or \
       len(raw) - off - hl != n * size:
        bad.append("%s: %r, %d data bytes" % (name, h, len(raw) - off - hl))
    if name.endswith("scale_inv.npy"):
        v = struct.unpack("<f", raw[off + hl:off + hl + 4])[0]
        if not (v > 0 and v < 1): bad.append("%s: scale_inv %g" % (name, v))
print("ok" if not bad else "; ".join(bad))
EOF
  if [ "$(cat "$TMP/npy")" = "ok" ]; then pass dump_npy; else fail dump_npy "$(head -c 400 "$TMP/npy")"; fi
else
  f="$DD/0.fc1.fprop.output.npy"
  if [ "$(head -c 6 "$f" | od -An -c | tr -d ' \n')" = "223NUMPY" ] &&
     head -c 128 "$f" | grep -q "'shape': (64, 64)"; then pass dump_npy; else fail dump_npy "bad header in $f"; fi
fi

# --- --compare-bf16 on a healthy checkpoint: a cosine per dumped tensor, none flagged
C="$TMP/cmp"
"$BIN" inspect "$CK" --spec 'layers=1,gemms=fprop+dgrad' --compare-bf16 --out "$C" >"$TMP/c.out" 2>"$TMP/err"; rc=$?
# dump rows: name, elements, cosine, relative error, SQNR
cos_rows=$(grep -cE '^1\.(qkv|proj|fc1|fc2)\.(fprop|dgrad)\.[a-z_]+ +[0-9]+ +(0\.99[0-9]*|1\.0+) ' "$TMP/c.out")
total_rows=$(grep -cE '^1\.(qkv|proj|fc1|fc2)\.' "$TMP/c.out")
if [ $rc -eq 0 ] && [ "$cos_rows" -eq 24 ] && [ "$total_rows" -eq 24 ] &&
   grep -q "all-BF16: " "$TMP/c.out" && grep -q "0 of 24 dumped tensors below cosine 0.99" "$TMP/c.out" &&
   [ -s "$C/bf16/stats.jsonl" ] && [ -d "$C/bf16/dumps/step_000003" ]; then pass compare_bf16
else fail compare_bf16 "rc $rc, $cos_rows/$total_rows rows with cosine >= 0.99: $(tail -8 "$TMP/c.out")"; fi
if grep -qE '^1\.fc2\.fprop\.weight +[0-9]+ +1\.000000 +0\.000e\+00 +exact' "$TMP/c.out"; then pass weights_identical
else fail weights_identical "the weight dumps of the two passes differ"; fi

# --- an injected outlier fault in layer 1 fc2's Fprop input: flagged in both tables, exit 1
# 1% of the entries (41 of 4096) set to +-1e4: FP8 clamps them, the output moves away from BF16
FAULT='layer=1,module=fc2,gemm=fprop,kind=outliers:1e4,frac=0.01'
F="$TMP/fault"
"$BIN" inspect "$CK" --inject "$FAULT" --compare-bf16 --out "$F" >"$TMP/f.out" 2>"$TMP/err"; rc=$?
flagged_sites=$(grep -E '<< cosine < 0\.99' "$TMP/f.out" | grep -vE '^[0-9head]+\.' | awk '{print $1,$2,$3,$4}')
if [ $rc -eq 1 ] && [ "$flagged_sites" = "1 fc2 fprop input" ] &&
   grep -q "fault: $FAULT (applied 1 time)" "$TMP/f.out"; then pass fault_flagged_site
else fail fault_flagged_site "rc $rc, flagged: '$flagged_sites'"; fi
if grep -qE '^1\.fc2\.fprop\.input .*<< cosine < 0\.99' "$TMP/f.out" &&
   grep -qE '^1\.fc2\.fprop\.output .*<< cosine < 0\.99' "$TMP/f.out" &&
   ! grep -qE '^0\.[a-z0-9_.]+ .*<< cosine' "$TMP/f.out"; then pass fault_flagged_vs_bf16
else fail fault_flagged_vs_bf16 "$(grep -E '<<' "$TMP/f.out" | head -5)"; fi
if [ $HAVE_PY -eq 1 ]; then
  if python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
s = [x for x in j["sites"] if x["flagged"]]
d = [x["tensor"] for x in j["compare_bf16"]["tensors"] if x["flagged"]]
assert j["exit_status"] == 1 and j["injected"] == 1, j["exit_status"]
assert [(x["layer"], x["module"], x["gemm"], x["tensor"]) for x in s] == [(1, "fc2", "fprop", "input")], s
assert s[0]["cosine"] < 0.99 and s[0]["saturation_pct"] > 0, s
assert "1.fc2.fprop.input" in d and "1.fc2.fprop.output" in d, d
' "$F/inspect.json" 2>"$TMP/err"; then pass inspect_json; else fail inspect_json "$(tail -2 "$TMP/err")"; fi
  "$BIN" inspect "$CK" --spec "$SEL" --json --out "$TMP/j" >"$TMP/j.out" 2>&1; rc=$?
  if [ $rc -eq 0 ] && python3 -c 'import json, sys
j = json.load(open(sys.argv[1])); assert len(j["sites"]) == 24 and j["step"] == 3' "$TMP/j.out" 2>/dev/null
  then pass json_stdout; else fail json_stdout "rc $rc: $(head -c 300 "$TMP/j.out")"; fi
fi
# the same fault under --precision bf16: when=fp8 faults skip BF16 GEMMs, nothing is flagged
"$BIN" inspect "$CK" --inject "$FAULT" --precision bf16 --out "$TMP/fb" >"$TMP/fb.out" 2>"$TMP/err"; rc=$?
if [ $rc -eq 0 ] && grep -q "never fired" "$TMP/err" && grep -q "bf16 / fp32 GEMMs" "$TMP/fb.out"; then
  pass fault_gone_in_bf16
else fail fault_gone_in_bf16 "rc $rc: $(head -c 300 "$TMP/err")"; fi

# --- an override: layer 1's Dgrad in current scaling shows in the table's precision column
"$BIN" inspect "$CK" --spec 'layers=1,gemms=dgrad,tensors=grad_output' \
  --override 'layers=1,gemm=dgrad,precision=current' --out "$TMP/ov" >"$TMP/ov.out" 2>&1; rc=$?
if [ $rc -eq 0 ] && [ "$(grep -cE '^1 +[a-z0-9]+ +dgrad +grad_output +current ' "$TMP/ov.out")" -eq 4 ]; then
  pass override
else fail override "rc $rc: $(grep -E '^1 ' "$TMP/ov.out" | head -3)"; fi

# --- weights without an amax history (an HF export): calibrated, then nothing flagged
if "$BIN" export "$RUN/checkpoints/step_000004" --to "$TMP/hf" >/dev/null 2>&1; then
  "$BIN" inspect "$TMP/hf" --batch 4 --seq-len 16 --spec 'tensors=operands' --out "$TMP/hfi" \
    >"$TMP/hf.out" 2>"$TMP/err"; rc=$?
  if [ $rc -eq 0 ] && grep -q "calibrated" "$TMP/err" &&
     grep -q "^0 of [0-9]* tensor sites flagged" "$TMP/hf.out"; then
    pass import_calibrated
  else fail import_calibrated "rc $rc: $(head -c 300 "$TMP/err") $(grep flagged "$TMP/hf.out")"; fi
else fail import_calibrated "fp8train export failed"; fi

# --- bad input: exit 2, a message naming the problem, nothing written
expect_usage no_weights "which weights?"
expect_usage missing_weights "does not exist" "$TMP/no/such/ckpt"
expect_usage two_weights "one WEIGHTS argument" "$CK" "$CK"
expect_usage bad_spec_key "--spec: unknown key 'bogus'" "$CK" --spec 'bogus=1'
expect_usage bad_spec_layers "--spec: layers=x" "$CK" --spec 'layers=x'
expect_usage bad_precision "--precision: bad value 'fp9'" "$CK" --precision fp9
expect_usage bad_override "--override" "$CK" --override 'layers=1,precision=zz'
expect_usage bad_inject "--inject" "$CK" --inject 'layer=1,gemm=fprop,kind=explode'
expect_usage bad_batches "--batches" "$CK" --batches 0
expect_usage long_seq "--seq-len 64 exceeds" "$CK" --seq-len 64
expect_usage bad_data "data:" "$CK" --data "$TMP/no_such_corpus.txt"
expect_usage bad_sort "--sort" "$CK" --sort best
expect_usage bad_flag "--cosine-flag" "$CK" --cosine-flag 2
expect_usage unknown_option "--frobnicate" "$CK" --frobnicate 1
expect_usage missing_value "--spec needs a value" "$CK" --spec
"$BIN" inspect "$CK" --out "$RUN" >/dev/null 2>"$TMP/err"; rc=$?
if [ $rc -eq 2 ] && grep -q "training run directory" "$TMP/err" && [ ! -e "$RUN/dumps" ] &&
   [ "$(grep -c . "$RUN/stats.jsonl")" -gt 0 ]; then pass out_is_run; else fail out_is_run "rc $rc"; fi
mkdir -p "$TMP/foreign" && echo '{}' >"$TMP/foreign/stats.jsonl"
"$BIN" inspect "$CK" --out "$TMP/foreign" >/dev/null 2>"$TMP/err"; rc=$?
if [ $rc -eq 2 ] && grep -q "did not write" "$TMP/err" && [ "$(cat "$TMP/foreign/stats.jsonl")" = "{}" ]; then
  pass out_foreign; else fail out_foreign "rc $rc"; fi
"$BIN" inspect "$CK" --spec 'layers=7' --out "$TMP/none" >/dev/null 2>"$TMP/err"; rc=$?
if [ $rc -eq 2 ] && grep -q "selected no tensor" "$TMP/err"; then pass spec_selects_nothing
else fail spec_selects_nothing "rc $rc: $(head -c 200 "$TMP/err")"; fi
