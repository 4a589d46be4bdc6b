#!/usr/bin/env bash
# Training on conversations (issue 38): a prepare-data --chat set trains whole conversations
# packed into rows (data.packing), with the loss over the trained tokens of the whole step: 1 rank
# x micro 8, 1 rank x micro 1 x accumulation 8, 2 ranks x micro 2 x accumulation 2 and 4 ranks at
# ZeRO 3 give the same losses within fp32 rounding on a set whose rows train very different token
# counts; the loss falls; a resumed run is bit-identical mid-epoch; bad combinations are refused.
# train.loss_normalization per_sample is as split-independent and micro_batch_mean is DeepSpeed's
# mean of micro-batch means; train.epochs derives the steps; an independent PyTorch + transformers
# loop fine-tunes the same HF model on the same data and masks to the same 30 losses (1e-5).
# Validation on conversations (eval.split of whole conversations, eval.paths of fine-tuning sets)
# scores the trained tokens alike at any split and rank count, as `dstrain eval` and transformers
# on the export do; blends of fine-tuning sets follow data.weights at any split.
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
expect_status 2 "$DSTRAIN" train sft.yaml --set run_dir=bad --set data.seq_len=16 --set model.max_seq_len=16
expect_out "data.seq_len: 16 (--set) is shorter than the longest conversation"
expect_out "--max-length 16"
expect_status 3 "$DSTRAIN" train sft.yaml --set run_dir=bad --set eval.split=500
expect_out "eval.split 500 holds out 500 of its"
expect_out "which leaves none to train on"
ok "document_mask, conversations longer than a row and a split that leaves nothing to train on are refused by name"

# eval.split of a fine-tuning set holds whole conversations out, scored on their trained tokens:
# the same values at 1 rank x micro 8 and 2 ranks x 2 x 2, bit-identical after a resume, and what
# `dstrain eval` computes from the last checkpoint at 3 ranks.
val_rows() {  # val_rows RUN: [step, set, val_loss, val_tokens] of every evaluation
  python3 -c "import json; print(json.dumps([(r['step'], r['eval'], r['val_loss'], r['val_tokens']) for r in map(json.loads, open('$1/metrics.jsonl')) if 'eval' in r]))"
}
same_vals() {  # same_vals A B RTOL: the same evaluations, losses within RTOL, the same token counts
  python3 -c "
import json, sys
a, b, rtol = json.loads(sys.argv[1]), json.loads(sys.argv[2]), float(sys.argv[3])
assert a and [r[:2] for r in a] == [r[:2] for r in b], (a, b)
for x, y in zip(a, b):
    assert x[3] == y[3] and abs(x[2] - y[2]) <= rtol * abs(x[2]), (x, y)
" "$(val_rows "$1")" "$(val_rows "$2")" "$3"
}
json_out() { grep '^{"datasets"' <<<"$OUT" | tail -n 1; }  # dstrain eval --json's line
logged_val() { python3 -c "import json; print(repr([r for r in map(json.loads, open('$1/metrics.jsonl')) if r.get('eval') == '$2'][-1]['val_loss']))"; }
close() { python3 -c "import sys; a, b = float('$1'), float('$2'); r = abs(a - b) / abs(a); print(f'{a!r} vs {b!r}: relative {r:.2e}'); sys.exit(0 if r <= $3 else f'relative {r:.2e} > $3')"; }
spl=(--set eval.split=0.1 --set eval.interval_steps=6)
expect_status 0 "$DSTRAIN" train sft.yaml --set run_dir=s8 "${spl[@]}"
expect_out "conversations left to train on"
expect_out "eval step 6/12 | heldout | val_loss"
expect_status 0 "$DSTRAIN" train sft.yaml --set run_dir=s2 "${spl[@]}" --set train.micro_batch_size=2 --nproc-per-node 2
python3 "$cmp" s8/metrics.jsonl s2/metrics.jsonl --rtol 1e-5 || fail "the split's training losses differ between 1 and 2 ranks"
same_vals s8 s2 1e-5 || fail "the held-out conversations' validation losses differ between 1 and 2 ranks"
cp -r s8 scut
rm -r scut/ckpt/step_00000012 && printf 'step_00000006\n' > scut/ckpt/latest
expect_status 0 "$DSTRAIN" resume scut
python3 "$cmp" s8/metrics.jsonl scut/metrics.jsonl --exact || fail "the resumed run with held-out conversations differs"
same_vals s8 scut 0 || fail "the resumed run's validation losses differ"
expect_status 0 "$DSTRAIN" eval s8 --nproc-per-node 3 --json
got=$(json_out | python3 -c "import json, sys; d = json.load(sys.stdin)['datasets'][0]; assert d['name'] == 'heldout' and d['conversations'] > 0, d; print(repr(d['val_loss']))")
close "$(logged_val s8 heldout)" "$got" 1e-8 || fail "dstrain eval at 3 ranks does not give the held-out loss training logged"
ok "eval.split holds whole conversations out: the same validation losses at 1 and 2 ranks, a bit-identical resume, dstrain eval at 3 ranks"

