#!/usr/bin/env bash
# Generative task speed (issue 61): `dstrain eval --task` against lm-evaluation-harness's
# HFLM.generate_until on the same model, rows and threads, at batch sizes 1 (lm-eval's default)
# and 8 (--batch_size 8 / --task-batch-size 8). A Llama-style model transformers makes (random
# weights, hidden 512, 4 layers, fp32, CPU); ROWS dstrain rows whose settings stop at a blank line
# or after 40 tokens. Times are the generation's alone (lm-eval's generate_until call; dstrain's
# eval_ms), and both sides must give the same texts.
#   scripts/bench-tasks.sh [ROWS]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
rows="${1:-16}"
"$DSTRAIN_ROOT/scripts/build.sh" dstrain >/dev/null
py="$DSTRAIN_VENV/bin/python"
trl="$DSTRAIN_TRL_VENV/bin/python"
ref="$DSTRAIN_ROOT/test/dist/generative_task_reference.py"
[ -x "$trl" ] || die "no TRL overlay with lm-evaluation-harness ($DSTRAIN_TRL_VENV): run scripts/setup.sh --test"
threads=$(nproc)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false
"$py" "$DSTRAIN_ROOT/test/text/make_corpus.py" corpus.jsonl --mb 1 >/dev/null
"$py" "$DSTRAIN_ROOT/test/text/chat_data_reference.py" tokenizers corpus.jsonl "$DSTRAIN_ROOT/test/fixtures/chat_templates" toks >/dev/null
tok=toks/deepseek-llm-chat
"$py" "$DSTRAIN_ROOT/test/dist/generate_reference.py" model hf --family llama --vocab 3000 --max-positions 1024 --eos 1 --hidden 512 \
  --layers 4 >/dev/null 2>&1 || die "could not make the model"
"$py" "$ref" rows corpus.jsonl rows.jsonl --count "$rows" --seed 3
echo "# $threads cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $rows rows, up to 40 new tokens each, greedy, fp32"
printf '%6s %12s %12s %12s %12s %8s\n' batch "new tokens" "lm-eval s" "dstrain s" "dstrain t/s" ratio
for batch in 1 8; do
  "$trl" "$ref" score hf "$tok" rows.jsonl theirs.json --batch-size $batch --threads "$threads" > lmeval.log 2>&1 ||
    die "lm-eval failed: $(tail -3 lmeval.log)"
  "$DSTRAIN_BUILD_DIR/dstrain" eval hf --task rows.jsonl --tokenizer "$tok" --task-batch-size $batch --log-samples ours.jsonl --json \
    > result.json 2> log || die "dstrain eval failed: $(tail -3 log)"
  "$py" "$ref" compare theirs.json result.json ours.jsonl --name rows >/dev/null || die "batch $batch: dstrain's texts differ from lm-eval's"
  python3 - theirs.json result.json ours.jsonl $batch <<'PY'
import json, sys
theirs = json.load(open(sys.argv[1]))["seconds"]
ours = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])["tasks"][0]["eval_ms"] / 1000
tokens = sum(json.loads(l)["new_tokens"] for l in open(sys.argv[3]))
print(f"{sys.argv[4]:>6} {tokens:>12} {theirs:>12.2f} {ours:>12.2f} {tokens / ours:>12.1f} {theirs / ours:>7.2f}x")
PY
done
echo "ratio: lm-eval's seconds over dstrain's; both generated the same texts"
