#!/usr/bin/env bash
# Reward models (issue 60): train.objective reward on a prepare-data --preference set equals TRL
# 1.16's RewardTrainer: the same token ids (DeepSeek LLM, ChatML, V3 with implicit prompts, text), the
# score read at the last token that is not the pad token, per-step loss, accuracy, margin and
# mean_reward within 1e-5 on 64 pairs (fp32, full-batch steps; with center_rewards_coefficient too, and
# with a "margin" per pair as TRL subtracts it),
# held-out pairs as its evaluate(); the loss is a mean over pairs whatever the split (2 ranks at
# ZeRO 3); export-hf writes a folder that AutoModelForSequenceClassification loads with the same
# scores; LoRA trains the score in full beside the adapters and exports a SEQ_CLS adapter PEFT
# loads with the same scores; a causal LM's folder starts the score from the seed; bad recipes are
# refused by key.
source "$(dirname "$0")/../lib.sh"
source "$SRC/scripts/common.sh"
py="$DSTRAIN_VENV/bin/python"
trl="$DSTRAIN_TRL_VENV/bin/python"
pairs_ref="$SRC/test/dist/dpo_reference.py"
ref="$SRC/test/dist/reward_reference.py"
[ -x "$trl" ] && "$trl" -c 'import trl' 2>/dev/null || { echo "SKIP: no TRL overlay ($DSTRAIN_TRL_VENV; scripts/setup.sh --test)"; exit 77; }
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false
"$py" "$SRC/test/text/make_corpus.py" corpus.jsonl --mb 1 >/dev/null
"$py" "$SRC/test/text/chat_data_reference.py" tokenizers corpus.jsonl "$SRC/test/fixtures/chat_templates" toks >/dev/null

# The rows, the reward model both sides start from, and TRL's runs (in the background while
# dstrain prepares and trains the same).
"$trl" "$pairs_ref" pairs corpus.jsonl pairs.jsonl --count 64 --seed 3
"$trl" "$pairs_ref" pairs corpus.jsonl evalpairs.jsonl --count 12 --seed 11
"$trl" "$pairs_ref" pairs corpus.jsonl chatml.jsonl --count 24 --seed 5
"$trl" "$pairs_ref" pairs corpus.jsonl v3.jsonl --count 24 --seed 6 --kind implicit
"$trl" "$pairs_ref" pairs corpus.jsonl text.jsonl --count 24 --seed 8 --kind text
"$py" "$SRC/test/dist/finetune_reference.py" model hf --vocab 3000 --max-positions 128 >/dev/null || fail "the causal LM could not be made"
"$trl" "$ref" model hf rm --seed 1 >/dev/null || fail "the reward model could not be made"
# The same pairs with TRL's "margin" column (integers among them), training and held-out.
for name in pairs evalpairs; do
  python3 - $name.jsonl margin-$name.jsonl <<'PY'
import json, random, sys
rng = random.Random(5)
with open(sys.argv[2], "w") as out:
    for i, line in enumerate(open(sys.argv[1])):
        row = json.loads(line)
        row["margin"] = i % 7 if i % 5 == 0 else round(rng.uniform(-1.5, 2.5), 4)
        out.write(json.dumps(row) + "\n")
PY
done
for name in pairs chatml v3 text; do
  tok=$(case $name in pairs | text) echo deepseek-llm-chat ;; chatml) echo chatml-qwen-style ;; v3) echo deepseek-v3-style ;; esac)
  echo "tokens toks/$tok $name.jsonl $name.trl-tokens.json"
done > trl-commands.txt
cat >> trl-commands.txt <<'EOF'
train rm toks/deepseek-llm-chat pairs.jsonl bt.trl.json --steps 6 --lr 1e-3 --eval-rows evalpairs.jsonl --eval-steps 3
train rm toks/deepseek-llm-chat pairs.jsonl center.trl.json --steps 6 --lr 1e-3 --center 0.05
train rm toks/deepseek-llm-chat margin-pairs.jsonl margin.trl.json --steps 6 --lr 1e-3 --eval-rows margin-evalpairs.jsonl --eval-steps 3
EOF
"$trl" "$ref" many trl-commands.txt > trl.log 2>&1 &
trl_pid=$!

