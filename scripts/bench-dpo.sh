#!/usr/bin/env bash
# The DPO step's head (issue 60): the completions' log-probs from the head's logits all at once
# (train.loss_chunk_tokens 0) against train.loss_chunk_tokens tokens at a time (the default 4096),
# where the gradient comes from the chunked cross-entropy weighted by the loss's gradient for each
# sequence: peak host memory and step time. A dense model of 2 x 64 with a 32,000-token vocabulary
# (the head is most of the step), 16 pairs (32 rows) of 512 tokens per step, one rank, fp32 on the
# CPU; the pairs come from test/dist/dpo_reference.py's generator and a test tokenizer (scripts/setup.sh --test).
# Then the reference's cost: preference.reference live (a frozen copy of the model, one more forward
# without autograd per micro-batch) and TR-DPO's sync after every step, against precomputed.
#   scripts/bench-dpo.sh [STEPS] [--set KEY=VALUE ...]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
steps="${1:-6}"
[ $# -gt 0 ] && shift
"$DSTRAIN_ROOT/scripts/build.sh" dstrain >/dev/null
py="$DSTRAIN_VENV/bin/python"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$py" "$DSTRAIN_ROOT/test/text/make_corpus.py" corpus.jsonl --mb 1 >/dev/null
"$py" "$DSTRAIN_ROOT/test/text/chat_data_reference.py" tokenizers corpus.jsonl "$DSTRAIN_ROOT/test/fixtures/chat_templates" toks >/dev/null
"$py" "$DSTRAIN_ROOT/test/dist/dpo_reference.py" pairs corpus.jsonl pairs.jsonl --count 256
"$DSTRAIN_BUILD_DIR/dstrain" prepare-data pairs.jsonl --preference --tokenizer toks/deepseek-llm-chat --output dpo >/dev/null
model=(--set model.family=dense --set model.vocab_size=32000 --set model.hidden_size=64 --set model.num_layers=2 --set model.num_heads=4
       --set model.intermediate_size=128 --set model.max_seq_len=512 --set data.path="$work/dpo" --set data.format=megatron
       --set data.seq_len=512 --set train.objective=dpo --set train.micro_batch_size=16 --set train.global_batch_size=16
       --set schedule.warmup_steps=0)
declare -A step_ms rss
measure() {  # measure MODE NAME ARGS...
  local mode=$1 name=$2; shift 2
  "$DSTRAIN_BUILD_DIR/dstrain" train "$DSTRAIN_ROOT/recipes/demo.yaml" --nproc-per-node 1 --set launch.threads_per_worker="$(nproc)" \
    --set train.steps="$steps" --set checkpoint.interval_steps=0 --set checkpoint.at_end=false --set run_dir="$work/$mode" \
    "${model[@]}" "$@" "${extra_sets[@]}" >/dev/null 2>&1 || die "the $mode run failed"
  read -r step_ms[$mode] rss[$mode] < <(python3 - "$work/$mode/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{statistics.median(r['step_ms'] for r in rows[2:]):.0f} {max(r['host_peak_rss_mb'] for r in rows):.0f}")
PY
)
  printf '%-34s %9s %14s MiB\n' "$name" "${step_ms[$mode]}" "${rss[$mode]}"
}
extra_sets=("$@")
echo "# $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); dense 2 x 64, vocabulary 32000, 16 pairs x 512 tokens, $steps steps"
printf '%-34s %9s %14s\n' mode "step ms" "peak host RSS"
measure whole 'logits all at once (chunk 0)' --set train.loss_chunk_tokens=0
measure chunked 'chunked (4096 tokens)' --set train.loss_chunk_tokens=4096
python3 -c "import sys; w, c, rw, rc = map(float, sys.argv[1:]); print(f'ratio  chunked / all at once: step time {c / w:.2f}, peak host RSS {rc / rw:.2f}')" \
  "${step_ms[whole]}" "${step_ms[chunked]}" "${rss[whole]}" "${rss[chunked]}"
# Where the reference's log-probs come from (chunked): precomputed before the first step (the row
# above), a frozen copy forwarded at every micro-batch (live), and TR-DPO syncing it after every step.
measure live 'reference live (a frozen copy)' --set train.loss_chunk_tokens=4096 --set preference.reference=live
measure sync 'live + TR-DPO sync every step' --set train.loss_chunk_tokens=4096 --set preference.reference=live \
  --set preference.sync_ref_model=true --set preference.ref_model_sync_steps=1
python3 -c "import sys; p, l, s = map(float, sys.argv[1:]); print(f'ratio  live / precomputed: step time {l / p:.2f}; with a sync every step {s / p:.2f}')" \
  "${step_ms[chunked]}" "${step_ms[live]}" "${step_ms[sync]}"
