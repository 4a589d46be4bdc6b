#!/usr/bin/env bash
# The validation loss (issue 37): equal to transformers' loss on dstrain's exported weights
# (1e-6 relative, fp32); the same on those weights at 1, 2 and 4 ranks, ZeRO stages 0-3 and with
# expert parallelism; training bit-identical with and without an evaluation every 5 steps (fp32
# dense, bf16 MoE with the bias updates); early stopping with keep_best, killed after its best
# checkpoint and resumed, stops at the same step with the same best checkpoint; keep_best
# survives keep_last: 1; bad eval settings are config errors.
source "$(dirname "$0")/../lib.sh"
source "$SRC/scripts/common.sh"
cmp="$SRC/test/dist/compare_metrics.py"
py="$DSTRAIN_VENV/bin/python"
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error
tail -c 40000 "$SRC/recipes/data/demo_corpus.txt" > val.txt
common=(--set train.global_batch_size=16 --set launch.threads_per_worker=1 --set checkpoint.interval_steps=0
        --set eval.paths="[$WORK/val.txt]" --set eval.micro_batch_size=4)
# val_loss ROW_STEP RUN [SET]: the run's validation loss at that step.
val() { python3 -c "import json,sys; r=[json.loads(l) for l in open('$2/metrics.jsonl')]; print(repr(next(x['val_loss'] for x in r if x.get('eval')=='${3:-val}' and x['step']==$1)))"; }
tokens() { python3 -c "import json; r=[json.loads(l) for l in open('$2/metrics.jsonl')]; print(next(x['val_tokens'] for x in r if x.get('eval')=='val' and x['step']==$1))"; }
close() { python3 -c "import sys; a,b=float('$1'),float('$2'); sys.exit(0 if abs(a-b)<=$3*abs(a) else f'{a!r} vs {b!r}: relative {abs(a-b)/abs(a):.2e} > $3')"; }

# 1. Trained weights, their validation loss, and transformers' on the exported model.
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --nproc-per-node 1 --set train.micro_batch_size=16 --set train.steps=12 \
  --set eval.interval_steps=6 --set run_dir=ref
expect_out "eval step 12/12 | val | val_loss"
trained=$(val 12 ref)
expect_status 0 "$DSTRAIN" export-hf ref hf
if "$py" -c 'import transformers' 2>/dev/null; then
  "$py" "$SRC/test/dist/peft_reference.py" - none val.txt 128 "$trained" hf \
    || fail "the validation loss differs from transformers' on the exported weights"
  ok "the validation loss of trained weights equals transformers' on the export (1e-6 relative, fp32)"
else
  echo "note: transformers is not importable from $py; the reference check was not run"
fi

# 2. The same weights (model.init_from the export, evaluated before the first step) at other world
# sizes and ZeRO stages.
for cfg in "1 16 0" "2 8 3" "4 4 1" "4 4 2" "2 8 0"; do
  set -- $cfg
  expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --nproc-per-node $1 --set train.micro_batch_size=$2 --set zero.stage=$3 \
    --set train.steps=1 --set schedule.warmup_steps=1 --set eval.at_start=true --set eval.at_end=false --set model.init_from="$WORK/hf" --set run_dir=init$1s$3
  close "$trained" "$(val 0 init$1s$3)" 1e-6 || fail "$1 ranks at ZeRO-$3 give another validation loss for the same weights"
  [ "$(tokens 0 init$1s$3)" = "$(tokens 12 ref)" ] || fail "$1 ranks evaluated another number of tokens"
done
ok "the same weights give the same validation loss and token count at 1, 2 and 4 ranks, ZeRO stages 0-3 (1e-6)"

# 3. Expert parallelism: a tiny MoE before its first step, one rank against 4 ranks with E = 2 and 4
# (the same 4 micro-batches: eval.max_batches counts over all ranks).
moe=("$SRC/recipes/tiny-mla-moe.yaml" --set launch.threads_per_worker=1 --set checkpoint.interval_steps=0 --set train.micro_batch_size=2
     --set eval.paths="[$WORK/val.txt]" --set eval.at_start=true --set eval.micro_batch_size=2)
