#!/usr/bin/env bash
# A disk that fills up during a checkpoint (issue 20): the error says why (errno), the partial
# shard is removed so the disk is not left full, the previous checkpoint stays committed and
# verifies, and the preflight speaks in MiB when space is short. Needs root for a small tmpfs.
source "$(dirname "$0")/../lib.sh"
[ "$(id -u)" = 0 ] || { echo "SKIPPED: needs root to mount a small tmpfs"; exit 77; }
mkdir small
mount -t tmpfs -o size=8m tmpfs small || { echo "SKIPPED: cannot mount a tmpfs here"; exit 77; }
trap 'rc=$?; umount "$WORK/small" 2>/dev/null; (exit $rc); cleanup' EXIT
# The demo's checkpoint is 5.3 MiB: the one at step 5 fits in 8 MiB, the one at step 10 cannot.
expect_status 5 timeout 120 "$DSTRAIN" train "$demo_recipe" --nproc-per-node 2 --set launch.threads_per_worker=1 --set train.steps=12 \
  --set checkpoint.interval_steps=5 --set checkpoint.keep_last=2 --set checkpoint.dir="$WORK/small/ckpt" --set run_dir=full
expect_out "No space left on device"
[ "$(cat small/ckpt/latest)" = "step_00000005" ] || fail "latest moved off the last good checkpoint: $(cat small/ckpt/latest)"
expect_status 0 timeout 60 "$DSTRAIN" inspect-ckpt small/ckpt/step_00000005 --verify
! ls small/ckpt/step_00000010.partial/rank_*.bin > /dev/null 2>&1 || fail "the partial shard was left on the full disk: $(ls -la small/ckpt/*)"
ok "a full disk during a save: exit 5 with 'No space left on device', the partial shard removed, step 5 still committed and verified"

mkdir tiny
mount -t tmpfs -o size=3m tmpfs tiny
trap 'rc=$?; umount "$WORK/small" "$WORK/tiny" 2>/dev/null; (exit $rc); cleanup' EXIT
expect_status 5 timeout 120 "$DSTRAIN" train "$demo_recipe" --nproc-per-node 2 --set launch.threads_per_worker=1 --set train.steps=12 \
  --set checkpoint.interval_steps=5 --set checkpoint.dir="$WORK/tiny/ckpt" --set run_dir=tiny-run
expect_out "3.0 MiB free, one checkpoint needs 5.3 MiB"
ok "too little space for one checkpoint is refused before training, in MiB (it said '0.0 GiB free, one checkpoint needs 0.0 GiB')"
finish
