#!/usr/bin/env bash
# `scripts/demo.sh --sft`: fine-tuning on conversations, end to end, on CPU, from the Python
# standard library alone (nothing is downloaded):
#   1. a small BPE tokenizer with DeepSeek-Coder's special tokens, trained on the stdlib's source;
#   2. a base model: the demo's tiny DeepSeek-coder pretrained on that source (recipes/demo-sft-base.yaml),
#      exported as a Hugging Face folder, which stands for a released model;
#   3. questions and answers from the stdlib's docstrings, rendered with DeepSeek-Coder-instruct's
#      chat template by `prepare-data --chat` (only the answers and <|EOT|> trained);
#   4. fine-tuning from the HF folder (recipes/demo-sft.yaml: packed conversations, 5% held out
#      and scored during training, 3 epochs), then `export-hf` (the template travels with it);
#   5. transformers loads the export, applies its chat template to questions never trained on, and
#      generates (scripts/demo-chat.py).
# Steps 1-3 run once (their files stay in recipes/data/sft-demo/); a second run fine-tunes again.
# Extra arguments go to the fine-tuning `dstrain train`.
#   DSTRAIN_DEMO_DATA=DIR      where the tokenizer, corpora and base model go (default recipes/data/sft-demo)
#   DSTRAIN_DEMO_RUNS=DIR      where the two runs go (default runs/demo-sft-<time>)
#   DSTRAIN_DEMO_BASE_STEPS=N  pretraining steps of the base model (default the recipe's 200)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
"$DSTRAIN_ROOT/scripts/setup.sh" --sft
"$DSTRAIN_ROOT/scripts/build.sh" dstrain
cd "$DSTRAIN_ROOT"
dstrain="$DSTRAIN_BUILD_DIR/dstrain"
py="$DSTRAIN_VENV/bin/python"
data="${DSTRAIN_DEMO_DATA:-$DSTRAIN_ROOT/recipes/data/sft-demo}"
runs="${DSTRAIN_DEMO_RUNS:-$DSTRAIN_ROOT/runs/demo-sft-$(date +%Y%m%d-%H%M%S)}"
stdlib="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')"
mkdir -p "$data"
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error

if [ ! -f "$data/tokenizer/tokenizer.json" ]; then
  say "training a 2048-id BPE tokenizer on $stdlib"
  "$py" scripts/make-demo-sft.py tokenizer "$stdlib" "$data/tokenizer"
fi
if [ ! -f "$data/pycode.idx" ]; then
  say "tokenizing the base model's corpus (Python sources, first 8 MB)"
  "$dstrain" prepare-data "$stdlib" --ext .py --tokenizer "$data/tokenizer" --output "$data/pycode" --max-bytes 8000000
fi
if [ ! -f "$data/base-hf/config.json" ]; then
  say "pretraining the base model (recipes/demo-sft-base.yaml), then exporting it as a Hugging Face folder"
  steps=()
  [ -n "${DSTRAIN_DEMO_BASE_STEPS:-}" ] && steps=(--set train.steps="$DSTRAIN_DEMO_BASE_STEPS")
  "$dstrain" train recipes/demo-sft-base.yaml --set run_dir="$runs/base" --set data.path="$data/pycode" "${steps[@]}"
  "$dstrain" export-hf "$runs/base" "$data/base-hf"
fi
if [ ! -f "$data/docstrings.idx" ]; then
  say "rendering the stdlib's docstrings as conversations with DeepSeek-Coder-instruct's chat template"
  "$py" scripts/make-demo-sft.py conversations "$stdlib" "$data/docstrings.jsonl" "$data/questions.jsonl"
  "$dstrain" prepare-data "$data/docstrings.jsonl" --chat --tokenizer "$data/tokenizer" \
    --chat-template recipes/chat_templates/deepseek-coder-instruct.jinja --max-length 256 --output "$data/docstrings"
fi
say "fine-tuning $data/base-hf on the conversations (recipes/demo-sft.yaml)"
"$dstrain" train recipes/demo-sft.yaml --set run_dir="$runs/sft" --set data.path="$data/docstrings" \
  --set model.init_from="$data/base-hf" "$@"
"$dstrain" export-hf "$runs/sft" "$runs/sft-hf"
say "asking the fine-tuned model, loaded by transformers, questions it was never trained on"
"$py" scripts/demo-chat.py "$runs/sft-hf" "$data/questions.jsonl" --json "$runs/chat.json"
say "the fine-tuned model is $runs/sft-hf (a Hugging Face folder with its chat template); its run is $runs/sft"
