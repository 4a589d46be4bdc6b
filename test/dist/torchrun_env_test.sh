#!/usr/bin/env bash
# Workers started by another launcher (here: by hand, with torchrun's variables) run directly as
# their rank and train exactly like workers that dstrain started itself.
source "$(dirname "$0")/../lib.sh"
common=(--set train.steps=12 --set checkpoint.interval_steps=0 --set launch.threads_per_worker=1)
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --set run_dir=launched
ok "reference run with dstrain's own launcher"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pids=()
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port TORCHELASTIC_RUN_ID=t1 \
    "$DSTRAIN" train "$demo_recipe" "${common[@]}" --set run_dir=direct > rank$r.log 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || fail "a directly started rank failed: $(cat rank0.log rank1.log)"; done
grep -q "step 12/12" rank0.log || fail "rank 0 did not train: $(cat rank0.log)"
python3 "$SRC/test/dist/compare_metrics.py" launched/metrics.jsonl direct/metrics.jsonl --exact || fail "direct ranks differ from launched workers"
ok "ranks started with RANK/WORLD_SIZE/LOCAL_RANK train bit-identically to dstrain's own workers"

# The real torchrun (from the test venv): its agent hosts the store (TORCHELASTIC_USE_AGENT_STORE)
# and dstrain's rank 0 names the run in it.
source "$SRC/scripts/common.sh"
torchrun="$DSTRAIN_VENV/bin/torchrun"
if [ -x "$torchrun" ]; then
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  expect_status 0 timeout 120 "$torchrun" --no-python --nproc-per-node 2 --master-port "$port" "$DSTRAIN" train "$demo_recipe" "${common[@]}" \
    --set run_dir=torchrun
  python3 "$SRC/test/dist/compare_metrics.py" launched/metrics.jsonl torchrun/metrics.jsonl --exact || fail "torchrun's ranks differ from dstrain's"
  ok "under the real torchrun (agent store) the demo trains bit-identically to dstrain's own launch"
else
  echo "note: no torchrun in $DSTRAIN_VENV; the real-torchrun check was not run"
fi

# Plain env:// (a scheduler's launcher: MASTER_ADDR/PORT, RANK, WORLD_SIZE, no agent): rank 0 hosts.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pids=()
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$DSTRAIN" train "$demo_recipe" "${common[@]}" --set run_dir=envrun > env$r.log 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || fail "a plain env:// rank failed: $(cat env0.log env1.log)"; done
python3 "$SRC/test/dist/compare_metrics.py" launched/metrics.jsonl envrun/metrics.jsonl --exact || fail "env:// ranks differ from dstrain's"
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port expect_status 0 "$DSTRAIN" train "$demo_recipe" --set run_dir=y --dry-run
expect_out "topology from env://"
ok "plain env:// (no LOCAL_RANK, no agent) trains bit-identically: rank 0 hosts the store"

RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_PORT=$port expect_status 0 "$DSTRAIN" train "$demo_recipe" --set run_dir=x --dry-run
expect_out "topology from torchrun: this process is rank 0 of 2"
ok "--dry-run shows the topology decision and why"
# A rank that waits for a peer that never comes names it; a rank of another run is refused.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
RANK=0 WORLD_SIZE=3 LOCAL_RANK=0 MASTER_PORT=$port TORCHELASTIC_RUN_ID=job-a expect_status 6 "$DSTRAIN" bench comm --check --timeout 3
expect_out "2 of 3 ranks never arrived within 3 s: ranks 1, 2 (arrived: 0@"
ok "a timeout names the ranks that never arrived"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_PORT=$port TORCHELASTIC_RUN_ID=job-a "$DSTRAIN" bench comm --check --timeout 8 > host.log 2>&1 &
host=$!
sleep 1
RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_PORT=$port TORCHELASTIC_RUN_ID=job-b expect_status 6 "$DSTRAIN" bench comm --check --timeout 8
expect_out "rank 1 belongs to run 'job-b/0' but the store at 127.0.0.1:$port serves run 'job-a/0'"
kill $host 2>/dev/null || true
wait $host 2>/dev/null || true
ok "a rank of another run is refused at join, naming both runs"
finish
