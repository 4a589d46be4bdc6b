#!/usr/bin/env bash
# The reference model of preference tuning (issue 60), preference.reference: with LoRA, live (the
# model with its adapters off at every micro-batch, no file, no second copy) gives the losses,
# metrics and held-out scores of precomputed within 1e-6, for dpo and kto, on 1 rank and on 2 ranks
# at ZeRO 3; dstrain eval scores a live run without any reference file; none trains on the policy's
# log-probs alone (rewards = beta x logps) and writes no file; live without LoRA, with
# modules_to_save, an unknown mode or the key under another objective are refused by key.
source "$(dirname "$0")/../lib.sh"
source "$SRC/scripts/common.sh"
py="$DSTRAIN_VENV/bin/python"
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false
"$py" "$SRC/test/text/make_corpus.py" corpus.jsonl --mb 1 >/dev/null
"$py" "$SRC/test/text/chat_data_reference.py" tokenizers corpus.jsonl "$SRC/test/fixtures/chat_templates" toks >/dev/null
tok=toks/deepseek-llm-chat
"$py" "$SRC/test/dist/dpo_reference.py" pairs corpus.jsonl pairs.jsonl --count 32 --seed 3
"$py" "$SRC/test/dist/dpo_reference.py" pairs corpus.jsonl evalpairs.jsonl --count 8 --seed 11
"$py" "$SRC/test/dist/finetune_reference.py" model hf --vocab 3000 --max-positions 128 >/dev/null || fail "the model could not be made"
expect_status 0 "$DSTRAIN" prepare-data pairs.jsonl --preference --tokenizer "$tok" --output pairs
expect_status 0 "$DSTRAIN" prepare-data evalpairs.jsonl --preference --tokenizer "$tok" --output heldout
expect_status 0 "$DSTRAIN" prepare-data pairs.jsonl --preference --kto --kl-batch-size 8 --tokenizer "$tok" --output kto
expect_status 0 "$DSTRAIN" prepare-data evalpairs.jsonl --preference --kto --kl-batch-size 8 --tokenizer "$tok" --output ktoheld

cat > pref.yaml <<'EOF'
run_dir: runs/pref
seed: 7
model: {init_from: hf}
data: {path: pairs, format: megatron, seq_len: 96}
lora: {rank: 8, alpha: 16}
train: {objective: dpo, steps: 6, micro_batch_size: 8, global_batch_size: 32, grad_clip: 1.0}
preference: {beta: 0.2}
optimizer: {lr: 3.0e-3, beta1: 0.9, beta2: 0.999, eps: 1.0e-8, weight_decay: 0.0}
schedule: {warmup_steps: 0, min_lr_ratio: 1.0}
eval: {paths: [heldout], interval_steps: 3}
checkpoint: {interval_steps: 100, keep_last: 0}
logging: {steps_per_print: 1}
launch: {threads_per_worker: 1}
EOF
metrics=(--key rewards/chosen --key rewards/margins --key logps/rejected --grad-norm)
same_evals() {  # same_evals A B: the held-out rows' loss and margins within 1e-6
  python3 - "$1" "$2" <<'PY'
import json, sys
a, b = ([r for r in map(json.loads, open(p)) if "eval" in r] for p in sys.argv[1:])
assert len(a) == len(b) == 2, (len(a), len(b))
for x, y in zip(a, b):
    for k in ("val_loss", "rewards/margins"):
        assert abs(x[k] - y[k]) <= 1e-7 + 1e-6 * abs(x[k]), (k, x[k], y[k])
PY
}
expect_status 0 "$DSTRAIN" train pref.yaml --set run_dir=pre
expect_status 0 "$DSTRAIN" train pref.yaml --set run_dir=live --set preference.reference=live
expect_out "step 6/6"
python3 "$SRC/test/dist/compare_metrics.py" pre/metrics.jsonl live/metrics.jsonl --rtol 1e-6 "${metrics[@]}" || fail "dpo: live differs from precomputed"
same_evals pre/metrics.jsonl live/metrics.jsonl || fail "dpo: live scores the held-out pairs differently"
expect_status 0 "$DSTRAIN" train pref.yaml --set run_dir=live2 --set preference.reference=live --set train.micro_batch_size=4 \
  --nproc-per-node 2 --set zero.stage=3
