#!/usr/bin/env bash
# Preference tuning without a reference model (issue 60): train.objective cpo, simpo and orpo equal
# TRL 1.16's CPOTrainer and ORPOTrainer step by step on 64 pairs (fp32, full-batch steps, the same
# token ids): the loss, rewards/*, logps/*, nll_loss and orpo's log_odds_ratio and log_odds_chosen
# within 1e-5, gradient norms within 1e-4 (cpo's sigmoid with label smoothing, ipo and hinge; simpo
# with simpo_gamma, and with AlphaPO and the NLL; orpo), held-out pairs as their evaluate(); the loss
# is a mean over pairs whatever the split (2 ranks at ZeRO 3, ORPO's NLL a token mean over every
# rank's chosen sequences); no reference file is made; dstrain eval scores a run; bad recipes are
# refused by key.
source "$(dirname "$0")/../lib.sh"
source "$SRC/scripts/common.sh"
py="$DSTRAIN_VENV/bin/python"
trl="$DSTRAIN_TRL_VENV/bin/python"
ref="$SRC/test/dist/reference_free_reference.py"
pairs_ref="$SRC/test/dist/dpo_reference.py"
[ -x "$trl" ] && "$trl" -c 'import trl' 2>/dev/null || { echo "SKIP: no TRL overlay ($DSTRAIN_TRL_VENV; scripts/setup.sh --test)"; exit 77; }
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false
"$py" "$SRC/test/text/make_corpus.py" corpus.jsonl --mb 1 >/dev/null
"$py" "$SRC/test/text/chat_data_reference.py" tokenizers corpus.jsonl "$SRC/test/fixtures/chat_templates" toks >/dev/null
"$trl" "$pairs_ref" pairs corpus.jsonl pairs.jsonl --count 64 --seed 3
"$trl" "$pairs_ref" pairs corpus.jsonl evalpairs.jsonl --count 12 --seed 11
"$py" "$SRC/test/dist/finetune_reference.py" model hf --vocab 3000 --max-positions 128 >/dev/null || fail "the model could not be made"

# TRL's runs in two processes of one thread each, in the background, while dstrain trains the same.
cat > runs1.json <<'EOF'
{"cpo": {"trainer": "cpo", "loss_type": "sigmoid", "label_smoothing": 0.1, "eval_rows": "evalpairs.jsonl", "eval_steps": 3, "steps": 6},
 "ipo": {"trainer": "cpo", "loss_type": "ipo", "beta": 0.5, "cpo_alpha": 0.5},
 "hinge": {"trainer": "cpo", "loss_type": "hinge", "cpo_alpha": 0.0}}
EOF
cat > runs2.json <<'EOF'
{"orpo": {"trainer": "orpo", "beta": 0.2, "eval_rows": "evalpairs.jsonl", "eval_steps": 3, "steps": 6},
 "simpo": {"trainer": "cpo", "loss_type": "simpo", "beta": 2.0, "simpo_gamma": 1.0, "cpo_alpha": 0.0},
 "alphapo": {"trainer": "cpo", "loss_type": "simpo", "beta": 2.0, "simpo_gamma": 0.5, "alpha": 0.25, "cpo_alpha": 0.3}}
EOF
trl_pids=()
for runs in runs1 runs2; do
  "$trl" "$ref" train-many hf toks/deepseek-llm-chat pairs.jsonl $runs.json --steps 4 --lr 1e-3 > trl-$runs.log 2>&1 &
  trl_pids+=($!)
done

expect_status 0 "$DSTRAIN" prepare-data pairs.jsonl --preference --tokenizer toks/deepseek-llm-chat --output pairs
expect_status 0 "$DSTRAIN" prepare-data evalpairs.jsonl --preference --tokenizer toks/deepseek-llm-chat --output heldout
cat > pref.yaml <<'EOF'
run_dir: runs/pref
seed: 7
model: {init_from: hf}
data: {path: pairs, format: megatron, seq_len: 96}
train: {objective: cpo, steps: 4, micro_batch_size: 8, global_batch_size: 64, grad_clip: 1.0}
optimizer: {lr: 1.0e-3, beta1: 0.9, beta2: 0.999, eps: 1.0e-8, weight_decay: 0.0}
schedule: {warmup_steps: 0, min_lr_ratio: 1.0}
checkpoint: {interval_steps: 3, keep_last: 0}
launch: {threads_per_worker: 1}
EOF
held=(--set train.steps=6 --set 'eval.paths=[heldout]' --set eval.interval_steps=3)
expect_status 0 "$DSTRAIN" train pref.yaml --set run_dir=cpo --set preference.label_smoothing=0.1 "${held[@]}"
expect_out "eval step 6/6 | heldout | val_loss"
expect_out "| rewards/accuracies"
expect_status 0 "$DSTRAIN" train pref.yaml --set run_dir=ipo --set 'preference.loss_type=[ipo]' --set preference.beta=0.5 --set preference.cpo_alpha=0.5
expect_status 0 "$DSTRAIN" train pref.yaml --set run_dir=hinge --set 'preference.loss_type=[hinge]' --set preference.cpo_alpha=0 \
  --set train.loss_chunk_tokens=100
expect_status 0 "$DSTRAIN" train pref.yaml --set run_dir=orpo --set train.objective=orpo --set preference.beta=0.2 "${held[@]}"
expect_out "| log_odds_ratio"
expect_status 0 "$DSTRAIN" train pref.yaml --set run_dir=simpo --set train.objective=simpo --set preference.beta=2.0 --set preference.simpo_gamma=1.0
expect_status 0 "$DSTRAIN" train pref.yaml --set run_dir=alphapo --set train.objective=simpo --set preference.beta=2.0 --set preference.alpha=0.25 \
  --set preference.cpo_alpha=0.3
