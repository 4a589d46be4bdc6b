#!/usr/bin/env bash
# Training on conversations (issue 38): a prepare-data --chat set trains whole conversations
# packed into rows (data.packing), with the loss over the trained tokens of the whole step: 1 rank
# x micro 8, 1 rank x micro 1 x accumulation 8, 2 ranks x micro 2 x accumulation 2 and 4 ranks at
# ZeRO 3 give the same losses within fp32 rounding on a set whose rows train very different token
# counts; the loss falls; a resumed run is bit-identical mid-epoch; bad combinations are refused.
# train.loss_normalization per_sample is as split-independent and micro_batch_mean is DeepSpeed's
# mean of micro-batch means; train.epochs derives the steps; an independent PyTorch + transformers
# loop fine-tunes the same HF model on the same data and masks to the same 30 losses (1e-5).
source "$(dirname "$0")/../lib.sh"
source "$SRC/scripts/common.sh"
cmp="$SRC/test/dist/compare_metrics.py"
py="$DSTRAIN_VENV/bin/python"
ref="$SRC/test/text/chat_data_reference.py"
"$py" "$SRC/test/text/make_corpus.py" corpus.jsonl --mb 1
"$py" "$ref" tokenizers corpus.jsonl "$SRC/test/fixtures/chat_templates" toks
: > none.jsonl
"$py" "$ref" chats corpus.jsonl none.jsonl chats.jsonl --count 400
expect_status 0 "$DSTRAIN" prepare-data chats.jsonl --tokenizer toks/deepseek-llm-chat --output sft --max-length 64
expect_out "conversations kept"

cat > sft.yaml <<'EOF'
run_dir: runs/sft
seed: 7
model: {family: dense, vocab_size: 3000, hidden_size: 64, num_layers: 2, num_heads: 4, intermediate_size: 128, max_seq_len: 64}
data: {path: sft, format: megatron, seq_len: 64, packing: greedy}
train: {steps: 12, micro_batch_size: 8, global_batch_size: 8}
optimizer: {lr: 2.0e-3}
schedule: {warmup_steps: 2}
checkpoint: {interval_steps: 6, keep_last: 0}
launch: {threads_per_worker: 1}
EOF
expect_status 0 "$DSTRAIN" train sft.yaml --set run_dir=m8
expect_out "packed (greedy) into"
expect_status 0 "$DSTRAIN" train sft.yaml --set run_dir=m1 --set train.micro_batch_size=1
expect_status 0 "$DSTRAIN" train sft.yaml --set run_dir=np2 --set train.micro_batch_size=2 --nproc-per-node 2
expect_status 0 "$DSTRAIN" train sft.yaml --set run_dir=np4 --set train.micro_batch_size=2 --nproc-per-node 4 --set zero.stage=3
python3 "$cmp" m8/metrics.jsonl --decreases 0.5 || fail "the fine-tuning loss did not fall"
for run in m1 np2 np4; do
  python3 "$cmp" m8/metrics.jsonl $run/metrics.jsonl --rtol 1e-5 || fail "$run's losses differ from 1 rank x micro 8"
done
python3 - m8 m1 np2 np4 <<'PY' || fail "the gradient norms or trained-token counts differ between the splits"
import json, sys
rows = {run: [r for r in map(json.loads, open(run + "/metrics.jsonl")) if "eval" not in r] for run in sys.argv[1:]}
want = rows["m8"]
for run, got in rows.items():
    for a, b in zip(want, got):
        assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-5 * abs(a["grad_norm"]), (run, a["step"], a["grad_norm"], b["grad_norm"])
PY
ok "packed conversations: 1 rank x micro 8, x micro 1 x accumulation 8, 2 ranks x 2 x 2 and 4 ranks at ZeRO 3 train the same losses and gradient norms (rtol 1e-5), and the loss falls"

