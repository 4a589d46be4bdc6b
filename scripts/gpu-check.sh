#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU: build with CUDA, run the gpu-labelled tests
# (which skip without a GPU) and the rest of the suite, and print what the device is.
# Used through the device tool as one prepared call; also fine on any GPU workstation.
#   scripts/gpu-check.sh            LibTorch from the torch virtualenv (scripts/setup.sh)
#   DSTRAIN_TORCH_PREFIX=/path ...  use another LibTorch (e.g. a preinstalled torch's cmake prefix)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
out="${OUT:-$DSTRAIN_ROOT/build-gpu}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$out/gpu.txt" || true

prefix="${DSTRAIN_TORCH_PREFIX:-}"
if [ -z "$prefix" ]; then
  py="$DSTRAIN_VENV/bin/python"; [ -x "$py" ] || py=python3
  prefix="$("$py" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')"
fi
build="$DSTRAIN_ROOT/build-gpu"
cmake -S "$DSTRAIN_ROOT" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" -DDSTRAIN_CUDA=ON >/dev/null
cmake --build "$build" -j "$(nproc)" 2>&1 | tail -3
"$build/dstrain" --version | tee -a "$out/gpu.txt"
"$build/dstrain" check-env --local | tee -a "$out/gpu.txt"
cd "$build"
ctest --output-on-failure -L gpu 2>&1 | tee "$out/ctest-gpu.txt"
ctest --output-on-failure -LE gpu 2>&1 | tail -15 | tee "$out/ctest-rest.txt"
