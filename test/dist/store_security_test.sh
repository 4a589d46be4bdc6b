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

# The secret never leaves the process that holds it (issue 55, D1): rank 1 reaches the store that
# rank 0 hosts through a recording proxy, so every byte it sends or reads there (environment facts,
# checkpoint summaries, heartbeats) is captured; none may hold the secret, and neither may any
# file of the run, nor check-env's output.
secret="s3cr3t-$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
store_port=$(free_port)
proxy_port=$(free_port)
python3 - "$proxy_port" "$store_port" capture.bin > proxy.log 2>&1 <<'PY' &
import socket, sys, threading
listen, target, capture = int(sys.argv[1]), int(sys.argv[2]), open(sys.argv[3], "ab", buffering=0)
lock = threading.Lock()
def pump(src, dst):
    try:
        while data := src.recv(65536):
            with lock: capture.write(data)
            dst.sendall(data)
    except OSError: pass
    finally:
        for s in (src, dst):
            try: s.shutdown(socket.SHUT_RDWR)
            except OSError: pass
server = socket.create_server(("127.0.0.1", listen))
server.settimeout(120)
print("listening", flush=True)
while True:
    try: client, _ = server.accept()
    except socket.timeout: break
    for _ in range(200):
        try: upstream = socket.create_connection(("127.0.0.1", target)); break
        except OSError: threading.Event().wait(0.05)
    threading.Thread(target=pump, args=(client, upstream), daemon=True).start()
    threading.Thread(target=pump, args=(upstream, client), daemon=True).start()
PY
proxy=$!
for _ in $(seq 1 100); do grep -q listening proxy.log && break; sleep 0.05; done
secret_run=(--set train.steps=8 --set schedule.warmup_steps=2 --set checkpoint.interval_steps=4 --set launch.threads_per_worker=1 --set run_dir=secret_run)
# torchrun's variables (its run id: the two ranks see different ports, so the default id would differ)
DSTRAIN_STORE_SECRET="$secret" RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 TORCHELASTIC_RUN_ID=secret MASTER_ADDR=127.0.0.1 MASTER_PORT=$store_port \
  timeout 120 "$DSTRAIN" train "$demo_recipe" "${secret_run[@]}" > secret0.log 2>&1 &
rank0=$!
DSTRAIN_STORE_SECRET="$secret" RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 TORCHELASTIC_RUN_ID=secret MASTER_ADDR=127.0.0.1 MASTER_PORT=$proxy_port \
  timeout 120 "$DSTRAIN" train "$demo_recipe" "${secret_run[@]}" > secret1.log 2>&1 || fail "rank 1 failed: $(tail -5 secret1.log)"
wait $rank0 || fail "rank 0 failed: $(tail -5 secret0.log)"
kill $proxy 2>/dev/null || true
grep -q "step 8/8" secret0.log || fail "the run through the proxy did not train: $(tail -5 secret0.log)"
[ "$(stat -c %s capture.bin)" -gt 1000 ] || fail "the proxy captured almost nothing: $(cat proxy.log)"
grep -qa "env DSTRAIN_STORE_SECRET" capture.bin || fail "rank 1's environment facts did not pass through the proxy"
! grep -qaF "$secret" capture.bin || fail "the secret went into the rendezvous store"
! grep -rlaF "$secret" secret_run secret0.log secret1.log || fail "the secret is in a file of the run"
grep -qaE "env DSTRAIN_STORE_SECRET	.*	\(set; value hidden\)" capture.bin || fail "rank 1 did not report that the secret is set"
ok "the secret is in no byte sent to or read from the store (the env check and checkpoint gathers), no run file, no log"

DSTRAIN_STORE_SECRET="$secret" expect_status 0 "$DSTRAIN" check-env --nproc-per-node 2
! grep -qF "$secret" <<<"$OUT" || fail "check-env prints the secret: $OUT"
expect_out "(set; value hidden)"
ok "check-env shows only that the secret is set"

finish