cp -r m8 cut
rm -r cut/ckpt/step_00000012 && printf 'step_00000006\n' > cut/ckpt/latest
expect_status 0 "$DSTRAIN" resume cut
expect_out "at step 6"
python3 "$cmp" m8/metrics.jsonl cut/metrics.jsonl --exact || fail "the resumed fine-tuning run differs"
same_checkpoint_data m8/ckpt/step_00000012 cut/ckpt/step_00000012 || fail "the resumed run's final state differs"
ok "6 steps + resume + 6 equal 12 straight, losses and final state bit for bit"

expect_status 2 "$DSTRAIN" train sft.yaml --set run_dir=bad --set data.document_mask=true --dry-run
expect_out "a fine-tuning set always keeps attention and positions inside each conversation"
expect_status 2 "$DSTRAIN" train sft.yaml --set run_dir=bad --set eval.split=0.1 --dry-run
expect_out "eval.split: holding conversations out of a fine-tuning set"
expect_status 2 "$DSTRAIN" train sft.yaml --set run_dir=bad --set data.seq_len=16 --set model.max_seq_len=16
expect_out "data.seq_len: 16 is shorter than the longest conversation"
expect_out "--max-length 16"
ok "document_mask, eval.split and conversations longer than a row are refused by name"
# The normalizations, without packing (a row is one conversation): per_sample gives the same
# losses on 1 rank x micro 8 and 2 ranks x micro 2 x accumulation 2; micro_batch_mean at micro 1 x
# accumulation 8 averages one conversation's mean per micro-batch, so it equals per_sample; at
# micro 8 it is one micro-batch's token mean, which differs (DeepSpeed's split-dependent loss).
none=(--set data.packing=none)
expect_status 0 "$DSTRAIN" train sft.yaml --set run_dir=ps8 "${none[@]}" --set train.loss_normalization=per_sample
expect_status 0 "$DSTRAIN" train sft.yaml --set run_dir=ps2 "${none[@]}" --set train.loss_normalization=per_sample \
  --set train.micro_batch_size=2 --nproc-per-node 2
expect_status 0 "$DSTRAIN" train sft.yaml --set run_dir=mb1 "${none[@]}" --set train.loss_normalization=micro_batch_mean \
  --set train.micro_batch_size=1
expect_status 0 "$DSTRAIN" train sft.yaml --set run_dir=mb8 "${none[@]}" --set train.loss_normalization=micro_batch_mean
python3 "$cmp" ps8/metrics.jsonl ps2/metrics.jsonl --rtol 1e-5 || fail "per_sample depends on the split"
python3 "$cmp" ps8/metrics.jsonl mb1/metrics.jsonl --rtol 1e-5 || fail "micro_batch_mean at micro 1 is not the mean of conversation means"
if python3 "$cmp" mb1/metrics.jsonl mb8/metrics.jsonl --rtol 1e-3 >/dev/null; then fail "micro_batch_mean did not change with the split"; fi
ok "per_sample: the same losses on 1 x 8 and 2 x 2 x 2; micro_batch_mean: the mean of micro-batch means (= per_sample at micro 1), split-dependent as in DeepSpeed"

