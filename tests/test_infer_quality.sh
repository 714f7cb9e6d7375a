#!/usr/bin/env bash
# bench/infer_quality.sh end to end at MODEL=tiny on the CPU (a 2-layer GPT-2 trained 60 steps
# in FP8 on tinyshakespeare): the tokens, the task, the training, the FP8 export, every eval
# configuration in the table with both precisions' losses and task accuracies, and each FP8 -
# BF16 gap within issue 21's 0.5% (the FP8 embedding table and head included).
# Prints one "PASS infer_quality: ..." / "FAIL infer_quality: ..." line per check.
set -u
cd "$(dirname "$0")/.." || exit 1
BIN=${FP8TRAIN_BIN:-build/fp8train}
PY=${FP8TRAIN_PYTHON:-python3}
TMP=$(mktemp -d /tmp/fp8t_infer_quality.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
command -v "$PY" >/dev/null || { echo "SKIP infer_quality: no $PY"; exit 0; }
[ -x "$BIN" ] || { echo "FAIL infer_quality: $BIN is not built"; exit 1; }
if FP8TRAIN_BIN=$BIN PYTHON=$PY MODEL=tiny STEPS=60 EVAL_BATCHES=2 TASK_EXAMPLES=40 \
     bench/infer_quality.sh "$TMP" >"$TMP/log" 2>&1; then
  echo "PASS infer_quality: the script exits 0"
else
  echo "FAIL infer_quality: the script failed"; tail -20 "$TMP/log" | sed 's/^/    /'; exit 1
fi
"$PY" - "$TMP/quality.jsonl" "$TMP/quality.md" <<'EOS'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    rows[r["config"]] = r
want = ["current", "delayed", "calibrated", "fp8_head", "export_fp8", "decode_bf16kv",
        "decode_fp8kv"]
fails = 0
def check(ok, what):
    global fails
    print(("PASS" if ok else "FAIL") + " infer_quality: " + what)
    fails += not ok
check(sorted(rows) == sorted(want), "the seven configurations: %s" % ", ".join(sorted(rows)))
for name in want:
    r = rows.get(name, {})
    l, acc = r.get("loss", {}), (r.get("tasks") or [{}])[0].get("accuracy", {})
    b = l.get("bf16") if name != "decode_fp8kv" else rows.get("decode_bf16kv", {}).get("loss", {}).get("bf16")
    f = l.get("fp8")
    ok = b is not None and f is not None and abs(f - b) / b <= 0.005 and "fp8" in acc
    check(ok, "%s: fp8 %s vs bf16 %s within 0.5%%, fp8 task accuracy %s" % (name, f, b, acc.get("fp8")))
for name, act, kv in (("calibrated", "calibrated", "default"), ("decode_fp8kv", "delayed", "fp8"),
                      ("decode_bf16kv", "delayed", "bf16")):
    r = rows.get(name, {})
    check(r.get("act_scale") == act and r.get("kv_cache") == kv and
          r.get("decode_loss") == name.startswith("decode"), "%s: recorded as %s / %s" % (name, act, kv))
md = open(sys.argv[2]).read()
check(md.count("| ok |") + md.count("| MISSED |") == 7, "the table has seven rows")
sys.exit(1 if fails else 0)
EOS
