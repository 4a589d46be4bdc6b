#!/usr/bin/env bash
# Two "nodes" in network namespaces joined by a veth pair, each running a dstrain launcher with
# 2 local workers: they rendezvous across the link, pass the collective check, and train with
# the same losses as 4 ranks on one node; a pipeline with its stages on different nodes (DP 2 x
# PP 2: activations and gradients cross the link) trains as it does on one node. Faults across nodes: a worker killed on node 1 makes
# both launchers restart together; node 1's launcher killed makes node 0 stop within the
# heartbeat timeout, and node 0 alone then resumes the run on 2 ranks.
source "$(dirname "$0")/../lib.sh"
if [ "$(id -u)" -ne 0 ]; then echo "SKIPPED: network namespaces need root"; exit 77; fi
tag="ds$$"
a="${tag}a" b="${tag}b"
cleanup_netns() { ip netns del "$a" 2>/dev/null || true; ip netns del "$b" 2>/dev/null || true; }
trap 'cleanup_netns; cleanup' EXIT
if ! ip netns add "$a" 2>/dev/null; then echo "SKIPPED: cannot create network namespaces here"; exit 77; fi
ip netns add "$b"
ip link add "${tag}x" netns "$a" type veth peer name "${tag}y" netns "$b"
ip -n "$a" addr add 10.199.0.1/24 dev "${tag}x"
ip -n "$b" addr add 10.199.0.2/24 dev "${tag}y"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "${tag}x" up
ip -n "$b" link set "${tag}y" up
ok "two namespaces linked by veth (10.199.0.1 <-> 10.199.0.2)"

flags=(--nnodes 2 --master-addr 10.199.0.1 --master-port 29561 --nproc-per-node 2)
ip netns exec "$a" "$DSTRAIN" bench comm "${flags[@]}" --node-rank 0 --check --timeout 60 > a.log 2>&1 &
pa=$!
ip netns exec "$b" "$DSTRAIN" bench comm "${flags[@]}" --node-rank 1 --check --timeout 60 > b.log 2>&1 || fail "node 1 failed: $(cat b.log)"
wait $pa || fail "node 0 failed: $(cat a.log)"
grep -q "collective check on 4 ranks (gloo): 82 passed, 0 failed" a.log || fail "no passing check on node 0: $(cat a.log)"
ok "2 nodes x 2 workers rendezvous across the link and pass the collective check"

common=(--set train.steps=10 --set train.micro_batch_size=4 --set checkpoint.interval_steps=0 --set launch.threads_per_worker=1)
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --nproc-per-node 4 --set run_dir=single
flags=(--nnodes 2 --master-addr 10.199.0.1 --master-port 29562 --nproc-per-node 2)
ip netns exec "$a" "$DSTRAIN" train "$demo_recipe" "${common[@]}" "${flags[@]}" --node-rank 0 --set run_dir=node0 > ta.log 2>&1 &
pa=$!
ip netns exec "$b" "$DSTRAIN" train "$demo_recipe" "${common[@]}" "${flags[@]}" --node-rank 1 --set run_dir=node1 > tb.log 2>&1 || fail "node 1 failed: $(cat tb.log)"
wait $pa || fail "node 0 failed: $(cat ta.log)"
python3 "$SRC/test/dist/compare_metrics.py" single/metrics.jsonl node0/metrics.jsonl --rtol 1e-5 || fail "two nodes differ from one node"
[ -f node1/config.resolved.json ] || fail "node 1 did not receive the resolved config"
ok "training across the two nodes matches 4 ranks on one node; node 1 got the config from node 0 (no shared filesystem needed)"