# train.epochs: the steps follow from the packed rows and the global batch; metrics carry the epoch.
expect_status 0 "$DSTRAIN" train sft.yaml --set run_dir=ep --set train.steps=0 --set train.epochs=0.5 --dry-run
expect_out "derived: ceil(train.epochs 0.5 x"
expect_out "LR schedule             warmup_cosine:"
expect_status 0 "$DSTRAIN" train sft.yaml --set run_dir=ep --set train.steps=0 --set train.epochs=0.5
python3 - ep <<'PY' || fail "the epoch in metrics.jsonl is not the share of the packed rows read"
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1] + "/metrics.jsonl")) if "eval" not in r]
packed_rows = 8 / rows[0]["epoch"]  # one step reads the global batch, 8 rows
assert 0.5 <= rows[-1]["epoch"] < 0.5 + 8 / packed_rows + 1e-9, rows[-1]
assert len(rows) == -(-int(round(0.5 * packed_rows)) // 8), (len(rows), packed_rows)
PY
expect_status 2 "$DSTRAIN" train sft.yaml --set run_dir=bad --set train.epochs=1 --dry-run
expect_out "train.epochs (--set) are both set; give the training length one way"
expect_status 2 "$DSTRAIN" train sft.yaml --set run_dir=bad --set train.steps=0 --set train.epochs=1 --set data.packing=none \
  --set data.format=bytes --set data.path="$SRC/recipes/data/demo_corpus.txt" --dry-run
expect_out "counts passes over a fine-tuning set"
ok "train.epochs: steps from the packed rows (shown by --dry-run), the epoch in the metrics; refused with train.steps and on pretraining data"

# DeepSeek-Coder's recipe on a set prepared here: the ds_config's WarmupLR replaces the cosine.
expect_status 0 "$DSTRAIN" train "$SRC/recipes/sft-deepseek-coder.yaml" --set run_dir=coder --set data.path="$WORK/sft" \
  --set data.seq_len=64 --dry-run
expect_out "derived: ceil(train.epochs 3 x"
expect_out "the ds_config's scheduler WarmupLR warms the LR up over 10 steps (log) to 2e-05 and then holds it there"
expect_out "in place of the recipe's schedule.type warmup_cosine"
expect_out "LR schedule             ds_warmup:"
ok "recipes/sft-deepseek-coder.yaml: --dry-run shows the epochs' steps and warns that WarmupLR replaces the cosine and never decays"

# The independent reference: transformers' LlamaForCausalLM and torch.optim.AdamW on the same
# conversations and masks, every step the whole set (the order within a step does not matter).
fr="$SRC/test/dist/finetune_reference.py"
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error  # local files only, quiet
"$py" "$ref" chats corpus.jsonl none.jsonl chats40.jsonl --count 40
for n in $(seq 24 40); do  # the first n conversations that keep 24 (truncation drops those left with nothing trained)
  head -n "$n" chats40.jsonl > chats24.jsonl
  expect_status 0 "$DSTRAIN" prepare-data chats24.jsonl --tokenizer toks/deepseek-llm-chat --output sft24 --max-length 64 --too-long truncate
  kept=$(python3 -c 'import json; print(json.load(open("sft24.json"))["chat"]["conversations"])')
  [ "$kept" -lt 24 ] || break
done
[ "$kept" = 24 ] || fail "prepare-data kept $kept conversations, not 24"
"$py" "$fr" model hf --vocab 3000 >/dev/null || fail "the reference model could not be made"
cat > ref.yaml <<'EOF'
run_dir: runs/ref
seed: 7
model: {init_from: hf}
data: {path: sft24, format: megatron, seq_len: 64, packing: none}
train: {epochs: 30, micro_batch_size: 4, global_batch_size: 24, grad_clip: 1.0}
optimizer: {lr: 2.0e-3, beta1: 0.9, beta2: 0.95, eps: 1.0e-8, weight_decay: 0.1}
schedule: {warmup_steps: 3, min_lr_ratio: 0.1}
launch: {threads_per_worker: 1}
EOF
expect_status 0 "$DSTRAIN" train ref.yaml --set run_dir=ref --nproc-per-node 2
"$py" "$fr" train hf sft24 ref.json --steps 30 --seq-len 64 --lr 2e-3 --warmup 3 --min-lr-ratio 0.1 --weight-decay 0.1 \
  || fail "the reference loop failed"
"$py" "$fr" compare ref.json ref/metrics.jsonl --rtol 1e-5 || fail "dstrain's fine-tuning differs from the PyTorch reference"
ok "30 steps (train.epochs 30) on 2 ranks x micro 4 x accumulation 3 equal a PyTorch + transformers loop's losses and LRs within 1e-5, gradient norms within 1e-4"
finish
