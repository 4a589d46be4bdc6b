#!/usr/bin/env bash
# The ZeRO engine's other guarantees (dist.zero_stages has the stages against the single process):
# the per-rank memory against the ZeRO formulas, bf16 against fp32, bit-exact resume at stage 3
# and a stage-2 resume on fewer ranks, the LR's batch scaling, fp16's skipped overflow step, and
# the delayed update.
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/zero_lib.sh"

# Memory per rank (bf16: the ZeRO paper's mixed-precision setting) within 5% of the formulas.
for stage in 1 2 3; do
  for n in 2 4; do
    run mem$stage$n $n 2 --set zero.stage=$stage --set precision.dtype=bf16 --set train.steps=1 --set schedule.warmup_steps=0
    python3 - "mem$stage$n/memory.json" <<'PY' || fail "stage $stage, $n ranks: memory off the formula"
import json, sys
m = json.load(open(sys.argv[1]))
for got, want in (("params_bytes", "formula_params_bytes"), ("grads_bytes", "formula_grads_bytes")):
    assert abs(m[got] - m[want]) <= 0.05 * m[want], (got, m[got], m[want])
states = m["master_bytes"] + m["optimizer_bytes"]
assert abs(states - m["formula_optimizer_bytes"]) <= 0.05 * m["formula_optimizer_bytes"], (states, m["formula_optimizer_bytes"])
PY
  done
done
ok "per-rank parameter, gradient and optimizer bytes are within 5% of the ZeRO formulas (stages 1-3, 2 and 4 ranks)"

run single 1 16
run bf16 2 8 --set zero.stage=3 --set precision.dtype=bf16
python3 - single/metrics.jsonl bf16/metrics.jsonl <<'PY' || fail "bf16 strays from fp32"
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p)] for p in sys.argv[1:])
worst = max(abs(x - y) / x for x, y in zip(a, b))
tail = abs(sum(a[-10:]) - sum(b[-10:])) / sum(a[-10:])
print(f"bf16 vs fp32: worst step {worst:.3f}, last 10 steps' mean {tail:.4f}")
assert len(a) == len(b) == 30 and worst < 0.05 and tail < 0.02
PY
ok "bf16 (stage 3) tracks the fp32 run: every step within 5%, the last 10 steps' mean within 2%"

# Resume: cut a finished run back to its step-10 checkpoint and resume it; the sharded optimizer
# state (and fp16's loss-scaler state) round-trips, so the steps after it are bit-identical.
cut_back() {  # cut_back RUN_DIR: keep the step-10 checkpoint only
  rm -rf "$1"/ckpt/step_000000[2-9]0 "$1"/ckpt/step_00000030
  printf 'step_00000010' > "$1/ckpt/latest"
}
run whole3 2 8 --set zero.stage=3 --set zero.overlap_comm=true --set checkpoint.interval_steps=10 --set checkpoint.keep_last=0
cp -r whole3 cut3 && cut_back cut3
expect_status 0 "$DSTRAIN" resume cut3
expect_out "resumed from"
expect_out "the run directory was moved or copied from $PWD/whole3: resuming in $PWD/cut3"
[ -e whole3/ckpt/step_00000030/COMMITTED ] && [ -e cut3/ckpt/step_00000030/COMMITTED ] || fail "the copy's resume wrote outside its directory"
python3 "$cmp" whole3/metrics.jsonl cut3/metrics.jsonl --exact || fail "stage 3: the resumed run differs"
same_checkpoint_data whole3/ckpt/step_00000030 cut3/ckpt/step_00000030 || fail "stage 3: final state differs"
ok "stage 3 resumes bit-exactly from a checkpoint (losses and final weights and Adam states)"