expect_status 0 "$DSTRAIN" prepare-data pairs.jsonl --preference --tokenizer toks/deepseek-llm-chat --output rm-pairs
expect_status 0 "$DSTRAIN" prepare-data evalpairs.jsonl --preference --tokenizer toks/deepseek-llm-chat --output rm-eval
expect_status 0 "$DSTRAIN" prepare-data chatml.jsonl --preference --tokenizer toks/chatml-qwen-style --output rm-chatml
expect_status 0 "$DSTRAIN" prepare-data v3.jsonl --preference --tokenizer toks/deepseek-v3-style --output rm-v3
expect_status 0 "$DSTRAIN" prepare-data text.jsonl --preference --tokenizer toks/deepseek-llm-chat --output rm-text
expect_status 0 "$DSTRAIN" prepare-data margin-pairs.jsonl --preference --tokenizer toks/deepseek-llm-chat --output rm-margin
expect_out "64 preference pairs kept, each with a margin"
expect_status 0 "$DSTRAIN" prepare-data margin-evalpairs.jsonl --preference --tokenizer toks/deepseek-llm-chat --output rm-margin-eval
cat > reward.yaml <<'EOF'
run_dir: runs/reward
seed: 7
model: {init_from: rm}
data: {path: rm-pairs, format: megatron, seq_len: 96}
train: {objective: reward, steps: 6, micro_batch_size: 8, global_batch_size: 64, grad_clip: 1.0}
optimizer: {lr: 1.0e-3, beta1: 0.9, beta2: 0.999, eps: 1.0e-8, weight_decay: 0.0}
schedule: {warmup_steps: 0, min_lr_ratio: 1.0}
checkpoint: {interval_steps: 3, keep_last: 0}
launch: {threads_per_worker: 1}
EOF
expect_status 0 "$DSTRAIN" train reward.yaml --set run_dir=bt --set 'eval.paths=[rm-eval]' --set eval.interval_steps=3
expect_out "eval step 6/6 | rm-eval | val_loss"
expect_out "| accuracy"
expect_status 0 "$DSTRAIN" train reward.yaml --set run_dir=center --set preference.center_rewards_coefficient=0.05
expect_status 0 "$DSTRAIN" train reward.yaml --set run_dir=margin --set data.path=rm-margin --set 'eval.paths=[rm-margin-eval]' \
  --set eval.interval_steps=3
expect_out "64 preference pairs with margins"
# The loss is a mean over the step's pairs: 2 ranks x micro 4 at ZeRO 3 train the same steps.
expect_status 0 "$DSTRAIN" train reward.yaml --set run_dir=np2 --set train.micro_batch_size=4 --nproc-per-node 2 --set zero.stage=3
python3 "$SRC/test/dist/compare_metrics.py" bt/metrics.jsonl np2/metrics.jsonl --rtol 1e-5 || fail "2 ranks at ZeRO 3 differ from 1 rank"
wait $trl_pid || fail "TRL failed: $(tail -5 trl.log)"

for name in pairs chatml v3 text; do
  "$py" "$ref" compare-tokens $name.trl-tokens.json rm-$name >/dev/null ||
    fail "$name: $("$py" "$ref" compare-tokens $name.trl-tokens.json rm-$name 2>&1 | tail -3)"
done
ok "prepare-data --preference gives RewardTrainer's token ids (DeepSeek LLM, ChatML, V3 with implicit prompts, text rows with eos)"
"$py" "$ref" compare bt.trl.json bt/metrics.jsonl --rtol 1e-5 --grad-rtol 1e-4 --eval rm-eval || fail "dstrain's reward model differs from TRL's"
"$py" "$ref" compare center.trl.json center/metrics.jsonl --rtol 1e-5 --grad-rtol 1e-4 || fail "center_rewards_coefficient differs from TRL's"
python3 - bt/metrics.jsonl <<'PY' || fail "the reward model did not learn the preferences"
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if "eval" not in r]
assert rows[-1]["accuracy"] > rows[0]["accuracy"] and rows[-1]["loss"] < rows[0]["loss"] and rows[-1]["margin"] > 0, rows
PY
ok "train.objective reward equals RewardTrainer step by step (loss, accuracy, margin, mean_reward within 1e-5, gradient norms 1e-4), with center_rewards_coefficient 0.05 too; held-out pairs score as its evaluate() at steps 3 and 6; 2 ranks x micro 4 at ZeRO 3 equal 1 rank x accumulation 8"
"$py" "$ref" compare margin.trl.json margin/metrics.jsonl --rtol 1e-5 --grad-rtol 1e-4 --eval rm-margin-eval ||
  fail "the margin column trains differently from TRL's"
python3 "$SRC/test/dist/compare_metrics.py" bt/metrics.jsonl margin/metrics.jsonl --rtol 1e-3 2>/dev/null &&
  fail "the margins changed nothing: the losses with and without them are the same"
