#!/usr/bin/env bash
# fp8train tokenize / train --tokenizer / generate --prompt with a Hugging Face tokenizer.json,
# end to end on the fixtures of tests/data/tokenizer/ (made by scripts/make_tokenizer_fixtures.py
# with the `tokenizers` library; no Python here): the shards hold exactly the ids `tokenizers`
# gives, with the document token before each document; the validation split; JSONL input;
# 32-bit (Llama-3) shards for vocabularies past 65536; training on the fly; text prompts; and
# clear failures that leave nothing behind.
# Prints one "PASS tokenize_cli: ..." / "FAIL tokenize_cli: ..." line per check (tests/run.sh).
set -u
BIN=${FP8TRAIN_BIN:-$(dirname "$0")/../build/fp8train}
TD=$(cd "$(dirname "$0")" && pwd)/data/tokenizer
TMP=$(mktemp -d /tmp/fp8t_tokenize_cli.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
fails=0
pass() { echo "PASS tokenize_cli: $1"; }
fail() { echo "FAIL tokenize_cli: $1"; fails=$((fails + 1)); }
run() { # run NAME EXPECTED_STATUS CMD...: output in $TMP/NAME.out
  local name=$1 want=$2; shift 2
  "$@" >"$TMP/$name.out" 2>&1; local rc=$?
  if [ "$rc" -ne "$want" ]; then
    fail "$name: exit status $rc, expected $want"; sed 's/^/    /' "$TMP/$name.out" | tail -8; return 1
  fi
  return 0
}
expect() { # expect NAME PATTERN: the output of NAME contains PATTERN
  if grep -q -- "$2" "$TMP/$1.out"; then pass "$1"; else
    fail "$1: output lacks '$2'"; sed 's/^/    /' "$TMP/$1.out" | tail -8; fi
}
# tokens of a shard, one per line (W: 2 or 4 bytes each)
tokens() { od -An -v -tu"$2" -j1024 "$1" | tr -s ' ' '\n' | grep -v '^$'; }
header() { od -An -v -tu4 -N12 "$1" | tr -s ' ' ' ' | sed 's/^ //'; }
[ -x "$BIN" ] || { echo "FAIL tokenize_cli: $BIN is not built"; exit 1; }

# 1. two text files, no validation split: [EOT] shakespeare ids [EOT] multilingual ids
run tok_txt 0 "$BIN" tokenize "$TD/shakespeare.txt" "$TD/multilingual.txt" \
  --tokenizer "$TD/gpt2.json" --out "$TMP/t1" --val-frac 0 --quiet && expect tok_txt "tokens/s"
{ echo 1000; tr ' ' '\n' <"$TD/gpt2.shakespeare.ids" | grep -v '^$'
  echo 1000; tr ' ' '\n' <"$TD/gpt2.multilingual.ids" | grep -v '^$'; } >"$TMP/want1"
if [ -f "$TMP/t1/train_000000.bin" ] && tokens "$TMP/t1/train_000000.bin" 2 | cmp -s - "$TMP/want1"
then pass "shard ids == tokenizers' ids ($(wc -l <"$TMP/want1") tokens)"
else fail "shard ids differ from tokenizers' ids"; fi
[ "$(header "$TMP/t1/train_000000.bin")" = "20240520 1 $(wc -l <"$TMP/want1")" ] &&
  pass "GPT-2 shard header" || fail "GPT-2 shard header: $(header "$TMP/t1/train_000000.bin")"
[ ! -e "$TMP/t1/val_000000.bin" ] && pass "--val-frac 0: no val shard" || fail "val shard with --val-frac 0"

# 2. the default 10% validation split and small shards: train + val = everything, in order
run tok_split 0 "$BIN" tokenize "$TD/shakespeare.txt" "$TD/multilingual.txt" \
  --tokenizer "$TD/gpt2.json" --out "$TMP/t2" --shard-tokens 4000 --quiet
for f in "$TMP"/t2/train_*.bin "$TMP"/t2/val_*.bin; do tokens "$f" 2; done >"$TMP/got2"
ntrain=$(for f in "$TMP"/t2/train_*.bin; do tokens "$f" 2; done | wc -l)
nval=$(for f in "$TMP"/t2/val_*.bin; do tokens "$f" 2; done | wc -l)
cmp -s "$TMP/got2" "$TMP/want1" && pass "train then val shards == all ids" ||
  fail "train + val shards differ from all ids"
total=$(wc -l <"$TMP/want1")
# the split is at 90% of the input bytes; the val part is about 10% of the tokens
if [ "$nval" -gt $((total / 20)) ] && [ "$nval" -lt $((total / 5)) ] &&
   [ "$(ls "$TMP"/t2/train_*.bin | wc -l)" -eq $(((ntrain + 3999) / 4000)) ]; then
  pass "val split $nval of $total tokens, $(ls "$TMP"/t2/*.bin | wc -l) shards of <= 4000"
else fail "val split: $nval of $total tokens, train $ntrain in $(ls "$TMP"/t2/train_*.bin | wc -l) shards"; fi

# 3. JSONL: one document per line (a blank line skipped), Llama-3 style: <|begin_of_text|> each
printf '{"text": "Hello, world!", "id": 1}\n\n{"id": 2, "text": "中文 and emoji 😀\\n"}\n' >"$TMP/d.jsonl"
run tok_jsonl 0 "$BIN" tokenize "$TMP/d.jsonl" --tokenizer "$TD/llama3.json" --out "$TMP/t3" \
  --val-frac 0 --quiet && expect tok_jsonl "2 documents"
nbos=$(tokens "$TMP/t3/train_000000.bin" 2 | grep -c '^1200$')
[ "$(tokens "$TMP/t3/train_000000.bin" 2 | head -1)" = 1200 ] && [ "$nbos" -eq 2 ] &&
  pass "JSONL: <|begin_of_text|> before each of 2 documents" || fail "JSONL: BOS count $nbos"
printf '{"text": "fine"}\n{"txt": "no text field"}\n' >"$TMP/bad.jsonl"
run tok_badjsonl 2 "$BIN" tokenize "$TMP/bad.jsonl" --tokenizer "$TD/gpt2.json" --out "$TMP/t4" --quiet &&
  expect tok_badjsonl "bad.jsonl:2: no string field \"text\""
[ -z "$(ls "$TMP/t4" 2>/dev/null)" ] && pass "a failed tokenize leaves no shards" ||
  fail "shards left after a failure: $(ls "$TMP/t4")"
printf '{"body": "under another name"}\n' >"$TMP/body.jsonl"
run tok_field 0 "$BIN" tokenize "$TMP/body.jsonl" --tokenizer "$TD/gpt2.json" --out "$TMP/t4b" \
  --field body --quiet && expect tok_field "1 document -> "
run tok_field2 2 "$BIN" tokenize "$TMP/bad.jsonl" --tokenizer "$TD/gpt2.json" --out "$TMP/t4c" \
  --field nope --quiet && expect tok_field2 "bad.jsonl:1: no string field \"nope\""

# 4. a vocabulary past 65536 gives llm.c's Llama-3 shards (uint32, magic 20240801)
sed 's/"id": 1000,/"id": 70000,/' "$TD/gpt2.json" >"$TMP/wide.json"
run tok_wide 0 "$BIN" tokenize "$TD/multilingual.txt" --tokenizer "$TMP/wide.json" \
  --out "$TMP/t5" --val-frac 0 --quiet && expect tok_wide "32-bit tokens"
{ echo 70000; tr ' ' '\n' <"$TD/gpt2.multilingual.ids" | grep -v '^$' | sed 's/^1000$/70000/'; } >"$TMP/want5"
[ "$(header "$TMP/t5/train_000000.bin")" = "20240801 7 $(wc -l <"$TMP/want5")" ] &&
  tokens "$TMP/t5/train_000000.bin" 4 | cmp -s - "$TMP/want5" &&
  pass "32-bit shard: header and ids" || fail "32-bit shard: $(header "$TMP/t5/train_000000.bin")"

# 5. refusals: existing shards, a bad tokenizer, a missing input, no --out
run tok_exists 2 "$BIN" tokenize "$TD/shakespeare.txt" --tokenizer "$TD/gpt2.json" --out "$TMP/t1" &&
  expect tok_exists "already holds shards"
echo '{"model": {"type": "Unigram"}}' >"$TMP/uni.json"
run tok_badtok 2 "$BIN" tokenize "$TD/shakespeare.txt" --tokenizer "$TMP/uni.json" --out "$TMP/t6" &&
  expect tok_badtok "uni.json: model type \"Unigram\" is not supported"
run tok_missing 2 "$BIN" tokenize "$TMP/nope.txt" --tokenizer "$TD/gpt2.json" --out "$TMP/t6" &&
  expect tok_missing "nope.txt' is not a readable file"
run tok_noout 2 "$BIN" tokenize "$TD/shakespeare.txt" --tokenizer "$TD/gpt2.json" &&
  expect tok_noout "--out DIR is required"
[ ! -e "$TMP/t6" ] && pass "refused runs create nothing" || fail "a refused run created $TMP/t6"

# --text: the ids of one string, as tokenizers gives them (the multilingual sample ends without
# a newline, so $(cat) passes it whole)
run tok_text 0 "$BIN" tokenize --tokenizer "$TD/qwen2.json" --text "$(cat "$TD/multilingual.txt")" &&
  expect tok_text "^ids: $(cat "$TD/qwen2.multilingual.ids")\$"
# a model directory stands for its tokenizer.json
mkdir -p "$TMP/model" && cp "$TD/gpt2.json" "$TMP/model/tokenizer.json"
run tok_dir 0 "$BIN" tokenize --tokenizer "$TMP/model" --text "x" && expect tok_dir "^ids: 87$"
run tok_nodir 2 "$BIN" tokenize --tokenizer "$TMP/t1" --text "x" &&
  expect tok_nodir "cannot open $TMP/t1/tokenizer.json"
run tok_text2 0 "$BIN" tokenize --tokenizer "$TD/llama3.json" --text "Hi<|eot_id|>" &&
  expect tok_text2 'pieces: "H" "i" "<|eot_id|>"'

# 6. train on the fly: the vocabulary comes from the tokenizer; a smaller one is refused
SMALL="--preset tiny --layers 1 --dim 32 --heads 2 --mlp-hidden 64 --batch 2 --seq-len 16 --val-every 0 --quiet"
run train_tok 0 "$BIN" train $SMALL --steps 2 --data "$TD/shakespeare.txt" \
  --tokenizer "$TD/gpt2.json" --out "$TMP/run"
grep -Eq '"vocab_size":[[:space:]]*1001' "$TMP/run/config.json" && pass "train: vocab 1001 from the tokenizer" ||
  fail "train: the model's vocab is not the tokenizer's: $(grep -Eo '"vocab_size":[[:space:]]*[0-9]*' "$TMP/run/config.json")"
run train_small 2 "$BIN" train $SMALL --steps 2 --vocab 512 --data "$TD/shakespeare.txt" \
  --tokenizer "$TD/gpt2.json" --out "$TMP/run2" &&
  expect train_small "has 1001 tokens but the model's vocabulary is 512"
run train_shards 0 "$BIN" train $SMALL --steps 2 --data "$TMP/t2/train_*.bin" \
  --val-data "$TMP/t2/val_*.bin" --vocab 1001 --out "$TMP/run3"

# 7. eval and generate: the run's tokenizer by default; a text prompt, decoded text out
CK=$TMP/run/checkpoints/step_000002
run eval_tok 0 "$BIN" eval "$CK" --batches 2 && expect eval_tok "through tokenizer '$TD/gpt2.json'"
run gen 0 "$BIN" generate "$CK" --prompt "ROMEO: café 😀" --tokens 5 --temperature 0 --print-tokens &&
  expect gen "^ROMEO: café 😀"
run gen_tok 0 "$BIN" generate "$CK" --prompt "ROMEO:" --tokens 5 --tokenizer "$TMP/model" &&
  expect gen_tok "^ROMEO:"

echo "tokenize_cli: $fails failed"
[ "$fails" -eq 0 ]