ls pairs.ref.* >/dev/null 2>&1 && fail "a reference-free objective wrote reference log-probs: $(ls pairs.ref.*)"
# ORPO's NLL is a token mean over every rank's chosen sequences: 2 ranks x micro 4 at ZeRO 3, eval micro 5.
expect_status 0 "$DSTRAIN" train pref.yaml --set run_dir=orpo2 --set train.objective=orpo --set preference.beta=0.2 "${held[@]}" \
  --set train.micro_batch_size=4 --set eval.micro_batch_size=5 --nproc-per-node 2 --set zero.stage=3
python3 "$SRC/test/dist/compare_metrics.py" orpo/metrics.jsonl orpo2/metrics.jsonl --rtol 1e-5 || fail "ORPO on 2 ranks at ZeRO 3 differs from 1 rank"
for i in 0 1; do
  wait "${trl_pids[$i]}" || fail "TRL failed: $(tail -5 trl-runs$((i + 1)).log)"
done
for name in cpo ipo hinge orpo simpo alphapo; do
  evalset=$(case $name in cpo | orpo) echo --eval heldout ;; esac)
  "$py" "$ref" compare "$name.trl.json" "$name/metrics.jsonl" --rtol 1e-5 --grad-rtol 1e-4 $evalset || fail "$name differs from TRL"
done
"$py" "$ref" compare orpo.trl.json orpo2/metrics.jsonl --rtol 1e-5 --eval heldout >/dev/null || fail "ORPO on 2 ranks differs from TRL"
ok "cpo (sigmoid with label smoothing, ipo, hinge with the head 100 tokens at a time), simpo (simpo_gamma; AlphaPO with the NLL) and orpo equal TRL's CPOTrainer and ORPOTrainer step by step (loss, rewards/*, logps/*, nll_loss, log_odds_* within 1e-5, gradient norms 1e-4), held-out pairs as their evaluate() at steps 3 and 6; ORPO on 2 ranks x micro 4 at ZeRO 3 (eval micro 5) equals 1 rank; no reference file"

expect_status 0 "$DSTRAIN" eval orpo --json
python3 - "$(grep '^{' <<<"$OUT")" orpo/metrics.jsonl <<'PY' || fail "dstrain eval of the ORPO run scores the held-out pairs differently"
import json, sys
d = json.loads(sys.argv[1])["datasets"][0]
last = [r for r in map(json.loads, open(sys.argv[2])) if r.get("eval") == "heldout"][-1]
assert d["pairs"] == 12 and abs(d["val_loss"] - last["val_loss"]) <= 1e-6 * abs(last["val_loss"]), (d, last)
for k in ("rewards/accuracies", "nll_loss", "log_odds_ratio"):
    assert abs(d["metrics"][k] - last[k]) <= 1e-7 + 1e-5 * abs(last[k]), (k, d, last)
PY
ok "dstrain eval of an ORPO run scores its held-out pairs as its last evaluation did"

# Bad recipes, refused by key before any worker starts.
expect_status 2 "$DSTRAIN" train pref.yaml --set run_dir=bad --set 'preference.loss_type=[sigmoid,hinge]'
expect_out "preference.loss_type [sigmoid, hinge] with train.objective cpo: CPO takes one of sigmoid, hinge, ipo, simpo"
expect_status 2 "$DSTRAIN" train pref.yaml --set run_dir=bad --set 'preference.loss_type=[alphapo]'
expect_out "TRL's alphapo is train.objective simpo with preference.alpha"
expect_status 2 "$DSTRAIN" train pref.yaml --set run_dir=bad --set 'preference.loss_type=[ipo]' --set preference.label_smoothing=0.1
expect_out "only sigmoid and simpo smooth labels"
expect_status 2 "$DSTRAIN" train pref.yaml --set run_dir=bad --set preference.simpo_gamma=1
expect_out "preference.simpo_gamma is set (--set) but preference.loss_type is sigmoid"
expect_status 2 "$DSTRAIN" train pref.yaml --set run_dir=bad --set train.objective=orpo --set preference.cpo_alpha=1
expect_out "preference.cpo_alpha is set (--set) but train.objective is orpo, which does not read it (train.objective cpo, simpo does)"
expect_status 2 "$DSTRAIN" train pref.yaml --set run_dir=bad --set train.objective=simpo --set 'preference.loss_type=[ipo]'
expect_out "preference.loss_type is set (--set) but train.objective is simpo, which does not read it"
expect_status 2 "$DSTRAIN" train pref.yaml --set run_dir=bad --set train.objective=dpo --set preference.simpo_gamma=1
expect_out "train.objective is dpo, which does not read it (train.objective cpo, simpo does)"
expect_status 0 "$DSTRAIN" train pref.yaml --set run_dir=dry --set train.objective=simpo --dry-run
expect_out "preference.cpo_alpha"
expect_out "train.objective simpo"
expect_status 0 "$DSTRAIN" train "$SRC/recipes/orpo-deepseek.yaml" --set run_dir=recipe --set data.path="$WORK/pairs" --set train.epochs=20 --dry-run
expect_out "the configuration is valid"
ok "several or unknown CPO loss types, label smoothing with ipo, simpo_gamma without simpo, keys of another objective are refused by key; simpo's cpo_alpha 0 is shown with its source; recipes/orpo-deepseek.yaml dry-runs"
finish
