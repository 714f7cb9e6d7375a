#!/usr/bin/env bash
# bench/gpu_infer.sh and bench/peers/hf_infer.py without torch or a GPU (issue 21's inference
# table): hf_infer.py --table on canned results of both tools (tests/data/infer_table: bench-infer
# --out files and hf_infer.py lines; the expected cells below are worked out by hand from them),
# the driver end to end on the CPU (DEVICE=cpu, a tiny preset, the real fp8train bench-infer and
# a stand-in Python that answers the peer's lines and runs the real --table), hf_infer.py's
# transformers configs against the presets, its import without torch, and bad arguments.
# Prints one "PASS gpu_infer_table: ..." / "FAIL gpu_infer_table: ..." line per check.
set -u
cd "$(dirname "$0")/.." || exit 1
BIN=${FP8TRAIN_BIN:-build/fp8train}
PY=${FP8TRAIN_PYTHON:-python3}
export PYTHONDONTWRITEBYTECODE=1 # the source tree stays clean
SCRIPT=bench/peers/hf_infer.py
D=tests/data/infer_table
TMP=$(mktemp -d /tmp/fp8t_infer_table.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
pass() { echo "PASS gpu_infer_table: $1"; }
fail() { echo "FAIL gpu_infer_table: $1"; }
command -v "$PY" >/dev/null || { echo "SKIP gpu_infer_table: no $PY"; exit 0; }
# has FILE LINE: FILE holds LINE exactly
has() {
  if grep -qxF -- "$2" "$1"; then pass "${3:-$2}"; else
    fail "${3:-$2}: not in the output"; sed 's/^/    /' "$1" | head -30; fi
}

# -- the table of canned results
if "$PY" "$SCRIPT" --table "$D/fp8train_gpt2-1.5b.json" "$D/fp8train_llama-1b.json" \
     "$D/peers.jsonl" >"$TMP/t.md" 2>"$TMP/t.err"; then pass "--table exits 0"; else
  fail "--table failed"; cat "$TMP/t.err"; fi
# peak GiB = bytes / 2^30 (4e9 -> 3.73); both transformers methods get a row
has "$TMP/t.md" "| gpt2-1.5b | 1 | fp8train BF16 | 10,000 | 100 | 3.73 |"
has "$TMP/t.md" "| gpt2-1.5b | 1 | fp8train FP8 | 12,000 | 130 | 2.05 |"
has "$TMP/t.md" "| gpt2-1.5b | 64 | transformers BF16 (loop) | 150,000 | 5,500 | 4.66 |"
has "$TMP/t.md" "| gpt2-1.5b | 64 | transformers BF16 (generate) | 125,000 | 6,000 | 4.75 |"
# batch 1: FP8/BF16 12000/10000, 130/100, 2.2e9/4e9; BF16 overhead 4 - 3 - 0.3 - 0.05 GB;
# against transformers' faster method (loop: 80 decode, 9000 prefill): 100/80, 10000/9000
has "$TMP/t.md" "| gpt2-1.5b | 1 | 1.20× | 1.30× | 0.55× | 0.65 | 1.25× | 1.11× | all met |" \
  "batch 1 ratios, every target met"
# batch 64: 320000/200000, 7000/5000, 4.2/6; 6 - 3 - 0.3 - 1.2 GB; decode against generate's
# 6000 (the faster), prefill against loop's 150000 (the faster): 5000/6000, 200000/150000
has "$TMP/t.md" "| gpt2-1.5b | 64 | 1.60× | 1.40× | 0.70× | 1.50 | 0.83× | 1.33× | missed: FP8 peak ≤ 0.6×, FP8 ≥ 1.5× BF16, BF16 decode ≥ transformers |" \
  "batch 64 ratios against the faster method, the missed targets named"
has "$TMP/t.md" "| llama-1b | 1 | fp8train FP8 | n/a | n/a | n/a |" "a failed fp8train run is n/a"
has "$TMP/t.md" "| llama-1b | 1 | transformers BF16 | n/a | n/a | n/a |" "a failed peer is n/a"
has "$TMP/t.md" "| llama-1b | 1 | n/a | n/a | n/a | 0.49 | n/a | n/a | missed: FP8 peak ≤ 0.6× (n/a), BF16 decode ≥ transformers (n/a) |" \
  "ratios of missing runs are n/a and count as missed"
has "$TMP/t.md" "failed: transformers llama-1b bf16: import: No module named 'torch'" \
  "the peer's error is shown"
has "$TMP/t.md" "failed: fp8train llama-1b fp8 batch 1" "a failed fp8train configuration is listed"

# -- the driver on the CPU: real bench-infer, a stand-in for the transformers peer
if [ -x "$BIN" ]; then
  cat >"$TMP/py" <<EOS
#!/usr/bin/env bash
# the real --table; for a run, one loop line per batch with fixed rates, and the arguments kept
case " \$* " in *" --table "*) exec "$PY" "\$@" ;; esac
echo "\$*" >>"$TMP/peer_args"
for b in 1 2; do
  echo "{\"source\": \"transformers\", \"precision\": \"bf16\", \"model\": \"tiny\", \"batch\": \$b, \"method\": \"loop\", \"ok\": true, \"prefill_tokens_per_s\": 1000.0, \"decode_tokens_per_s\": 100.0, \"peak_bytes\": 1073741824, \"torch\": \"0\", \"transformers\": \"0\"}"
