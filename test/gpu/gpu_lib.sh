# Shared by the GPU training tests (train_gpu_test.sh, newer_paths_gpu_test.sh). Sourced after lib.sh.
# gpus: the GPUs check-env sees. DSTRAIN_GPU_TEST_DRY=1 runs a script's mechanics on the CPU
# (the GPU-only checks skipped), so that a mistake in it is found before a lent GPU's minutes
# are spent; without it, a machine without a GPU skips (exit 77).
cmp="$SRC/test/dist/compare_metrics.py"
gpus=$("$DSTRAIN" check-env --local --skip probes --json | python3 -c 'import json,sys; print(next(f["values"][0]["value"] for f in json.load(sys.stdin)["facts"] if f["name"] == "gpus"))')
gpus=${gpus%% *}  # "0 (none visible: ...)" without a GPU
dry=${DSTRAIN_GPU_TEST_DRY:-0}
if [ "$gpus" = "0" ] && [ "$dry" != 1 ]; then echo "SKIPPED: no GPU visible"; exit 77; fi
gpu_check() { [ "$dry" = 1 ] || "$@"; }
gpu_train() {  # gpu_train NAME RECIPE [args]: one rank on GPU 0
  local name=$1 recipe=$2; shift 2
  expect_status 0 "$DSTRAIN" train "$recipe" --nproc-per-node 1 --set run_dir="$name" "$@"
  gpu_check grep -q "training on GPUs: rank 0 on cuda:0" "$name/logs/rank_00000.log" || fail "$name did not train on the GPU"
}
cpu_train() {  # cpu_train NAME RECIPE [args]: one rank on the CPU (the GPU hidden), the fp32 twin
  local name=$1 recipe=$2; shift 2
  CUDA_VISIBLE_DEVICES= expect_status 0 "$DSTRAIN" train "$recipe" --nproc-per-node 1 --set run_dir="$name" --set precision.dtype=fp32 "$@"
  grep -q "training on CPU" "$name/logs/rank_00000.log" || fail "CUDA_VISIBLE_DEVICES= did not hide the GPU from $name"
}
