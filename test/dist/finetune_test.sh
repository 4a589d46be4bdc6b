#!/usr/bin/env bash
# Training on conversations (issue 38): a prepare-data --chat set trains whole conversations
# packed into rows (data.packing), with the loss over the trained tokens of the whole step: 1 rank
# x micro 8, 1 rank x micro 1 x accumulation 8, 2 ranks x micro 2 x accumulation 2 and 4 ranks at
# ZeRO 3 give the same losses within fp32 rounding on a set whose rows train very different token
# counts; the loss falls; a resumed run is bit-identical mid-epoch; bad combinations are refused.
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
finish
