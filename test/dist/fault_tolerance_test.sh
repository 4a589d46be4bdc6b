#!/usr/bin/env bash
# Hangs and bad steps (issue 9):
#  - SIGSTOP of one worker: the launcher finds its heartbeat stale within the timeout (+5 s),
#    names the rank and where it was, kills the group, restarts, and the run completes with the
#    same final weights as an uninterrupted run;
#  - a rank alive but late (it sleeps in forward): the collective timeout names it and its phase
#    while the others wait in the collective;
#  - a NaN loss (bf16/fp32): stop (exit 8), skip (counted in metrics), rollback (bit-identical to
#    an uninterrupted run when the fault is transient; exit 8 when it repeats);
#  - a worker that dies of SIGSEGV after its last step (the GPU workers' crash at exit, issue 17):
#    the launcher exits 7 naming it, its exit record says signal 11, and check_worker_exits fails.
source "$(dirname "$0")/../lib.sh"
cmp="$SRC/test/dist/compare_metrics.py"
common=(--nproc-per-node 2 --set launch.threads_per_worker=1 --set train.steps=30 --set checkpoint.interval_steps=5 --set checkpoint.keep_last=2
        --set train.micro_batch_size=4 --set train.global_batch_size=16)
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --set run_dir=whole

# --- SIGSTOP ---------------------------------------------------------------------------------
"$DSTRAIN" train "$demo_recipe" "${common[@]}" --set launch.heartbeat_timeout_s=3 --max-restarts 1 --set run_dir=stopped > stopped.log 2>&1 &
launcher=$!
for _ in $(seq 1 600); do
  [ "$(wc -l 2>/dev/null < stopped/metrics.jsonl || echo 0)" -ge 12 ] && break
  sleep 0.05
done
victim_rank=1
victim=$(pgrep -P $launcher -f "worker" | sed -n "$((victim_rank + 1))p")
[ "$(tr '\0' '\n' < /proc/$victim/environ | grep '^RANK=')" = "RANK=$victim_rank" ] || fail "could not find rank $victim_rank's process"
stopped_at=$(date +%s.%N)
kill -STOP "$victim"
for _ in $(seq 1 400); do grep -q "stopped responding" stopped.log && break; sleep 0.05; done
detected_at=$(date +%s.%N)
set +e; wait $launcher; status=$?; set -e
[ $status -eq 0 ] || fail "the run did not complete after the hang (exit $status): $(tail -5 stopped.log)"
delay=$(python3 -c "print(round($detected_at - $stopped_at, 1))")
python3 -c "import sys; sys.exit(0 if $delay <= 3 + 5 else 1)" || fail "the hang was found after $delay s (timeout 3 s + 5 s allowed)"
grep -q "hang: rank 1 (.*) stopped responding: no heartbeat for [0-9]* s (launch.heartbeat_timeout_s = 3), last heard in [a-z_]*" stopped.log ||
  fail "the report does not name rank 1 and where it was: $(grep hang stopped.log)"
grep -q "rank 0: " stopped.log || fail "the report does not say where rank 0 was"
python3 - stopped/failures.jsonl <<'PY' || fail "failures.jsonl does not record the hang"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 1 and rows[0]["kind"] == "hang" and rows[0]["rank"] == 1 and rows[0]["pid"] > 0, rows
PY
same_checkpoint_data whole/ckpt/step_00000030 stopped/ckpt/step_00000030 || fail "the final weights after the hang and restart differ"
ok "SIGSTOP of rank 1 found in $delay s (timeout 3 s), reported by rank and phase; restarted and bit-identical at the end"

# --- a late rank, alive: the collective timeout --------------------------------------------
# A 1 s heartbeat (launch.heartbeat_timeout_s / 6): the default 10 s one reports ~30 s later, three beats down the chain.
DSTRAIN_TEST_FAULTS=stall=1:4:30 expect_status 6 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --set launch.collective_timeout_s=2 \
  --set launch.heartbeat_timeout_s=6 --set run_dir=late
expect_out "hang: rank 1 ("
expect_out "stuck in forward of step 4 for"
expect_out "while others wait in "
expect_out "(launch.collective_timeout_s = 2)"
ok "a rank late in forward is named, with its phase and the collective the others wait in (exit 6)"

# --- bad steps --------------------------------------------------------------------------------
bad=(--set precision.dtype=bf16 --set zero.stage=2 --set train.steps=16)  # bf16 is slow on a CPU; the fault is at step 12
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" "${bad[@]}" --set run_dir=bf16
DSTRAIN_TEST_FAULTS=nan_loss=1:12 expect_status 8 "$DSTRAIN" train "$demo_recipe" "${common[@]}" "${bad[@]}" --set run_dir=badstop
expect_out "step 12: the loss is nan (train.on_bad_step = stop): stopped"
[ -d badstop/ckpt/step_00000010 ] || fail "the last checkpoint before the bad step is gone"
ok "on_bad_step stop: a NaN loss on rank 1 stops the run at step 12 (exit 8); step 10's checkpoint is intact"