# Stage-major ranks: stage 0 is ranks 0-1 (node 0), stage 1 ranks 2-3 (node 1); each stage's
# data-parallel group stays inside its node. A pipeline's checkpoints need a directory every node
# sees (each stage writes its own pieces).
pp=("${common[@]}" --set train.micro_batch_size=2 --set train.global_batch_size=16 --set parallel.pipeline_parallel_size=2 --set zero.stage=1
    --set checkpoint.dir="$WORK/pp_ckpt")
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${pp[@]}" --nproc-per-node 4 --set run_dir=pp_single --set checkpoint.dir="$WORK/pp_single/ckpt"
flags=(--nnodes 2 --master-addr 10.199.0.1 --master-port 29567 --nproc-per-node 2)
ip netns exec "$a" "$DSTRAIN" train "$demo_recipe" "${pp[@]}" "${flags[@]}" --node-rank 0 --set run_dir=pp0 > pa.log 2>&1 &
pa=$!
ip netns exec "$b" "$DSTRAIN" train "$demo_recipe" "${pp[@]}" "${flags[@]}" --node-rank 1 --set run_dir=pp1 > pb.log 2>&1 || fail "node 1 failed: $(cat pb.log)"
wait $pa || fail "node 0 failed: $(cat pa.log)"
python3 "$SRC/test/dist/compare_metrics.py" pp_single/metrics.jsonl pp0/metrics.jsonl --exact || fail "the pipeline across two nodes differs from one node"
grep -q "pipeline rank 1 of 2: stage 1 (layer 1, the final norm and head)" pp1/logs/rank_00002.log || fail "node 1's ranks do not hold stage 1: $(head -20 pp1/logs/rank_00002.log)"
expect_status 0 "$DSTRAIN" inspect-ckpt "$WORK/pp_ckpt/step_00000010" --verify
ok "a pipeline with stage 0 on node 0 and stage 1 on node 1 trains bit-identically to one node"

# --- check-env across the two nodes, each with its own hostname (a UTS namespace) ----------
flags=(--nnodes 2 --master-addr 10.199.0.1 --master-port 29566 --nproc-per-node 2)
ip netns exec "$a" unshare --uts sh -c 'hostname node-a && exec "$@"' sh "$DSTRAIN" check-env "$demo_recipe" "${flags[@]}" --node-rank 0 --set train.micro_batch_size=4 --set run_dir=env > ea.log 2>&1 &
pa=$!
ip netns exec "$b" unshare --uts sh -c 'hostname node-b && exec "$@"' sh "$DSTRAIN" check-env "$demo_recipe" "${flags[@]}" --node-rank 1 --set train.micro_batch_size=4 --set run_dir=env > eb.log 2>&1 ||
  fail "check-env on node 1 failed: $(cat eb.log)"
wait $pa || fail "check-env on node 0 failed: $(cat ea.log)"
grep -q "check-env: 4 ranks on 2 nodes (node-a, node-b)" ea.log || fail "the report does not show both hosts: $(cat ea.log)"
grep -q "· host .*node-a: ranks 0–1; node-b: ranks 2–3" ea.log || fail "the host row does not group the ranks by node: $(cat ea.log)"
grep -q "[✓·] inter-node link (slowest from this node) .*GB/s to node" ea.log || fail "no pairwise link probe: $(cat ea.log)"
grep -q "✓ config hash" ea.log || fail "the nodes' resolved configs differ: $(cat ea.log)"
ok "check-env on two nodes: facts from both hosts, consistent, with the link between them measured"

