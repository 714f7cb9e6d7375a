#!/usr/bin/env bash
# scripts/install-deps.sh decides by what links, not by which headers exist. A machine is
# modelled by a stand-in C compiler whose headers and libraries are the files under a fake
# root (it fails like gcc/ld: "fatal error: X.h: No such file", "cannot find -lX"), and
# stand-in apt-get/sudo/mpicc/mpirun/protoc-c on PATH; the real system is never touched.
# Cases: a machine with the reference BLAS (cblas.h and libblas.so, no libopenblas) must get
# libopenblas-openmp-dev; --check installs nothing; an install that fixes it passes; one that
# does not fails loudly; and the real compiler of this machine passes --check when everything
# is installed.
set -u
SUITE=install_deps
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SCRIPT="$ROOT/scripts/install-deps.sh"
TMP=$(mktemp -d /tmp/fp8t_install_deps.XXXXXX)
trap 'rm -rf "$TMP"' EXIT

pass() { echo "PASS $SUITE: $1"; }
fail() { echo "FAIL $SUITE: $1: $2"; }

# make_machine DIR LIB...: headers of every library, the given libraries (lib<name>.so), and
# the stand-in tools
make_machine() {
  local m=$1
  shift
  mkdir -p "$m/include/cjson" "$m/include/protobuf-c" "$m/lib" "$m/bin"
  # the reference BLAS's cblas.h (Debian's libblas-dev installs one)
  : >"$m/include/cblas.h"
  : >"$m/include/cjson/cJSON.h"
  : >"$m/include/pcre2.h"
  : >"$m/include/protobuf-c/protobuf-c.h"
  : >"$m/include/mpi.h"
  for l in "$@"; do : >"$m/lib/lib$l.so"; done
  cat >"$m/bin/cc" <<'EOF'
#!/bin/sh
# stand-in C compiler: reads the program from stdin (-x c -), needs every #include <h> under
# $M/include and every -lX as $M/lib/libX.so
M=$(cd "$(dirname "$0")/.." && pwd)
echo "cc $*" >>"$M/cc.log"
src=$(cat)
for h in $(printf '%s\n' "$src" | sed -n 's/^#include <\(.*\)>.*/\1/p'); do
  [ -e "$M/include/$h" ] || { echo "<stdin>:1:10: fatal error: $h: No such file or directory" >&2; exit 1; }
done
for a in "$@"; do
  case $a in
    -l*) [ -e "$M/lib/lib${a#-l}.so" ] || { echo "/usr/bin/ld: cannot find $a: No such file or directory" >&2; exit 1; } ;;
  esac
done
exit 0
EOF
  cat >"$m/bin/mpicc" <<'EOF'
#!/bin/sh
M=$(cd "$(dirname "$0")/.." && pwd)
exec "$M/bin/cc" "$@" -lmpi
EOF
  : >"$m/lib/libmpi.so"
  printf '#!/bin/sh\nexit 0\n' >"$m/bin/mpirun"
  printf '#!/bin/sh\nexit 0\n' >"$m/bin/protoc-c"
  # apt-get: records its arguments; "install" runs $M/on_install (the package's effect)
  cat >"$m/bin/apt-get" <<'EOF'
#!/bin/sh
M=$(cd "$(dirname "$0")/.." && pwd)
echo "apt-get $*" >>"$M/apt.log"
case " $* " in *" install "*) [ -x "$M/on_install" ] && "$M/on_install" ;; esac
exit 0
EOF
  printf '#!/bin/sh\nexec "$@"\n' >"$m/bin/sudo"
  chmod +x "$m/bin/"*
}

# the few system tools the script and the stand-ins use, alone on PATH: so a tool this
# machine happens to have (mpirun, protoc-c) cannot answer for the modelled machine
SYSBIN="$TMP/sysbin"
mkdir -p "$SYSBIN"
for t in bash sh env mktemp grep sed head rm id cat dirname; do
  p=$(command -v "$t") && ln -s "$p" "$SYSBIN/$t"
done

# run_script MACHINE ARGS...: the script on the machine; output in $out, status in $rc
run_script() {
  local m=$1
  shift
  out=$(PATH="$m/bin:$SYSBIN" CC="$m/bin/cc" MPICC="$m/bin/mpicc" "$SCRIPT" "$@" 2>&1)
  rc=$?
}

