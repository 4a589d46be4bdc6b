#!/usr/bin/env bash
# KTO (issue 60): prepare-data --preference --kto makes what TRL 1.16's KTOTrainer makes of labelled
# rows and of pairs (unpaired as TRL does; its KL sequences rotated within chunks of --kl-batch-size;
# prompts that fill --max-length dropped, sequences cut), token for token with the labels;
# train.objective kto equals KTOTrainer step by step on whole-batch steps (loss, kl, rewards/*,
# logps/*, logits/* within 1e-5, gradient norms 1e-4; held-out examples as its evaluate()), and
# apo_zero_unpaired with the desirable and undesirable weights does too, split into micro-batches;
# the KL estimate is per micro-batch, so 2 ranks at ZeRO 3 equal 1 rank at the same micro-batch; the
# reference log-probs are made once beside the set and read back by a resume (bit-identical); dstrain eval scores a run; bad sets, rows and
# recipes are refused by name.
source "$(dirname "$0")/../lib.sh"
source "$SRC/scripts/common.sh"
py="$DSTRAIN_VENV/bin/python"
trl="$DSTRAIN_TRL_VENV/bin/python"
ref="$SRC/test/dist/kto_reference.py"
pairs_ref="$SRC/test/dist/dpo_reference.py"
[ -x "$trl" ] && "$trl" -c 'import trl' 2>/dev/null || { echo "SKIP: no TRL overlay ($DSTRAIN_TRL_VENV; scripts/setup.sh --test)"; exit 77; }
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false
"$py" "$SRC/test/text/make_corpus.py" corpus.jsonl --mb 1 >/dev/null
"$py" "$SRC/test/text/chat_data_reference.py" tokenizers corpus.jsonl "$SRC/test/fixtures/chat_templates" toks >/dev/null
tok=toks/deepseek-llm-chat
"$trl" "$pairs_ref" pairs corpus.jsonl pairs.jsonl --count 32 --seed 3
"$trl" "$pairs_ref" pairs corpus.jsonl textpairs.jsonl --count 24 --seed 4 --kind text
"$trl" "$pairs_ref" pairs corpus.jsonl evalpairs.jsonl --count 8 --seed 11
"$trl" "$ref" labelled pairs.jsonl labelled.jsonl --seed 1
"$trl" "$ref" labelled textpairs.jsonl textrows.jsonl --seed 2
"$trl" "$ref" labelled evalpairs.jsonl heldout.jsonl --seed 5
"$py" "$SRC/test/dist/finetune_reference.py" model hf --vocab 3000 --max-positions 128 >/dev/null || fail "the model could not be made"

# TRL's tokens and runs, in the background (one thread each), while dstrain prepares and trains the same.
cat > tokens.jsonl <<EOF
{"tokdir": "$tok", "rows": "labelled.jsonl", "out": "labelled.trl.json", "kl_batch_size": 8}
{"tokdir": "$tok", "rows": "pairs.jsonl", "out": "cut.trl.json", "kl_batch_size": 6, "max_length": 30}
{"tokdir": "toks/chatml-qwen-style", "rows": "textrows.jsonl", "out": "text.trl.json", "kl_batch_size": 5}
EOF
"$trl" "$ref" tokens-many tokens.jsonl > trl-tokens.log 2>&1 &
tokens_pid=$!
mkdir -p lab unp
cat > lab/runs.json <<'EOF'
{"kto": {"loss_type": "kto", "beta": 0.5, "desirable_weight": 0.6, "eval_rows": "heldout.jsonl", "eval_steps": 3}}
EOF
cat > unp/runs.json <<'EOF'
{"apo": {"loss_type": "apo_zero_unpaired", "beta": 0.2, "desirable_weight": 1.3, "undesirable_weight": 0.7}}
EOF
"$trl" "$ref" train-many hf "$tok" labelled.jsonl lab/runs.json --steps 6 --lr 3e-3 --kl-batch-size 32 > trl-lab.log 2>&1 &
lab_pid=$!
"$trl" "$ref" train-many hf "$tok" pairs.jsonl unp/runs.json --steps 4 --lr 1e-3 --kl-batch-size 64 > trl-unp.log 2>&1 &
unp_pid=$!

