#!/usr/bin/env bash
# Runs every test program given on the command line, prints their output, and ends with the
# line "N passed, N failed". A program that crashes or exits nonzero without a FAIL line
# counts as one failure. Exit status: 0 only if nothing failed.
set -u
# Tests share 2 cores with each other and with builds: idle OpenMP threads must not spin.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
passed=0; failed=0; crashed=()
log=$(mktemp /tmp/fp8t_run.XXXXXX)
trap 'rm -f "$log"' EXIT
for t in "$@"; do
  name=$(basename "$t")
  echo "== $name"
  start=$(date +%s)
  # shown as it comes (long tests print progress), and kept for the counts
  "$t" 2>&1 | tee "$log"; rc=${PIPESTATUS[0]}
  p=$(grep -c '^PASS ' "$log"); f=$(grep -c '^FAIL ' "$log")
  passed=$((passed + p)); failed=$((failed + f))
  if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then
    echo "FAIL $name: exited with status $rc"; failed=$((failed + 1)); crashed+=("$name")
  fi
  echo "   ($name: $(( $(date +%s) - start ))s)"
done
[ ${#crashed[@]} -gt 0 ] && echo "crashed: ${crashed[*]}"
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