# Blends of fine-tuning sets: rows drawn by data.weights (each source packed on its own), the
# same losses at 1 rank x micro 8 and 2 ranks x 2 x 2 at ZeRO 2; conversations and text do not blend.
tail -n 60 chats.jsonl > other.jsonl
expect_status 0 "$DSTRAIN" prepare-data other.jsonl --tokenizer toks/deepseek-llm-chat --output other --max-length 64
sed -e 's/path: sft, /paths: [sft, other], weights: [3, 1], /' sft.yaml > blend.yaml
expect_status 0 "$DSTRAIN" train blend.yaml --set run_dir=b8
expect_out "fine-tuning set $WORK/other: "
expect_out "blend weight 1"
expect_status 0 "$DSTRAIN" train blend.yaml --set run_dir=b2 --set train.micro_batch_size=2 --nproc-per-node 2 --set zero.stage=2
python3 "$cmp" b8/metrics.jsonl b2/metrics.jsonl --rtol 1e-5 || fail "the blend's losses differ between 1 and 2 ranks"
expect_status 0 "$DSTRAIN" prepare-data corpus.jsonl --tokenizer toks/deepseek-llm-chat --no-chat --output text --max-bytes 200000
sed -e 's/path: sft, /paths: [sft, text], /' sft.yaml > mixed.yaml
expect_status 2 "$DSTRAIN" train mixed.yaml --set run_dir=bad --dry-run
expect_out "sources are fine-tuning sets (a loss mask beside them) and the others text"
ok "blends of fine-tuning sets: the same losses at 1 and 2 ranks (ZeRO 2); a blend of conversations and text is refused"
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
expect_out "counts passes over fine-tuning sets"
ok "train.epochs: steps from the packed rows (shown by --dry-run), the epoch in the metrics; refused with train.steps and on pretraining data"

# DeepSeek-Coder's recipe on a set prepared here: the ds_config's WarmupLR replaces the cosine.
expect_status 0 "$DSTRAIN" train "$SRC/recipes/sft-deepseek-coder.yaml" --set run_dir=coder --set data.path="$WORK/sft" \
  --set data.seq_len=64 --dry-run
expect_out "derived: ceil(train.epochs 3 x"
expect_out "the ds_config's scheduler WarmupLR warms the LR up over 10 steps (log) to 2e-05 and then holds it there"
expect_out "in place of the recipe's schedule.type warmup_cosine"
expect_out "LR schedule             ds_warmup:"
ok "recipes/sft-deepseek-coder.yaml: --dry-run shows the epochs' steps and warns that WarmupLR replaces the cosine and never decays"
expect_status 0 "$DSTRAIN" train "$SRC/recipes/lora-deepseek-coder.yaml" --set run_dir=lora-coder --set data.path="$WORK/sft" --set data.seq_len=64 \
  --set schedule.warmup_steps=1 --dry-run
