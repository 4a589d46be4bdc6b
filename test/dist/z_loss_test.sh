#!/usr/bin/env bash
# PaLM's z-loss (train.z_loss_weight), the objective's proof that a new term is one file: with MTP
# depth 1 on the MLA + MoE model, 2 ranks at ZeRO-3, expert parallelism and 2-stage pipelines
# (1F1B and zero-bubble) give the single process's loss, z_loss and mtp_loss within 1e-5; z_loss
# is in metrics.jsonl, TensorBoard and the console; it changes training (the loss at weight 0
# differs) and weight 0 logs none; a negative weight is refused by key.
source "$(dirname "$0")/../lib.sh"
source "$SRC/scripts/common.sh"
cmp="$SRC/test/dist/compare_metrics.py"
py="$DSTRAIN_VENV/bin/python"
recipe="$SRC/recipes/tiny-mla-moe.yaml"
common=(--set train.z_loss_weight=0.01 --set model.mtp_depth=1 --set train.steps=6 --set train.micro_batch_size=2
        --set train.global_batch_size=8 --set schedule.warmup_steps=1 --set launch.threads_per_worker=1 --set checkpoint.interval_steps=0
        --set checkpoint.at_end=false --set zero.stage3_param_persistence_threshold=0)
run() {  # run NAME NPROC [--set ...]
  local name=$1 n=$2; shift 2
  expect_status 0 "$DSTRAIN" train "$recipe" "${common[@]}" --nproc-per-node "$n" --set run_dir="$name" "$@"
}

run one 1 --set 'logging.sinks=[console, jsonl, tensorboard]'
expect_out "| z_loss "
python3 - one/metrics.jsonl <<'PY' || fail "metrics.jsonl's z_loss is not one positive number per step"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
z = [r["z_loss"] for r in rows]
assert len(z) == 6 and all(isinstance(x, float) and x > 0 for x in z), z
keys = list(rows[0])
assert keys[keys.index("loss") + 1:keys.index("lr")] == ["mtp_loss", "z_loss"], keys  # the objective's terms, after the loss
print(f"z_loss {z[0]:.4f} -> {z[-1]:.4f}")
PY
if "$py" -c 'import tensorboard' 2>/dev/null; then
  "$py" - one <<'PY' || fail "TensorBoard has no train/z_loss equal to metrics.jsonl's"
import json, math, sys, warnings
warnings.filterwarnings("ignore")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(f"{sys.argv[1]}/tensorboard", size_guidance={"scalars": 0})
acc.Reload()
rows = {r["step"]: r for r in map(json.loads, open(f"{sys.argv[1]}/metrics.jsonl"))}
events = acc.Scalars("train/z_loss")
assert [e.step for e in events] == list(range(1, 7)), events
assert all(math.isclose(e.value, rows[e.step]["z_loss"], rel_tol=1e-6) for e in events)
print("train/z_loss: 6 values equal to metrics.jsonl's")
PY
fi
run z3 2 --set zero.stage=3
python3 "$cmp" one/metrics.jsonl z3/metrics.jsonl --rtol 1e-5 --mtp --key z_loss --grad-norm || fail "z-loss at 2 ranks ZeRO-3 differs from one process"
run ep 2 --set moe.expert_parallel_size=2 --set zero.stage=2
python3 "$cmp" one/metrics.jsonl ep/metrics.jsonl --rtol 1e-5 --mtp --key z_loss || fail "z-loss with expert parallelism differs from one process"
run pp 2 --set parallel.pipeline_parallel_size=2 --set pipeline.schedule=1f1b
python3 "$cmp" one/metrics.jsonl pp/metrics.jsonl --rtol 1e-5 --mtp --key z_loss || fail "z-loss through a 2-stage 1F1B pipeline differs from one process"
run zb 2 --set parallel.pipeline_parallel_size=2 --set pipeline.schedule=zb_h1 --set zero.stage=1
python3 "$cmp" one/metrics.jsonl zb/metrics.jsonl --rtol 1e-5 --mtp --key z_loss || fail "z-loss through a zero-bubble pipeline differs from one process"
ok "z-loss with MTP: 2 ranks at ZeRO-3, expert parallelism and 2-stage 1F1B and zb_h1 pipelines equal one process within 1e-5 (loss, z_loss, mtp_loss); z_loss in metrics.jsonl, TensorBoard and the console"

run off 1 --set train.z_loss_weight=0
! grep -q z_loss off/metrics.jsonl || fail "weight 0 logged a z_loss"
python3 - one/metrics.jsonl off/metrics.jsonl <<'PY' || fail "the z-loss did not change training"
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:])
assert a[0] == b[0] and a[-1] != b[-1], (a, b)  # the first step's loss is the cross-entropy either way
print(f"step 1 loss equal ({a[0]:.6f}); step 6: {a[-1]:.6f} with z-loss, {b[-1]:.6f} without")
PY
expect_status 2 "$DSTRAIN" train "$recipe" --set train.z_loss_weight=-1 --set run_dir=bad
expect_out "train.z_loss_weight: -1 is out of range"
ok "weight 0 logs no z_loss and trains otherwise; a negative weight is a config error naming the key"
finish
