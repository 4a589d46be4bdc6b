#!/usr/bin/env bash
# The fine-tuning and preference demos as a user runs them (`scripts/demo.sh --dpo`, which runs
# `--sft` first; shortened: 60 pretraining steps, one epoch, 20 DPO steps): a base model exported
# as a Hugging Face folder is fine-tuned on conversations with validation, exported with the chat
# template its data were rendered with, and transformers loads the export, renders the template and
# generates. The export's tokenizer and template reproduce the training data's tokens exactly, and
# the model learned to end its turns. DPO from that export then learns preference pairs made from
# the same docstrings, and held-out pairs show it.
source "$(dirname "$0")/../lib.sh"
source "$SRC/scripts/common.sh"
py="$DSTRAIN_VENV/bin/python"
export DSTRAIN_BUILD_DIR="$(dirname "$DSTRAIN")" DSTRAIN_DEMO_DATA="$WORK/data" DSTRAIN_DEMO_RUNS="$WORK/runs" DSTRAIN_DEMO_BASE_STEPS=60
# The preference demo runs the fine-tuning demo first, then DPO from its export.
export DSTRAIN_DEMO_SFT_ARGS="--set train.epochs=1 --set eval.interval_steps=30"
expect_status 0 "$SRC/scripts/demo.sh" --dpo --set train.steps=20
expect_out "pretraining the base model"
expect_out "initialised from $WORK/data/base-hf"
expect_out "conversations left to train on"
expect_out "evaluation set 'heldout': "
expect_out "| heldout | val_loss"
expect_out "and the chat template it rendered with"
expect_out "answers ended with <|EOT|>"
ok "scripts/demo.sh --sft: tokenizer, base model, its HF export, conversations, fine-tuning with validation, export, transformers chats"

python3 - runs/sft/metrics.jsonl <<'PY' || fail "the held-out loss did not fall"
import json, sys
vals = [r["val_loss"] for r in map(json.loads, open(sys.argv[1])) if r.get("eval") == "heldout"]
assert len(vals) >= 2 and vals[-1] < vals[0], vals
print(f"held-out loss {vals[0]:.4f} -> {vals[-1]:.4f}")
PY
"$py" - runs/sft-hf data/docstrings "$SRC/recipes/chat_templates/deepseek-coder-instruct.jinja" "$SRC/test/text" <<'PY' \
  || fail "the export's chat template and tokenizer do not reproduce the training data"
import json, sys
sys.path.insert(0, sys.argv[4])
import transformers
from chat_data_reference import read_dataset
out, prefix, template = sys.argv[1:4]
tok = transformers.AutoTokenizer.from_pretrained(out)
assert tok.chat_template == open(template, encoding="utf-8").read(), "the export's chat_template is not the one the data was rendered with"
assert tok.eos_token == "<|EOT|>", tok.eos_token
conversations = [json.loads(line)["messages"] for line in open(prefix + ".jsonl", encoding="utf-8")][:50]
for i, ((ids, mask), messages) in enumerate(zip(read_dataset(prefix), conversations)):
    rendered = tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
    assert list(rendered) == list(ids), f"conversation {i}: the export's template renders other tokens than training read"
print("the export's tokenizer and chat template give the training data's tokens for 50 conversations")
PY
python3 - runs/chat.json <<'PY' || fail "the fine-tuned model never ended its turn"
import json, sys
chat = json.load(open(sys.argv[1]))
assert len(chat["results"]) == 6 and chat["stopped"] >= 3, chat
print(f"{chat['stopped']} of 6 answers ended with <|EOT|>")
PY
ok "the export renders the training data's tokens exactly, the held-out loss fell, and the model ends its turns"

# Then DPO from the fine-tuned export on pairs from the same docstrings (scripts/demo.sh --dpo).
expect_out "tokenizing the pairs with $WORK/runs/sft-hf's tokenizer and chat template"
expect_out "1440 preference pairs left to train on (160 held out by eval.split)"
expect_out "reference log-probs: written to $WORK/runs/pairs.ref."
expect_out "held-out pairs (160): rewards/accuracies 0.00 (step 0)"
python3 - runs/dpo/metrics.jsonl <<'PY' || fail "DPO did not learn the held-out preferences"
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if r.get("eval") == "heldout"]
assert [r["step"] for r in rows] == [0, 10, 20], rows
assert rows[0]["rewards/accuracies"] == 0 and rows[-1]["rewards/accuracies"] >= 0.8 and rows[-1]["rewards/margins"] > 0.5, rows[-1]
assert rows[-1]["val_loss"] < 0.7 * rows[0]["val_loss"], [r["val_loss"] for r in rows]
print(f"held-out rewards/accuracies {rows[0]['rewards/accuracies']:.2f} -> {rows[-1]['rewards/accuracies']:.2f}")
PY
ok "scripts/demo.sh --dpo: pairs from the docstrings, tokenized with the export's template, DPO from the fine-tuned export; held-out rewards/accuracies 0 -> at least 0.8"
finish