expect_out "lora                    rank 16, alpha 32 (scale 2) on [all-linear]: 39.98M adapter parameters"
expect_out "model states per rank 12.7 GiB instead of full training's 23.5 GiB"
ok "recipes/lora-deepseek-coder.yaml: --dry-run counts the adapters and the model states they leave"
expect_status 0 "$DSTRAIN" train "$SRC/recipes/qlora-deepseek-coder.yaml" --set run_dir=qlora-coder --set data.path="$WORK/sft" --set data.seq_len=64 \
  --set schedule.warmup_steps=1 --dry-run
expect_out "lora base               6.48B of the frozen projections' weights in NF4 (double quantization): 3.1 GiB (12.1 GiB in bf16)"
expect_out "model states per rank 6.0 GiB instead of full training's 100.4 GiB"
ok "recipes/qlora-deepseek-coder.yaml: --dry-run plans the NF4 base (3.1 GiB) and 6.0 GiB of model states on one GPU"


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
eval: {paths: [other], interval_steps: 15}
launch: {threads_per_worker: 1}
EOF
expect_status 0 "$DSTRAIN" train ref.yaml --set run_dir=ref --nproc-per-node 2
"$py" "$fr" train hf sft24 ref.json --steps 30 --seq-len 64 --lr 2e-3 --warmup 3 --min-lr-ratio 0.1 --weight-decay 0.1 \
  || fail "the reference loop failed"
"$py" "$fr" compare ref.json ref/metrics.jsonl --rtol 1e-5 || fail "dstrain's fine-tuning differs from the PyTorch reference"
ok "30 steps (train.epochs 30) on 2 ranks x micro 4 x accumulation 3 equal a PyTorch + transformers loop's losses and LRs within 1e-5, gradient norms within 1e-4"

# train.freeze against PyTorch's requires_grad=False on the same tensors (issue 57): the dense
# model and a DeepSeek-V3 (MLA + MoE, its routed experts frozen too), 10 steps on 2 ranks at ZeRO 3.
"$py" "$fr" model hf-v3 --vocab 3000 --family deepseek_v3 >/dev/null || fail "the reference DeepSeek-V3 could not be made"
for family in llama v3; do
  model=hf globs=('model.embed_tokens.*' 'model.layers.0.*') extra=()
  if [ "$family" = v3 ]; then
    model=hf-v3 globs+=('*.mlp.experts.*') extra=(--set model.aux_loss_alpha=0 --set model.bias_update_speed=0)
  fi
  list=$(printf '"%s", ' "${globs[@]}")
  expect_status 0 "$DSTRAIN" train ref.yaml --set run_dir=frozen-$family --set model.init_from=$model --set train.epochs=0 \
    --set train.steps=10 --set eval.interval_steps=0 --set zero.stage=3 --set "train.freeze=[${list%, }]" "${extra[@]}" --nproc-per-node 2
  "$py" "$fr" train $model sft24 frozen-$family.json --steps 10 --seq-len 64 --lr 2e-3 --warmup 3 --min-lr-ratio 0.1 --weight-decay 0.1 \
    --freeze "${globs[@]}" || fail "the reference loop with frozen parameters failed"
  "$py" "$fr" compare frozen-$family.json frozen-$family/metrics.jsonl --rtol 1e-6 --grad-rtol 1e-4 \
    || fail "$family: dstrain's train.freeze differs from PyTorch's requires_grad=False"
done
ok "train.freeze (embeddings, layer 0; the V3's routed experts too) equals PyTorch's requires_grad=False over 10 steps at ZeRO 3 on 2 ranks: losses and LRs within 1e-6, gradient norms within 1e-4, the dense model and DeepSeek-V3"