ok "a \"margin\" per pair (training and held-out) trains and evaluates as RewardTrainer's -logsigmoid(chosen - rejected - margin) (1e-5)"

# Margins: every pair has one or none does; a margin is a finite number; other objectives leave them unread.
sed -n 1,3p margin-pairs.jsonl > mixed.jsonl && sed -n 4p pairs.jsonl >> mixed.jsonl
expect_status 3 "$DSTRAIN" prepare-data mixed.jsonl --preference --tokenizer toks/deepseek-llm-chat --output bad-mixed
expect_out "mixed.jsonl:4: a pair without a \"margin\", after "
expect_out "mixed.jsonl:1's pair with one"
python3 -c 'import json,sys; r=json.loads(open("pairs.jsonl").readline()); r["margin"]="big"; print(json.dumps(r))' > text-margin.jsonl
expect_status 3 "$DSTRAIN" prepare-data text-margin.jsonl --preference --tokenizer toks/deepseek-llm-chat --output bad-margin
expect_out "text-margin.jsonl:1: \"margin\" is \"big\": a finite number"
[ ! -e bad-mixed.json ] && [ ! -e bad-margin.json ] || fail "a refused set was written"
expect_status 0 "$DSTRAIN" train reward.yaml --set run_dir=margin-dpo --set data.path=rm-margin --set train.objective=dpo \
  --set model.init_from=hf --set train.steps=1
expect_out "its pairs' margins are left unread: only train.objective reward reads them"
ok "margins: a set mixing pairs with and without one, and a margin that is not a number, are refused by file:line; dpo says it leaves them unread"

# The export loads in transformers as a sequence classifier with the same scores.
expect_status 0 "$DSTRAIN" export-hf bt bt-hf
python3 - bt-hf/config.json <<'PY' || fail "the export's config.json is not a reward model's"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["architectures"] == ["LlamaForSequenceClassification"] and c["id2label"] == {"0": "LABEL_0"} and c["pad_token_id"] == 1, c
PY
"$trl" "$ref" score bt-hf toks/deepseek-llm-chat evalpairs.jsonl bt-hf.score.json >/dev/null 2>&1 || fail "transformers could not score the export"
python3 - bt-hf.score.json bt/metrics.jsonl <<'PY' || fail "transformers scores the export differently"
import json, sys
hf = json.load(open(sys.argv[1]))
last = [r for r in map(json.loads, open(sys.argv[2])) if r.get("eval") == "rm-eval"][-1]
for k, got in [("loss", "val_loss"), ("accuracy", "accuracy"), ("margin", "margin"), ("mean_reward", "mean_reward")]:
    assert abs(hf[k] - last[got]) <= 1e-7 + 1e-5 * abs(hf[k]), (k, hf[k], last[got])
PY
expect_status 0 "$DSTRAIN" eval bt
expect_out "accuracy"
expect_out "rm-eval"
# The exported folder itself, evaluated by dstrain on the same pairs, scores them as the run did.
expect_status 0 "$DSTRAIN" eval bt-hf --data rm-eval --seq-len 96 --json
python3 - "$(grep '^{' <<<"$OUT")" bt/metrics.jsonl <<'PY' || fail "dstrain eval of the exported folder scores the held-out pairs differently"
import json, sys
d = json.loads(sys.argv[1])["datasets"][0]
last = [r for r in map(json.loads, open(sys.argv[2])) if r.get("eval") == "rm-eval"][-1]
assert d["pairs"] == 12 and abs(d["val_loss"] - last["val_loss"]) <= 1e-6 * abs(last["val_loss"]), (d, last)
for k in ("accuracy", "margin", "mean_reward"):
    assert abs(d["metrics"][k] - last[k]) <= 1e-7 + 1e-5 * abs(last[k]), (k, d, last)
PY
ok "export-hf writes LlamaForSequenceClassification (num_labels 1, pad_token_id); transformers scores the held-out pairs as dstrain did (1e-5); dstrain eval prints accuracy, of the run and of the exported folder"

