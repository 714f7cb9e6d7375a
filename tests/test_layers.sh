#!/usr/bin/env bash
# The layers run one way (README's "Layout"): util -> numerics -> backend -> model -> io ->
# instrument -> train -> tools -> cli, each folder of src/ calling and including only the
# folders before it.
#   - symbols: every undefined symbol of a folder's object files that another folder defines
#     is defined by an earlier folder (nm over the build's objects, the ones whose source
#     still exists);
#   - private headers: no file includes another folder's private header ("train/...") from a
#     later folder;
#   - the check itself: a planted upward call is caught.
set -u
BIN=${FP8TRAIN_BIN:-build/fp8train}
SUITE=layers
pass() { echo "PASS $SUITE: $1"; }
fail() { echo "FAIL $SUITE: $1: $2"; }
cd "$(dirname "$0")/.."
OBJ=$(dirname "$BIN")/src
if [ ! -d "$OBJ" ] || ! command -v nm >/dev/null; then
  echo "SKIP $SUITE: no object files under $OBJ (or no nm): build with make first"
  exit 0
fi
ORDER="util numerics backend model io instrument train tools cli"

# check_symbols BUILD [EXTRA_OBJ FOLDER]: "FOLDER -> LATER symbol" for each call into a later
# folder (scripts/layer_graph.py, which also prints the whole graph)
check_symbols() { python3 scripts/layer_graph.py --check "$@"; }

up=$(check_symbols "$(dirname "$BIN")" 2>/dev/null)
if [ -z "$up" ]; then pass "no folder calls a later one ($ORDER)"
else fail "calls into later folders" "$(echo "$up" | head -10 | tr '\n' ';')"; fi

# private headers: "F/..." included from a folder before F
bad_inc=""
for f in $ORDER; do
  [ -d "src/$f" ] || continue
  later=0
  for g in $ORDER; do
    if [ "$g" = "$f" ]; then later=1; continue; fi
    [ $later = 1 ] || continue
    hits=$(grep -rln "#include \"$g/" "src/$f" 2>/dev/null)
    [ -n "$hits" ] && bad_inc="$bad_inc $(echo "$hits" | tr '\n' ' ')(includes $g/)"
  done
done
if [ -z "$bad_inc" ]; then pass "no private header of a later folder is included"
else fail "private headers of later folders" "$bad_inc"; fi

# the check catches an upward call: a model object that calls a train function
TMP=$(mktemp -d /tmp/fp8t_layers.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
printf 'int fp8t_train_config_default(void *);\nint planted(void) { return fp8t_train_config_default(0); }\n' \
  >"$TMP/planted.c"
if cc -c -o "$TMP/planted.o" "$TMP/planted.c" 2>/dev/null; then
  up=$(check_symbols "$(dirname "$BIN")" "$TMP/planted.o" model 2>/dev/null)
  if echo "$up" | grep -q "^model -> train fp8t_train_config_default"; then
    pass "a planted model -> train call is caught"
  else fail "a planted model -> train call is caught" "got: $up"; fi
else
  fail "a planted model -> train call is caught" "cannot compile the planted object"
fi
