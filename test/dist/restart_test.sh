#!/usr/bin/env bash
# Automatic restart: a worker killed with SIGKILL at a random step (5 seeds here; more with
# RESTART_SEEDS=20): the launcher stops the group, records the failure in failures.jsonl,
# restarts from the latest checkpoint, and the run completes with the same losses and the same
# final weights, bit for bit, as an uninterrupted run. A failure that a restart would only repeat
# (bad data) is not retried.
source "$(dirname "$0")/../lib.sh"
cmp="$SRC/test/dist/compare_metrics.py"
common=(--nproc-per-node 2 --set launch.threads_per_worker=1 --set train.steps=30 --set checkpoint.interval_steps=5 --set checkpoint.keep_last=2
        --set zero.stage=2 --set train.micro_batch_size=4 --set train.global_batch_size=16)
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --set run_dir=whole

seeds=${RESTART_SEEDS:-5}
for seed in $(seq 1 "$seeds"); do
  kill_at=$(python3 -c "import random; random.seed($seed); print(random.randint(3, 27))")
  "$DSTRAIN" train "$demo_recipe" "${common[@]}" --max-restarts 2 --set run_dir=r$seed > r$seed.log 2>&1 &
  launcher=$!
  # Once metrics.jsonl reaches the step, SIGKILL a random worker of the launcher.
  for _ in $(seq 1 600); do
    [ "$(wc -l 2>/dev/null < r$seed/metrics.jsonl || echo 0)" -ge "$kill_at" ] && break
    sleep 0.05
  done
  victim=$(pgrep -P $launcher | python3 -c "import random, sys; random.seed($seed); print(random.choice(sys.stdin.read().split()))")
  kill -9 "$victim"
  set +e; wait $launcher; status=$?; set -e
  [ $status -eq 0 ] || fail "seed $seed (kill at step $kill_at): the run did not complete after the restart (exit $status): $(tail -5 r$seed.log)"
  grep -q "restart 1 of 2" r$seed.log || fail "seed $seed: no restart was announced"
  grep -q "1 failure in this run" r$seed.log || fail "seed $seed: no root-cause report"
  python3 - r$seed/failures.jsonl "$victim" <<'PY' || fail "seed $seed: failures.jsonl does not record the kill"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 1, rows
r = rows[0]
assert r["pid"] == int(sys.argv[2]) and r["signal"] == 9 and r["generation"] == 0 and r["step_reached"] >= 1, r
assert "SIGKILL" in r["what"] and r["host"] and isinstance(r["log_tail"], list), r
PY
  python3 "$cmp" whole/metrics.jsonl r$seed/metrics.jsonl --exact || fail "seed $seed: the restarted run's losses differ"
  same_checkpoint_data whole/ckpt/step_00000030 r$seed/ckpt/step_00000030 || fail "seed $seed: the final weights differ"
done
ok "$seeds random SIGKILLs at random steps: restarted from the latest checkpoint, recorded, and bit-identical to the uninterrupted run"

printf 'short' > tiny.txt
expect_status 3 "$DSTRAIN" train "$demo_recipe" --max-restarts 3 --set data.path="$WORK/tiny.txt" --set run_dir=tiny
[ "$(grep -c "restart 1 of" <<<"$OUT" || true)" -eq 0 ] || fail "a data error was retried: $OUT"
ok "a data error is not retried (exit 3 at once)"
finish
