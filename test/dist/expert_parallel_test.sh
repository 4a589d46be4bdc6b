#!/usr/bin/env bash
# Expert parallelism (issue 22): 4 real ranks with the routed experts spread over E = 1, 2 and 4
# of them, at ZeRO stages 0-3, give the single-process losses (V3-style routing with the
# aux-loss-free bias, and V2-style softmax routing with the balance loss); checkpoints hold every
# expert under its global name, so a run saved at E = 4 continues at E = 2 and on 2 ranks;
# --dry-run shows the layout; a size that does not fit is a config error.
source "$(dirname "$0")/../lib.sh"
cmp="$SRC/test/dist/compare_metrics.py"
recipe="$SRC/recipes/tiny-mla-moe.yaml"
common=(--set train.steps=30 --set train.micro_batch_size=2 --set launch.threads_per_worker=1 --set checkpoint.keep_last=0
        --set checkpoint.interval_steps=0 --set zero.stage3_param_persistence_threshold=0)
v2=(--set model.scoring_func=softmax --set model.topk_method=greedy --set model.norm_topk_prob=false --set model.aux_loss_alpha=0.01)

run() {  # run NAME NPROC [--set ...]
  local name=$1 n=$2; shift 2
  expect_status 0 "$DSTRAIN" train "$recipe" "${common[@]}" --nproc-per-node "$n" --set run_dir="$name" "$@"
}

run one 1
python3 "$cmp" one/metrics.jsonl --decreases 1.0 || fail "the single-process loss did not fall"
for ep in 1 2 4; do
  for stage in 0 1 2 3; do
    run e${ep}s${stage} 4 --set moe.expert_parallel_size=$ep --set zero.stage=$stage --set zero.overlap_comm=$([ $stage -ge 2 ] && echo true || echo false)
    python3 "$cmp" one/metrics.jsonl e${ep}s${stage}/metrics.jsonl --rtol 1e-5 || fail "E=$ep at ZeRO-$stage differs from one process"
  done
done
grep -q "routed experts over 4 ranks, 1 per rank and layer, each expert data-parallel over 1" e4s2/logs/rank_00000.log ||
  fail "the engine's line does not describe the expert layout"
python3 - e2s1/metrics.jsonl e1s1/metrics.jsonl <<'PY' || fail "all_to_all_ms is wrong"
import json, sys
ep, plain = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
assert all(r["all_to_all_ms"] is not None and r["all_to_all_ms"] >= 0 for r in ep), [r["all_to_all_ms"] for r in ep]
assert sum(r["all_to_all_ms"] for r in ep) > 0, "no exchange time at all"
assert all(r["all_to_all_ms"] is None for r in plain), "all_to_all_ms without expert parallelism"
PY
ok "V3 routing: E = 1, 2, 4 at ZeRO 0-3 on 4 ranks give the single-process losses within 1e-5; all_to_all_ms logged with E > 1"

run v2one 1 "${v2[@]}"
for case in "2 0" "2 1" "4 3"; do
  set -- $case
  run v2e$1s$2 4 "${v2[@]}" --set moe.expert_parallel_size=$1 --set zero.stage=$2
  python3 "$cmp" v2one/metrics.jsonl v2e$1s$2/metrics.jsonl --rtol 1e-5 || fail "V2 routing, E=$1 at ZeRO-$2 differs from one process"
done
DSTRAIN_EP_OVERLAP=0 run v2e2s2 4 "${v2[@]}" --set moe.expert_parallel_size=2 --set zero.stage=2
python3 "$cmp" v2one/metrics.jsonl v2e2s2/metrics.jsonl --rtol 1e-5 || fail "V2 routing, E=2 without overlap differs from one process"
ok "V2 routing (softmax, balance loss): E = 2 at ZeRO 0/1/2 (2: the shared experts after the dispatch) and E = 4 at ZeRO-3 give the single-process losses"

# Checkpoints at E = 4 (stage 0: the four expert blocks written by ranks 0-3, asynchronously; stage 1:
# every rank its shard) hold every expert under its global name and continue at E = 2.
run c4s0 4 --set moe.expert_parallel_size=4 --set zero.stage=0 --set checkpoint.interval_steps=10 --set checkpoint.async=true
run c4s1 4 --set moe.expert_parallel_size=4 --set zero.stage=1 --set checkpoint.interval_steps=10
for dir in c4s0 c4s1; do
  expect_status 0 "$DSTRAIN" inspect-ckpt $dir/ckpt/step_00000010 --tensors
  for e in 0 1 2 3; do
    for kind in "" exp_avg. exp_avg_sq.; do expect_out "${kind}model.layers.1.mlp.experts.$e.down_proj.weight"; done
  done
done
expect_status 0 "$DSTRAIN" train "$recipe" "${common[@]}" --nproc-per-node 4 --set moe.expert_parallel_size=2 --set zero.stage=3 \
  --set run_dir=r42 --resume c4s0/ckpt/step_00000010
python3 "$cmp" one/metrics.jsonl r42/metrics.jsonl --resumed --rtol 1e-5 || fail "E=4 -> E=2 resume differs"
expect_status 0 "$DSTRAIN" train "$recipe" "${common[@]}" --nproc-per-node 2 --set moe.expert_parallel_size=2 --set zero.stage=2 \
  --set run_dir=r42n2 --resume c4s1/ckpt/step_00000020
python3 "$cmp" one/metrics.jsonl r42n2/metrics.jsonl --resumed --rtol 1e-5 || fail "E=4 on 4 ranks -> E=2 on 2 ranks differs"
expect_status 0 "$DSTRAIN" train "$recipe" "${common[@]}" --nproc-per-node 1 --set run_dir=r41 --resume c4s1/ckpt/step_00000010
python3 "$cmp" one/metrics.jsonl r41/metrics.jsonl --resumed --rtol 1e-5 || fail "E=4 -> one process differs"
ok "a checkpoint written at E = 4 holds every expert and continues at E = 2 (4 and 2 ranks) and in one process"

expect_status 0 "$DSTRAIN" train "$recipe" "${common[@]}" --nproc-per-node 4 --set moe.expert_parallel_size=2 --set zero.stage=2 \
  --set run_dir=dry --dry-run
expect_out "expert parallelism      2 ranks per group: 2 of 4 routed experts per rank and MoE layer"
expect_out "each expert data-parallel over 2 rank(s) {0,2}"
expect_status 2 "$DSTRAIN" train "$recipe" "${common[@]}" --nproc-per-node 4 --set moe.expert_parallel_size=3 --set run_dir=bad
expect_out "moe.expert_parallel_size 3 does not divide model.n_routed_experts 4"
expect_out "moe.expert_parallel_size 3 does not divide the world size 4"
ok "--dry-run shows the expert-parallel layout; a size that does not divide is a config error"
finish
