#!/usr/bin/env bash
# Time in a conversation's turns (issue 55, D10): one conversation of T user/assistant pairs through
# `dstrain prepare-data --chat` (the incremental prefix mask: each assistant turn's span comes from
# the renderings of messages[:i] and messages[:i+1]), for DeepSeek-V3's and Llama 3's template
# layouts, against transformers doing the same mask with apply_chat_template per prefix (what
# fine-tuning scripts do; quadratic, so only up to a few thousand pairs). Linear time doubles with T:
# the "x prev" column is time(T) / time(T/2).
#   scripts/bench-chat-turns.sh [MAX_PAIRS]      default 16000 (the peer stops at 1000: 2000 takes it 5 minutes)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
"$DSTRAIN_ROOT/scripts/build.sh" dstrain >/dev/null
max="${1:-16000}"
py="$DSTRAIN_VENV/bin/python"
ref="$DSTRAIN_ROOT/test/text/chat_data_reference.py"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false
"$py" "$DSTRAIN_ROOT/test/text/make_corpus.py" "$work/corpus.jsonl" --mb 1
"$py" "$ref" tokenizers "$work/corpus.jsonl" "$DSTRAIN_ROOT/test/fixtures/chat_templates" "$work/toks" >/dev/null
echo "# $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); one conversation, --workers 1;" \
  "dstrain $(git -C "$DSTRAIN_ROOT" rev-parse --short HEAD), transformers $("$py" -c 'import transformers; print(transformers.__version__)')"
printf '| template | pairs | dstrain s | us / message | x prev | transformers s | transformers / dstrain |\n|---|---|---|---|---|---|---|\n'
for template in deepseek-v3-style llama3-style; do
  prev=""
  for ((pairs = 500; pairs <= max; pairs *= 2)); do
    python3 - "$work/c.jsonl" "$pairs" <<'PY'
import json, sys
m = []
for k in range(int(sys.argv[2])):
    m += [{"role": "user", "content": f"question {k}: what is {k} squared?"}, {"role": "assistant", "content": f"{k} squared is {k * k}."}]
open(sys.argv[1], "w").write(json.dumps({"messages": m}) + "\n")
PY
    seconds=$("$DSTRAIN_BUILD_DIR/dstrain" prepare-data "$work/c.jsonl" --chat --tokenizer "$work/toks/$template" \
      --output "$work/out" --workers 1 | sed -nE 's/.* MB in ([0-9.]+) s with.*/\1/p')
    peer="-"
    ratio="-"
    if ((pairs <= 1000)); then
      peer=$("$py" - "$work/c.jsonl" "$work/toks/$template" <<'PY'
import json, sys, time
from transformers import AutoTokenizer
messages = json.loads(open(sys.argv[1]).read())["messages"]
tok = AutoTokenizer.from_pretrained(sys.argv[2])
render = lambda m, gp: tok.apply_chat_template(m, tokenize=False, add_generation_prompt=gp)
ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]
t0 = time.perf_counter()
full = ids(render(messages, False))
mask = [0] * len(full)
for i, m in enumerate(messages):
    if m["role"] == "assistant":
        a, b = len(ids(render(messages[:i], True))), len(ids(render(messages[:i + 1], False)))
        mask[a:b] = [1] * (b - a)
print(f"{time.perf_counter() - t0:.2f}")
PY
)
      ratio=$(python3 -c "print(f'{$peer / max($seconds, 1e-3):.0f}x')")
    fi
    growth=$([ -n "$prev" ] && python3 -c "print(f'{$seconds / max($prev, 1e-3):.1f}')" || echo "-")
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$template" "$pairs" "$seconds" \
      "$(python3 -c "print(f'{$seconds * 1e6 / (2 * $pairs):.1f}')")" "$growth" "$peer" "$ratio"
    prev=$seconds
  done
done
