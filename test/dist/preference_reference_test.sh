#!/usr/bin/env bash
# The reference model of preference tuning (issue 60), preference.reference: with LoRA, live (the
# model with its adapters off at every micro-batch, no file, no second copy) gives the losses,
# metrics and held-out scores of precomputed within 1e-6, for dpo and kto, on 1 rank and on 2 ranks
# at ZeRO 3; dstrain eval scores a live run without any reference file; none trains on the policy's
# log-probs alone (rewards = beta x logps) and writes no file. Without LoRA, live keeps a frozen
# copy of the starting model: the same losses as precomputed (1e-6; 2 ranks at ZeRO 3 1e-5), a
# resume bit-identical to the run straight through, dstrain eval without a reference file, the
# copy counted by --dry-run, and a resume refused when model.init_from's weights changed. Live
# with modules_to_save, an unknown mode or the key under another objective are refused by key.
# TR-DPO (preference.sync_ref_model) equals TRL's DPOTrainer with sync_ref_model step by step
# (1e-5) and on held-out pairs; 2 ranks at ZeRO 3 equal 1; its checkpoints hold the moving copy, so
# a resume is bit-identical and dstrain eval scores the run as it did; bad combinations are refused.
source "$(dirname "$0")/../lib.sh"
source "$SRC/scripts/common.sh"
py="$DSTRAIN_VENV/bin/python"
trl="$DSTRAIN_TRL_VENV/bin/python"
[ -x "$trl" ] && "$trl" -c 'import trl' 2>/dev/null || { echo "SKIP: no TRL overlay ($DSTRAIN_TRL_VENV; scripts/setup.sh --test)"; exit 77; }
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
resumes_exactly() {  # RUN (6 steps, a checkpoint at 3): resumed from step 3, its metrics and final state equal RUN's bit for bit
  cp -r "$1" "$1-cut" && rm -r "$1-cut/ckpt/step_00000006" && printf 'step_00000003\n' > "$1-cut/ckpt/latest"
  expect_status 0 "$DSTRAIN" resume "$1-cut"
  python3 "$SRC/test/dist/compare_metrics.py" "$1/metrics.jsonl" "$1-cut/metrics.jsonl" --exact || fail "the resumed $1 run differs"
  same_checkpoint_data "$1/ckpt/step_00000006" "$1-cut/ckpt/step_00000006" || fail "the resumed $1 run's final state differs"
}
eval_without_reference_file() {  # RUN: dstrain eval scores its held-out pairs as its last evaluation did, reading no reference file
  mkdir aside && mv heldout.ref.* aside/
  expect_status 0 "$DSTRAIN" eval "$1" --json
  python3 - "$(grep '^{' <<<"$OUT")" "$1/metrics.jsonl" <<'PY' || fail "dstrain eval of $1 scores the held-out pairs differently"
import json, sys
d = json.loads(sys.argv[1])["datasets"][0]
last = [r for r in map(json.loads, open(sys.argv[2])) if r.get("eval") == "heldout"][-1]
assert abs(d["val_loss"] - last["val_loss"]) <= 1e-6 * abs(last["val_loss"]), (d, last)
PY
  ls heldout.ref.* >/dev/null 2>&1 && fail "dstrain eval of $1 wrote a reference file"
  mv aside/* . && rmdir aside
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
eval_without_reference_file live
ok "dstrain eval of a live run scores its held-out pairs as its last evaluation did, with no reference file"

# Without LoRA: a frozen copy of the starting model, as TRL's create_reference_model keeps one.
sed '/^lora:/d' pref.yaml > full.yaml
full=(--set optimizer.lr=1e-3 --set checkpoint.interval_steps=3)
expect_status 0 "$DSTRAIN" train full.yaml --set run_dir=fpre "${full[@]}"
expect_status 0 "$DSTRAIN" train full.yaml --set run_dir=copy "${full[@]}" --set preference.reference=live
expect_out "preference.reference live: a frozen copy of the starting model ($WORK/hf)"
python3 "$SRC/test/dist/compare_metrics.py" fpre/metrics.jsonl copy/metrics.jsonl --rtol 1e-6 "${metrics[@]}" ||
  fail "dpo without LoRA: the live copy differs from precomputed"
same_evals fpre/metrics.jsonl copy/metrics.jsonl || fail "dpo without LoRA: the live copy scores the held-out pairs differently"
expect_status 0 "$DSTRAIN" train full.yaml --set run_dir=copy2 "${full[@]}" --set preference.reference=live --set train.micro_batch_size=4 \
  --nproc-per-node 2 --set zero.stage=3
python3 "$SRC/test/dist/compare_metrics.py" fpre/metrics.jsonl copy2/metrics.jsonl --rtol 1e-5 "${metrics[@]}" ||
  fail "dpo without LoRA: the live copy on 2 ranks at ZeRO 3 differs"
resumes_exactly copy
eval_without_reference_file copy
expect_status 0 "$DSTRAIN" train full.yaml --set run_dir=dry "${full[@]}" --dry-run
pre_states=$(grep -o 'model states per rank *[0-9.]* [KMG]iB' <<<"$OUT")
expect_status 0 "$DSTRAIN" train full.yaml --set run_dir=dry "${full[@]}" --set preference.reference=live --dry-run
expect_out "(the frozen reference copy of preference.reference live included)"
[ "$(grep -o 'model states per rank *[0-9.]* [KMG]iB' <<<"$OUT")" != "$pre_states" ] || fail "--dry-run does not count the reference copy"
ok "dpo without LoRA: live keeps a frozen copy of the starting model, equal to precomputed (1e-6; 2 ranks x micro 4 at ZeRO 3 1e-5); 3 steps + resume + 3 equal 6 straight bit for bit; dstrain eval needs no reference file; --dry-run counts the copy"

# The copy is made again on a resume: from model.init_from's files as they were.
cp -r copy cut2 && rm -r cut2/ckpt/step_00000006 && printf 'step_00000003\n' > cut2/ckpt/latest
cp -r hf hf-saved
"$py" - hf <<'PY'
import sys, torch
from safetensors.torch import load_file, save_file
path = f"{sys.argv[1]}/model.safetensors"
w = load_file(path)
w["model.norm.weight"] = w["model.norm.weight"] * 1.01
save_file(w, path, metadata={"format": "pt"})
PY
expect_status 4 "$DSTRAIN" resume cut2
expect_out "the checkpoint's reference model (preference.reference live: a frozen copy of the starting model) was made from other weights"
rm -r hf && mv hf-saved hf
ok "a live-copy run's resume is refused (exit 4) when model.init_from's weights changed since the run started"

# TR-DPO: TRL's run in the background while dstrain trains the same.
"$trl" "$SRC/test/dist/dpo_reference.py" train hf "$tok" pairs.jsonl tr.trl.json --steps 6 --lr 1e-3 --beta 0.2 \
  --eval-rows evalpairs.jsonl --eval-steps 3 --sync-steps 2 --mixup-alpha 0.6 > trl-tr.log 2>&1 &
trl_pid=$!
tr=(--set preference.reference=live --set preference.sync_ref_model=true --set preference.ref_model_sync_steps=2)
expect_status 0 "$DSTRAIN" train full.yaml --set run_dir=tr "${full[@]}" "${tr[@]}"
expect_out "step 2: the reference moved toward the policy (preference.sync_ref_model, alpha 0.6)"
expect_status 0 "$DSTRAIN" train full.yaml --set run_dir=tr2 "${full[@]}" "${tr[@]}" --set train.micro_batch_size=4 --nproc-per-node 2 \
  --set zero.stage=3
python3 "$SRC/test/dist/compare_metrics.py" tr/metrics.jsonl tr2/metrics.jsonl --rtol 1e-5 "${metrics[@]}" || fail "TR-DPO on 2 ranks at ZeRO 3 differs"
python3 "$SRC/test/dist/compare_metrics.py" copy/metrics.jsonl tr/metrics.jsonl --rtol 1e-3 "${metrics[@]}" 2>/dev/null &&
  fail "the syncs changed nothing: TR-DPO trains as the fixed copy does"
resumes_exactly tr
eval_without_reference_file tr
expect_status 0 "$DSTRAIN" export-hf tr tr-hf
wait $trl_pid || fail "TRL failed: $(tail -5 trl-tr.log)"
"$py" "$SRC/test/dist/dpo_reference.py" compare tr.trl.json tr/metrics.jsonl --rtol 1e-5 --grad-rtol 1e-4 --eval heldout ||
  fail "TR-DPO differs from TRL's sync_ref_model"
ok "TR-DPO (sync_ref_model every 2 steps, alpha 0.6) equals TRL's DPOTrainer step by step (1e-5) and on held-out pairs at steps 3 and 6; 2 ranks x micro 4 at ZeRO 3 equal 1 rank (1e-5); checkpoints hold the moving copy: 3 steps + resume + 3 equal 6 straight bit for bit, dstrain eval scores the run as it did; export-hf exports the policy"

expect_status 2 "$DSTRAIN" train full.yaml --set run_dir=bad --set preference.sync_ref_model=true
expect_out "preference.sync_ref_model with preference.reference precomputed"
expect_status 2 "$DSTRAIN" train pref.yaml --set run_dir=bad "${tr[@]}"
expect_out "preference.sync_ref_model with lora"
expect_status 2 "$DSTRAIN" train full.yaml --set run_dir=bad --set preference.ref_model_mixup_alpha=0.5
expect_out "preference.ref_model_mixup_alpha is set (--set) but preference.sync_ref_model is false"
ok "TR-DPO with a precomputed reference or LoRA, and its alpha without it, are refused by key"

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

expect_status 2 "$DSTRAIN" train pref.yaml --set run_dir=bad --set preference.reference=live --set 'lora.modules_to_save=[lm_head]'
expect_out "preference.reference live with lora.modules_to_save [lm_head]"
expect_status 2 "$DSTRAIN" train pref.yaml --set run_dir=bad --set preference.reference=frozen
expect_out "preference.reference frozen: one of precomputed, live, none"
expect_status 2 "$DSTRAIN" train pref.yaml --set run_dir=bad --set train.objective=orpo --set preference.reference=live
expect_out "preference.reference is set (--set) but train.objective is orpo, which does not read it (train.objective dpo, kto does)"
ok "live with modules_to_save, an unknown mode, and the key under orpo are refused by key"
finish
