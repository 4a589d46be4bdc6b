# Shared by the pipeline tests (pipeline_test.sh, pipeline_ops_test.sh). Sourced after lib.sh.
# The demo model with 4 layers (so that 4 stages each get one), 20 steps of a 16-sample batch in
# micro-batches of 2 (20 steps: the runs are compared with each other, and a wrong gradient shows
# from step 2), no checkpoints unless a test asks.
cmp="$SRC/test/dist/compare_metrics.py"
common=(--set train.steps=20 --set train.global_batch_size=16 --set train.micro_batch_size=2 --set model.num_layers=4
        --set launch.threads_per_worker=1 --set checkpoint.interval_steps=0 --set checkpoint.keep_last=0
        --set zero.stage3_param_persistence_threshold=0)

run() {  # run NAME NPROC [--set ...]
  local name=$1 n=$2; shift 2
  expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --nproc-per-node "$n" --set run_dir="$name" "$@"
}