# QLoRA against PEFT + bitsandbytes (issue 59): the same PEFT-made adapter (random A and B, rsLoRA)
# trained 50 steps on the base quantized to NF4, by dstrain (lora.base nf4, lora.init_from) and by
# PEFT on transformers' 4-bit load, on 2 ranks at ZeRO 2.
if "$py" -c 'import bitsandbytes, peft' 2>/dev/null; then
  "$py" "$SRC/test/dist/peft_reference.py" make hf qadapter - 64 8 16 q_proj k_proj v_proj o_proj gate_proj up_proj down_proj \
    >/dev/null || fail "PEFT could not make the adapter"
  expect_status 0 "$DSTRAIN" train ref.yaml --set run_dir=qlora --set train.epochs=0 --set train.steps=50 --set eval.interval_steps=0 \
    --set zero.stage=2 --set lora.rank=8 --set lora.alpha=16 --set lora.use_rslora=true --set lora.base=nf4 \
    --set lora.init_from="$WORK/qadapter" --set 'lora.targets=[q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]' \
    --nproc-per-node 2
  expect_out "lora: base in NF4: 14 frozen projections"
  "$py" "$fr" train hf sft24 qlora.json --steps 50 --seq-len 64 --lr 2e-3 --warmup 3 --min-lr-ratio 0.1 --weight-decay 0.1 \
    --qlora qadapter || fail "the QLoRA reference loop failed"
  # The losses stay within 1e-3 (the issue asks 1%); the gradient norms agree to 1e-3 for 10 steps,
  # after which Adam at lr 2e-3 on a tiny model turns float rounding into visible norm noise.
  "$py" "$fr" compare qlora.json qlora/metrics.jsonl --rtol 1e-3 --grad-rtol 1e-3 --grad-steps 10 ||
    fail "dstrain's QLoRA differs from PEFT + bitsandbytes"
  ok "QLoRA: 50 steps of a PEFT adapter on the NF4 base give PEFT + bitsandbytes' losses and LRs within 1e-3 (gradient norms of the first 10 within 1e-3)"
else
  echo "skipped: QLoRA against PEFT + bitsandbytes (bitsandbytes or peft is not importable from $py; scripts/setup.sh --test installs them)"
fi

# A fine-tuning set in eval.paths: the loss on its trained tokens, as transformers computes it from
# the exported weights (each conversation alone in a row) and as dstrain eval computes it from the
# export; the export ships the chat template the conversations were rendered with.
expect_status 0 "$DSTRAIN" export-hf ref ref-hf
expect_out "and the chat template it rendered with"
"$py" "$fr" eval ref-hf other --seq-len 64 > other-ref.json || fail "the reference could not evaluate the export"
want=$(logged_val ref other)
close "$want" "$(python3 -c "import json; print(repr(json.load(open('other-ref.json'))['val_loss']))")" 1e-5 \
  || fail "the logged validation loss on a fine-tuning set differs from transformers' on the exported weights"
expect_status 0 "$DSTRAIN" eval ref-hf --data other --seq-len 64 --json
close "$want" "$(json_out | python3 -c "import json, sys; print(repr(json.load(sys.stdin)['datasets'][0]['val_loss']))")" 1e-6 \
  || fail "dstrain eval of the export on the fine-tuning set differs from the logged loss"
python3 - ref-hf "$SRC/test/fixtures/chat_templates/deepseek-llm-chat.jinja" <<'PY' || fail "the export does not carry the chat template"
import json, sys
config = json.load(open(sys.argv[1] + "/tokenizer_config.json"))
assert config["chat_template"] == open(sys.argv[2], encoding="utf-8").read(), "chat_template differs"
assert config["eos_token"] == "<｜end▁of▁sentence｜>", config["eos_token"]
PY
ok "eval.paths of conversations: the logged loss equals transformers' on the export (1e-5) and dstrain eval's on the HF folder; the export carries the chat template"
finish