prepare() { expect_status 0 "$DSTRAIN" prepare-data "$1" --preference --kto --output "$2" "${@:3}"; }
prepare labelled.jsonl labelled --tokenizer "$tok" --kl-batch-size 8
expect_out "32 KTO examples kept"
prepare pairs.jsonl cut --tokenizer "$tok" --kl-batch-size 6 --max-length 30
expect_out "from 32 pairs unpaired"
expect_out "dropped: the prompt alone fills --max-length"
expect_out "truncated to --max-length"
prepare textrows.jsonl text --tokenizer toks/chatml-qwen-style --kl-batch-size 5
prepare labelled.jsonl lab32 --tokenizer "$tok" --kl-batch-size 32
prepare pairs.jsonl unp64 --tokenizer "$tok" --kl-batch-size 64
prepare heldout.jsonl heldout --tokenizer "$tok" --kl-batch-size 32
wait $tokens_pid || fail "TRL could not tokenize the sets: $(tail -5 trl-tokens.log)"
for name in labelled cut text; do
  "$py" "$ref" compare-tokens "$name.trl.json" "$name" >/dev/null || fail "$name: $("$py" "$ref" compare-tokens "$name.trl.json" "$name" 2>&1 | tail -3)"
done
ok "prepare-data --kto: labelled chat rows, pairs unpaired with --max-length 30 (dropped and cut), text rows with ChatML: every example's and KL sequence's token ids, completion mask and label equal TRL's KTOTrainer's"

cat > kto.yaml <<'EOF'
run_dir: runs/kto
seed: 7
model: {init_from: hf}
data: {path: lab32, format: megatron, seq_len: 96}
train: {objective: kto, steps: 6, micro_batch_size: 32, global_batch_size: 32, grad_clip: 1.0}
preference: {beta: 0.5, desirable_weight: 0.6}
optimizer: {lr: 3.0e-3, beta1: 0.9, beta2: 0.999, eps: 1.0e-8, weight_decay: 0.0}
schedule: {warmup_steps: 0, min_lr_ratio: 1.0}
checkpoint: {interval_steps: 100, keep_last: 0}
launch: {threads_per_worker: 1}
EOF
expect_status 0 "$DSTRAIN" train kto.yaml --set run_dir=kto --set 'eval.paths=[heldout]' --set eval.interval_steps=3
expect_out "32 KTO examples (21 desirable) each with its KL sequence"
expect_out "eval step 6/6 | heldout | val_loss"
expect_out "| kl "
ls lab32.ref.* >/dev/null 2>&1 || fail "no reference log-probs beside the set"
expect_status 0 "$DSTRAIN" train kto.yaml --set run_dir=apo --set data.path=unp64 --set train.steps=4 --set optimizer.lr=1e-3 \
  --set 'preference.loss_type=[apo_zero_unpaired]' --set preference.beta=0.2 --set preference.desirable_weight=1.3 \
  --set preference.undesirable_weight=0.7 --set train.micro_batch_size=16 --set train.global_batch_size=64 --set train.loss_chunk_tokens=100
# The KL estimate is each micro-batch's: 2 ranks x micro 8 at ZeRO 3 equal 1 rank x micro 8.
expect_status 0 "$DSTRAIN" train kto.yaml --set run_dir=micro8 --set train.micro_batch_size=8 --set preference.desirable_weight=1 \
  --set checkpoint.interval_steps=3
# 21 desirable against 11, weighed alike: the KTO paper's advice, as TRL warns it.
expect_out "21 desirable and 11 undesirable examples, weighed 1 and 1: the KTO paper advises preference.desirable_weight in [0.52, 0.70]"
expect_status 0 "$DSTRAIN" train kto.yaml --set run_dir=micro8x2 --set train.micro_batch_size=8 --set preference.desirable_weight=1 \
  --nproc-per-node 2 --set zero.stage=3
python3 "$SRC/test/dist/compare_metrics.py" micro8/metrics.jsonl micro8x2/metrics.jsonl --rtol 1e-5 || fail "KTO on 2 ranks at ZeRO 3 differs from 1 rank"
cp -r micro8 cut && rm -r cut/ckpt/step_00000006 && printf 'step_00000003\n' > cut/ckpt/latest
expect_status 0 "$DSTRAIN" resume cut
expect_out "reference log-probs: read from"
python3 "$SRC/test/dist/compare_metrics.py" micro8/metrics.jsonl cut/metrics.jsonl --exact || fail "the resumed KTO run differs"
same_checkpoint_data micro8/ckpt/step_00000006 cut/ckpt/step_00000006 || fail "the resumed KTO run's final state differs"
wait $lab_pid || fail "TRL failed: $(tail -5 trl-lab.log)"
wait $unp_pid || fail "TRL failed: $(tail -5 trl-unp.log)"
# atol 1e-5: margins of rewards from log-prob sums near -70, whose float32 rounding is about 4e-6.
"$py" "$ref" compare lab/kto.trl.json kto/metrics.jsonl --rtol 1e-5 --atol 1e-5 --grad-rtol 1e-4 --eval heldout || fail "kto differs from TRL"
python3 - lab/kto.trl.json <<'PY' || fail "TRL's kl stayed at 0: the test would not see the KL shift"
import json, sys
assert max(s["kl"] for s in json.load(open(sys.argv[1]))["steps"]) > 0.5
PY
# rewards/margins is each micro-batch's difference of means, averaged (TRL's under accumulation): a
# step split in 4 logs another mean than TRL's one batch; every other number is the same.
"$py" "$ref" compare unp/apo.trl.json apo/metrics.jsonl --rtol 1e-5 --grad-rtol 1e-4 --skip rewards/margins || fail "apo_zero_unpaired differs from TRL"
ok "kto equals TRL's KTOTrainer step by step (loss, kl up to 3.7, rewards/*, logps/*, logits/* within 1e-5, grad norms 1e-4) and on held-out examples at steps 3 and 6; apo_zero_unpaired with weights 1.3/0.7 in micro-batches of 16 with the head 100 tokens at a time; 2 ranks x micro 8 at ZeRO 3 equal 1 rank; 3 steps + resume + 3 equal 6 straight bit for bit"

