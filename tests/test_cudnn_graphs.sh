#!/usr/bin/env bash
# The cuDNN SDPA operation graphs of the CUDA backend's attention (cuda_attention_cudnn.cu)
# finalize on this machine: build/dev/cuda/attn_cudnn_graphs builds every tensor, operation and
# the operation graph for the forward and both backward forms at the backend's shapes and lets
# cuDNN check them on the host (no GPU needed). Whether an engine then takes them needs the GPU
# (make gpu-test, build/gpu_test --attn-bench). SKIP where the build has no cuDNN.
set -u
SUITE=cudnn_graphs
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN_DIR=$(dirname "${FP8TRAIN_BIN:-$ROOT/build/fp8train}")
TOOL="$BIN_DIR/dev/cuda/attn_cudnn_graphs"
if [ ! -x "$TOOL" ]; then
  # make test builds it when nvcc and cuDNN are there
  echo "SKIP $SUITE: no $TOOL (the build has no nvcc or no cuDNN)"
  exit 0
fi
out=$("$TOOL" 2>&1); rc=$?
n_ok=$(grep -c '^ok ' <<<"$out"); n_bad=$(grep -c '^FAIL ' <<<"$out")
if [ $rc -eq 0 ] && [ "$n_bad" -eq 0 ] && [ "$n_ok" -gt 0 ]; then
  echo "PASS $SUITE: $n_ok graphs finalize ($(head -1 <<<"$out"))"
else
  echo "FAIL $SUITE: $n_bad of $((n_ok + n_bad)) graphs did not finalize (exit $rc)"
  grep -v '^ok ' <<<"$out" | sed 's/^/    /'
fi