expect_status 0 "$DSTRAIN" train "${moe[@]}" --nproc-per-node 1 --set train.steps=1 --set schedule.warmup_steps=1 --set eval.max_batches=4 --set run_dir=moe1
for ep in 2 4; do
  expect_status 0 "$DSTRAIN" train "${moe[@]}" --nproc-per-node 4 --set moe.expert_parallel_size=$ep --set zero.stage=3 --set train.steps=1 --set schedule.warmup_steps=1 \
    --set eval.max_batches=4 --set run_dir=moe4e$ep
  close "$(val 0 moe1)" "$(val 0 moe4e$ep)" 1e-6 || fail "expert parallelism E=$ep gives another validation loss"
done
ok "expert parallelism (E = 2, 4 over 4 ranks, ZeRO-3) gives the one-process validation loss (1e-6)"

# 4. No side effects: the training losses are bit-identical with and without evaluation.
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --nproc-per-node 2 --set train.micro_batch_size=8 --set train.steps=15 \
  --set eval.paths="[]" --set run_dir=plain
expect_status 0 "$DSTRAIN" train "$demo_recipe" "${common[@]}" --nproc-per-node 2 --set train.micro_batch_size=8 --set train.steps=15 \
  --set eval.interval_steps=5 --set eval.at_start=true --set run_dir=evaluated
python3 "$cmp" plain/metrics.jsonl evaluated/metrics.jsonl --exact || fail "evaluation changed the dense fp32 training"
[ "$(grep -c '"eval"' evaluated/metrics.jsonl)" = 4 ] || fail "expected evaluations at steps 0, 5, 10 and 15"
for e in 0 1; do
  expect_status 0 "$DSTRAIN" train "${moe[@]}" --nproc-per-node 2 --set precision.dtype=bf16 --set train.steps=15 --set model.bias_update_speed=0.01 \
    --set eval.interval_steps=$((e * 5)) --set eval.at_start=$([ $e = 1 ] && echo true || echo false) --set eval.at_end=$([ $e = 1 ] && echo true || echo false) \
    --set run_dir=moeb$e
done
python3 "$cmp" moeb0/metrics.jsonl moeb1/metrics.jsonl --exact || fail "evaluation changed the bf16 MoE training (routing bias, load)"
ok "training losses are bit-identical with and without an evaluation every 5 steps (fp32 dense; bf16 MoE with bias updates)"

# 5. Early stopping with keep_best: uninterrupted, then killed after its best checkpoint and resumed.
stop=("$demo_recipe" "${common[@]}" --nproc-per-node 2 --set train.micro_batch_size=8 --set train.steps=80 --set eval.interval_steps=5
      --set eval.max_batches=4 --set eval.early_stopping_patience=2 --set eval.early_stopping_min_delta=0.2 --set checkpoint.keep_best=true
      --set checkpoint.keep_last=1 --set checkpoint.interval_steps=5)
