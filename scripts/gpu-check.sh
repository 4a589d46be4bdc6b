#!/usr/bin/env bash
# The GPU check (issues 12, 17), one command on a machine with an NVIDIA GPU (the lent H200
# through the device tool, or any GPU workstation). Builds dstrain against that machine's
# LibTorch with CUDA on (-g1, so that backtraces have names) and checks that no C++ runtime
# symbol binds to libtorch.so (scripts/check-link.sh); then, each phase under its own time limit
# and all inside DSTRAIN_GPU_CHECK_BUDGET_S (default 480 s):
#   exit      does every process end cleanly? the demo (pruning checkpoints) on the GPU and on
#             the CPU of this build, and the NCCL check: a crash is named with its backtrace;
#   offload   the offloaded (CPU) optimizer against Adam on the device, fp32 and bf16, one chunk
#             and many (not in the default set: a diagnosis);
#   tests     the gpu-labelled CTest tests (gpu.kernels, gpu.nccl, gpu.train, gpu.newer_paths: validation,
#             fine-tuning and MTP against their CPU twins);
#   bench     the NCCL, fused-Adam and MoE-expert benchmarks, and training tokens/s (when time is left);
#   generate-bench  issue 61's row (not in the default set): generation's tokens/s with the key/value
#             cache against transformers' generate, bf16 (scripts/bench-generate.sh);
#   offload-bench  issue 23's rows (a call of its own; not in the default set): the host's CPU Adam
#             against its bandwidth, 1.3B ZeRO-3 + offload at accumulation 8 against ZeRO-0, full
#             recompute at 4 x 4096, deepseek-llm-7b with the optimizer and parameters offloaded.
# Every crash leaves a core (core_pattern and ulimit -c, when allowed) whose backtrace cuda-gdb
# prints into the logs. The summary table comes last; 4 files come back in $OUT: summary.md,
# gpu-check.log, logs.tar.gz (every other log), gpu.txt.
#   scripts/gpu-prepare.sh (here, first)  ->  device: bash scripts/gpu-check.sh  (carry: .gpu-deps)
#   DSTRAIN_TORCH_PREFIX=/path ...  another LibTorch cmake prefix; DSTRAIN_CUDA_ARCH=90 (default: the GPU's)
#   DSTRAIN_GPU_CHECK_PHASES="exit tests bench" (the default)
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${OUT:-$root/build-gpu/out}"
build="$root/build-gpu"
logs="$build/check-logs"
cores="$build/cores"
budget="${DSTRAIN_GPU_CHECK_BUDGET_S:-480}"
phases=" ${DSTRAIN_GPU_CHECK_PHASES:-exit tests bench} "
rm -rf "$logs" "$cores"
mkdir -p "$out" "$build" "$logs" "$cores"
start=$SECONDS
declare -a rows
step() { printf '\n== %s (%d s)\n' "$*" $((SECONDS - start)) | tee -a "$out/gpu-check.log"; }
note() { echo "$*" | tee -a "$out/gpu-check.log"; }
row() { rows+=("| $1 | $2 |"); note "$1: $2"; }
left() { echo $((budget - (SECONDS - start))); }
# limit SECONDS CMD...: runs CMD under `timeout`, at most what is left of the budget.
limit() {
  local want=$1 have
  shift
  have=$(left)
  [ "$have" -gt 5 ] || { note "(out of time: skipped $*)"; return 124; }
  timeout -k 5 $((want < have ? want : have)) "$@"
}
pack() {
  cp "$out/gpu-check.log" "$logs/" 2>/dev/null
  tar -C "$build" -czf "$out/logs.tar.gz" --exclude='core.*' check-logs 2>/dev/null
}
summary() {
  step "summary"
  {
    echo "| check | result |"
    echo "|---|---|"
    printf '%s\n' "${rows[@]}"
    echo "| wall time | $((SECONDS - start)) s of $budget |"
    [ -f "$logs/bench-train.md" ] && { echo; grep "^|" "$logs/bench-train.md"; }
  } | tee "$out/summary.md"
  pack
}

