#!/usr/bin/env bash
# prepare-data on conversations against the usual Python pipeline (issue 38): N conversations
# (1-4 turns, system prompts, unicode; test/text/chat_data_reference.py chats) and a byte-level BPE
# with DeepSeek-V3's pre-tokenizer, rendered with deepseek-llm-chat's template. With the same cores
# (taskset) and the same number of processes/threads:
#   transformers-mask  what a fine-tuning script does per conversation in datasets.map(num_proc=N):
#                      apply_chat_template + tokenizers for the whole conversation and for each
#                      assistant turn's two prefixes (the incremental mask), in a process pool
#   transformers-ids   the same without the mask: one apply_chat_template(tokenize=True) each
#   dstrain            the whole `dstrain prepare-data --chat --workers N`: reading, JSON, the
#                      template, tokenizing, masks, and writing the dataset
# Best of 3 each. Prints conversations per second and the ratio dstrain / the peer.
#   scripts/bench-chat-data.sh [CONVERSATIONS]      default 20000
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
"$DSTRAIN_ROOT/scripts/build.sh" >/dev/null
count="${1:-20000}"
py="$DSTRAIN_VENV/bin/python"
ref="$DSTRAIN_ROOT/test/text/chat_data_reference.py"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false
"$py" "$DSTRAIN_ROOT/test/text/make_corpus.py" "$work/corpus.jsonl" --mb 2
"$py" "$ref" tokenizers "$work/corpus.jsonl" "$DSTRAIN_ROOT/test/fixtures/chat_templates" "$work/toks"
: > "$work/empty.jsonl"
"$py" "$ref" chats "$work/corpus.jsonl" "$work/empty.jsonl" "$work/chats.jsonl" --count "$count"
tok="$work/toks/deepseek-llm-chat"
cores=$(nproc)
echo "# $cores cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $count conversations," \
  "$(du -m "$work/chats.jsonl" | cut -f1) MB JSON Lines; transformers $("$py" -c 'import transformers; print(transformers.__version__)')," \
  "dstrain $(git -C "$DSTRAIN_ROOT" rev-parse --short HEAD)"
printf '| threads | transformers-ids conv/s | transformers-mask conv/s | dstrain conv/s | dstrain / ids | dstrain / mask |\n|---|---|---|---|---|---|\n'
for threads in 1 "$cores"; do
  cpus="0-$((threads - 1))"
  peer() {
    taskset -c "$cpus" "$py" - "$work/chats.jsonl" "$tok" "$threads" "$1" <<'PY'
import json, multiprocessing, sys, time
from transformers import AutoTokenizer

path, tokdir, procs, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
tok = AutoTokenizer.from_pretrained(tokdir)

def encode(line):
    messages = json.loads(line)["messages"]
    render = lambda m, gp: tok.apply_chat_template(m, tokenize=False, add_generation_prompt=gp)
    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]
    full = ids(render(messages, False))
    if mode == "ids":
        return len(full)
    mask = [0] * len(full)
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            a, b = len(ids(render(messages[:i], True))), len(ids(render(messages[:i + 1], False)))
            mask[a:b] = [1] * (b - a)
    return len(full)

best = 0
for _ in range(3):
    t0 = time.perf_counter()
    lines = open(path, encoding="utf-8").readlines()
    with multiprocessing.Pool(procs) as pool:
        pool.map(encode, lines, chunksize=256)
    best = max(best, len(lines) / (time.perf_counter() - t0))
print(f"{best:.0f}")
PY
  }
  ids_rate=$(peer ids)
  mask_rate=$(peer mask)
  best=0
  for _ in 1 2 3; do
    seconds=$(taskset -c "$cpus" "$DSTRAIN_BUILD_DIR/dstrain" prepare-data "$work/chats.jsonl" --chat --tokenizer "$tok" \
      --output "$work/out" --workers "$threads" | sed -nE 's/.* MB in ([0-9.]+) s with.*/\1/p')
    best=$(python3 -c "print(round(max($best, $count / $seconds)))")
  done
  printf '| %s | %s | %s | %s | %.1fx | %.1fx |\n' "$threads" "$ids_rate" "$mask_rate" "$best" \
    "$(python3 -c "print($best / $ids_rate)")" "$(python3 -c "print($best / $mask_rate)")"
done