# --- 1. reference BLAS only: cblas.h is there, -lopenblas is not
M1="$TMP/refblas"
make_machine "$M1" blas cjson pcre2-8 protobuf-c
run_script "$M1" --check
if [ $rc -ne 1 ]; then
  fail header_only_blas_check "exit status $rc, expected 1: $out"
elif ! grep -q -- "-lopenblas does not link (/usr/bin/ld: cannot find -lopenblas" <<<"$out" ||
     ! grep -q "would install libopenblas-openmp-dev" <<<"$out"; then
  fail header_only_blas_check "no '-lopenblas does not link ... would install libopenblas-openmp-dev': $out"
elif [ "$(grep -c "would install" <<<"$out")" -ne 1 ]; then
  fail header_only_blas_check "asked for more than OpenBLAS: $out"
elif [ -e "$M1/apt.log" ]; then
  fail header_only_blas_check "--check ran apt-get: $(cat "$M1/apt.log")"
elif ! grep -q -- "-lopenblas" "$M1/cc.log"; then
  fail header_only_blas_check "the compiler was never asked to link -lopenblas"
else
  pass header_only_blas_check
fi

# --- 2. the same machine, installing: apt-get is asked for exactly that package, and the
#        install (which puts libopenblas.so in place) is verified by linking again
cat >"$M1/on_install" <<EOF
#!/bin/sh
: >"$M1/lib/libopenblas.so"
EOF
chmod +x "$M1/on_install"
run_script "$M1"
if [ $rc -ne 0 ]; then
  fail header_only_blas_install "exit status $rc: $out"
elif ! grep -q "^apt-get install .*libopenblas-openmp-dev" "$M1/apt.log" 2>/dev/null; then
  fail header_only_blas_install "apt-get was not asked for libopenblas-openmp-dev: $(cat "$M1/apt.log" 2>/dev/null)"
elif grep "^apt-get install" "$M1/apt.log" | grep -qE "libcjson|libpcre2|protobuf|openmpi"; then
  fail header_only_blas_install "apt-get was asked for packages that were present: $(cat "$M1/apt.log")"
elif ! grep -q "fp8train: -lopenblas does not link .*: installing libopenblas-openmp-dev" <<<"$out"; then
  fail header_only_blas_install "no 'installing ... because' line: $out"
else
  pass header_only_blas_install
fi

# --- 3. an install that does not provide the library: a clear failure, not a silent pass
M3="$TMP/broken"
make_machine "$M3" blas cjson pcre2-8 protobuf-c
printf '#!/bin/sh\nexit 0\n' >"$M3/on_install"
chmod +x "$M3/on_install"
run_script "$M3"
if [ $rc -eq 0 ]; then
  fail install_not_effective "exit status 0 although -lopenblas still does not link: $out"
elif ! grep -q "after installing libopenblas-openmp-dev: -lopenblas does not link" <<<"$out"; then
  fail install_not_effective "no 'after installing ...' message: $out"
else
  pass install_not_effective
fi

# --- 4. every library, tool and header present: nothing to do
M4="$TMP/complete"
make_machine "$M4" openblas cjson pcre2-8 protobuf-c
run_script "$M4" --check
if [ $rc -eq 0 ] && ! grep -q "would install" <<<"$out"; then pass complete_machine
else fail complete_machine "exit status $rc: $out"; fi

# --- 5. a missing tool (mpirun) and a missing library header (cJSON) are each named
M5="$TMP/partial"
make_machine "$M5" openblas cjson pcre2-8 protobuf-c
rm "$M5/bin/mpirun" "$M5/include/cjson/cJSON.h"
run_script "$M5" --check
if [ $rc -eq 1 ] && grep -q "mpirun is not on PATH: would install openmpi-bin" <<<"$out" &&
   grep -q "\-lcjson does not link (.*cJSON.h: No such file.*would install libcjson-dev" <<<"$out"; then
  pass partial_machine
else
  fail partial_machine "exit status $rc: $out"
fi

# --- 6. this machine's real compiler: the link programs are valid C and link here
if out=$("$SCRIPT" --check 2>&1); then
  pass real_compiler_check
elif grep -q "would install" <<<"$out"; then
  echo "SKIP $SUITE: real_compiler_check: this machine lacks packages the build links ($(grep "would install" <<<"$out" | tr '\n' ' '))"
else
  fail real_compiler_check "$out"
fi
