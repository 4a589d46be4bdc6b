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

printf '\x01' | dd of=r/ckpt/step_00000020/rank_00000.bin bs=1 seek=1000 conv=notrunc status=none
expect_status 4 "$DSTRAIN" inspect-ckpt r/ckpt
expect_out "CORRUPT: crc32c mismatch (corrupt); holds"
expect_status 0 "$DSTRAIN" inspect-ckpt r/ckpt/step_00000010 --verify
expect_out "verified: all 1 files OK (crc32c)"
ok "inspect-ckpt verifies checksums: exit 4 for a flipped byte (naming the file and its tensors), 0 for a good checkpoint"

expect_status 0 "$DSTRAIN" resume r
expect_out "skipping a checkpoint that does not verify"
expect_out "step_00000020/rank_00000.bin: checksum mismatch"
expect_out "resumed from $PWD/r/ckpt/step_00000010"
expect_out "step 20/20"
expect_status 0 "$DSTRAIN" inspect-ckpt r/ckpt
ok "resume falls back past a corrupt checkpoint to the previous one, says why, and finishes the run"

rm r/ckpt/step_00000020/COMMITTED
printf '\x01' | dd of=r/ckpt/step_00000010/rank_00000.bin bs=1 seek=1000 conv=notrunc status=none
expect_status 4 "$DSTRAIN" resume r
expect_out "not a committed checkpoint"
expect_out "no committed checkpoint in $PWD/r/ckpt verifies"
ok "with no checkpoint that verifies, resume refuses with exit 4 and says why for each"

printf 'short' > tiny.txt
expect_status 3 "$DSTRAIN" train "$demo_recipe" --set data.path="$WORK/tiny.txt" --set run_dir=tiny
expect_out "has 5 tokens, fewer than one sample"
ok "a data file too short for one sample is a data error (exit 3)"
finish
