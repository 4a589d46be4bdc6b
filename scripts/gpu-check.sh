#!/usr/bin/env bash
# The GPU check (issue 12), one command on a machine with an NVIDIA GPU (the lent H200 through
# the device tool, or any GPU workstation): build against that machine's LibTorch with CUDA on
# for its architecture, run the gpu-labelled tests, the GPU benchmarks, and print a short table
# last. Full logs go to $OUT (the device tool brings them back) or build-gpu/.
#   scripts/gpu-prepare.sh (here, first)  ->  device: bash scripts/gpu-check.sh  (carry: .gpu-deps)
#   DSTRAIN_TORCH_PREFIX=/path ...  another LibTorch cmake prefix; DSTRAIN_CUDA_ARCH=90 (default: the GPU's)
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${OUT:-$root/build-gpu/out}"
build="$root/build-gpu"
mkdir -p "$out" "$build"
start=$SECONDS
step() { printf '\n== %s (%d s)\n' "$*" $((SECONDS - start)) | tee -a "$out/gpu-check.log"; }

step "device"
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv 2>&1 | tee "$out/gpu.txt"
arch="${DSTRAIN_CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d '.')}"
arch="${arch:-90}"

step "configure (LibTorch of this machine's python3, CUDA arch sm_$arch)"
prefix="${DSTRAIN_TORCH_PREFIX:-}"
if [ -z "$prefix" ]; then
  py="python3"
  [ -x "${DSTRAIN_VENV:-/nonexistent}/bin/python" ] && py="$DSTRAIN_VENV/bin/python"
  prefix="$("$py" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')" || { echo "no torch found" | tee -a "$out/gpu-check.log"; exit 1; }
fi
deps=""
[ -d "$root/.gpu-deps/root/usr" ] && deps=";$root/.gpu-deps/root/usr"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=$prefix$deps" -DDSTRAIN_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" -DTORCH_CUDA_ARCH_LIST="$((arch / 10)).$((arch % 10))" > "$out/configure.log" 2>&1 ||
  { tail -30 "$out/configure.log"; exit 1; }
grep -E "dstrain: CUDA kernels" "$out/configure.log" | tee -a "$out/gpu-check.log"

step "build"
cmake --build "$build" -j "$(nproc)" > "$out/build.log" 2>&1 || { grep -E "error|FAILED" -A3 "$out/build.log" | head -40; exit 1; }
"$build/dstrain" --version | tee -a "$out/gpu-check.log"
"$build/dstrain" check-env --local --skip disk > "$out/check-env.txt" 2>&1
grep -E "gpu|cuda|nccl|cudnn" "$out/check-env.txt" | tee -a "$out/gpu-check.log"

step "gpu tests"
(cd "$build" && ctest --output-on-failure -L gpu > "$out/ctest-gpu.log" 2>&1)
gpu_tests=$?
tail -8 "$out/ctest-gpu.log"

step "gpu benchmarks"
bench_status=0
if [ -x "$build/dstrain" ]; then
  "$build/dstrain" bench comm --backend nccl --nproc-per-node 1 --max-bytes 268435456 > "$out/bench-nccl.log" 2>&1 || bench_status=$?
  # Fused AdamW against a device-to-device copy moving the same bytes, in the same process.
  "$build/dstrain" bench optimizer --device cuda --params 200000000 --iters 20 > "$out/bench-adam.log" 2>&1 || bench_status=$?
  cat "$out/bench-adam.log"
  # Training tokens/s and MFU: deepseek-coder-1.3b and a small MoE, bf16 ZeRO-0 on one GPU.
  timeout 300 bash "$root/scripts/bench-gpu-train.sh" "$build/dstrain" 25 > "$out/bench-train.md" 2>&1 || bench_status=$?
  cat "$out/bench-train.md"
fi

step "summary"
{
  echo "| check | result |"
  echo "|---|---|"
  echo "| device | $(head -2 "$out/gpu.txt" | tail -1) |"
  echo "| build | sm_$arch, $(grep -c . "$out/build.log") log lines |"
  echo "| gpu tests | $(grep -cE "Test +#.* Passed" "$out/ctest-gpu.log") passed, $(grep -cE "Test +#.*\*\*\*Skipped|Test +#.* Skipped" "$out/ctest-gpu.log") skipped, $(grep -cE "Test +#.*(\*\*\*Failed|Timeout|Exception)" "$out/ctest-gpu.log") failed |"
  echo "| nccl bench | $( [ $bench_status -eq 0 ] && grep -E "^ *268435456" "$out/bench-nccl.log" | head -1 || echo "failed ($bench_status)") |"
  echo "| fused AdamW (200M fp32 params) | $(tail -1 "$out/bench-adam.log" 2>/dev/null) |"
  echo "| wall time | $((SECONDS - start)) s |"
  echo
  grep "^|" "$out/bench-train.md" 2>/dev/null
} | tee "$out/summary.md"
exit $gpu_tests