DSTRAIN_TEST_FAULTS=nan_loss=1:12 expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" "${bad[@]}" --set train.on_bad_step=skip --set run_dir=badskip
expect_out "step 12: the loss is nan (train.on_bad_step = skip): update skipped (bad step 1 of at most 10)"
python3 - badskip/metrics.jsonl <<'PY' || fail "metrics.jsonl does not count the bad step"
import json, sys
rows = {r["step"]: r for r in map(json.loads, open(sys.argv[1]))}
assert rows[11]["bad_steps"] == 0 and rows[12]["bad_steps"] == 1 and rows[12]["loss"] is None and rows[16]["bad_steps"] == 1, rows[12]
PY
ok "on_bad_step skip: the update is skipped, the run completes, metrics count it"

DSTRAIN_TEST_FAULTS=nan_loss=0:3 expect_status 8 "$DSTRAIN" train "$demo_recipe" "${common[@]}" "${bad[@]}" --set train.on_bad_step=skip --set train.max_bad_steps=0 --set run_dir=badmax
expect_out "1 bad steps in this launch, more than train.max_bad_steps = 0"
ok "on_bad_step skip stops after train.max_bad_steps"

DSTRAIN_TEST_FAULTS=nan_loss=1:12 expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" "${bad[@]}" --set train.on_bad_step=rollback --set run_dir=badroll
expect_out "step 12: the loss is nan (train.on_bad_step = rollback): rolled back to"
expect_out "(step 10); bad step 1 of at most 10"
python3 "$cmp" bf16/metrics.jsonl badroll/metrics.jsonl --exact || fail "the rolled-back run's losses differ from the uninterrupted run"
same_checkpoint_data bf16/ckpt/step_00000016 badroll/ckpt/step_00000016 || fail "the rolled-back run's final weights differ"
ok "on_bad_step rollback: a transient NaN rolls back to step 10 and the run ends bit-identical to the uninterrupted one"

DSTRAIN_TEST_FAULTS=nan_loss=1:12:always expect_status 8 "$DSTRAIN" train "$demo_recipe" "${common[@]}" "${bad[@]}" --set train.on_bad_step=rollback --set run_dir=badagain
expect_out "bad again after rolling back"
ok "on_bad_step rollback: a NaN that repeats after the rollback stops the run (exit 8)"

# --- a crash at exit, after the last step -------------------------------------------------------
DSTRAIN_TEST_FAULTS=crash_at_exit=1 expect_status 7 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --set train.steps=12 --set run_dir=exitcrash
expect_out "rank 1 (pid"
expect_out "was killed by signal 11 (SIGSEGV)"
[ -d exitcrash/ckpt/step_00000012 ] || fail "the crash at exit came after the last checkpoint, which must be committed"
python3 - exitcrash/logs/exits.node0.json <<'PY' || fail "the exit record does not say that rank 1 died of SIGSEGV: $(cat exitcrash/logs/exits.node0.json)"
import json, sys
r = json.load(open(sys.argv[1]))
w = {x["rank"]: x for x in r["workers"]}
assert r["launcher_status"] == 7 and w[1]["signal"] == 11 and w[1]["signal_from_launcher"] == 0 and w[1]["exit_code"] is None, r
assert w[0]["exit_code"] == 0 or w[0]["signal_from_launcher"] == 9, r  # rank 0 ended first, or the launcher stopped it
PY
(check_worker_exits) 2>/dev/null && fail "check_worker_exits accepted a worker that died of SIGSEGV"
mv exitcrash/logs/exits.node0.json exitcrash/exits.checked.json  # this crash was on purpose
ok "a worker's SIGSEGV after its last step: exit 7 naming rank 1, recorded as signal 11, caught by the tests' exit check"

# --- SIGTERM during the restart backoff (issue 20): a clean stop with the report, not 143 --------
DSTRAIN_TEST_FAULTS=crash_at_exit=1 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --set train.steps=12 --max-restarts 1 --set run_dir=backoff > backoff.log 2>&1 &
launcher=$!
for _ in $(seq 1 1200); do grep -q "restart 1 of 1 in" backoff.log && break; sleep 0.05; done
grep -q "restart 1 of 1 in" backoff.log || fail "no restart backoff: $(tail -5 backoff.log)"
kill -TERM $launcher
set +e; wait $launcher; status=$?; set -e
[ $status -eq 75 ] || fail "SIGTERM during the backoff exited $status, expected 75: $(tail -5 backoff.log)"
grep -q "stopped by SIGTERM during the restart backoff; continue with \`dstrain resume" backoff.log || fail "no stop report: $(tail -5 backoff.log)"
grep -q "failure in this run (run_dir/failures.jsonl); the first:" backoff.log || fail "the failure report is missing: $(tail -8 backoff.log)"
mv backoff/logs/exits.node0.json backoff/exits.checked.json  # rank 1's SIGSEGV was on purpose
ok "SIGTERM during the restart backoff: exit 75 with the failure report and how to resume"
finish
