# Shared by the ZeRO tests (zero_stages_test.sh, zero_memory_resume_test.sh). Sourced after lib.sh.
# The demo model for 30 steps of a 16-sample batch, stage 3 sharding every parameter and small
# reduce buckets, so that every path of the engine runs at this size.
cmp="$SRC/test/dist/compare_metrics.py"
common=(--set train.steps=30 --set train.global_batch_size=16 --set launch.threads_per_worker=1
        --set zero.stage3_param_persistence_threshold=0 --set zero.reduce_bucket_size=30000)

run() {  # run NAME NPROC MICRO [--set ...]
  local name=$1 n=$2 micro=$3; shift 3
  expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --nproc-per-node "$n" --set train.micro_batch_size="$micro" --set run_dir="$name" "$@"
}