# --- a worker killed on node 1: every node's launcher stops and restarts together ----------
common=(--set train.steps=30 --set train.micro_batch_size=4 --set train.global_batch_size=16 --set checkpoint.interval_steps=5
        --set launch.threads_per_worker=1 --set launch.heartbeat_timeout_s=3)
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --nproc-per-node 4 --set run_dir=whole
flags=(--nnodes 2 --master-addr 10.199.0.1 --master-port 29564 --nproc-per-node 2)
ip netns exec "$a" "$DSTRAIN" train "$demo_recipe" "${common[@]}" "${flags[@]}" --node-rank 0 --max-restarts 1 --set run_dir=ra > ra.log 2>&1 &
pa=$!
ip netns exec "$b" "$DSTRAIN" train "$demo_recipe" "${common[@]}" "${flags[@]}" --node-rank 1 --set run_dir=rb > rb.log 2>&1 &
pb=$!
for _ in $(seq 1 600); do [ "$(wc -l 2>/dev/null < ra/metrics.jsonl || echo 0)" -ge 12 ] && break; sleep 0.05; done
victim=$(pgrep -P $pb -f worker | head -n1)
[ -n "$victim" ] || victim=$(pgrep -P "$(pgrep -P $pb | head -n1)" -f worker | head -n1)
kill -9 "$victim"
set +e; wait $pa; sa=$?; wait $pb; sb=$?; set -e
[ $sa -eq 0 ] && [ $sb -eq 0 ] || fail "the group did not complete after the restart (node 0 exit $sa, node 1 exit $sb): $(tail -5 ra.log) // $(tail -5 rb.log)"
grep -q "the first: rank [23] on .* (node 1) was killed by signal 9 (SIGKILL)" ra.log || fail "node 0 does not report node 1's failure: $(grep -i fail ra.log)"
grep -q "node 0 restarts the group (generation 1); rejoining" rb.log || fail "node 1 did not rejoin: $(tail rb.log)"
python3 - ra/failures.jsonl <<'PY' || fail "node 0's failures.jsonl does not record the remote failure"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
# The SIGKILL on node 1 first (the root cause), then any echo of it on node 0 (a comm error).
assert rows[0].get("signal") == 9 and rows[0]["rank"] in (2, 3) and rows[0]["node"] == 1, rows
assert all(r.get("exit_code") == 6 for r in rows[1:]) and [r["time"] for r in rows] == sorted(r["time"] for r in rows), rows
PY
python3 "$SRC/test/dist/compare_metrics.py" whole/metrics.jsonl ra/metrics.jsonl --rtol 1e-5 || fail "the restarted two-node run differs from 4 ranks on one node"
ok "a worker killed on node 1: node 0 records it, both launchers restart generation 1 from the checkpoint, and the run completes like one node's"

# --- node 1's launcher killed: node 0 stops within the heartbeat timeout; resume on node 0 alone
flags=(--nnodes 2 --master-addr 10.199.0.1 --master-port 29565 --nproc-per-node 2)
ip netns exec "$a" "$DSTRAIN" train "$demo_recipe" "${common[@]}" "${flags[@]}" --node-rank 0 --set run_dir=la > la.log 2>&1 &
pa=$!
ip netns exec "$b" "$DSTRAIN" train "$demo_recipe" "${common[@]}" "${flags[@]}" --node-rank 1 --set run_dir=lb > lb.log 2>&1 &
pb=$!
for _ in $(seq 1 600); do [ "$(wc -l 2>/dev/null < la/metrics.jsonl || echo 0)" -ge 12 ] && break; sleep 0.05; done
node1_launcher=$(pgrep -P $pb -f "dstrain train" || echo $pb)
killed_at=$(date +%s.%N)
kill -9 $node1_launcher
set +e; wait $pa; sa=$?; set -e
stopped_in=$(python3 -c "import time; print(round(time.time() - $killed_at, 1))")
wait $pb 2>/dev/null || true
[ $sa -ne 0 ] || fail "node 0 finished although node 1 was lost"
python3 -c "import sys; sys.exit(0 if $stopped_in <= 3 + 5 else 1)" || fail "node 0 took $stopped_in s to stop (heartbeat timeout 3 s)"
[ -z "$(pgrep -f "run_dir=la" | grep -v $$ || true)" ] || fail "processes of node 0 are left"
grep -q "node 1 lost: the group cannot be formed again; continue on the remaining nodes with \`dstrain resume" la.log || fail "node 0 does not say node 1 is lost: $(tail -5 la.log)"
last=$(cat la/ckpt/latest)
expect_status 0 ip netns exec "$a" "$DSTRAIN" resume la --nnodes 1 --nproc-per-node 2 --master-port 0
expect_out "resumed from"
python3 "$SRC/test/dist/compare_metrics.py" whole/metrics.jsonl la/metrics.jsonl --rtol 1e-5 || fail "the resumed run on 2 ranks differs"
ok "node 1's launcher killed: node 0 stopped in $stopped_in s (exit $sa); node 0 alone resumed from $last on 2 ranks and finished like the uninterrupted run"

ip netns exec "$b" "$DSTRAIN" bench comm --nnodes 2 --node-rank 1 --master-addr 10.199.0.1 --master-port 29563 --nproc-per-node 2 --check --timeout 3 > lone.log 2>&1 && fail "node 1 alone should fail"
grep -q "cannot reach node 0's launcher at 10.199.0.1:29563" lone.log || fail "the error does not name node 0's address: $(cat lone.log)"
ok "a node whose peer never comes names the address it waited for"
finish