# Backtraces of any cores the last command left, then the cores are removed (they are large).
backtraces() {
  local label=$1 core bin
  for core in "$cores"/core.*; do
    [ -e "$core" ] || continue
    bin="$build/dstrain"
    [[ "$core" == *gpu_tes* ]] && bin="$build/test/dstrain_gpu_tests"
    note "core dump after '$label': $(basename "$core") ($(du -h "$core" | cut -f1)); backtrace in $label.backtrace.txt"
    if command -v cuda-gdb > /dev/null; then
      limit 40 cuda-gdb -batch -ex "info threads" -ex "bt 40" -ex "thread apply all bt 16" "$bin" "$core" >> "$logs/$label.backtrace.txt" 2>&1
      grep -m 12 -E "^#[0-9]+ " "$logs/$label.backtrace.txt" | tee -a "$out/gpu-check.log"
    fi
    rm -f "$core"
  done
}
# run_exit LABEL CMD...: a run whose every process must exit 0; a crash is named with its backtrace.
run_exit() {
  local label=$1 status=0
  shift
  limit 120 "$@" > "$logs/$label.log" 2>&1 || status=$?
  local crashes
  crashes=$(grep -hoE "killed by signal [0-9]+ \([A-Z]+\)" "$logs/$label.log" | sort | uniq -c | tr -s ' ' | tr '\n' ';')
  row "exit: $label" "exit $status${crashes:+; workers $crashes}"
  [ $status -eq 0 ] || tail -4 "$logs/$label.log" | tee -a "$out/gpu-check.log"
  backtraces "$label"
  return $status
}

step "device"
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv 2>&1 | tee "$out/gpu.txt"
arch="${DSTRAIN_CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d '.')}"
arch="${arch:-90}"
# Cores for every crash (root on the lent machine; elsewhere this may be refused: then no backtraces).
ulimit -c unlimited 2>/dev/null || note "(ulimit -c refused: no core dumps)"
if echo "$cores/core.%e.%p" > /proc/sys/kernel/core_pattern 2>/dev/null; then note "core dumps to $cores"; else note "(core_pattern not writable: no core dumps)"; fi

step "configure (LibTorch of this machine's python3, CUDA arch sm_$arch, -g1)"
prefix="${DSTRAIN_TORCH_PREFIX:-}"
if [ -z "$prefix" ]; then
  py="python3"
  [ -x "${DSTRAIN_VENV:-/nonexistent}/bin/python" ] && py="$DSTRAIN_VENV/bin/python"
  prefix="$("$py" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')" || { note "no torch found"; summary; exit 1; }
fi
deps=""
[ -d "$root/.gpu-deps/root/usr" ] && deps=";$root/.gpu-deps/root/usr"
limit 120 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS=-g1" "-DCMAKE_PREFIX_PATH=$prefix$deps" -DDSTRAIN_TESTS_REQUIRED=ON -DDSTRAIN_PCH=OFF \
  -DDSTRAIN_CUDA=ON -DDSTRAIN_CUDART=shared -DCMAKE_CUDA_ARCHITECTURES="$arch" -DTORCH_CUDA_ARCH_LIST="$((arch / 10)).$((arch % 10))" \
  > "$logs/configure.log" 2>&1 || { tail -30 "$logs/configure.log"; row configure failed; summary; exit 1; }
grep -E "dstrain: CUDA kernels" "$logs/configure.log" | tee -a "$out/gpu-check.log"

step "build (dstrain and the GPU tests)"
if ! limit 300 cmake --build "$build" -j "$(nproc)" --target dstrain dstrain_gpu_tests > "$logs/build.log" 2>&1; then
  grep -E "error|FAILED" -A3 "$logs/build.log" | head -40
  row build "failed after $((SECONDS - start)) s"
  summary
  exit 1
fi
"$build/dstrain" --version | tee -a "$out/gpu-check.log"
row build "sm_$arch, -g1, $(ldd "$build/dstrain" | grep -oE "libcudart[^ ]*" | sort -u | tr '\n' ' ')"
# No C++ runtime symbol may bind to libtorch.so's copies (issue 17: its std::filesystem::remove_all
# segfaulted every run that pruned a checkpoint, with this machine's static libstdc++).
row "link check" "$("$root/scripts/check-link.sh" "$build/dstrain" 2>&1 | head -3 | tr '\n' ' ')"
"$build/dstrain" check-env --local --skip disk > "$logs/check-env.txt" 2>&1
grep -E "gpu|cuda|nccl|cudnn" "$logs/check-env.txt" | tee -a "$out/gpu-check.log"

cd "$build"
# Checkpoints at 5, 10, 15, 20 with keep_last 2: pruning (remove_all) runs, as it did when it crashed.
demo=(train "$root/recipes/demo.yaml" --nproc-per-node 1 --set train.steps=20 --set checkpoint.interval_steps=5 --set checkpoint.keep_last=2
      --set train.micro_batch_size=16 --set train.global_batch_size=16)
