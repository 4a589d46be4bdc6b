#!/usr/bin/env bash
# Checkpoints re-partitioned on load: saved at 4 ranks and continued at 2 and at 1, saved at 2
# and continued at 4, saved at ZeRO stage 3 and continued at stage 1 (train --resume PATH starts
# a new run from another run's checkpoint). Each continuation's losses follow the uninterrupted
# run's within 1e-6 relative.
source "$(dirname "$0")/../lib.sh"
common=(--set train.steps=20 --set train.global_batch_size=16 --set launch.threads_per_worker=1 --set checkpoint.interval_steps=10
        --set checkpoint.keep_last=0 --set zero.reduce_bucket_size=30000)

continues() {  # continues WHOLE PART: PART's steps equal WHOLE's same steps within 1e-6
  python3 - "$1/metrics.jsonl" "$2/metrics.jsonl" <<'PY'
import json, sys
whole = {r["step"]: r["loss"] for r in map(json.loads, open(sys.argv[1]))}
part = {r["step"]: r["loss"] for r in map(json.loads, open(sys.argv[2]))}
assert sorted(part) == list(range(11, 21)), sorted(part)
worst = max(abs(part[s] - whole[s]) / whole[s] for s in part)
print(f"steps 11-20: largest relative difference {worst:.2g}")
assert worst <= 1e-6, worst
PY
}

expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --nproc-per-node 4 --set train.micro_batch_size=2 --set zero.stage=2 --set run_dir=w4
for n in 2 1; do
  expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --nproc-per-node $n --set train.micro_batch_size=4 --set zero.stage=2 \
    --set run_dir=from4to$n --resume w4/ckpt/step_00000010
  expect_out "resumed from $PWD/w4/ckpt/step_00000010 at step 10"
  continues w4 from4to$n || fail "4 -> $n ranks does not continue the 4-rank run"
done
ok "a stage-2 checkpoint of 4 ranks continues on 2 and on 1 rank"

expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --nproc-per-node 2 --set train.micro_batch_size=4 --set zero.stage=2 --set run_dir=w2
rm -r w2/ckpt/step_00000020 && printf 'step_00000010\n' > w2/ckpt/latest  # as if the run had stopped at step 10
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --nproc-per-node 4 --set train.micro_batch_size=2 --set zero.stage=2 \
  --set run_dir=from2to4 --resume w2/ckpt
continues w2 from2to4 || fail "2 -> 4 ranks does not continue the 2-rank run"
ok "a checkpoint of 2 ranks continues on 4 (a ckpt/ directory picks its newest good checkpoint)"

expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --nproc-per-node 2 --set train.micro_batch_size=4 --set zero.stage=3 \
  --set zero.stage3_param_persistence_threshold=0 --set run_dir=s3
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --nproc-per-node 2 --set train.micro_batch_size=4 --set zero.stage=1 \
  --set run_dir=s3to1 --resume s3/ckpt/step_00000010
continues s3 s3to1 || fail "stage 3 -> stage 1 does not continue"
ok "a ZeRO-3 checkpoint continues at ZeRO-1"
expect_status 2 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --set run_dir=nowhere --resume w4
expect_out "neither a checkpoint (no manifest.json) nor a directory of committed checkpoints"
[ ! -e nowhere ] || fail "a refused --resume created its run directory"
ok "--resume with a run directory instead of its ckpt/ is refused before anything is created"
finish
