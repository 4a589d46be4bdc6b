#!/usr/bin/env bash
# The rendezvous store is the job's (issue 20): it listens on the master address only
# (127.0.0.1 for one node), and control values not signed with the job's secret are ignored:
# a stranger's forged heartbeats, decision and failure report neither kill nor steer the run.
source "$(dirname "$0")/../lib.sh"
source "$SRC/scripts/common.sh"
py="$DSTRAIN_VENV/bin/python"
[ -x "$py" ] || { echo "SKIPPED: no test venv with torch at $DSTRAIN_VENV"; exit 77; }
common=(--nproc-per-node 2 --set launch.threads_per_worker=1 --set train.steps=200 --set checkpoint.interval_steps=0 --set launch.heartbeat_timeout_s=3)
"$DSTRAIN" train "$demo_recipe" "${common[@]}" --set run_dir=guarded > guarded.log 2>&1 &
launcher=$!
for _ in $(seq 1 600); do grep -q "rendezvous at 127.0.0.1:" guarded.log && break; sleep 0.05; done
port=$(grep -o "rendezvous at 127.0.0.1:[0-9]*" guarded.log | head -1 | cut -d: -f2)
[ -n "$port" ] || fail "no rendezvous port in the log: $(cat guarded.log)"

# Listening on 127.0.0.1 only, not the wildcard address (/proc/net/tcp: local address, state 0A).
python3 - "$port" <<'PY' || fail "the store does not listen on 127.0.0.1 only"
import sys
port = "%04X" % int(sys.argv[1])
rows = [l.split() for l in open("/proc/net/tcp").readlines()[1:] + open("/proc/net/tcp6").readlines()[1:]]
listening = [r[1] for r in rows if r[3] == "0A" and r[1].endswith(":" + port)]
assert listening and all(a.split(":")[0] in ("0100007F", "0000000000000000FFFF00000100007F") for a in listening), listening
PY
ok "the store listens on 127.0.0.1:$port only"

# A stranger on the machine with a standard store client forges rank 1's heartbeat (stuck in an
# all_reduce for 1000 s: one such value read made the launcher kill the job as a hang), a "stop"
# decision and a failure report. Three bursts of 1 s, every 20 ms, so that the launcher's watch
# reads forged values (the workers overwrite theirs every 0.5 s), and gaps of 1.5 s in between,
# shorter than the heartbeat timeout, so that the genuine beats still get through.
"$py" - "$port" > forger.log 2>&1 <<'PY' &
import sys, time
from torch.distributed import TCPStore
store = TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False, wait_for_workers=False)
run = store.get("dstrain/run").decode()
forged = 0
try:
    while not store.check([f"dstrain/{run}/hb/1"]):  # the workers are up
        time.sleep(0.05)
    for burst in range(3):
        end = time.time() + 1.0
        while time.time() < end:
            store.set(f"dstrain/{run}/hb/1", "v1 999 3 5 all_reduce 9 999999 forger 1764547200.000")
            store.set(f"dstrain/{run}/decision", "0 0 forged decision")
            store.set(f"dstrain/{run}/failed/0", "forged failure")
            time.sleep(0.02)
        forged += 1
        time.sleep(1.5)
except Exception as e:  # the run ended first: the store is gone
    print("store gone:", e)
print(f"forged in {forged} bursts under {run}")
PY
forger=$!
set +e; wait $launcher; status=$?; set -e
wait $forger || fail "the forger failed: $(cat forger.log)"
grep -qE "forged in [2-3] bursts" forger.log || fail "the forger did not get to forge: $(cat forger.log)"
[ $status -eq 0 ] || fail "the run did not survive the forgeries (exit $status): $(tail -8 guarded.log)"
grep -q "rendezvous store: ignored [0-9]* value(s) so far" guarded.log || fail "the ignored values were not reported: $(grep -i store guarded.log)"
! grep -q "hang:" guarded.log || fail "a forged heartbeat was taken for a hang"
ok "forged heartbeats, decision and failure report are ignored (counted in a warning); the run completes"
finish
