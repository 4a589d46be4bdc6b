#!/usr/bin/env bash
# Sets up, builds and runs the demo: a tiny DeepSeek-coder-style model trained by 2 worker
# processes on CPU (Gloo) on the Python standard library's source, which `dstrain prepare-data`
# first turns into a byte-level Megatron dataset (no download). It installs and builds only what
# dstrain itself needs (scripts/test.sh adds the test suite's). Extra arguments go to
# `dstrain train`.
#   DSTRAIN_DEMO_TOKENIZER=path/tokenizer.json scripts/demo.sh
#     prepares the corpus with that Hugging Face tokenizer instead (e.g. one trained with the
#     `tokenizers` package) and sizes the model's vocabulary and end-of-document token from it.
#   scripts/demo.sh --sft
#     fine-tuning on conversations instead: scripts/demo-sft.sh (a base model exported as a Hugging
#     Face folder, fine-tuned on the stdlib's docstrings as chats, exported, and asked through transformers).
#   scripts/demo.sh --dpo
#     the fine-tuning demo, then preference tuning (DPO) on pairs from the same docstrings, with
#     rewards/accuracies rising on held-out pairs: scripts/demo-dpo.sh.
set -euo pipefail
[ "${1:-}" = --sft ] && exec "$(dirname "${BASH_SOURCE[0]}")/demo-sft.sh" "${@:2}"
[ "${1:-}" = --dpo ] && exec "$(dirname "${BASH_SOURCE[0]}")/demo-dpo.sh" "${@:2}"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
"$DSTRAIN_ROOT/scripts/setup.sh"
"$DSTRAIN_ROOT/scripts/build.sh" dstrain
cd "$DSTRAIN_ROOT"
data="$DSTRAIN_ROOT/recipes/data/pycode"
prepare=()
overrides=()
if [ -n "${DSTRAIN_DEMO_TOKENIZER:-}" ]; then
  data="$DSTRAIN_ROOT/recipes/data/pycode-$(sha256sum "$DSTRAIN_DEMO_TOKENIZER" 2>/dev/null | cut -c1-12 || echo bpe)"
  prepare=(--tokenizer "$DSTRAIN_DEMO_TOKENIZER")
fi
if [ ! -f "$data.idx" ] || [ ! -f "$data.bin" ]; then
  stdlib="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')"
  say "building the demo corpus from $stdlib (Python sources, first 8 MB)"
  "$DSTRAIN_BUILD_DIR/dstrain" prepare-data "$stdlib" --ext .py --output "$data" --max-bytes 8000000 "${prepare[@]}"
fi
# The dataset's PREFIX.json gives the model its vocabulary and end-of-document token.
[ -n "${DSTRAIN_DEMO_TOKENIZER:-}" ] && overrides=(--set data.path="$data")
# A fresh run directory each time: dstrain never trains into an existing run.
exec "$DSTRAIN_BUILD_DIR/dstrain" train recipes/demo-coder.yaml --set run_dir="runs/demo-$(date +%Y%m%d-%H%M%S)" "${overrides[@]}" "$@"
