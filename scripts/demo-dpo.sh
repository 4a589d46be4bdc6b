#!/usr/bin/env bash
# `scripts/demo.sh --dpo`: preference tuning after the fine-tuning demo, end to end, on CPU, from the
# Python standard library alone (nothing is downloaded):
#   1. the fine-tuning demo (scripts/demo-sft.sh: tokenizer, base model, docstring conversations,
#      fine-tuning, export), unless DSTRAIN_DEMO_SFT names a fine-tuned export already made;
#   2. preference pairs from the same docstrings in TRL's format: the right answer chosen; rejected,
#      a signature naming another function or the docstring's words shuffled (make-demo-sft.py pairs),
#      tokenized by `prepare-data --preference` with the fine-tuned export's tokenizer and chat
#      template, as TRL's DPOTrainer tokenizes them;
#   3. DPO from the fine-tuned export (recipes/demo-dpo.yaml: the reference log-probs computed once,
#      160 pairs held out and scored at the start and every 10 steps), showing rewards/accuracies
#      on the held-out pairs rise.
# Extra arguments go to the DPO `dstrain train`.
#   DSTRAIN_DEMO_SFT=DIR       start from this fine-tuned Hugging Face folder (step 1 skipped)
#   DSTRAIN_DEMO_SFT_ARGS=...  arguments for step 1's fine-tuning run (e.g. "--set train.epochs=1")
#   DSTRAIN_DEMO_DATA, DSTRAIN_DEMO_RUNS, DSTRAIN_DEMO_BASE_STEPS: as scripts/demo-sft.sh reads them
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$DSTRAIN_ROOT"
data="${DSTRAIN_DEMO_DATA:-$DSTRAIN_ROOT/recipes/data/sft-demo}"
runs="${DSTRAIN_DEMO_RUNS:-$DSTRAIN_ROOT/runs/demo-dpo-$(date +%Y%m%d-%H%M%S)}"
sft="${DSTRAIN_DEMO_SFT:-}"
if [ -z "$sft" ]; then
  read -r -a sft_args <<<"${DSTRAIN_DEMO_SFT_ARGS:-}"
  DSTRAIN_DEMO_DATA="$data" DSTRAIN_DEMO_RUNS="$runs" "$DSTRAIN_ROOT/scripts/demo-sft.sh" "${sft_args[@]}"
  sft="$runs/sft-hf"
else
  "$DSTRAIN_ROOT/scripts/setup.sh" --sft
  "$DSTRAIN_ROOT/scripts/build.sh" dstrain
fi
[ -f "$sft/config.json" ] || die "$sft is not a Hugging Face folder (no config.json): point DSTRAIN_DEMO_SFT at a fine-tuned export"
dstrain="$DSTRAIN_BUILD_DIR/dstrain"
stdlib="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')"
mkdir -p "$runs"
if [ ! -f "$data/pairs.jsonl" ]; then
  say "making preference pairs from the stdlib's docstrings (right answers against wrong names and shuffled words)"
  "$DSTRAIN_VENV/bin/python" scripts/make-demo-sft.py pairs "$stdlib" "$data/pairs.jsonl"
fi
say "tokenizing the pairs with $sft's tokenizer and chat template, as TRL's DPOTrainer does"
"$dstrain" prepare-data "$data/pairs.jsonl" --preference --tokenizer "$sft" --max-length 256 --output "$runs/pairs"
say "preference tuning $sft (recipes/demo-dpo.yaml)"
"$dstrain" train recipes/demo-dpo.yaml --set run_dir="$runs/dpo" --set data.path="$runs/pairs" --set model.init_from="$sft" "$@"
python3 - "$runs/dpo/metrics.jsonl" <<'PY'
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if r.get("eval") == "heldout"]
curve = ", ".join(f"{r['rewards/accuracies']:.2f} (step {r['step']})" for r in rows)
print(f"held-out pairs ({rows[-1]['pairs']}): rewards/accuracies {curve}; rewards/margins {rows[0]['rewards/margins']:.3f} -> "
      f"{rows[-1]['rewards/margins']:.3f}")
PY
say "the preference-tuned run is $runs/dpo (dstrain export-hf $runs/dpo OUT makes a Hugging Face folder of it)"
