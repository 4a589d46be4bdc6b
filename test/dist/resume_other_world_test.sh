#!/usr/bin/env bash
# A run started on 2 ranks, killed, and resumed on 1 rank (then on 4): the global batch and the
# data order stay, only the accumulation steps change, so the losses follow the uninterrupted
# run within fp32 rounding.
source "$(dirname "$0")/../lib.sh"
common=(--set train.steps=30 --set train.micro_batch_size=4 --set train.global_batch_size=16 --set checkpoint.interval_steps=10 \
        --set checkpoint.keep_last=0 --set launch.threads_per_worker=1)
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --set run_dir=whole

"$DSTRAIN" train "$demo_recipe" "${common[@]}" --set run_dir=moved > moved.log 2>&1 &
kill_worker_when moved/ckpt/step_00000010/COMMITTED $!
rm -rf moved/ckpt/step_00000020  # if the kill came late, resume from step 10 anyway
printf 'step_00000010\n' > moved/ckpt/latest
cp -r moved moved4  # the same killed run, for the 4-rank resume below
expect_status 0 "$DSTRAIN" resume moved --nproc-per-node 1
expect_out "resuming on 1 ranks instead of 2: 4 accumulation steps of 4 per rank keep the global batch of 16"
python3 "$SRC/test/dist/compare_metrics.py" whole/metrics.jsonl moved/metrics.jsonl --rtol 1e-5 || fail "resuming on 1 rank changed the training"
ok "a 2-rank run resumed on 1 rank continues like the uninterrupted run"

expect_status 0 "$DSTRAIN" resume moved4 --nproc-per-node 4
expect_out "resuming on 4 ranks instead of 2: 1 accumulation step of 4 per rank keep the global batch of 16"
python3 "$SRC/test/dist/compare_metrics.py" whole/metrics.jsonl moved4/metrics.jsonl --rtol 1e-5 || fail "resuming on 4 ranks changed the training"
ok "the same run resumed on 4 ranks continues like the uninterrupted run"

expect_status 2 "$DSTRAIN" resume moved --nproc-per-node 3
expect_out "its global batch 16 does not split into micro batches of 4 over 3 ranks"
expect_out "resume on one of these rank counts: 1, 2, 4"
ok "a rank count that does not divide the global batch is refused with the ones that do"
finish
