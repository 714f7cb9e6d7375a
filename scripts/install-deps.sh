#!/usr/bin/env bash
# Installs the Debian packages fp8train builds against, if they are missing.
#   OpenBLAS (OpenMP flavour) for CPU GEMMs, cJSON for JSON, OpenMPI for data parallel.
# Optional: --with-browser also installs chromium (used to screenshot HTML reports).
set -euo pipefail
need=()
[ -f /usr/include/x86_64-linux-gnu/cblas.h ] || [ -f /usr/include/cblas.h ] || [ -f /usr/include/openblas/cblas.h ] || need+=(libopenblas-openmp-dev)
[ -f /usr/include/cjson/cJSON.h ] || need+=(libcjson-dev)
# OpenMPI: data parallel (mpirun -np N fp8train train ...; tests/test_dp.sh runs N = 2)
command -v mpicc >/dev/null 2>&1 || need+=(libopenmpi-dev openmpi-bin)
if [ "${1:-}" = "--with-browser" ]; then
  command -v chromium >/dev/null 2>&1 || need+=(chromium)
fi
[ ${#need[@]} -eq 0 ] && exit 0
echo "fp8train: installing missing packages: ${need[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq || true
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
