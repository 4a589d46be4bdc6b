#!/usr/bin/env bash
# Two "nodes" in network namespaces joined by a veth pair, each running a dstrain launcher with
# 2 local workers: they rendezvous across the link, pass the collective check, and train with
# the same losses as 4 ranks on one node.
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
grep -q "collective check on 4 ranks (gloo): 76 passed, 0 failed" a.log || fail "no passing check on node 0: $(cat a.log)"
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

ip netns exec "$b" "$DSTRAIN" bench comm --nnodes 2 --node-rank 1 --master-addr 10.199.0.1 --master-port 29563 --nproc-per-node 2 --check --timeout 3 > lone.log 2>&1 && fail "node 1 alone should fail"
grep -q "cannot reach node 0's launcher at 10.199.0.1:29563" lone.log || fail "the error does not name node 0's address: $(cat lone.log)"
ok "a node whose peer never comes names the address it waited for"
finish