# A reward model's Hugging Face folder converts as one: score.weight, not lm_head.
expect_status 0 "$DSTRAIN" export-hf bt-hf bt-bf16 --dtype bf16
"$py" - bt-hf bt-bf16 <<'PY' || fail "the bf16 conversion of a reward model's folder differs"
import json, sys, torch
from safetensors.torch import load_file
a, b = (load_file(f"{d}/model.safetensors") for d in sys.argv[1:])
assert set(a) == set(b) and "score.weight" in b and "lm_head.weight" not in b, sorted(set(a) ^ set(b))
for k in a: assert b[k].dtype == torch.bfloat16 and torch.equal(a[k].to(torch.bfloat16), b[k]), k
ca, cb = (json.load(open(f"{d}/config.json")) for d in sys.argv[1:])
for k in ("architectures", "id2label", "pad_token_id"): assert ca[k] == cb[k], (k, ca[k], cb[k])
PY
ok "export-hf converts a reward model's folder (bf16): LlamaForSequenceClassification, score.weight, pad_token_id kept"

# LoRA: the adapters, and the score in full beside them (PEFT's SEQ_CLS modules_to_save); the
# adapter export loads in PEFT over the same base and scores the held-out pairs as dstrain did.
expect_status 0 "$DSTRAIN" train reward.yaml --set run_dir=lora --set lora.rank=8 --set lora.alpha=16 --set optimizer.lr=5e-3 \
  --set 'eval.paths=[rm-eval]' --set eval.interval_steps=3
expect_out "score"
python3 "$SRC/test/dist/compare_metrics.py" lora/metrics.jsonl --decreases 0.05 || fail "LoRA's reward loss did not fall"
expect_status 0 "$DSTRAIN" export-hf lora lora-adapter
python3 - lora-adapter/adapter_config.json <<'PY' || fail "the adapter is not a SEQ_CLS adapter with the score"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["task_type"] == "SEQ_CLS" and c["modules_to_save"] == ["score"], c
PY
"$trl" "$ref" score rm toks/deepseek-llm-chat evalpairs.jsonl lora.score.json --adapter lora-adapter >/dev/null 2>&1 ||
  fail "PEFT could not score the adapter"
python3 - lora.score.json lora/metrics.jsonl <<'PY' || fail "PEFT scores the adapter differently"
import json, sys
hf = json.load(open(sys.argv[1]))
last = [r for r in map(json.loads, open(sys.argv[2])) if r.get("eval") == "rm-eval"][-1]
for k, got in [("loss", "val_loss"), ("accuracy", "accuracy"), ("margin", "margin"), ("mean_reward", "mean_reward")]:
    assert abs(hf[k] - last[got]) <= 1e-6 + 1e-5 * abs(hf[k]), (k, hf[k], last[got])
PY
ok "LoRA trains a reward model (the score in full beside the adapters); its SEQ_CLS adapter loads in PEFT over the base and scores the held-out pairs as dstrain did (1e-5)"

# A causal LM's folder: its weights, the score from the seed (the same on every rank).
expect_status 0 "$DSTRAIN" train reward.yaml --set run_dir=from-lm --set model.init_from=hf --set train.steps=2
expect_out "has no 'score.weight'"
python3 "$SRC/test/dist/compare_metrics.py" from-lm/metrics.jsonl --decreases 0 || fail "a reward model from a causal LM did not train"
ok "a causal LM's folder starts a reward model (its score from the seed)"

# Bad recipes.
expect_status 2 "$DSTRAIN" train reward.yaml --set run_dir=bad --set preference.beta=0.2
expect_out "preference.beta is set (--set) but train.objective is reward, which does not read it (train.objective dpo, cpo, simpo, orpo, kto does)"
expect_status 2 "$DSTRAIN" train reward.yaml --set run_dir=bad --set train.objective=dpo --set preference.center_rewards_coefficient=0.1
expect_out "which does not read it (train.objective reward does)"
expect_status 2 "$DSTRAIN" train reward.yaml --set run_dir=bad --set train.objective=sft --set model.score_head=true
expect_out "model.score_head is set but train.objective is sft"
expect_status 4 "$DSTRAIN" train reward.yaml --set run_dir=bad --set train.objective=sft --set data.path="$SRC/recipes/data/demo_corpus.txt" \
  --set data.format=bytes --dry-run
expect_out "$WORK/rm is a sequence classifier (LlamaForSequenceClassification: a reward model's score.weight in place of lm_head)"
expect_status 0 "$DSTRAIN" train "$SRC/recipes/reward-deepseek.yaml" --set run_dir=recipe --set data.path="$WORK/rm-pairs" --set train.epochs=20 --dry-run
expect_out "the configuration is valid"
expect_out "model.score_head"
expect_out "train.epochs 20 x 63 preference pairs"
ok "DPO keys with reward, center_rewards_coefficient without it and a score head without reward are refused by key; a reward model's folder as a causal LM is named as such; recipes/reward-deepseek.yaml dry-runs"
finish
