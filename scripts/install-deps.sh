#!/usr/bin/env bash
# Installs the Debian packages fp8train builds and links against, when what the build LINKS is
# missing. Each library is checked by compiling and linking a small program that calls it (the
# way the Makefile links), not by looking for a header: a header can come from another package
# (Debian's reference BLAS, libblas-dev, provides cblas.h but no -lopenblas), and then the build
# would fail at the link although a header check said all was well.
#
#   OpenBLAS  -lopenblas (libopenblas-openmp-dev)       CPU GEMMs; the reference BLAS does not do
#   cJSON     -lcjson (libcjson-dev)                    JSON
#   PCRE2     -lpcre2-8 (libpcre2-dev)                  tokenizer pre-split regex
#   protobuf-c -lprotobuf-c + protoc-c (libprotobuf-c-dev, protobuf-c-compiler)
#   OpenMPI   mpicc links an MPI program + mpirun (libopenmpi-dev, openmpi-bin)
#   cuDNN     (optional, reported only) part of the CUDA toolkit: cudnn.h + libcudnn.so
#
# usage: scripts/install-deps.sh [--check] [--with-browser]
#   --check         report only: say what is missing and which package would provide it; exit 1
#                   when something is missing, 0 when nothing is. Installs and writes nothing.
#   --with-browser  also chromium (used to screenshot HTML reports)
# environment: CC (the C compiler of the link tests; default cc, as make's), MPICC (default mpicc)
set -euo pipefail

CC=${CC:-cc}
MPICC=${MPICC:-mpicc}
check=0
browser=0
for a in "$@"; do
  case $a in
    --check) check=1 ;;
    --with-browser) browser=1 ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "install-deps.sh: unknown option '$a' (expected --check or --with-browser)" >&2; exit 2 ;;
  esac
done

if ! command -v "${CC%% *}" >/dev/null 2>&1; then
  echo "fp8train: the C compiler '$CC' is not on PATH: install gcc (apt-get install gcc), or set CC" >&2
  exit 2
fi
TMPD=$(mktemp -d "${TMPDIR:-/tmp}/fp8t_deps.XXXXXX")
trap 'rm -rf "$TMPD"' EXIT

# The link-test programs: each calls a function of the library, so the linker must resolve it
# in the library named on the command line. openblas_get_num_threads exists only in OpenBLAS:
# a -lopenblas that is some other BLAS under that name fails too.
PROG_OPENBLAS='#include <cblas.h>
int openblas_get_num_threads(void);
int main(void) {
    float a = 1, b = 1, c = 0;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1, 1, 1, 1.0f, &a, 1, &b, 1, 0.0f, &c, 1);
    return openblas_get_num_threads() < 1;
}'
PROG_CJSON='#include <cjson/cJSON.h>
int main(void) { cJSON *j = cJSON_Parse("1"); cJSON_Delete(j); return 0; }'
PROG_PCRE2='#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
int main(void) {
    int e; PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)"a+", PCRE2_ZERO_TERMINATED, 0, &e, &off, NULL);
    pcre2_code_free(re);
    return 0;
}'
PROG_PROTOBUF_C='#include <protobuf-c/protobuf-c.h>
int main(void) { return protobuf_c_version()[0] == 0; }'
PROG_MPI='#include <mpi.h>
int main(int argc, char **argv) { MPI_Init(&argc, &argv); MPI_Finalize(); return 0; }'

# links NAME PROGRAM COMPILER ARGS...: 0 when PROGRAM compiles and links; else 1, with the
# compiler's first error line in $why
links() {
  local name=$1 prog=$2 compiler=$3
  shift 3
  why=""
  # $compiler unquoted: CC may be "ccache gcc"
  if printf '%s\n' "$prog" | $compiler -x c - -o "$TMPD/$name" "$@" >"$TMPD/$name.log" 2>&1; then
    return 0
  fi
  why=$(grep -m1 -E 'error|cannot find|undefined reference|not found' "$TMPD/$name.log" || true)
  [ -n "$why" ] || why=$(head -n1 "$TMPD/$name.log")
  [ -n "$why" ] || why="$compiler failed"
  return 1
}

need=()
missing=()
verb=installing
[ $check -eq 1 ] && verb="would install"
# want PACKAGE WHAT: PACKAGE provides WHAT, which is missing (each package once)
want() {
  missing+=("$2")
  local p
  for p in "${need[@]+"${need[@]}"}"; do [ "$p" = "$1" ] && return 0; done
  need+=("$1")
  echo "fp8train: $2: $verb $1"
}

run_checks() {
  need=()
  missing=()
  links openblas "$PROG_OPENBLAS" "$CC" -lopenblas ||
    want libopenblas-openmp-dev "-lopenblas does not link ($why)"
  links cjson "$PROG_CJSON" "$CC" -lcjson || want libcjson-dev "-lcjson does not link ($why)"
  links pcre2 "$PROG_PCRE2" "$CC" -lpcre2-8 || want libpcre2-dev "-lpcre2-8 does not link ($why)"
  links protobuf-c "$PROG_PROTOBUF_C" "$CC" -lprotobuf-c ||
    want libprotobuf-c-dev "-lprotobuf-c does not link ($why)"
  command -v protoc-c >/dev/null 2>&1 ||
    want protobuf-c-compiler "protoc-c (the protobuf-c code generator) is not on PATH"
  if ! command -v "${MPICC%% *}" >/dev/null 2>&1; then
    want libopenmpi-dev "$MPICC (the MPI compiler wrapper) is not on PATH"
  elif ! links mpi "$PROG_MPI" "$MPICC"; then
    want libopenmpi-dev "$MPICC does not link an MPI program ($why)"
  fi
  command -v mpirun >/dev/null 2>&1 || want openmpi-bin "mpirun is not on PATH"
  if [ $browser -eq 1 ]; then
    command -v chromium >/dev/null 2>&1 || want chromium "chromium is not on PATH"
  fi
  return 0
}

run_checks
# cuDNN (optional; the CUDA backend's fused attention) ships with the CUDA toolkit: nothing to
# install, only say whether the Makefile will find it (the same test: cudnn.h + libcudnn.so)
nvcc_path=$(command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
if [ -n "$nvcc_path" ]; then
  cuda_home=${CUDA_HOME:-${nvcc_path%/bin/nvcc}}
  if [ -f "$cuda_home/include/cudnn.h" ] &&
     { [ -e "$cuda_home/lib64/libcudnn.so" ] || [ -e "$cuda_home/lib/libcudnn.so" ]; }; then
    echo "fp8train: cuDNN found in $cuda_home (CUDA attention uses its fused attention at head size 128)"
  else
    echo "fp8train: cuDNN not found in $cuda_home (optional: CUDA attention runs the flash kernels only)"
  fi
fi
if [ ${#need[@]} -eq 0 ]; then
  [ $check -eq 1 ] && echo "fp8train: every library the build links is present (CC=$CC, MPICC=$MPICC)"
  exit 0
fi
[ $check -eq 1 ] && exit 1

echo "fp8train: installing ${need[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq || true
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"

# the packages are in; what they should have fixed must now work, or the build fails later
# with a less clear message
installed=("${need[@]}")
run_checks >/dev/null
if [ ${#missing[@]} -gt 0 ]; then
  for m in "${missing[@]}"; do
    echo "fp8train: after installing ${installed[*]}: $m" >&2
  done
  echo "fp8train: install the packages above by hand, or set CC/MPICC to the compilers to use" >&2
  exit 1
fi
