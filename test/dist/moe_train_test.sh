#!/usr/bin/env bash
# The tiny MLA + DeepSeekMoE model (V3-style routing with the aux-loss-free bias): 1 and 2 ranks
# train identically (the bias moves by the globally summed expert load), the loss falls, and a
# resume after a kill is bit-exact, the biases included; recompute changes no loss.
source "$(dirname "$0")/../lib.sh"
recipe="$SRC/recipes/tiny-mla-moe.yaml"
common=(--set train.steps=30 --set checkpoint.interval_steps=10 --set checkpoint.keep_last=0 --set launch.threads_per_worker=1)
expect_status 0 "$DSTRAIN" train "$recipe" "${common[@]}" --nproc-per-node 1 --set run_dir=one
expect_status 0 "$DSTRAIN" train "$recipe" "${common[@]}" --set run_dir=two
python3 "$SRC/test/dist/compare_metrics.py" one/metrics.jsonl two/metrics.jsonl --rtol 1e-5 || fail "1 and 2 ranks differ"
python3 "$SRC/test/dist/compare_metrics.py" one/metrics.jsonl --decreases 1.0 || fail "the MoE model does not learn"
python3 - one/metrics.jsonl two/metrics.jsonl <<'PY' || fail "metrics.jsonl lacks the expert balance"
import json, sys
one, two = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
# The busiest expert over the mean, from the globally summed load: at least 1, and about the same
# whatever the world size (the load is summed over ranks first; fp32 rounding between the two runs
# may send a token to another expert, hence 5%).
assert all(r["expert_imbalance"] is not None and r["expert_imbalance"] >= 1.0 for r in one), [r["expert_imbalance"] for r in one]
assert all(abs(a["expert_imbalance"] - b["expert_imbalance"]) <= 0.05 * a["expert_imbalance"] for a, b in zip(one, two))
PY
ok "MLA + MoE trains the same on 1 and 2 ranks, and learns; the expert balance is logged alike"

# Activation checkpointing (issue 23) on 2 real ranks at ZeRO-3: full and selective recompute give
# the losses of no recompute bit for bit (the expert load, and so the bias updates, counted once).
expect_status 0 "$DSTRAIN" train "$recipe" "${common[@]}" --set zero.stage=3 --set checkpoint.interval_steps=0 --set run_dir=z3
for mode in full selective; do
  expect_status 0 "$DSTRAIN" train "$recipe" "${common[@]}" --set zero.stage=3 --set checkpoint.interval_steps=0 \
    --set train.activation_checkpointing=$mode --set run_dir=z3$mode
  python3 "$SRC/test/dist/compare_metrics.py" z3/metrics.jsonl z3$mode/metrics.jsonl --exact || fail "$mode recompute changes the losses"
done
ok "ZeRO-3 on 2 ranks: full and selective recompute give no recompute's losses bit for bit"

"$DSTRAIN" train "$recipe" "${common[@]}" --set run_dir=cut > cut.log 2>&1 &
kill_worker_when cut/ckpt/step_00000010/COMMITTED $!
expect_status 0 "$DSTRAIN" resume cut
python3 "$SRC/test/dist/compare_metrics.py" two/metrics.jsonl cut/metrics.jsonl --exact || fail "resume is not bit-exact"
expect_status 0 "$DSTRAIN" inspect-ckpt cut/ckpt --tensors
expect_out "model.layers.1.mlp.gate.e_score_correction_bias"
ok "resume after a kill is bit-exact; checkpoints hold the selection biases"
finish
