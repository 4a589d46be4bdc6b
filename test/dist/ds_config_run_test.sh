#!/usr/bin/env bash
# A run configured through an inline DeepSpeed mapping: Adam with L2 decay (adam_w_mode false),
# DeepSpeed's WarmupDecayLR and staged gradient accumulation. The LR in metrics.jsonl follows
# DeepSpeed's formula, the data cursor follows the stages, and a resume after a kill is bit-exact.
source "$(dirname "$0")/../lib.sh"
cat > ds.yaml <<YAML
run_dir: unused
seed: 5
model: {hidden_size: 64, num_layers: 1, num_heads: 4, intermediate_size: 128, max_seq_len: 64}
data: {path: $SRC/recipes/data/demo_corpus.txt, seq_len: 64}
train:
  micro_batch_size: 2
  accumulation: [{until_step: 6, steps: 1}, {until_step: 12, steps: 2}, {steps: 3}]
checkpoint: {interval_steps: 8, keep_last: 0}
launch: {nproc_per_node: 2, threads_per_worker: 1}
deepspeed:
  optimizer: {type: Adam, params: {lr: 0.002, adam_w_mode: false, weight_decay: 0.01}}
  scheduler: {type: WarmupDecayLR, params: {total_num_steps: 20, warmup_num_steps: 4, warmup_min_lr: 0.0002, warmup_max_lr: 0.002, warmup_type: linear}}
YAML

expect_status 0 "$DSTRAIN" train ds.yaml --set run_dir=whole
ok "trained 20 steps from an inline ds_config with staged accumulation"

python3 - whole/metrics.jsonl <<'PY' || fail "LR or token counts differ from DeepSpeed's WarmupDecayLR and the stages"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 20, len(rows)
lo, hi, n, total = 0.0002, 0.002, 4, 20
for k, r in enumerate(rows):          # optimizer step k (0-based) uses DeepSpeed's it = k - 1
    it = k - 1
    if it < 0: want = lo
    elif it < n: want = lo + (hi - lo) * it / n
    else: want = lo + (hi - lo) * max(0.0, (total - it) / max(1.0, total - n))
    assert abs(r["lr"] - want) < 1e-12, (k, r["lr"], want)
tokens, seq = 0, 64
for k, r in enumerate(rows):
    accum = 1 if k < 6 else 2 if k < 12 else 3
    tokens += 2 * 2 * accum * seq    # micro x ranks x accumulation x seq_len
    assert r["tokens"] == tokens, (k, r["tokens"], tokens)
print("lr and tokens match for 20 steps")
PY
ok "the LR is DeepSpeed's WarmupDecayLR step for step, and the tokens follow the accumulation stages"

"$DSTRAIN" train ds.yaml --set run_dir=cut > cut.log 2>&1 &
kill_worker_when cut/ckpt/step_00000008/COMMITTED $!
expect_status 0 "$DSTRAIN" resume cut
python3 "$SRC/test/dist/compare_metrics.py" whole/metrics.jsonl cut/metrics.jsonl --exact || fail "resume with stages is not bit-exact"
ok "resuming mid-run (inside the second stage) is bit-exact"

expect_status 0 "$DSTRAIN" train ds.yaml --set run_dir=timed --set checkpoint.interval_steps=0 --set checkpoint.interval_minutes=0.0005 \
  --set checkpoint.dir=timed-ckpt
saves=$(ls -d timed-ckpt/step_* | wc -l)
[ "$saves" -ge 3 ] || fail "expected time-based checkpoints besides the final one, found $saves: $(ls timed-ckpt)"
[ ! -e timed/ckpt ] || fail "checkpoint.dir was ignored"
expect_status 0 "$DSTRAIN" inspect-ckpt timed-ckpt
expect_status 0 "$DSTRAIN" resume timed
expect_out "resumed from $WORK/timed-ckpt/step_00000020"
expect_out "the run is already complete (20 of 20 steps); nothing to do"
ok "checkpoint.interval_minutes saves on the clock ($saves checkpoints), into checkpoint.dir, and resume finds them"
finish
