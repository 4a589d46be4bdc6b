#!/usr/bin/env bash
# A save killed at 20 different points (half a shard written, unflushed, fsynced, manifest
# written, renamed, COMMITTED, `latest` moved, while pruning; on either rank): afterwards `latest`
# always loads and verifies, and `dstrain resume` finishes the run.
source "$(dirname "$0")/../lib.sh"
common=(--set train.steps=12 --set checkpoint.interval_steps=4 --set checkpoint.keep_last=1 --set zero.stage=2
        --set launch.threads_per_worker=1 --set train.micro_batch_size=4 --set train.global_batch_size=8)
for k in $(seq 1 20); do
  set +e
  DSTRAIN_TEST_FAULTS=crash_at_save_point=$k "$DSTRAIN" train "$demo_recipe" "${common[@]}" --set run_dir=r$k > r$k.log 2>&1
  status=$?
  set -e
  [ $status -eq 7 ] || fail "crash point $k: the run exited $status, expected 7 (a worker died): $(tail -5 r$k.log)"
  grep -q "exited with status 99" r$k.log || fail "crash point $k: no worker died at the crash point: $(tail -5 r$k.log)"
  [ ! -e r$k/ckpt/latest ] || expect_status 0 "$DSTRAIN" inspect-ckpt r$k/ckpt --verify
  if ls r$k/ckpt/step_*/COMMITTED > /dev/null 2>&1; then
    # Committed (`latest` may still name the previous one, or not exist yet): resume finishes.
    expect_status 0 "$DSTRAIN" resume r$k
    expect_out "step 12/12"
  else
    [ ! -e r$k/ckpt/latest ] || fail "crash point $k: latest exists but nothing is committed"
  fi
done
ok "after a kill at each of 20 points of a save, latest loads and verifies and the run resumes to the end"
finish
