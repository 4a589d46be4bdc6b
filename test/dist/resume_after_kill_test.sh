#!/usr/bin/env bash
# A worker killed with SIGKILL: the launcher stops the others, names the rank and the signal, and
# exits 7. `dstrain resume` then finishes the run, and its losses equal an uninterrupted run's
# bit for bit.
source "$(dirname "$0")/../lib.sh"
cmp="$SRC/test/dist/compare_metrics.py"
common=(--set train.steps=60 --set checkpoint.interval_steps=20 --set checkpoint.keep_last=0)

expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --set run_dir=whole
ok "uninterrupted reference run"

"$DSTRAIN" train "$demo_recipe" "${common[@]}" --set run_dir=cut > cut.log 2>&1 &
launcher=$!
wait_for cut/ckpt/step_00000020/COMMITTED 120
workers=$(pgrep -P $launcher || true)
[ "$(wc -w <<<"$workers")" -eq 2 ] || fail "expected 2 workers under the launcher, found: $workers"
victim=$(head -n1 <<<"$workers")
killed_at=$(date +%s.%N)
kill -9 "$victim"
set +e; wait $launcher; status=$?; set -e
elapsed=$(python3 -c "import time; print(f'{time.time() - $killed_at:.1f}')")
python3 -c "import sys; sys.exit(0 if $elapsed <= 10 else 1)" || fail "the launcher took ${elapsed} s to stop the others (limit 10 s)"
[ $status -eq 7 ] || fail "launcher exited $status after a worker was killed, expected 7: $(cat cut.log)"
grep -qE "rank [01] \(pid $victim on [^)]+\) was killed by signal 9 \(SIGKILL\)" cut.log || fail "report does not name the rank and SIGKILL: $(cat cut.log)"
left=$(alive $workers)
[ -z "$left" ] || fail "workers still running after the launcher exited: $left"
ok "a SIGKILLed worker stops the run within ${elapsed} s, is named with its host and signal, and no worker is left"

expect_status 0 "$DSTRAIN" resume cut
expect_out "resumed from"
expect_out "step 60/60"
python3 "$cmp" whole/metrics.jsonl cut/metrics.jsonl --exact || fail "the resumed run differs from the uninterrupted one"
ok "the resumed run's losses equal the uninterrupted run's exactly"
same_checkpoint_data whole/ckpt/step_00000060 cut/ckpt/step_00000060 || fail "final weights differ"
ok "and so do the final weights and optimizer state, byte for byte"
finish
