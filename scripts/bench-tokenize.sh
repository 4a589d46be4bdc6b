#!/usr/bin/env bash
# prepare-data's tokenizer against Hugging Face `tokenizers` (issue 24): a mixed corpus of
# --mb MB (test/text/make_corpus.py), the DeepSeek-V3, GPT-2 and Llama 3 style tokenizers trained
# on it (test/text/train_tokenizers.py), then, with the same cores for both (taskset) and the same
# thread count:
#   tokenizers  Tokenizer.encode_batch(texts) on the texts already in memory (RAYON_NUM_THREADS=N)
#   dstrain     the whole `dstrain prepare-data --workers N`: reading, JSON parsing, tokenizing
#               and writing the dataset
# Best of 3 each. Prints MB/s of text (UTF-8 bytes of the documents, not of the JSON) and the ratio dstrain / tokenizers, for 1 thread and for
# every core.
#   scripts/bench-tokenize.sh [MB]      default 10
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
"$DSTRAIN_ROOT/scripts/build.sh" >/dev/null
mb="${1:-10}"
py="$DSTRAIN_VENV/bin/python"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$py" "$DSTRAIN_ROOT/test/text/make_corpus.py" "$work/corpus.jsonl" --mb "$mb"
"$py" "$DSTRAIN_ROOT/test/text/train_tokenizers.py" "$work/corpus.jsonl" "$work/toks" >/dev/null
cores=$(nproc)
echo "# $cores cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); corpus $(du -m "$work/corpus.jsonl" | cut -f1) MB JSON Lines;" \
  "tokenizers $("$py" -c 'import tokenizers; print(tokenizers.__version__)'), dstrain $(git -C "$DSTRAIN_ROOT" rev-parse --short HEAD)"
printf '| tokenizer | threads | tokenizers MB/s | dstrain MB/s | dstrain / tokenizers |\n|---|---|---|---|---|\n'
for threads in 1 "$cores"; do
  cpus="0-$((threads - 1))"
  for name in deepseek_v3 gpt2 llama3; do
    read -r text_bytes hf < <(RAYON_NUM_THREADS=$threads TOKENIZERS_PARALLELISM=true taskset -c "$cpus" "$py" - "$work/corpus.jsonl" "$work/toks/$name" <<'PY'
import json, sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[2] + "/tokenizer.json")
texts = [t for t in (json.loads(l)["text"] for l in open(sys.argv[1], encoding="utf-8")) if t]
size = sum(len(t.encode()) for t in texts)
times = []
for _ in range(3):
    t0 = time.perf_counter()
    tok.encode_batch(texts)
    times.append(time.perf_counter() - t0)
print(size, f"{size / 1e6 / min(times):.2f}")
PY
)
    best=0
    for _ in 1 2 3; do
      seconds=$(taskset -c "$cpus" "$DSTRAIN_BUILD_DIR/dstrain" prepare-data "$work/corpus.jsonl" --tokenizer "$work/toks/$name" \
        --output "$work/out" --workers "$threads" | sed -nE 's/.* MB in ([0-9.]+) s with.*/\1/p')
      best=$(python3 -c "print(round(max($best, $text_bytes / 1e6 / $seconds), 2))")
    done
    printf '| %s | %s | %s | %s | %.2fx |\n' "$name" "$threads" "$hf" "$best" "$(python3 -c "print($best / $hf)")"
  done
done
