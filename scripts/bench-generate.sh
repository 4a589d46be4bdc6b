#!/usr/bin/env bash
# Generation speed (issue 61): greedy tokens/s of `dstrain generate` with its key/value cache
# against transformers' generate(use_cache=True, do_sample=False) on the same model, the same
# prompts and the same threads, one prompt at a time and in batches of 8; and dstrain without the
# cache (the whole sequence again at every token: O(context^2)). Two models transformers makes
# (random weights): a Llama with GQA and a DeepSeek-V2-Lite-shaped MLA + MoE model (the latent
# cache, kv_b absorbed), hidden 512, fp32 on the CPU. Both sides must produce the same tokens.
#   scripts/bench-generate.sh [NEW_TOKENS] [PROMPTS]
#   DSTRAIN_BENCH_DEVICE=cuda DSTRAIN_BENCH_DTYPE=bf16 DSTRAIN_BENCH_PYTHON=python3 ...  the GPU row
#     (scripts/gpu-check.sh: its own build, the machine's python with transformers); in bf16 the two
#     sides' tokens may part at a near tie, so the agreement is printed instead of required.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
new="${1:-128}"
count="${2:-8}"
device="${DSTRAIN_BENCH_DEVICE:-cpu}"
dtype="${DSTRAIN_BENCH_DTYPE:-fp32}"
hidden="${DSTRAIN_BENCH_HIDDEN:-512}"  # the models' width (a multiple of 64) and decoder layers
layers="${DSTRAIN_BENCH_LAYERS:-4}"
py="${DSTRAIN_BENCH_PYTHON:-$DSTRAIN_VENV/bin/python}"
[ -n "${DSTRAIN_BENCH_PYTHON:-}" ] || "$DSTRAIN_ROOT/scripts/build.sh" dstrain >/dev/null
ref="$DSTRAIN_ROOT/test/dist/generate_reference.py"
threads=$(nproc)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false
"$py" "$DSTRAIN_ROOT/test/text/make_corpus.py" corpus.jsonl --mb 1 >/dev/null
"$py" "$DSTRAIN_ROOT/test/text/chat_data_reference.py" tokenizers corpus.jsonl "$DSTRAIN_ROOT/test/fixtures/chat_templates" toks >/dev/null
tok=toks/deepseek-llm-chat
"$py" - corpus.jsonl prompts.jsonl "$count" <<'PY'
import json, sys
rows = [json.loads(l)["text"] for l in open(sys.argv[1]) if len(json.loads(l)["text"]) > 400]
with open(sys.argv[2], "w") as f:
    for r in rows[:int(sys.argv[3])]:
        f.write(json.dumps({"prompt": r[:400]}) + "\n")
PY
rate() { python3 -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]):.1f}')" "$1" "$2"; }
ours() {  # ours MODEL BATCH [FLAGS...]: "seconds new_tokens" from the log's last line
  local model=$1 batch=$2; shift 2
  "$DSTRAIN_BUILD_DIR/dstrain" generate "$model" --prompts prompts.jsonl --tokenizer $tok --max-new-tokens "$new" --batch-size "$batch" \
    --device "$device" --dtype "$dtype" --json "$@" > out.jsonl 2> log || die "dstrain generate failed: $(tail -3 log)"
  sed -n 's/.* \([0-9]*\) new tokens in \([0-9.]*\) s.*/\2 \1/p' log | tail -1
}
where="$threads cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
[ "$device" = cpu ] || where="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || echo "$device")"
echo "# $where; $count prompts of about 100 tokens, $new new tokens each, greedy, $dtype on $device"
printf '%-26s %6s %16s %16s %16s %10s\n' model batch "transformers t/s" "dstrain t/s" "no cache t/s" "ratio"
for fam in llama deepseek_v2; do
  "$py" "$ref" model $fam --family $fam --vocab 3000 --max-positions 1024 --eos 1 --hidden "$hidden" --layers "$layers" >/dev/null 2>&1 ||
    die "could not make $fam"
  for batch in 1 8; do
    read -r hs hn < <("$py" "$ref" generate $fam $tok prompts.jsonl theirs.jsonl --max-new-tokens "$new" --batch-size $batch \
      --threads "$threads" --device "$device" --dtype "$dtype" 2>/dev/null | python3 -c 'import json, sys; j = json.loads(sys.stdin.read().splitlines()[-1]); print(j["seconds"], j["new_tokens"])')
    read -r ds dn < <(ours $fam $batch)
    if [ "$dtype" = fp32 ]; then
      "$py" "$ref" compare theirs.jsonl out.jsonl >/dev/null || die "$fam: dstrain's tokens differ from transformers'"
    else  # bf16: the agreement, for the record
      "$py" "$ref" compare theirs.jsonl out.jsonl 2>&1 | tail -1 | sed "s/^/# $fam batch $batch: /" || true
    fi
    nc="-"
    if [ $batch = 1 ]; then read -r cs cn < <(ours $fam 1 --no-cache); nc=$(rate "$cn" "$cs"); fi
    printf '%-26s %6s %16s %16s %16s %9sx\n' "$fam (hidden $hidden, $layers+ layers)" $batch "$(rate "$hn" "$hs")" "$(rate "$dn" "$ds")" "$nc" \
      "$(python3 -c "import sys; print(f'{float(sys.argv[1]) / float(sys.argv[2]) * float(sys.argv[3]) / float(sys.argv[4]):.2f}')" "$dn" "$ds" "$hs" "$hn")"
  done
done
echo "ratio: dstrain's tokens/s over transformers'; $([ "$dtype" = fp32 ] && echo "both generated the same tokens" || echo "the tokens' agreement above")"
