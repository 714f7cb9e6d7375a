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

# check_symbols OBJDIR [EXTRA_OBJ FOLDER]: prints "FOLDER -> UPPER symbol" for each upward call
check_symbols() {
  python3 - "$1" "$ORDER" "${2:-}" "${3:-}" <<'PY'
import os, subprocess, sys
objdir, order, extra, extra_folder = sys.argv[1], sys.argv[2].split(), sys.argv[3], sys.argv[4]
objs = []
for root, _, files in os.walk(objdir):
    for fn in files:
        if not fn.endswith(".o"):
            continue
        rel = os.path.relpath(os.path.join(root, fn), objdir)[:-2]
        if not any(os.path.exists(os.path.join("src", rel + ext)) for ext in (".c", ".cu")):
            continue  # stale: its source moved or went away
        objs.append((rel.split("/")[0], os.path.join(root, fn)))
if extra:
    objs.append((extra_folder, extra))
defined, undef = {}, []
for folder, o in objs:
    out = subprocess.run(["nm", "-P", o], capture_output=True, text=True).stdout
    for line in out.splitlines():
        p = line.split()
        if len(p) < 2:
            continue
        if p[1] in "TDBR":
            defined[p[0]] = folder
        elif p[1] == "U":
            undef.append((folder, p[0]))
rank = {f: i for i, f in enumerate(order)}
bad = sorted({(f, defined[s], s) for f, s in undef
              if s in defined and defined[s] != f and f in rank and defined[s] in rank
              and rank[defined[s]] > rank[f]})
for f, d, s in bad:
    print(f"{f} -> {d} {s}")
print(f"# {len(objs)} objects", file=sys.stderr)
PY
}

up=$(check_symbols "$OBJ" 2>/dev/null)
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
  up=$(check_symbols "$OBJ" "$TMP/planted.o" model 2>/dev/null)
  if echo "$up" | grep -q "^model -> train fp8t_train_config_default"; then
    pass "a planted model -> train call is caught"
  else fail "a planted model -> train call is caught" "got: $up"; fi
else
  fail "a planted model -> train call is caught" "cannot compile the planted object"
fi
