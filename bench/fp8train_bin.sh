# shellcheck shell=bash
# Sourced by the bench drivers, from the repository root: BIN, the fp8train binary
# (FP8TRAIN_BIN, else build-gpu/fp8train where scripts/gpu-session.sh prepared it, else
# build/fp8train), and the runtime libraries gpu-session.sh carries (.gpulibs: cJSON,
# protobuf-c) on the library path when they are there.
BIN=${FP8TRAIN_BIN:-}
if [ -z "$BIN" ]; then
  if [ -x build-gpu/fp8train ]; then BIN=build-gpu/fp8train; else BIN=build/fp8train; fi
fi
if [ -d .gpulibs ]; then
  export LD_LIBRARY_PATH=$PWD/.gpulibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