if [[ "$phases" == *" exit "* ]]; then
  step "exit: does every process end cleanly?"
  run_exit "demo-gpu-fp32" ./dstrain "${demo[@]}" --set run_dir=exit-fp32
  run_exit "demo-gpu-bf16" ./dstrain "${demo[@]}" --set precision.dtype=bf16 --set run_dir=exit-bf16
  CUDA_VISIBLE_DEVICES= run_exit "demo-cpu-of-cuda-build" ./dstrain "${demo[@]}" --set run_dir=exit-cpu
  run_exit "nccl-check" ./dstrain bench comm --backend nccl --nproc-per-node 1 --check
fi

if [[ "$phases" == *" offload "* ]]; then
  # Offloaded Adam (CPU) against Adam on the device, fp32 and bf16, one chunk and many: which
  # differences are rounding (CPU vs CUDA Adam) and which are not.
  step "offload: the CPU optimizer against the device's"
  dense=(train "$root/recipes/demo.yaml" --nproc-per-node 1 --set train.steps=30 --set train.micro_batch_size=16 --set train.global_batch_size=16
         --set checkpoint.interval_steps=0 --set launch.env_check=false)
  o() { local name=$1; shift; limit 60 "$@" --set run_dir="off-$name" > "$logs/off-$name.log" 2>&1 || note "off-$name failed: $(tail -2 "$logs/off-$name.log")"; }
  o fp32-s0 ./dstrain "${dense[@]}" --set precision.dtype=fp32
  o fp32-s1 ./dstrain "${dense[@]}" --set precision.dtype=fp32 --set zero.stage=1
  o fp32-off ./dstrain "${dense[@]}" --set precision.dtype=fp32 --set zero.stage=1 --set zero.offload_optimizer=cpu
  DSTRAIN_TEST_FAULTS=offload_chunk=20000 o fp32-off20k ./dstrain "${dense[@]}" --set precision.dtype=fp32 --set zero.stage=1 --set zero.offload_optimizer=cpu
  o bf16-s0 ./dstrain "${dense[@]}" --set precision.dtype=bf16
  o bf16-s1 ./dstrain "${dense[@]}" --set precision.dtype=bf16 --set zero.stage=1
  o bf16-off ./dstrain "${dense[@]}" --set precision.dtype=bf16 --set zero.stage=1 --set zero.offload_optimizer=cpu
  DSTRAIN_TEST_FAULTS=offload_chunk=20000 o bf16-off20k ./dstrain "${dense[@]}" --set precision.dtype=bf16 --set zero.stage=1 --set zero.offload_optimizer=cpu
  CUDA_VISIBLE_DEVICES= o cpu-fp32-s0 ./dstrain "${dense[@]}" --set precision.dtype=fp32
  for pair in fp32-s0:fp32-s1 fp32-s1:fp32-off fp32-off:fp32-off20k cpu-fp32-s0:fp32-s0 bf16-s0:bf16-s1 bf16-s1:bf16-off bf16-off:bf16-off20k; do
    a=${pair%%:*} b=${pair##*:}
    row "offload: $a vs $b" "$(python3 "$root/test/dist/compare_metrics.py" "off-$a/metrics.jsonl" "off-$b/metrics.jsonl" --rtol 1e9 2>&1 | tail -1)"
  done
  python3 - off-fp32-s1/metrics.jsonl off-fp32-off/metrics.jsonl off-bf16-s1/metrics.jsonl off-bf16-off/metrics.jsonl > "$logs/offload-losses.txt" 2>&1 <<'PY'
import json, sys
cols = [[json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:]]
print("step " + " ".join(p.split("/")[0] for p in sys.argv[1:]))
for i, r in enumerate(zip(*cols)): print(i + 1, " ".join("%.8f" % x for x in r))
PY
  head -12 "$logs/offload-losses.txt" | tee -a "$out/gpu-check.log"
fi

gpu_tests=0
if [[ "$phases" == *" tests "* ]]; then
  step "gpu tests"
  limit 420 ctest --output-on-failure -L gpu > "$logs/ctest-gpu.log" 2>&1
  gpu_tests=$?
  tail -8 "$logs/ctest-gpu.log" | tee -a "$out/gpu-check.log"
  grep -E "^ok - |^FAIL|SKIPPED|failed|Failed|passed" "$logs/ctest-gpu.log" | head -40 >> "$out/gpu-check.log"
  for t in kernels nccl train newer_paths; do
    row "gpu.$t" "$(grep -oE "gpu\.$t \.+ *[*A-Za-z]+[A-Za-z ]* +[0-9.]+ sec" "$logs/ctest-gpu.log" | sed -E 's/ \.+ */: /' | head -1)"
  done
  backtraces gpu-tests
fi

if [[ "$phases" == *" bench "* ]] && [ "$(left)" -gt 60 ]; then
  step "gpu benchmarks"
  limit 40 ./dstrain bench comm --backend nccl --nproc-per-node 1 --max-bytes 268435456 > "$logs/bench-nccl.log" 2>&1
  row "nccl bench (256 MiB, 1 rank)" "$(grep -E "^ *256 MiB" "$logs/bench-nccl.log" | tr -s ' ' | tr '\n' ';')"
  # 1.35B parameters: the deepseek-coder-1.3b model's optimizer phase (issue 21: <= 12 ms).
  limit 60 ./dstrain bench optimizer --device cuda --params 1350000000 --iters 10 > "$logs/bench-adam.log" 2>&1
  row "fused AdamW (1.35B fp32 params)" "$(grep -m1 "fused is" "$logs/bench-adam.log")"
  row "bf16 optimizer step (1.35B)" "$(grep -m1 "bf16 optimizer step" "$logs/bench-adam.log")"
  # One DeepSeek-V2-Lite MoE layer's routed experts (64 of width 1408, top-6, hidden 2048) at
  # 2 x 2048 tokens, bf16 (issue 22): per-expert, grouped loop, grouped GEMMs; and PyTorch's.
  moe_shape=(--tokens 4096 --hidden 2048 --inner 1408 --experts 64 --top-k 6 --dtype bf16 --device cuda --iters 10)
  limit 60 ./dstrain bench moe "${moe_shape[@]}" > "$logs/bench-moe.log" 2>&1
  limit 60 python3 "$root/bench/torch_moe.py" "${moe_shape[@]}" >> "$logs/bench-moe.log" 2>&1
  for way in "per expert (previous)" "grouped, expert loop" "grouped GEMMs" "torch grouped_mm" "torch loop"; do
    row "moe experts: $way (ms, TFLOP/s)" "$(grep -m1 "^$way " "$logs/bench-moe.log" | tr -s ' ' | sed "s/^$way //")"
  done
  limit $(($(left) - 10)) bash "$root/scripts/bench-gpu-train.sh" "$build/dstrain" 25 > "$logs/bench-train.md" 2>&1
fi

if [[ "$phases" == *" generate-bench "* ]] && [ "$(left)" -gt 60 ]; then
  # Generation (issue 61): tokens/s with the key/value cache against transformers' generate, bf16,
  # one prompt at a time and 8 together, on a Llama and a DeepSeek-V2-Lite-shaped model (hidden 2048).
  step "generation benchmark (bf16)"
  limit 240 env DSTRAIN_BENCH_DEVICE=cuda DSTRAIN_BENCH_DTYPE=bf16 DSTRAIN_BENCH_PYTHON=python3 DSTRAIN_BUILD_DIR="$build" \
    DSTRAIN_BENCH_HIDDEN=2048 DSTRAIN_BENCH_LAYERS=8 bash "$root/scripts/bench-generate.sh" 128 8 > "$logs/bench-generate.md" 2>&1
  row "generate bf16 (model, batch, transformers t/s, dstrain t/s, no cache t/s, ratio)" \
    "$(grep -E "^(llama|deepseek_v2) " "$logs/bench-generate.md" | sed 's/ (hidden [^)]*)//' | tr -s ' ' | tr '\n' ';')"
fi

if [[ "$phases" == *" offload-bench "* ]] && [ "$(left)" -gt 60 ]; then
  step "issue 23 benchmarks: the host's CPU Adam, offload, recompute, 7B"
  # The CPU Adam as offload_optimizer runs it, on every core, against the host's bandwidth (>= 0.8x).
  limit 60 ./dstrain bench optimizer --params 200000000 --threads "$(nproc)" --iters 5 > "$logs/bench-cpu-adam.log" 2>&1
  row "host CPU Adam (200M fp32, $(nproc) threads)" "$(grep -m1 "fused is" "$logs/bench-cpu-adam.log")"
  row "host bf16 update (200M)" "$(grep -m1 "bf16 update" "$logs/bench-cpu-adam.log")"
  limit $(($(left) - 10)) env DSTRAIN_BENCH_OFFLOAD=only bash "$root/scripts/bench-gpu-train.sh" "$build/dstrain" 10 \
    > "$logs/bench-train.md" 2>&1
fi
summary
exit $gpu_tests