done
EOS
  chmod +x "$TMP/py"
  if FP8TRAIN_BIN=$BIN PYTHON=$TMP/py DEVICE=cpu MODELS=tiny BATCH=1,2 PROMPT_LEN=8 GEN=4 \
       REPEAT=1 bench/gpu_infer.sh "$TMP/out" >"$TMP/drv.log" 2>&1; then
    pass "gpu_infer.sh on the CPU exits 0"; else
    fail "gpu_infer.sh failed"; tail -20 "$TMP/drv.log" | sed 's/^/    /'; fi
  has "$TMP/peer_args" "$SCRIPT --model tiny --batch 1,2 --prompt-len 8 --gen 4 --repeat 1" \
    "the peer gets bench-infer's settings"
  # FP8_ARGS' default reaches bench-infer's fp8 rows, and the table names the configuration
  if grep -qF "| tiny | 1 | fp8train FP8 (calibrated scales (4 batches of 1 x 8 tokens), KV fp8, head fp8) |" \
       "$TMP/out/infer_table.md"; then pass "the fp8 rows: calibrated scales, FP8 cache and head"
  else fail "the fp8 row's configuration"; grep "fp8train FP8" "$TMP/out/infer_table.md" | head -3; fi
  for f in fp8train_tiny.json fp8train_tiny.txt peers.jsonl infer_table.md card.txt; do
    [ -f "$TMP/out/$f" ] || fail "$f not written"
  done
  # the expected rows from bench-infer's own JSON: its rates, the ratios to the stand-in's
  if "$PY" - "$TMP/out/fp8train_tiny.json" >"$TMP/want" <<'EOS'
import json, sys
j = json.load(open(sys.argv[1]))
r = {(x["precision"], x["batch"]): x for x in j["results"]}
for b in (1, 2):
    bf, f8 = r[("bf16", b)], r[("fp8", b)]
    print("| tiny | %d | fp8train BF16 | %s | %s | n/a |" % (
        b, "{:,.0f}".format(bf["prefill_tokens_per_s"]), "{:,.0f}".format(bf["decode_tokens_per_s"])))
    print("| tiny | %d | %.2f× | %.2f× | n/a | n/a | %.2f× | %.2f× |" % (
        b, f8["prefill_tokens_per_s"] / bf["prefill_tokens_per_s"],
        f8["decode_tokens_per_s"] / bf["decode_tokens_per_s"],
        bf["decode_tokens_per_s"] / 100.0, bf["prefill_tokens_per_s"] / 1000.0))
EOS
  then
    n=0
    while IFS= read -r line; do
      grep -qF -- "$line" "$TMP/out/infer_table.md" || { n=1; fail "table lacks: $line"; }
    done <"$TMP/want"
    [ $n -eq 0 ] && [ -s "$TMP/want" ] && pass "the driver's table has bench-infer's rates and ratios"
  else
    fail "bench-infer's JSON is not as expected"; sed 's/^/    /' "$TMP/out/fp8train_tiny.txt"
  fi
else
  fail "$BIN is not built"
fi

# -- the transformers configs: the shapes of pytorch_gpt.py's presets (checked against
#    src/model/config.c by tests/test_peers_script.c)
if "$PY" "$SCRIPT" --dry-run --model all >"$TMP/dry" 2>&1 && "$PY" - "$TMP/dry" <<'EOS'
import json, os, sys
sys.path.insert(0, "bench/peers")
from pytorch_gpt import PRESETS, param_count
n = 0
for line in open(sys.argv[1]):
    o = json.loads(line)
    p, c = PRESETS[o["model"]], o["config"]
    assert o["params"] == param_count(p), o["model"]
    if p["arch"] == "gpt2":
        got = (c["n_layer"], c["n_embd"], c["n_head"], c["n_head"], c["vocab_size"], c["n_inner"],
               c["n_positions"], c["tie_word_embeddings"], c["activation_function"])
        want = (p["n_layer"], p["n_embd"], p["n_head"], p["n_kv_head"], p["vocab"],
                p["mlp_hidden"], p["max_seq"], True, "gelu_new")
    else:
        rs = c["rope_scaling"]
        got = (c["num_hidden_layers"], c["hidden_size"], c["num_attention_heads"],
               c["num_key_value_heads"], c["vocab_size"], c["intermediate_size"],
               c["max_position_embeddings"], c["tie_word_embeddings"], c["rope_theta"],
               rs["rope_type"], rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"],
               rs["original_max_position_embeddings"], c["head_dim"])
        s = p["rope_scaling"]
        want = (p["n_layer"], p["n_embd"], p["n_head"], p["n_kv_head"], p["vocab"],
                p["mlp_hidden"], p["max_seq"], True, p["rope_theta"], "llama3", s["factor"],
                s["low"], s["high"], s["original_max_pos"], p["n_embd"] // p["n_head"])
    assert got == want, (o["model"], got, want)
    n += 1
assert n == 2, n
EOS
then pass "--dry-run configs have the presets' shapes"; else
  fail "--dry-run configs differ from the presets"; sed 's/^/    /' "$TMP/dry"; fi

# -- import-safe without torch; bad arguments exit 2
if "$PY" -c "import sys; sys.path.insert(0, 'bench/peers'); import hf_infer; assert 'torch' not in sys.modules" 2>"$TMP/imp"; then
  pass "imports without torch"; else fail "import: $(cat "$TMP/imp")"; fi
for bad in "--model gpt2-124m" "--batch 0" "--method beam" "--model llama-1b --prompt-len 2040 --gen 16"; do
  # shellcheck disable=SC2086 # the words are the arguments
  "$PY" "$SCRIPT" $bad >/dev/null 2>&1; rc=$?
  if [ $rc -eq 2 ]; then pass "$bad: exit 2"; else fail "$bad: exit $rc, expected 2"; fi
done
