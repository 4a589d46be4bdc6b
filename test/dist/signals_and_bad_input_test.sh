#!/usr/bin/env bash
# The launcher killed with SIGTERM leaves no process behind. Bad input gets a clear error and a
# documented exit status, and never damages what was already written.
source "$(dirname "$0")/../lib.sh"

"$DSTRAIN" train "$demo_recipe" --set train.steps=100000 --set run_dir=long > long.log 2>&1 &
launcher=$!
wait_for long/metrics.jsonl 60
workers=$(pgrep -P $launcher || true)
[ "$(wc -w <<<"$workers")" -eq 2 ] || fail "expected 2 workers, found: $workers"
kill -TERM $launcher
set +e; wait $launcher; status=$?; set -e
[ $status -eq 130 ] || fail "launcher exited $status on SIGTERM, expected 130: $(cat long.log)"
sleep 0.5
left=$(alive $workers)
[ -z "$left" ] || fail "workers left after SIGTERM: $left"
ok "SIGTERM to the launcher stops every worker and exits 130"

expect_status 0 "$DSTRAIN" train "$demo_recipe" --set train.steps=20 --set checkpoint.interval_steps=10 --set checkpoint.keep_last=0 --set run_dir=r
expect_status 2 "$DSTRAIN" train "$demo_recipe" --set run_dir=r
expect_out "already holds a run"
expect_out "dstrain resume"
[ -f r/ckpt/step_00000020/COMMITTED ] || fail "the refused run touched the existing checkpoints"
ok "training into an existing run directory is refused and changes nothing"

cp r/ckpt/step_00000020/tensors.bin good.bin
printf '\x01' | dd of=r/ckpt/step_00000020/tensors.bin bs=1 seek=1000 conv=notrunc status=none
expect_status 4 "$DSTRAIN" inspect-ckpt r/ckpt
expect_out "CORRUPT: crc32c mismatch"
expect_status 0 "$DSTRAIN" inspect-ckpt r/ckpt/step_00000010
expect_out "OK (crc32c)"
ok "inspect-ckpt verifies checksums: exit 4 for a flipped byte, 0 for a good checkpoint"

expect_status 4 "$DSTRAIN" resume r
expect_out "checksum mismatch"
ok "resume refuses a corrupt checkpoint with exit 4"
cp good.bin r/ckpt/step_00000020/tensors.bin

rm r/ckpt/step_00000020/COMMITTED
expect_status 4 "$DSTRAIN" resume r
expect_out "not a committed checkpoint"
ok "resume refuses a checkpoint whose save never committed"

printf 'short' > tiny.txt
expect_status 3 "$DSTRAIN" train "$demo_recipe" --set data.path="$WORK/tiny.txt" --set run_dir=tiny
expect_out "has 5 tokens, fewer than one sample"
ok "a data file too short for one sample is a data error (exit 3)"
finish