run whole2 4 2 --set zero.stage=2 --set checkpoint.interval_steps=10 --set checkpoint.keep_last=0
cp -r whole2 cut2 && cut_back cut2
expect_status 0 "$DSTRAIN" resume cut2 --nproc-per-node 2
expect_out "resumed from"
python3 "$cmp" whole2/metrics.jsonl cut2/metrics.jsonl --rtol 1e-5 || fail "stage 2 resumed on 2 ranks diverges from the 4-rank run"
ok "a stage-2 run on 4 ranks resumes on 2 (shards re-cut) and continues within fp32 rounding"

# LR batch scaling: the LR follows the global batch when the accumulation stages double it.
grep -v global_batch_size "$demo_recipe" > staged.yaml
expect_status 0 "$DSTRAIN" train staged.yaml --nproc-per-node 2 --set launch.threads_per_worker=1 --set data.path="$SRC/recipes/data/demo_corpus.txt" \
  --set run_dir=scaled --set train.steps=8 --set train.micro_batch_size=4 --set 'train.accumulation=[{until_step: 4, steps: 1}, {steps: 2}]' \
  --set schedule.type=constant --set schedule.batch_scaling=linear
python3 - scaled/metrics.jsonl <<'PY' || fail "schedule.batch_scaling: linear did not double the LR with the batch"
import json, sys
lr = [json.loads(l)["lr"] for l in open(sys.argv[1])]
assert lr[:4] == [0.003] * 4 and all(abs(x - 0.006) < 1e-12 for x in lr[4:]), lr
PY
ok "schedule.batch_scaling: linear doubles the LR when the accumulation stages double the batch"

DSTRAIN_TEST_FAULTS=inf_step=3 run fp16 2 8 --set zero.stage=2 --set precision.dtype=fp16 --set train.steps=6 --set schedule.warmup_steps=2 --set precision.hysteresis=1
expect_out "step 3: fp16 gradients overflowed at loss scale 65536: update skipped"
python3 - fp16/metrics.jsonl <<'PY' || fail "the overflowing step was not skipped as DeepSpeed does"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["skipped"] for r in rows] == [False, False, True, False, False, False], rows
assert [r["loss_scale"] for r in rows] == [65536, 65536, 65536, 32768, 32768, 32768], rows
assert rows[3]["lr"] == rows[2]["lr"], "a skipped step must not advance the LR schedule"
PY
ok "fp16: an injected inf skips its step, halves the scale and holds the LR schedule"

# zero.delayed_update (DPU): each step's CPU update is applied at the end of the next one. It
# trains (another trajectory than without the delay), and a checkpoint applies the pending update
# first, so a run continued from it with the same checkpoint steps matches the uninterrupted run
# exactly (the save at step 20 applies its update early in both).
run dpu 2 4 --set zero.stage=2 --set zero.offload_optimizer=cpu --set zero.delayed_update=true --set zero.delayed_update_after=5 --set checkpoint.interval_steps=10 \
  --set checkpoint.keep_last=0
expect_out "delayed update: each step's update runs during the next step"
python3 "$cmp" dpu/metrics.jsonl --decreases 1.0 || fail "the delayed update does not train"
run s2n2 2 4 --set zero.stage=2 --set zero.overlap_comm=false
if python3 "$cmp" s2n2/metrics.jsonl dpu/metrics.jsonl --rtol 1e-3 > /dev/null 2>&1; then fail "the delayed update changed nothing"; fi
run dpu_resumed 2 4 --set zero.stage=2 --set zero.offload_optimizer=cpu --set zero.delayed_update=true --set zero.delayed_update_after=5 --set checkpoint.interval_steps=10 \
  --set checkpoint.keep_last=0 --resume dpu/ckpt/step_00000010
python3 "$cmp" dpu/metrics.jsonl dpu_resumed/metrics.jsonl --resumed --exact || fail "a run continued from a delayed-update checkpoint differs"
expect_status 2 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --set zero.delayed_update=true --set run_dir=dpu_bad
expect_out "zero.delayed_update (--set) needs zero.offload_optimizer = cpu"
ok "zero.delayed_update trains another trajectory, resumes exactly from its checkpoints, and needs offload_optimizer"
finish