python3 "$SRC/test/dist/compare_metrics.py" pre/metrics.jsonl live2/metrics.jsonl --rtol 1e-5 "${metrics[@]}" || fail "dpo: live on 2 ranks at ZeRO 3 differs"
ok "dpo with LoRA: live (adapters off) equals precomputed within 1e-6 (loss, rewards, logps, grad norms, held-out pairs); 2 ranks x micro 4 at ZeRO 3 too (1e-5)"

kto=(--set train.objective=kto --set data.path=kto --set 'eval.paths=[ktoheld]' --set preference.beta=0.5)
expect_status 0 "$DSTRAIN" train pref.yaml --set run_dir=kpre "${kto[@]}"
expect_status 0 "$DSTRAIN" train pref.yaml --set run_dir=klive "${kto[@]}" --set preference.reference=live
python3 "$SRC/test/dist/compare_metrics.py" kpre/metrics.jsonl klive/metrics.jsonl --rtol 1e-6 --key kl --key rewards/chosen --grad-norm ||
  fail "kto: live differs from precomputed"
same_evals kpre/metrics.jsonl klive/metrics.jsonl || fail "kto: live scores the held-out examples differently"
ok "kto with LoRA: live equals precomputed within 1e-6 (loss, kl, rewards, grad norms, held-out examples)"

# dstrain eval of a live run: no reference file is read or needed.
mkdir aside && mv heldout.ref.* aside/
expect_status 0 "$DSTRAIN" eval live --json
python3 - "$(grep '^{' <<<"$OUT")" live/metrics.jsonl <<'PY' || fail "dstrain eval of the live run scores the held-out pairs differently"
import json, sys
d = json.loads(sys.argv[1])["datasets"][0]
last = [r for r in map(json.loads, open(sys.argv[2])) if r.get("eval") == "heldout"][-1]
assert abs(d["val_loss"] - last["val_loss"]) <= 1e-6 * abs(last["val_loss"]), (d, last)
PY
ls heldout.ref.* >/dev/null 2>&1 && fail "dstrain eval of a live run wrote a reference file"
mv aside/* . && rmdir aside
ok "dstrain eval of a live run scores its held-out pairs as its last evaluation did, with no reference file"

rm -f pairs.ref.* heldout.ref.*
expect_status 0 "$DSTRAIN" train pref.yaml --set run_dir=none --set preference.reference=none
python3 - none/metrics.jsonl <<'PY' || fail "reference none: the rewards are not beta x the policy's log-probs"
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "eval" not in r]
assert len(rows) == 6
for r in rows:
    assert abs(r["rewards/chosen"] - 0.2 * r["logps/chosen"]) <= 1e-5 * abs(r["rewards/chosen"]), r
PY
ls pairs.ref.* heldout.ref.* >/dev/null 2>&1 && fail "reference none wrote a reference file"
ok "reference none: rewards are beta x the policy's log-probs at every step, and no reference file is written"

expect_status 2 "$DSTRAIN" train pref.yaml --set run_dir=bad --set preference.reference=live --set lora.rank=0
expect_out "preference.reference live needs lora"
expect_status 2 "$DSTRAIN" train pref.yaml --set run_dir=bad --set preference.reference=live --set 'lora.modules_to_save=[lm_head]'
expect_out "preference.reference live with lora.modules_to_save [lm_head]"
expect_status 2 "$DSTRAIN" train pref.yaml --set run_dir=bad --set preference.reference=frozen
expect_out "preference.reference frozen: one of precomputed, live, none"
expect_status 2 "$DSTRAIN" train pref.yaml --set run_dir=bad --set train.objective=orpo --set preference.reference=live
expect_out "preference.reference is set (--set) but train.objective is orpo, which does not read it (train.objective dpo, kto does)"
ok "live without LoRA or with modules_to_save, an unknown mode, and the key under orpo are refused by key"
finish