expect_status 0 "$DSTRAIN" train "${stop[@]}" --set run_dir=whole
expect_out "stopped early at step"
last=$(python3 -c "import json; print([json.loads(l) for l in open('whole/metrics.jsonl')][-1]['step'])")
best=$(cat whole/ckpt/best)
[ "$last" -lt 80 ] || fail "the run did not stop early"
[ -f "whole/ckpt/$best/COMMITTED" ] && [ -f "whole/ckpt/$(cat whole/ckpt/latest)/COMMITTED" ] || fail "best or latest is not committed"
[ "$(ls -d whole/ckpt/step_* | wc -l)" = 2 ] && [ "$best" != "$(cat whole/ckpt/latest)" ] || fail "keep_best with keep_last: 1 should keep two checkpoints"
ok "early stopping at step $last (of 80); the best, $best, survives keep_last: 1 next to the latest"
allow_worker_signals
best_step=$((10#${best#step_}))
"$DSTRAIN" train "${stop[@]}" --set run_dir=cut > cut.log 2>&1 &
kill_worker_when "cut/ckpt/step_$(printf %08d $((best_step + 5)))/COMMITTED" $!
[ "$LAUNCHER_STATUS" != 0 ] || fail "the killed run exited 0"
expect_status 0 "$DSTRAIN" resume cut
expect_out "stopped early at step $last"
[ "$(cat cut/ckpt/best)" = "$best" ] || fail "the resumed run's best is $(cat cut/ckpt/best), the uninterrupted one's $best"
python3 - whole/metrics.jsonl cut/metrics.jsonl <<'PY' || fail "the resumed run's validation losses differ"
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
ea, eb = ([(r["step"], r["val_loss"]) for r in rows if "eval" in r] for rows in (a, b))
assert ea == eb, (ea, eb)
PY
expect_status 0 "$DSTRAIN" resume cut
expect_out "the run stopped early at step $last"
ok "killed after its best checkpoint and resumed, the run stops at step $last with the same best ($best) and validation losses"

# 6. Bad settings.
expect_status 2 "$DSTRAIN" train "$demo_recipe" --set run_dir=bad --set eval.interval_steps=5
expect_out "nothing to evaluate"
expect_status 2 "$DSTRAIN" train "$demo_recipe" --set run_dir=bad --set eval.split=0.1
expect_out "data.eos_token"
expect_status 2 "$DSTRAIN" train "$demo_recipe" --set run_dir=bad --set eval.paths="[$WORK/val.txt]" --set checkpoint.keep_best=true
expect_out "set eval.interval_steps"
expect_status 3 "$DSTRAIN" train "$demo_recipe" --set run_dir=bad --set eval.paths="[$WORK/missing.txt]"
expect_out "missing.txt"
head -c 100 val.txt > short.txt
expect_status 3 "$DSTRAIN" train "$demo_recipe" --set run_dir=bad --set eval.paths="[$WORK/short.txt]" --set train.steps=2 --set schedule.warmup_steps=1 --set launch.nproc_per_node=1
expect_out "short.txt' has 100 tokens"
expect_status 0 "$DSTRAIN" prepare-data "$SRC/lib" --ext .cpp --output code  # demo.sh's corpus is not in a fresh clone
expect_status 3 "$DSTRAIN" train "$SRC/recipes/demo-coder.yaml" --set data.path="$WORK/code" --set run_dir=bad --set eval.split=100000 --set train.steps=2 --set schedule.warmup_steps=1
expect_out "leaves none to train on"
ok "eval settings without a set, a split without documents, keep_best without an interval, missing and short sets are clear errors"

# 7. The demo recipe (scripts/demo.sh) shows the validation loss of its held-out split next to the
# training loss (on the corpus prepared above; demo.sh prepares the standard library's sources).
expect_status 0 "$DSTRAIN" train "$SRC/recipes/demo-coder.yaml" --set data.path="$WORK/code" --set run_dir=demo --set train.steps=10 \
  --set schedule.warmup_steps=2 --set eval.interval_steps=5 --set logging.steps_per_print=5
expect_out "step 10/10 | loss"
expect_out "eval step 10/10 | heldout | val_loss"
ok "the demo recipe prints the held-out split's validation loss next to the training loss"

# 8. dstrain eval: a run's checkpoint (its own sets, the split too), the best one, one checkpoint
# directory and a Hugging Face folder, at other world sizes than training's: what training logged.
# evaluated JSON_FILE ARGS...: dstrain eval ARGS --json into JSON_FILE; prints its first set's val_loss.
evaluated() {
  local out=$1; shift
  "$DSTRAIN" eval "$@" --json > "$out" 2> "$out.log" || fail "dstrain eval $* failed: $(cat "$out.log")"
  python3 -c "import json; print(repr(json.load(open('$out'))['datasets'][0]['val_loss']))"
}
for n in 1 3; do
  close "$(val 10 demo heldout)" "$(evaluated demo$n.json demo --nproc-per-node $n)" 1e-6 || fail "dstrain eval of the demo's held-out split at $n ranks"
  close "$(val "$best_step" whole)" "$(evaluated best$n.json whole --step best --nproc-per-node $n)" 1e-6 || fail "dstrain eval --step best at $n ranks"
done
python3 -c "import json,sys; j=json.load(open('best3.json')); sys.exit(0 if j['step']==$best_step and j['world_size']==3 and j['datasets'][0]['name']=='val' and j['datasets'][0]['val_tokens']>0 else j)" ||
  fail "the JSON report does not name the best step, the world size and the set"
close "$(val "$best_step" whole)" "$(evaluated dir.json "whole/ckpt/$best" --nproc-per-node 2)" 1e-6 || fail "dstrain eval of one checkpoint directory"
close "$trained" "$(evaluated hf.json hf --data val.txt --format bytes --seq-len 128 --micro-batch-size 8 --nproc-per-node 2)" 1e-6 ||
  fail "dstrain eval of the exported Hugging Face folder"
expect_status 0 "$DSTRAIN" eval ref --data val.txt --name held --data short.txt --name short --max-batches 0 --step 12 --seq-len 32
expect_out "held "
expect_out "short "
script -qfec "$DSTRAIN eval ref --nproc-per-node 2" /dev/null > tty.out 2>&1 || fail "dstrain eval on a terminal failed: $(tail -5 tty.out)"
grep -q "39/39 100% | ETA 0:00:00 | [0-9]* tok/s | loss" tty.out || fail "no progress bar on the terminal: $(tail -c 600 tty.out)"
grep -q "^val  *2\.78" tty.out || fail "no table row on the terminal: $(tail -c 600 tty.out)"
! grep -q "ETA" hf.json.log || fail "a progress bar was drawn although stderr was not a terminal"
ok "dstrain eval gives what training logged: the split at 1 and 3 ranks (trained on 2), --step best, a checkpoint directory, the HF export"
# bf16 MoE with expert parallelism and ZeRO-3 in training; evaluated on 1 rank and on 4 with E = 4.
expect_status 0 "$DSTRAIN" train "${moe[@]}" --nproc-per-node 2 --set moe.expert_parallel_size=2 --set zero.stage=3 --set precision.dtype=bf16 \
  --set train.steps=4 --set schedule.warmup_steps=1 --set checkpoint.interval_steps=4 --set model.bias_update_speed=0.01 --set eval.max_batches=8 \
  --set eval.at_start=false --set run_dir=moeev
for cfg in "1 1" "4 4"; do
  set -- $cfg
  close "$(val 4 moeev)" "$(evaluated moe$1.json moeev --nproc-per-node $1 --expert-parallel-size $2)" 1e-6 || fail "bf16 MoE eval at $1 ranks, E=$2"
done
ok "dstrain eval of a bf16 MoE checkpoint (trained with E = 2, ZeRO-3) on 1 rank and on 4 with E = 4: what training logged"
# Bad targets and flags.
expect_status 4 "$DSTRAIN" eval ref --step 7
expect_out "no committed checkpoint of step 7"
expect_status 4 "$DSTRAIN" eval ref --step best
expect_out "no best checkpoint"
expect_status 2 "$DSTRAIN" eval "$WORK"
expect_out "is not a run directory"
expect_status 2 "$DSTRAIN" eval "$SRC/recipes/demo.yaml"
expect_status 2 "$DSTRAIN" eval hf --step 3 --data val.txt --seq-len 128
expect_out "--step picks a checkpoint of a run"
expect_status 2 "$DSTRAIN" eval ref --seq-len 100000
expect_out "--seq-len 100000 is longer than the model's longest sequence, 128"
expect_status 2 "$DSTRAIN" eval hf --data val.txt
expect_out "pass --seq-len N"
expect_status 2 "$DSTRAIN" eval plain --step 15
expect_out "has no evaluation sets of its own"
expect_status 3 "$DSTRAIN" eval ref --data code --format megatron
expect_out "--data: '$WORK/code' was tokenized with 257 ids"
expect_status 3 "$DSTRAIN" eval ref --data missing.txt
expect_out "missing.txt' does not exist"
head -c 20 val.txt > tiny.txt
expect_status 3 "$DSTRAIN" eval ref --data tiny.txt
expect_out "fewer than one sample"
ok "dstrain eval: a missing step or best checkpoint (4), a target that is none of the three, --step on a checkpoint or HF folder, a long --seq-len, no sets (2), data of another vocabulary, missing or too short (3)"
finish