expect_status 0 "$DSTRAIN" eval kto --json
python3 - "$(grep '^{' <<<"$OUT")" kto/metrics.jsonl <<'PY' || fail "dstrain eval of the KTO run scores the held-out examples differently"
import json, sys
d = json.loads(sys.argv[1])["datasets"][0]
last = [r for r in map(json.loads, open(sys.argv[2])) if r.get("eval") == "heldout"][-1]
assert d["pairs"] == 8 and abs(d["val_loss"] - last["val_loss"]) <= 1e-6 * abs(last["val_loss"]), (d, last)
for k in ("kl", "rewards/margins", "logps/chosen"):
    assert abs(d["metrics"][k] - last[k]) <= 1e-7 + 1e-5 * abs(last[k]), (k, d, last)
PY
ok "dstrain eval of a KTO run scores its held-out examples as its last evaluation did"

# Bad sets, rows and recipes.
expect_status 2 "$DSTRAIN" train kto.yaml --set run_dir=bad --set train.objective=dpo --set preference.beta=0.1 --set preference.desirable_weight=1
expect_out "preference.desirable_weight is set (--set) but train.objective is dpo, which does not read it (train.objective kto does)"
expect_status 2 "$DSTRAIN" train kto.yaml --set run_dir=bad --set train.objective=dpo
expect_out "is not a set of preference pairs"
expect_out "it holds KTO examples: train.objective kto trains on them"
expect_status 0 "$DSTRAIN" prepare-data pairs.jsonl --preference --tokenizer "$tok" --output dpo
expect_status 2 "$DSTRAIN" train kto.yaml --set run_dir=bad --set data.path=dpo
expect_out "is not a set of KTO examples"
expect_out "prepare-data --preference --kto"
expect_status 2 "$DSTRAIN" train kto.yaml --set run_dir=bad --set 'preference.loss_type=[sigmoid]'
expect_out "preference.loss_type [sigmoid] with train.objective kto: KTO takes one of kto, apo_zero_unpaired"
expect_status 2 "$DSTRAIN" prepare-data labelled.jsonl --preference --tokenizer "$tok" --output bad --kl-batch-size 4
expect_status 2 "$DSTRAIN" prepare-data labelled.jsonl --preference --kto --tokenizer "$tok" --output bad --kl-batch-size 1
expect_status 2 "$DSTRAIN" prepare-data labelled.jsonl --preference --kto --tokenizer "$tok" --output bad --truncation-mode keep_end
expect_out "TRL's KTOTrainer cuts each sequence from the right"
head -3 labelled.jsonl > mixed.jsonl && head -2 pairs.jsonl >> mixed.jsonl
expect_status 3 "$DSTRAIN" prepare-data mixed.jsonl --preference --kto --tokenizer "$tok" --output bad
expect_out "mixed.jsonl:4: a chosen/rejected row after mixed.jsonl:1's labelled row"
printf '{"prompt": "a", "completion": " b", "label": "yes"}\n' > badlabel.jsonl
expect_status 3 "$DSTRAIN" prepare-data badlabel.jsonl --preference --kto --tokenizer "$tok" --output bad
expect_out "badlabel.jsonl:1: \"label\" is \"yes\": true (a desirable completion) or false"
ls bad.* >/dev/null 2>&1 && fail "a refused prepare-data left files: $(ls bad.*)"
expect_status 0 "$DSTRAIN" train "$SRC/recipes/kto-deepseek.yaml" --set run_dir=recipe --set data.path="$WORK/lab32" --set train.epochs=20 --dry-run
expect_out "the configuration is valid"
expect_out "KTO examples"
ok "a KTO set under dpo and pairs under kto, other objectives' keys, DPO's loss types, --kl-batch-size without --kto or under 2, keep_end, mixed and mislabelled rows are refused by name, leaving no files; recipes/kto-deepseek.yaml dry-runs"
finish
